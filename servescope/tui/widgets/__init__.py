"""Reusable widgets of the servescope app."""

from servescope.tui.widgets.curve import ThroughputCurve, find_knee
from servescope.tui.widgets.histogram import LatencyHistogram, percentile
from servescope.tui.widgets.panels import CellTable, EventLog, ServerPanel, SweepProgress

__all__ = ["CellTable", "EventLog", "LatencyHistogram", "ServerPanel", "SweepProgress", "ThroughputCurve",
           "find_knee", "percentile"]

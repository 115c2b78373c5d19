"""Reusable widgets of the servescope app."""

from servescope.tui.widgets.curve import OverlayCurve, ThroughputCurve, find_knee
from servescope.tui.widgets.histogram import LatencyHistogram, percentile
from servescope.tui.widgets.panels import CellTable, EventLog, ServerPanel, SweepProgress, TelemetryPanel
from servescope.tui.widgets.table import Col, FitTable
from servescope.tui.widgets.turns import TurnChart, TurnRow
from servescope.tui.widgets.zoom import Zoomable

__all__ = ["CellTable", "Col", "FitTable", "Zoomable", "EventLog", "LatencyHistogram", "OverlayCurve", "ServerPanel", "SweepProgress", "TelemetryPanel",
           "ThroughputCurve", "TurnChart", "TurnRow",
           "find_knee", "percentile"]

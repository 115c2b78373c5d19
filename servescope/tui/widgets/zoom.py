"""Zoom any pane to the whole screen, as k9s and lazygit do: a focusable pane that inherits `Zoomable`
gets `z` (zoom / unzoom) and `esc` (unzoom, only while zoomed) in the footer when it has focus. It uses
Textual's own maximize, so the screens need no code of their own.

A zoomed pane that a screen hides (`t` swaps the telemetry panel and the per-cell /metrics panel; `q` swaps a
session's cells for its quality) hands the zoom to the pane shown in its place, which takes the focus: the
screen never keeps a maximized pane that is not displayed (an empty, hatched screen) or that lost the focus to
a pane it hides, and `esc` then unzooms onto the pane that was on screen."""

from __future__ import annotations

from typing import Any

from textual import events
from textual.actions import SkipAction
from textual.binding import Binding
from textual.screen import Screen
from textual.widget import Widget


class Zoomable(Widget):
    """Mix in after the widget class (`class FitTable(DataTable, Zoomable)`: Textual takes CSS from the first
    base only); or subclass it directly. The pane must be focusable."""

    BINDINGS = [Binding("z", "zoom", "Zoom"), Binding("escape", "unzoom", "Unzoom")]
    _hidden_at_zoom: tuple[Widget, ...] = ()  # its sibling panes hidden when it was zoomed (zoom_to)

    @property
    def zoomed(self) -> bool:
        return self.is_attached and self.screen.maximized is self

    def action_zoom(self) -> None:
        """Zoom this pane to the whole screen, or back."""
        if self.zoomed:
            unzoom(self.screen)
        else:
            zoom_to(self)

    def action_unzoom(self) -> None:
        if not self.zoomed:
            raise SkipAction()  # esc does what the screen says (e.g. back)
        unzoom(self.screen)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # unzoom: hidden unless zoomed, and then the key goes on to the screen (e.g. esc: back)
        return not (action == "unzoom" and not self.zoomed)

    def _on_hide(self, event: events.Hide) -> None:
        # hidden while zoomed (`t`): once the screen has swapped in what it shows instead, hand the zoom on
        if self.zoomed:
            self.call_after_refresh(self._hand_on_zoom)

    def _on_blur(self, event: events.Blur) -> None:
        # the screen moved the focus away while zoomed (`q` hid this pane's column and focused its quality)
        if self.zoomed:
            self.call_after_refresh(self._hand_on_zoom)

    def _hand_on_zoom(self) -> None:
        """Zoomed but no longer shown: the pane shown in its place (a sibling hidden when it was zoomed), else the
        pane the screen focused instead, takes the zoom; with neither, the screen unzooms."""
        if not self.zoomed or shown(self):
            return
        scr = self.screen
        heir = next((w for w in self._hidden_at_zoom if shown(w)), None)
        if heir is None and scr.focused is not None:
            heir = next((w for w in scr.focused.ancestors_with_self if isinstance(w, Zoomable)), None)
        if isinstance(heir, Zoomable) and shown(heir) and heir is not self:
            heir.action_zoom()
        else:
            unzoom(scr)


def shown(widget: Widget) -> bool:
    """Whether `widget` is on its screen's layout: attached, and neither it nor a container above it hidden."""
    return widget.is_attached and all(n.display for n in widget.ancestors_with_self if isinstance(n, Widget))


def zoom_to(target: Widget) -> None:
    """Maximize `target` and focus it; a Zoomable notes which of its sibling panes were hidden then (the one the
    screen shows in its place, should it hide `target`, takes the zoom over)."""
    if isinstance(target, Zoomable):
        siblings = target.parent.children if target.parent is not None else ()
        target._hidden_at_zoom = tuple(w for w in siblings if isinstance(w, Zoomable) and w is not target
                                       and not w.display and w.can_focus)
    target.screen.maximize(target, container=False)
    target.focus()
    target.screen.refresh_bindings()  # the footer: esc unzooms now


def zoomed_elsewhere(screen: Screen[Any], *panes: type[Widget]) -> bool:
    """Whether a pane other than `panes` is zoomed: a key that swaps those panes (`t`) would change nothing on
    screen, so the screen neither offers it in the footer nor runs it."""
    zoomed = screen.maximized
    return zoomed is not None and not isinstance(zoomed, panes)


def unzoom(screen: Screen[object]) -> None:
    screen.minimize()
    screen.refresh_bindings()  # the footer: esc does what the screen says again

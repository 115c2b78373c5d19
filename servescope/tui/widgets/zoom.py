"""Zoom any pane to the whole screen, as k9s and lazygit do: a focusable pane that inherits `Zoomable`
gets `z` (zoom / unzoom) and `esc` (unzoom, only while zoomed) in the footer when it has focus. It uses
Textual's own maximize, so the screens need no code of their own."""

from __future__ import annotations

from textual.actions import SkipAction
from textual.binding import Binding
from textual.widget import Widget


class Zoomable(Widget):
    """Mix in after the widget class (`class FitTable(DataTable, Zoomable)`: Textual takes CSS from the first
    base only); or subclass it directly. The pane must be focusable."""

    BINDINGS = [Binding("z", "zoom", "Zoom"), Binding("escape", "unzoom", "Unzoom", show=False)]

    @property
    def zoomed(self) -> bool:
        return self.is_attached and self.screen.maximized is self

    def action_zoom(self) -> None:
        """Zoom this pane to the whole screen, or back."""
        if self.zoomed:
            self.screen.minimize()
        else:
            self.screen.maximize(self, container=False)
            self.focus()

    def action_unzoom(self) -> None:
        if not self.zoomed:
            raise SkipAction()  # esc does what the screen says (e.g. back)
        self.screen.minimize()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # unzoom: hidden unless zoomed, and then the key goes on to the screen (e.g. esc: back)
        return not (action == "unzoom" and not self.zoomed)

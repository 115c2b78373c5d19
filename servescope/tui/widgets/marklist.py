"""A selection list whose marks are characters, `[x]` selected and `[ ]` not, so a selection reads the
same without colour (NO_COLOR=1) as with it; the highlight shows only while the list has focus."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widgets import OptionList, SelectionList
from textual.widgets.option_list import OptionDoesNotExist

ON, OFF = "[x] ", "[ ] "


class MarkedSelectionList(SelectionList[str]):
    DEFAULT_CSS = """
    MarkedSelectionList > .selection-list--button-selected { color: $text-success; text-style: bold; }
    MarkedSelectionList:blur > .option-list--option-highlighted { background: transparent; text-style: none; }
    """

    def render_line(self, y: int) -> Strip:
        line = OptionList.render_line(self, y)  # the prompt alone; the mark replaces the toggle button
        _, scroll_y = self.scroll_offset
        index = scroll_y + y
        try:
            option = self.get_option_at_index(index)
        except OptionDoesNotExist:
            return line
        on = option.value in self._selected
        base = next(iter(line)).style or self.rich_style or Style()
        comp = self.get_component_rich_style("selection-list--button-selected" if on else "selection-list--button")
        style = base + Style(color=comp.color if on else None, bold=on, dim=not on, meta={"option": index})
        return Strip([Segment(ON if on else OFF, style=style), *line])

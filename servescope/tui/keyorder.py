"""Keys act in the order they were typed, also those that move focus (Tab, shift+Tab) or act (Enter).

Textual's App sends each key to the widget that has focus *when the App reads the key*. The key then travels
back up from that widget to the App, one container's message queue at a time, and only at the App do the
bindings that are not priority ones run: Tab's `focus_next`, Enter on a button (which posts `Pressed`, whose
handler may open a dialog). Keys read in one go from the terminal (a paste, a bursty SSH link, tmux
send-keys) were all sent before the first had come back: `abc`, Tab, `def` gave name = `abcdef`, the focus
moving to the next field after `def` had been typed into the old one.

`KeysInOrderApp` sends a key only once the key before it has settled. A marker (a callback) follows the key up
its path, from the focused widget to the App: in each widget's queue it runs after the key and after what the
key made that widget post to itself (an Input's `Submitted`, a Button's `Pressed`), so when it is back at the
App the key and the messages it caused on its way have been handled. Where that moved the focus, opened or
closed a screen, or left messages in a widget of the path, the marker goes round again from the new focus (a
pushed screen first composes, mounts and focuses its field). Keys that arrive meanwhile, and pastes, wait in
order. A character (or a paste) typed into a text field, and a key a `FormInput` edits with, are handled
where they land and go no further: the next key follows them at once, with no marker. A marker that stops
moving (a handler awaiting something long) lets the keys go after about STUCK_S, as Textual would send them.

`FormInput` is the other half, for keys within one field: it applies its own editing keys on arrival."""

from __future__ import annotations

from collections import deque
from functools import partial
from typing import TypeVar

from textual import events
from textual import messages as internal
from textual.app import App
from textual.dom import DOMNode
from textual.message import Message
from textual.message_pump import MessagePump
from textual.timer import Timer
from textual.widgets import Input

R = TypeVar("R")

MAX_ROUNDS = 8  # times a marker goes up the path for one key (the key, then its Pressed, then the new screen...)
MAX_WAITS = 4  # times a marker lets a widget's newer messages go first before it moves on
STUCK_S = 0.5  # a marker that has not moved between two looks this far apart lets the waiting keys go

Typed = events.Key | events.Paste


def caused(pump: MessagePump) -> bool:
    """Whether `pump` has a widget's message waiting (a Button's Pressed, an Input's Submitted: what a key may have
    caused, and whose handler may move the focus or open a screen); Textual's own events and repaint messages
    (Blur, Focus, a timer, Update, Layout) change nothing a key is sent to."""
    queue = getattr(pump._message_queue, "_queue", None)  # asyncio.Queue's deque: read, never changed
    if queue is None:
        return pump.message_queue_size > 0
    return any(isinstance(msg, Message) and not isinstance(msg, events.Event)
               and type(msg).__module__ != internal.__name__ for msg in list(queue))


class FormInput(Input):
    """An Input that applies its own keys (backspace, delete, the arrows, home/end, enter) as soon as each
    reaches it, so every key acts in the order it was typed.

    Textual inserts a typed character in the Input at once, but runs a binding such as backspace only once
    the key has bubbled back up to the App through each container's message queue. Keys that arrive
    together (a paste over SSH, a fast typist, a busy repaint) then overtake it: End, 8 backspaces and
    `1,2,4,8` came out as `1,1,2,`. Here a key the Input itself binds runs its action on arrival and goes no
    further; priority bindings (the App's) are still checked before the key gets here, and every other key
    bubbles as before."""

    async def _on_key(self, event: events.Key) -> None:
        active = self.screen.active_bindings.get(event.key)
        if active is None or active.node is not self or not active.enabled or active.binding.priority:
            return  # Input._on_key (next in the MRO) inserts a character; anything else bubbles
        event.prevent_default()  # Input._on_key: nothing to insert
        event.stop()  # the App does not run the binding a second time
        await self.run_action(active.binding.action)


class KeysInOrderApp(App[R]):
    """An App that sends each key (and paste) to the focused widget only once the key before it has settled:
    see the module's docstring."""

    def __init__(self) -> None:
        super().__init__()
        self._waiting: deque[Typed] = deque()
        self._settling: int | None = None  # the marker's token while a key settles
        self._token = 0
        self._moves = 0  # steps markers made (the stuck check reads it)
        self._stuck_timer: Timer | None = None

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, Typed) and not event.is_forwarded:
            if self._settling is not None or self._waiting:
                self._waiting.append(event)
                return
            await self._send(event)
            return
        await super().on_event(event)

    # ---- one key --------------------------------------------------------------------------------
    def _stays(self, event: Typed) -> bool:
        """Whether `event` is handled where it lands and goes no further: a paste or a character typed into a
        text field, or an editing key (not enter) a FormInput applies itself."""
        focused = self.focused
        if not isinstance(focused, Input):
            return False
        if isinstance(event, events.Paste):
            return True
        active = self.screen.active_bindings.get(event.key)
        if active is not None and active.binding.priority:
            return False  # the App runs it before the field sees it
        if event.is_printable:
            return True
        return (isinstance(focused, FormInput) and active is not None and active.node is focused and active.enabled
                and active.binding.action != "submit")

    async def _send(self, event: Typed) -> None:
        """Textual's routing of `event` (the priority bindings, else the focused widget), then its marker."""
        if self._stays(event):
            await super().on_event(event)
            return
        self._token += 1
        token = self._token
        self._settling = token
        await super().on_event(event)
        if self._settling == token:
            self._watch(token)
            self._round(token, 0)

    def _path(self) -> tuple[list[MessagePump], DOMNode | None, DOMNode | None]:
        """The nodes a key takes now (the focused widget, else the screen, up to the App), the screen and the
        focused widget."""
        try:
            screen = self.screen
        except Exception:  # no screen: the app is closing
            return [self], None, None
        start = self.focused or screen
        return [start, *start.ancestors], screen, self.focused

    def _round(self, token: int, n: int) -> None:
        path, screen, focused = self._path()
        self._walk(token, n, path, 0, 0, (screen, focused))

    def _walk(self, token: int, n: int, path: list[MessagePump], i: int, waits: int,
              was: tuple[DOMNode | None, DOMNode | None]) -> None:
        """Put the marker in path[i]'s queue (a node that takes no more messages is passed)."""
        while i < len(path):
            if path[i].call_later(self._step, token, n, path, i, waits, was):
                return
            i, waits = i + 1, 0
        self._round_done(token, n, path, was)

    def _step(self, token: int, n: int, path: list[MessagePump], i: int, waits: int,
              was: tuple[DOMNode | None, DOMNode | None]) -> None:
        """The marker's turn in path[i]'s queue: what was queued there before it has been handled."""
        if self._settling != token:
            return
        self._moves += 1
        if caused(path[i]) and waits < MAX_WAITS:
            self._walk(token, n, path, i, waits + 1, was)  # the key made it post a message: let that go first
        else:
            self._walk(token, n, path, i + 1, 0, was)

    def _round_done(self, token: int, n: int, path: list[MessagePump],
                    was: tuple[DOMNode | None, DOMNode | None]) -> None:
        """The marker is back at the App: go round again if the key changed the screen, or left a message in a
        widget it passed (a focus moved within the screen needs no round: the keys after it are sent to the new
        widget, behind its Focus)."""
        _, screen, _ = self._path()
        widgets = [p for p in path if p is not self and p is not was[0]]
        if (screen is not was[0] or any(caused(p) for p in widgets)) and n + 1 < MAX_ROUNDS:
            self._round(token, n + 1)
        else:
            self._settled(token)

    # ---- the keys that waited -------------------------------------------------------------------
    def _settled(self, token: int) -> None:
        if self._settling != token:
            return
        self._settling = None
        if self._stuck_timer is not None:
            self._stuck_timer.stop()
            self._stuck_timer = None
        if self._waiting:
            self.call_later(self._send_waiting)

    async def _send_waiting(self) -> None:
        while self._settling is None and self._waiting:
            await self._send(self._waiting.popleft())

    def _watch(self, token: int) -> None:
        """Look at the marker again in STUCK_S."""
        self._stuck_timer = self.set_timer(STUCK_S, partial(self._check_stuck, token, self._moves))

    def _check_stuck(self, token: int, moves: int) -> None:
        if self._settling != token:
            return
        if self._moves != moves:  # still moving: look again later
            self._watch(token)
            return
        self._settled(token)

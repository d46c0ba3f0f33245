"""Process plumbing shared by the long-lived commands: the one signal scope.

:func:`on_stop` is how the workflow worker and the ``hold_lease`` command take SIGTERM,
SIGINT (and, for the holder, SIGHUP): a handler that only records the signal and wakes the
loop, installed for the length of a block and taken away after it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

#: The signals that ask a process to stop.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def on_stop(
    handler: Callable[[int], None],
    signals: tuple[signal.Signals, ...] = STOP_SIGNALS,
) -> Iterator[dict[int, Any]]:
    """While the block runs, call ``handler(signum)`` for each of ``signals`` received.

    The handler runs on the main thread between two bytecodes: it should only record the
    signal and wake whoever waits. A signal the process started with ignored (``nohup``, a
    background job) stays ignored. The previous handlers are put back when the block ends.
    Off the main thread (where Python cannot handle signals) nothing is installed.

    Yields the handlers it replaced, by signal number (what a child process should get back
    before it ``exec``\\ s: see ``holder.py``); empty off the main thread.
    """
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in map(int, signals):
            current = signal.getsignal(signum)
            if current == signal.SIG_IGN:
                continue
            previous[signum] = signal.SIG_DFL if current is None else current
            signal.signal(signum, _calling(handler))
    try:
        yield previous
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _calling(handler: Callable[[int], None]) -> Callable[[int, FrameType | None], None]:
    def received(signum: int, frame: FrameType | None) -> None:
        handler(signum)

    return received


def signal_name(signum: int) -> str:
    """``"SIGTERM"`` for 15, ``"signal 99"`` for a number that names no signal."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


__all__ = ["STOP_SIGNALS", "on_stop", "signal_name"]

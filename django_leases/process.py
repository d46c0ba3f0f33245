"""Process plumbing shared by the long-lived parts: the one signal scope and the one timer
thread.

* :func:`on_stop` is how the workflow worker and the ``hold_lease`` command take SIGTERM,
  SIGINT (and, for the holder, SIGHUP): a handler that only records the signal and wakes the
  loop, installed for the length of a block and taken away after it.
* :data:`TIMERS` runs actions at a ``time.monotonic()`` moment on one thread per process
  (started on first use, again after a fork): the deferred start of renewal threads, and the
  deadline that cuts a database connection which stopped answering (``db.bounded``).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import select
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType
from typing import Any

logger = logging.getLogger("django_leases.process")

#: The signals that ask a process to stop.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def on_stop(
    handler: Callable[[int], None],
    signals: tuple[signal.Signals, ...] = STOP_SIGNALS,
) -> Iterator[dict[int, Any]]:
    """While the block runs, call ``handler(signum)`` for each of ``signals`` received.

    The handler runs on the main thread between two bytecodes, wherever the main thread is:
    it should only record the signal and wake whoever waits with a :class:`Doorbell`, never
    take a lock the main thread may hold (``threading.Event.set`` takes the lock that the
    same event's ``wait`` and ``clear`` hold for a moment: setting from here an event the
    main thread waits on can deadlock it) nor write to a stream (logging) the main thread
    may be writing to. A signal the process started with ignored (``nohup``, a background
    job) stays ignored. The previous handlers are put back when the block ends.
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


class Doorbell:
    """A wake-up that a signal handler, or any thread, may ring without taking a lock.

    :meth:`ring` writes a byte to a pipe; :meth:`wait` sleeps in ``select`` until one is
    there (or ``timeout`` seconds pass) and takes every byte rung meanwhile. Made for the
    loop that a signal handler wakes (see :func:`on_stop`). The pipe is closed when the
    object is collected — never before, so a late ring cannot land on a reused file
    descriptor; it is not inherited by child processes.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        weakref.finalize(self, _close_all, self._read, self._write)

    def ring(self) -> None:
        """Wake the waiter (now, or at its next :meth:`wait`). Safe in a signal handler."""
        try:
            os.write(self._write, b"\0")
        except BlockingIOError:  # the pipe is full: rung already
            return

    def wait(self, timeout: float) -> bool:
        """Sleep until rung or ``timeout`` seconds (``float`` ≥ 0) pass; ``True`` if rung.
        The rings are taken: the next wait sleeps until the next one."""
        readable, _, _ = select.select([self._read], [], [], timeout)
        if not readable:
            return False
        with suppress(BlockingIOError):
            while os.read(self._read, 512):
                pass
        return True


def _close_all(*fds: int) -> None:
    for fd in fds:
        with suppress(OSError):
            os.close(fd)


class Timer:
    r"""An action :class:`Timers` runs at ``when`` unless :meth:`cancel`\ led first."""

    def __init__(
        self, when: float, action: Callable[[], None], owner: Timers | None = None
    ) -> None:
        self.when = when
        self.action = action
        self.cancelled = False
        self._owner = owner

    def cancel(self) -> None:
        """Do not run the action (a no-op once it ran); it leaves its :class:`Timers` at once,
        so a busy process keeps no dead timer queued until its moment."""
        self.cancelled = True
        if self._owner is not None:
            self._owner.discard(self)


class Timers:
    """One thread running timed actions, in order of their moment (a heap). An action runs
    on that thread and must be quick; one that raises is logged and the next runs."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def at(self, when: float, action: Callable[[], None]) -> Timer:
        """Run ``action`` at ``time.monotonic()`` moment ``when``; returns its :class:`Timer`."""
        timer = Timer(when, action, self)
        with self._cond:
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                # (again after a fork: threads do not survive it)
                self._heap = []
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="dl-timers", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, (when, next(self._order), timer))
            if self._heap[0][2] is timer:
                self._cond.notify()
        return timer

    def discard(self, timer: Timer) -> None:
        """Take a cancelled ``timer`` out of the queue (a no-op when it is not there)."""
        with self._cond:
            for index, (_, _, queued) in enumerate(self._heap):
                if queued is timer:
                    last = self._heap.pop()
                    if index < len(self._heap):
                        self._heap[index] = last
                        heapq.heapify(self._heap)
                    return

    def queued(self) -> int:
        """How many timers wait to run (``int``)."""
        with self._cond:
            return len(self._heap)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][2].cancelled:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._cond.wait()
                        continue
                    late = time.monotonic() - self._heap[0][0]
                    if late >= 0:
                        timer = heapq.heappop(self._heap)[2]
                        break
                    self._cond.wait(-late)
            if timer.cancelled:
                continue
            try:
                timer.action()
            except Exception:
                logger.exception("A timed action failed")


#: The process's timer thread.
TIMERS = Timers()


__all__ = ["STOP_SIGNALS", "TIMERS", "Doorbell", "Timer", "Timers", "on_stop", "signal_name"]

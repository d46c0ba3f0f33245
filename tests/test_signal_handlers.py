"""Signal handlers run on the main thread between two bytecodes, wherever it is.

So a handler must take no lock the interrupted code may hold. The test delivers a "signal"
(calls the handler) at each line the supervision loop runs inside its wake-up's wait — where a
real signal lands most often — one line after another, and needs the loop to carry on.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from django_leases import process
from django_leases.holder import LeaseHolder

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups")

#: The files whose lines the wake-up of a supervision loop runs (a ``threading.Event`` lives
#: in ``threading.py``; the :class:`~django_leases.process.Doorbell` in ``process.py``).
WAKE_UP_FILES = {threading.__file__, process.__file__}
#: Signals delivered in all, one at each line: enough to cover every line of several waits.
DELIVERIES = 300


def test_the_holders_handler_may_run_at_any_line_of_its_loops_wait() -> None:
    holder = LeaseHolder("signals:anywhere", [sys.executable, "-c", "pass"], ttl=3)
    # A child that ignores the SIGTERMs forwarded to it (ignored from before its exec), and
    # is killed once every delivery was made: the loop must have lived through them all.
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        process_group=0,
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN),
    )
    delivered = 0

    def in_the_wake_up(frame: FrameType | None) -> bool:
        while frame is not None:
            if frame.f_locals.get("self") is holder._wake:
                return True
            frame = frame.f_back
        return False

    def deliver_everywhere(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal delivered
        if (
            delivered < DELIVERIES
            and event == "line"
            and frame.f_code.co_filename in WAKE_UP_FILES
            and in_the_wake_up(frame)
        ):
            delivered += 1
            holder._on_signal(signal.SIGTERM)  # as if SIGTERM arrived at this line
            if delivered == DELIVERIES:
                child.kill()
        return deliver_everywhere

    outcome: list[bool] = []

    def supervise() -> None:
        waiter = threading.Thread(target=holder._wait_for_child, args=(child,), daemon=True)
        waiter.start()
        sys.settrace(deliver_everywhere)
        try:
            outcome.append(holder._supervise(child))
        finally:
            sys.settrace(None)

    loop = threading.Thread(target=supervise, daemon=True)
    loop.start()
    loop.join(30)
    try:
        # Hung: the handler waited for a lock the loop held at the line it interrupted.
        assert not loop.is_alive(), "the supervision loop hung in a signal handler"
        assert delivered == DELIVERIES
        assert outcome == [False]  # the child ended, the lease was not lost
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_doorbell_rung_before_the_wait_wakes_it_once(tmp_path: Path) -> None:
    bell = process.Doorbell()
    assert bell.wait(0) is False
    for _ in range(3):
        bell.ring()
    assert bell.wait(5) is True
    assert bell.wait(0) is False  # the rings were taken together

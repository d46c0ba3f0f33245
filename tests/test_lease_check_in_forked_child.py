"""``HeldLease.check()`` in a child forked inside the hold never blocks.

Rule (``HeldLease.finish`` / ``Renewed.stop``): a child forked inside a hold holds nothing of
its parent's renewer, whose locks "may have been held at the fork". ``check()`` used to read
only the ``lost`` event; it now reads the local deadline through ``Renewed.deadline``, which
takes the renewer's condition lock. If any parent thread (the renewer's tick, the watchdog,
another hold registering) held that lock at the moment of the fork, the child's first
``check()`` blocks for ever. Here a parent thread holds the lock across the fork; the child
gets 5 s (SIGALRM) to return from ``check()``.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from django_leases import hold_lease
from tests.helpers import end_renewers, unique_key

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_check_in_a_child_forked_while_the_renewer_lock_was_held_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = unique_key("check-in-child")
    with hold_lease(key, 30) as held:
        renewal = held._renewal
        assert renewal is not None
        taken, forked = threading.Event(), threading.Event()

        def hold_the_lock() -> None:  # as the renewer's tick does, briefly, all the time
            with renewal.renewer.cond:
                taken.set()
                forked.wait(30)

        thread = threading.Thread(target=hold_the_lock)
        thread.start()
        assert taken.wait(30)
        pid = os.fork()
        if pid == 0:  # the child: no database, no pytest; SIGALRM ends a hang
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not pytest-timeout's handler
            signal.alarm(5)
            try:
                held.check()
            except BaseException:
                os._exit(3)  # check() raised (the lease is the parent's, and live)
            os._exit(0)
        forked.set()
        thread.join()
        _, status = os.waitpid(pid, 0)
    end_renewers(monkeypatch)
    assert not os.WIFSIGNALED(status), (
        f"the child's check() hung until killed by signal {os.WTERMSIG(status)} (SIGALRM)"
    )
    assert os.WEXITSTATUS(status) == 0

"""``manage.py hold_lease`` and the processes a command leaves behind: real subprocesses, as
``tests/test_command_hold_lease.py`` drives them (its ``Holders`` helper)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from django_leases.models import LeaseState
from tests.hold_command import TTL, Holders, lease_row, pid_alive

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics"),
]


def test_grandchild_left_by_the_child_is_stopped_before_the_lease_is_released(
    holders: Holders,
) -> None:
    """``sh -c 'worker & exit 0'``: the child ends, the worker it started runs on in the
    child's process group. The holder stops the group (SIGTERM, SIGKILL after the grace), as
    when the lease is lost, before it releases the lease: no part of the job runs without it.
    (Before, the lease was released with the worker still running.)"""
    key = "cron:grandchild"
    pid_file = holders.dir / "grandchild.pid"
    script = f'sleep 120 & echo $! > "{pid_file}"; exit 0'
    code, output = holders.run(key, "--ttl", str(TTL), "--grace", "1", "--", "sh", "-c", script)
    grandchild = int(pid_file.read_text())
    try:
        assert code == 0, output
        assert lease_row(key).state == LeaseState.RELEASED
        # The lease is released: nothing of the job may still run.
        assert not pid_alive(grandchild), "the grandchild runs on after the lease was released"
    finally:
        if pid_alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)

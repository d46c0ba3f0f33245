"""Edges of ``manage.py hold_lease`` (real processes, real databases).

Each test's docstring states the rule it checks. Leases are lapsed on the database clock;
nothing is ordered by sleeps.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from django_leases.holder import EXIT_CANNOT_EXECUTE, EXIT_LOST
from django_leases.models import Lease, LeaseState
from tests.helpers import lapse_lease, process_stopped, terminate_other_backends, wait_until
from tests.hold_command import (
    PATIENCE,
    TTL,
    Holders,
    lease_row,
    pid_alive,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics"),
]


def test_sighup_to_the_holder_is_forwarded_and_its_status_passed_on(
    holders: Holders,
) -> None:
    """SIGHUP is forwarded to the child's group (the child does not handle it, so it
    dies of it): the holder exits 128 + SIGHUP and releases the lease."""
    key = "hold-cmd:sighup"
    holder = holders.start(key, "--ttl", str(TTL), "--", *holders.child("a", "--hold"))
    a = holders.info("a")
    holder.send_signal(signal.SIGHUP)
    assert holder.wait(timeout=PATIENCE) == 128 + signal.SIGHUP, holders.log(holder)
    assert not pid_alive(a["pid"])
    assert lease_row(key).state == LeaseState.RELEASED


def test_sigkilled_child_exits_137_and_the_lease_is_released(
    holders: Holders,
) -> None:
    """A child killed by SIGKILL: the holder exits 128 + 9 and releases at once."""
    key = "hold-cmd:child-sigkill"
    holder = holders.start(key, "--ttl", "600", "--", *holders.child("a", "--hold"))
    a = holders.info("a")
    os.kill(a["pid"], signal.SIGKILL)
    assert holder.wait(timeout=PATIENCE) == 128 + signal.SIGKILL, holders.log(holder)
    row = lease_row(key)
    assert row.state == LeaseState.RELEASED  # released, not left to lapse (TTL 600 s)
    assert row.token == int(a["token"])


def test_stopped_child_under_a_lost_lease_is_sigkilled_after_the_grace(
    holders: Holders,
) -> None:
    """Only the child is SIGSTOPped; the lease is then lost (lapsed and taken). The
    stopped child cannot act on SIGTERM; the holder SIGKILLs it after --grace, exits 76 and
    leaves the new holder's lease alone."""
    key = "hold-cmd:stopped-child"
    holder = holders.start(
        key, "--ttl", str(TTL), "--grace", "2", "--", *holders.child("a", "--hold")
    )
    a = holders.info("a")
    os.kill(a["pid"], signal.SIGSTOP)
    wait_until(lambda: process_stopped(a["pid"]), PATIENCE, what="the child to stop")
    lapse_lease(key)
    intruder = Lease.objects.acquire(key, "intruder", ttl=120)
    assert intruder is not None
    assert holder.wait(timeout=PATIENCE) == EXIT_LOST, holders.log(holder)
    wait_until(lambda: not pid_alive(a["pid"]), PATIENCE, what="the stopped child to be killed")
    current = Lease.objects.current(key)
    assert current is not None
    assert (current.holder, current.token) == ("intruder", intruder.token)


def test_renewal_connection_killed_mid_hold_reconnects_and_keeps_the_lease(
    holders: Holders,
) -> None:
    """The server kills every connection of the holder (pg_terminate_backend / KILL)
    mid-hold, once: renewals reconnect, the child runs on under the same token, and the
    holder exits with the child's status, releasing the lease."""
    if connection.vendor == "sqlite":
        pytest.skip("no server connections to kill")
    key = "hold-cmd:killed-connection"
    holder = holders.start(key, "--ttl", "6", "--", *holders.child("a", "--hold"))
    a = holders.info("a")
    before = lease_row(key).renewed_at
    wait_until(lambda: terminate_other_backends() > 0, PATIENCE, what="a connection to kill")
    # a renewal succeeds again after the kill (on a new connection)
    try:
        wait_until(
            lambda: lease_row(key).renewed_at > before, PATIENCE, what="a renewal after the kill"
        )
    except AssertionError:
        pytest.fail(f"no renewal; holder exit {holder.poll()}; log:\n{holders.log(holder)}")
    assert pid_alive(a["pid"])
    assert holder.poll() is None, holders.log(holder)
    row = lease_row(key)
    assert row.state == LeaseState.LIVE and row.token == int(a["token"])
    holders.finish("a")
    assert holder.wait(timeout=PATIENCE) == 0, holders.log(holder)
    assert lease_row(key).state == LeaseState.RELEASED


@pytest.mark.parametrize("kind", ["directory", "no-exec-bit"])
def test_program_that_cannot_be_executed_exits_126_and_releases(
    holders: Holders,
    kind: str,
) -> None:
    """A program found but not executable: exit 126, a message, the lease released."""
    target = holders.dir / "prog"
    if kind == "directory":
        target.mkdir()
    else:
        target.write_text("#!/bin/sh\nexit 0\n")
        target.chmod(0o644)
    key = f"hold-cmd:cannot-exec-{kind}"
    code, output = holders.run(key, "--", str(target))
    assert code == EXIT_CANNOT_EXECUTE, output
    assert "Traceback" not in output
    assert lease_row(key).state == LeaseState.RELEASED


def test_a_command_with_a_nul_byte_is_refused_before_anything_is_written() -> None:
    """A command part with a NUL character is a bad command: refused (``CommandError``)
    before anything is written, as a bad key or TTL is — not acquired and then failed in
    ``Popen`` with a bare ``ValueError``."""
    key = "hold-cmd:nul-command"
    with pytest.raises(CommandError):
        call_command("hold_lease", key, ttl="5", command=["echo\x00"])
    assert not Lease.objects.filter(key=key).exists()


def test_forwarded_sigterm_reaches_a_stopped_child(
    holders: Holders,
) -> None:
    """The child is SIGSTOPped (a debugger, ``kill -STOP``, SIGTTIN), then the holder gets
    SIGTERM (``systemctl stop``, a CronJob deadline): the holder forwards it with a SIGCONT,
    as systemd and a shell's ``kill %job`` do, so the child acts on it (its handler runs,
    exit 42) and the holder exits 42 — rather than renewing the key for a child that never
    wakes."""
    key = "hold-cmd:term-stopped-child"
    holder = holders.start(key, "--ttl", str(TTL), "--", *holders.child("a", "--hold"))
    a = holders.info("a")
    os.kill(a["pid"], signal.SIGSTOP)
    wait_until(lambda: process_stopped(a["pid"]), PATIENCE, what="the child to stop")
    holder.send_signal(signal.SIGTERM)
    wait_until(lambda: "Forwarding SIGTERM" in holders.log(holder), PATIENCE, what="the forward")
    try:
        # Several TTLs: a forwarded SIGTERM that took effect ends the child at once.
        wait_until(lambda: holder.poll() is not None, 5 * TTL, what="the holder to exit")
    except AssertionError:
        pytest.fail(
            f"the child stayed stopped with SIGTERM pending (stopped={process_stopped(a['pid'])}),"
            f" the holder still holds {key!r}: {Lease.objects.current(key)}"
        )
    finally:
        if pid_alive(a["pid"]):
            os.kill(a["pid"], signal.SIGCONT)
    assert holder.wait(timeout=PATIENCE) == 42, holders.log(holder)

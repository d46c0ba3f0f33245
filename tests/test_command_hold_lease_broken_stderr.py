"""``manage.py hold_lease`` whose stderr is a pipe nobody reads any more (``| head``, a
restarted journald): a progress message must not cost the lease its release.

Rule (``holder.py`` docstring): the lease is released when the child has ended — "always, in
a ``finally``"; the holder never leaves a granted lease behind to lapse after its TTL for
want of a place to write a message.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from django_leases.models import Lease
from tests.helpers import MANAGE_PY, ROOT, wait_until
from tests.hold_command import PATIENCE

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics"),
]


#: The system checks' own messages (W036 on SQLite, I032 on psycopg2) would hit the closed
#: stderr first and end the command before the holder runs: the checks are not what these
#: tests are about.
NO_CHECKS = "--skip-checks"


def test_a_closed_stderr_at_verbosity_2_does_not_leave_the_lease_held(
    subprocess_env: dict[str, str], tmp_path: object
) -> None:
    """With ``-v 2`` the "Acquired lease" message is written after the grant: a stderr
    nobody reads (EPIPE) must not keep the holder from running the command and releasing
    the lease (it stayed held for its TTL by a process that had exited)."""
    key = "hold-cmd:broken-stderr"
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read the holder's stderr
    try:
        proc = subprocess.Popen(
            [*MANAGE_PY, "hold_lease", NO_CHECKS, key, "--ttl", "600", "-v", "2", "--", "true"],
            cwd=ROOT,
            env=subprocess_env,
            stdout=subprocess.DEVNULL,
            stderr=write_end,
        )
    finally:
        os.close(write_end)
    try:
        code = proc.wait(timeout=PATIENCE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Whatever the exit code, the holder has exited: the key must be free again.
    current = Lease.objects.current(key)
    assert current is None, (
        f"holder exited {code} leaving lease {key!r} held by {current.holder!r} "
        f"until {current.expires_at}"
    )


def _start_with_closed_stderr(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.Popen(
            [*MANAGE_PY, "hold_lease", NO_CHECKS, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=write_end,
        )
    finally:
        os.close(write_end)


def test_control_a_closed_stderr_at_default_verbosity_runs_and_releases(
    subprocess_env: dict[str, str],
) -> None:
    """at the default verbosity nothing is written on a clean run, so the
    closed stderr is never touched: exit 0, lease released."""
    key = "hold-cmd:broken-stderr-v1"
    proc = _start_with_closed_stderr(subprocess_env, key, "--ttl", "600", "--", "true")
    try:
        assert proc.wait(timeout=PATIENCE) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert Lease.objects.current(key) is None


def test_a_closed_stderr_does_not_change_the_exit_code_of_a_forwarded_sigterm(
    subprocess_env: dict[str, str], tmp_path: object
) -> None:
    """The holder forwards SIGTERM and exits with the child's status (143 for a ``sleep``
    killed by it, ``EXIT_CODES["hold_lease"]``), also when its "Forwarding SIGTERM" message
    cannot be written (it exited 1 with a traceback, the signal sent only by the emergency
    ``_terminate``)."""
    import signal
    from pathlib import Path

    key = "hold-cmd:broken-stderr-term"
    marker = Path(str(tmp_path)) / "started"
    proc = _start_with_closed_stderr(
        subprocess_env,
        key,
        "--ttl",
        "600",
        "--grace",
        "5",
        "--",
        "sh",
        "-c",
        f'touch "{marker}"; exec sleep 120',
    )
    try:
        wait_until(marker.exists, PATIENCE, what="the child to start")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=PATIENCE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert Lease.objects.current(key) is None
    assert code == 128 + signal.SIGTERM, f"exit {code}, expected the child's 143"

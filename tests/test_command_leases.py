"""``manage.py leases list|release`` driven as a real subprocess, on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from django_leases.models import Lease, LeaseState

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def leases(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "leases", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def table(stdout: str) -> dict[str, list[str]]:
    """``leases list`` output as {key: [state, holder, token, seconds left]}.

    Only for keys and holders without spaces.
    """
    lines = stdout.splitlines()
    assert lines[0].split() == ["KEY", "STATE", "HOLDER", "TOKEN", "SECONDS", "LEFT"]
    return {line.split()[0]: line.split()[1:] for line in lines[1:]}


def make_lapsed(key: str) -> Lease:
    lease = Lease.objects.acquire(key, "lapsed-holder", ttl=1)
    assert lease is not None
    deadline = time.monotonic() + 30
    while Lease.objects.current(key) is not None:
        assert time.monotonic() < deadline, "the lease did not lapse"
        time.sleep(0.1)
    return lease


def test_list_shows_state_holder_token_and_time_left(subprocess_env: dict[str, str]) -> None:
    live = Lease.objects.acquire("report:live", "live-holder", ttl=600)
    assert live is not None
    first = Lease.objects.acquire("report:released", "gone-holder", ttl=600)
    assert first is not None
    Lease.objects.release(first)
    again = Lease.objects.acquire("report:released", "gone-holder", ttl=600)
    assert again is not None and again.token == 2
    Lease.objects.release(again)
    make_lapsed("report:lapsed")

    result = leases(subprocess_env, "list")
    assert result.returncode == 0, result.stderr
    rows = table(result.stdout)
    assert set(rows) == {"report:live", "report:released", "report:lapsed"}
    state, holder, token, left = rows["report:live"]
    assert (state, holder, token) == (LeaseState.LIVE, "live-holder", "1")
    assert 0 < float(left) <= 600
    assert rows["report:released"] == [LeaseState.RELEASED, "gone-holder", "2", "-"]
    assert rows["report:lapsed"] == [LeaseState.LAPSED, "lapsed-holder", "1", "-"]

    only_live = leases(subprocess_env, "list", "--state", "live", "--database", "default")
    assert only_live.returncode == 0, only_live.stderr
    assert set(table(only_live.stdout)) == {"report:live"}


def test_list_without_leases(subprocess_env: dict[str, str]) -> None:
    result = leases(subprocess_env, "list")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "No leases."


def test_release_frees_a_live_lease_and_the_token_keeps_rising(
    subprocess_env: dict[str, str],
) -> None:
    key = "report:held"
    held = Lease.objects.acquire(key, "busy-holder", ttl=600)
    assert held is not None

    result = leases(subprocess_env, "release", key)
    assert result.returncode == 0, result.stderr
    assert key in result.stdout and "token 1" in result.stdout and "busy-holder" in result.stdout
    assert Lease.objects.current(key) is None
    assert Lease.objects.with_state().get(key=key).state == LeaseState.RELEASED
    # The ex-holder cannot renew; the next holder gets a higher token.
    assert Lease.objects.refresh(held, 600) is None
    nxt = Lease.objects.acquire(key, "next-holder", ttl=600)
    assert nxt is not None and nxt.token == 2


def test_release_without_a_live_lease_fails_clearly(subprocess_env: dict[str, str]) -> None:
    released = Lease.objects.acquire("report:done", "h", ttl=600)
    assert released is not None
    Lease.objects.release(released)
    make_lapsed("report:stale")

    for key, text in [
        ("report:unknown", "No lease on 'report:unknown'"),
        ("report:done", "No live lease on 'report:done' (it is released"),
        ("report:stale", "No live lease on 'report:stale' (it is lapsed"),
    ]:
        result = leases(subprocess_env, "release", key)
        assert result.returncode == 1, (key, result.stdout)
        assert text in result.stderr
        assert "Traceback" not in result.stderr
    # Nothing changed.
    assert Lease.objects.with_state().get(key="report:stale").state == LeaseState.LAPSED
    assert not Lease.objects.filter(key="report:unknown").exists()


def test_bad_arguments_fail_clearly(subprocess_env: dict[str, str]) -> None:
    empty = leases(subprocess_env, "release", "")
    assert empty.returncode == 1
    assert "key" in empty.stderr and "Traceback" not in empty.stderr
    unknown_db = leases(subprocess_env, "list", "--database", "nope")
    assert unknown_db.returncode == 1
    assert "nope" in unknown_db.stderr
    no_action = leases(subprocess_env)
    assert no_action.returncode != 0
    assert "list" in no_action.stderr

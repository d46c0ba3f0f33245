"""``manage.py leases list|release`` driven as a real subprocess, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime

import pytest

from django_leases.management.base import EXIT_CODES, USAGE_ERROR
from django_leases.models import Lease, LeaseState
from tests.helpers import lapse_lease, manage

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def leases(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return manage("leases", *args, env=env, timeout=60)


def table(stdout: str) -> dict[str, list[str]]:
    """``leases list`` output as {key: [state, holder, token, seconds left]}.

    Only for keys and holders without spaces.
    """
    lines = stdout.splitlines()
    assert lines[0].split() == ["KEY", "STATE", "HOLDER", "TOKEN", "SECONDS", "LEFT"]
    return {line.split()[0]: line.split()[1:] for line in lines[1:]}


def make_lapsed(key: str) -> Lease:
    """A lease on ``key`` lapsed on the database clock (nobody released it)."""
    lease = Lease.objects.acquire(key, "lapsed-holder", ttl=60)
    assert lease is not None
    lapse_lease(key)
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
    for action in (["list"], ["release", "k"]):
        unknown_db = leases(subprocess_env, *action, "--database", "nope")
        assert unknown_db.returncode == USAGE_ERROR == 2, unknown_db.stderr
        assert "Unknown database alias 'nope' (configured: 'default')" in unknown_db.stderr
        assert "Traceback" not in unknown_db.stderr
    no_action = leases(subprocess_env)
    assert no_action.returncode != 0
    assert "list" in no_action.stderr


def test_list_as_json_has_typed_fields(subprocess_env: dict[str, str]) -> None:
    for key, holder in [("json:live", "live-holder"), ("json:released", "gone-holder")]:
        assert Lease.objects.acquire(key, holder, ttl=600) is not None
    Lease.objects.release(Lease.objects.get(key="json:released"))

    result = leases(subprocess_env, "list", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = {row["key"]: row for row in json.loads(result.stdout)}
    assert set(rows) == {"json:live", "json:released"}
    for row in rows.values():
        assert list(row) == ["key", "state", "holder", "token", "seconds_left", "expires_at"]
    first = rows["json:live"]
    assert (first["state"], first["holder"], first["token"]) == ("live", "live-holder", 1)
    assert isinstance(first["seconds_left"], float) and 0 < first["seconds_left"] <= 600
    assert datetime.fromisoformat(first["expires_at"]).tzinfo is not None
    second = rows["json:released"]
    assert (second["state"], second["token"], second["seconds_left"]) == ("released", 1, None)

    only_live = leases(subprocess_env, "list", "--state", "live", "--format", "json")
    assert [row["key"] for row in json.loads(only_live.stdout)] == ["json:live"]
    as_table = leases(subprocess_env, "list", "--format", "table")
    assert set(table(as_table.stdout)) == {"json:live", "json:released"}


def test_an_empty_list_as_json_is_an_empty_array(subprocess_env: dict[str, str]) -> None:
    result = leases(subprocess_env, "list", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
    lapsed = leases(subprocess_env, "list", "--state", "lapsed")
    assert lapsed.stdout.strip() == "No lapsed leases."
    bad = leases(subprocess_env, "list", "--format", "xml")
    assert bad.returncode == 2 and "invalid choice: 'xml'" in bad.stderr


def test_django_options_work_after_the_subcommand(subprocess_env: dict[str, str]) -> None:
    # The environment names no usable settings: only --settings after "list" can work.
    env = {**subprocess_env, "DJANGO_SETTINGS_MODULE": "no_such_settings_module"}
    result = leases(env, "list", "--settings", "tests.settings", "--pythonpath", ".", "-v", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "No leases."
    before = leases(env, "--settings", "tests.settings", "release", "nope", "--traceback")
    assert before.returncode == 1 and "Traceback" in before.stderr


def test_help_ends_with_the_exit_codes(subprocess_env: dict[str, str]) -> None:
    result = leases(subprocess_env, "--help")
    assert result.returncode == 0, result.stderr
    epilog = result.stdout.split("exit codes:\n", 1)[1]
    shown = [line.split()[0] for line in epilog.splitlines() if not line.startswith("     ")]
    assert shown == [row.shown for row in EXIT_CODES["leases"].rows] == ["0", "1", "2", "4"]
    assert "unknown --database alias" in " ".join(epilog.split())

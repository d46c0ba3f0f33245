"""Which standbys a failover may lose acknowledged commits to: ``db.replication()``'s rule,
system check W032 and ``leases_check``'s ``replication`` finding.

The rule is tested here on the rows the servers answer with (every case, every backend); a
real asynchronous and a real synchronous standby are ``tests/test_failover.py``'s.
"""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from django_leases import db, health
from django_leases.checks import check_replication, replication_checks
from django_leases.db import Replication, _mariadb_replication, _pg_replication

# Rows of the PostgreSQL query: names setting, synchronous_commit, application_name,
# sync_state, "is a logical WAL sender".
NONE = [("", "on", None, None, None)]


def _rows(names: str, commit: str, *senders: tuple[Any, Any, Any]) -> list[tuple[Any, ...]]:
    return [(names, commit, *sender) for sender in senders] or [(names, commit, None, None, None)]


def test_no_standby_connected_is_nothing_to_warn_about() -> None:
    state = _pg_replication(NONE)
    assert (state.standbys, state.asynchronous, state.warning()) == (0, 0, None)


def test_standbys_without_synchronous_standby_names_are_asynchronous() -> None:
    state = _pg_replication(_rows("", "on", ("a", "async", False), ("b", "async", False)))
    assert (state.standbys, state.asynchronous, state.names) == (2, 2, ("a", "b"))
    warning = state.warning()
    assert warning is not None
    assert "2 of 2 standby(s) replicate asynchronously (a, b)" in warning
    assert "synchronous_standby_names is empty" in warning
    assert "docs/operations/replication.md" in warning


@pytest.mark.parametrize("commit", ["local", "off"])
def test_a_synchronous_commit_that_waits_for_nobody_makes_every_standby_asynchronous(
    commit: str,
) -> None:
    state = _pg_replication(_rows("a", commit, ("a", "sync", False)))
    assert state.asynchronous == 1
    assert f"synchronous_commit = {commit}" in (state.warning() or "")


@pytest.mark.parametrize("commit", ["on", "remote_apply", "remote_write"])
def test_synchronous_and_quorum_standbys_are_covered(commit: str) -> None:
    state = _pg_replication(
        _rows("ANY 1 (a, b)", commit, ("a", "quorum", False), ("b", "quorum", False))
    )
    assert (state.standbys, state.asynchronous, state.warning()) == (2, 0, None)
    state = _pg_replication(_rows("a", commit, ("a", "sync", False)))
    assert state.warning() is None


def test_async_and_potential_standbys_beside_a_synchronous_one_are_not() -> None:
    state = _pg_replication(
        _rows(
            "FIRST 1 (a, b)",
            "on",
            ("a", "sync", False),
            ("b", "potential", False),
            ("c", "async", False),
        )
    )
    assert (state.standbys, state.asynchronous, state.names) == (3, 2, ("b", "c"))
    assert "does not cover them" in (state.warning() or "")


def test_logical_subscribers_are_not_standbys() -> None:
    state = _pg_replication(_rows("", "on", ("subscription", "async", True)))
    assert (state.standbys, state.warning()) == (0, None)


def test_a_role_that_cannot_see_sync_states_is_warned_only_when_nothing_is_synchronous() -> None:
    # Without pg_read_all_stats the server shows the WAL senders' names, not their state.
    hidden = _rows("a", "on", ("a", None, False))
    state = _pg_replication(hidden)
    assert (state.standbys, state.asynchronous, state.known, state.warning()) == (1, 0, False, None)
    assert "pg_read_all_stats" in state.why
    state = _pg_replication(_rows("", "on", ("a", None, False)))
    assert (state.asynchronous, state.known) == (1, False)
    assert "logical subscribers among them" in (state.warning() or "")


def test_mariadb_counts_semi_synchronous_replicas() -> None:
    assert _mariadb_replication({}) is None  # MySQL: no Slaves_connected
    assert _mariadb_replication({"Slaves_connected": "0"}) == Replication(0, 0)
    off = _mariadb_replication({"Slaves_connected": "2", "Rpl_semi_sync_master_status": "OFF"})
    assert off is not None and (off.asynchronous, off.why) == (
        2,
        "semi-synchronous replication is off",
    )
    some = _mariadb_replication(
        {
            "Slaves_connected": "3",
            "Rpl_semi_sync_master_status": "ON",
            "Rpl_semi_sync_master_clients": "2",
        }
    )
    assert some is not None and (some.standbys, some.asynchronous) == (3, 1)
    every = _mariadb_replication(
        {
            "Slaves_connected": "2",
            "Rpl_semi_sync_master_status": "ON",
            "Rpl_semi_sync_master_clients": "2",
        }
    )
    assert every is not None and every.warning() is None


def test_w032_carries_the_warning() -> None:
    assert check_replication("default", None) == []
    (message,) = check_replication("default", "1 of 1 standby(s) replicate asynchronously")
    assert message.id == "django_leases.W032"
    assert "Database 'default': 1 of 1 standby(s)" in message.msg
    assert "synchronous_standby_names" in (message.hint or "")


@pytest.mark.django_db
def test_the_test_database_has_no_standby_and_nothing_is_reported(vendor: str) -> None:
    state = db.replication(connection)
    if vendor == "sqlite":
        assert state is None
    else:  # the suite's PostgreSQL and MariaDB stream to nobody
        assert state is not None and (state.standbys, state.warning()) == (0, None)
    assert replication_checks(databases=["default"]) == []
    finding = health.check_replication("default")
    assert finding.status == "ok"
    out = StringIO()
    call_command("check", "--database", "default", stdout=out)
    assert "W032" not in out.getvalue()


@pytest.mark.django_db
def test_a_warning_leaves_leases_check_healthy(monkeypatch: pytest.MonkeyPatch) -> None:
    lagging = Replication(1, 1, ("b",), "synchronous_standby_names is empty")
    monkeypatch.setattr(db, "replication", lambda connection: lagging)
    report = health.run_checks(["default"])
    (finding,) = [f for f in report.findings if f.check == "replication"]
    assert finding.status == "warning"
    assert finding.details == {"standbys": 1, "asynchronous": 1, "names": ["b"], "known": True}
    assert report.exit_code == 0 and report.healthy
    text = health.format_text(report)
    assert text.startswith("django-leases: healthy (1 warning)")
    assert "WARNING     replication [default]" in text
    (w032,) = replication_checks(databases=["default"])
    assert w032.id == "django_leases.W032"

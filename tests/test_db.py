"""``django_leases.db``: the tuned-SQL switch and prepared statements where they are safe."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from importlib.util import find_spec
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction
from django.test import override_settings

from django_leases import db
from django_leases.checks import check_postgresql_driver
from django_leases.workflows.wakeup import listens, wakeup_method
from tests.helpers import tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _forget_refusals() -> Iterator[None]:
    db._unprepared.clear()
    db._direct.clear()
    yield
    db._unprepared.clear()
    db._direct.clear()


@pytest.mark.postgres_only
def test_the_driver_is_detected_and_psycopg2_prepares_nothing_and_polls() -> None:
    # Django takes psycopg 3 when it is importable: the psycopg2 pass of .ci/run has none.
    on_psycopg3 = find_spec("psycopg") is not None
    assert db.psycopg3(connection) is on_psycopg3
    assert db.prepares(connection) is on_psycopg3
    assert listens("default") is on_psycopg3
    assert ("psycopg2" in wakeup_method("default", 1.0)) is not on_psycopg3
    found = [message.id for message in check_postgresql_driver(["default"])]
    assert found == ([] if on_psycopg3 else ["django_leases.I032"])
    with db.cursor(connection) as cursor:  # the tuned statements' cursor works on both
        assert cursor.execute("SELECT %s::int + 1", [1]).fetchone() == (2,)


@pytest.mark.postgres_only
def test_without_psycopg3_nothing_is_prepared_workers_poll_and_a_check_says_so_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(db, "_django_uses_psycopg3", lambda: False)
    assert not db.psycopg3(connection)
    assert not db.prepares(connection)
    assert not listens("default")
    assert "psycopg2: LISTEN/NOTIFY needs psycopg 3" in wakeup_method("default", 1.0)
    messages = check_postgresql_driver(["default", "default"])
    assert [message.id for message in messages] == ["django_leases.I032"]
    assert "'default' run on psycopg2" in messages[0].msg
    assert "django-leases[postgres]" in str(messages[0].hint)


def test_the_driver_check_speaks_only_of_postgresql_on_psycopg2(vendor: str) -> None:
    on_psycopg2 = vendor == "postgresql" and find_spec("psycopg") is None
    assert db.psycopg3(connection) is (vendor == "postgresql" and not on_psycopg2)
    assert len(check_postgresql_driver(["default"])) == int(on_psycopg2)


def test_the_switch_names_the_vendors_a_statement_is_written_for() -> None:
    assert db.tuned(connection, connection.vendor)
    assert not db.tuned(connection, "some-other-vendor")
    with tuned_sql(False):
        assert not db.tuned(connection, connection.vendor)


@pytest.mark.psycopg3_only
def test_statements_are_prepared_only_where_that_is_safe() -> None:
    assert db.prepares(connection)
    with transaction.atomic():  # a refusal would abort the caller's transaction
        assert not db.prepares(connection)
    with override_settings(DJANGO_LEASES={"PREPARED_STATEMENTS": False}):
        assert not db.prepares(connection)
    connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = True
    try:
        assert not db.prepares(connection), "a declared transaction pooler"
    finally:
        connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = False


def _prepared_count() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        return int(cursor.fetchone()[0])


@pytest.mark.psycopg3_only
def test_a_prepared_statement_is_prepared_on_the_server() -> None:
    connection.close()
    before = _prepared_count()
    with db.cursor(connection) as cursor:
        assert cursor.execute("SELECT %s::int + 1", [1]).fetchone() == (2,)
    assert _prepared_count() == before + 1


@pytest.mark.psycopg3_only
@pytest.mark.parametrize("refusal", ["does not exist", "already exists"])
def test_a_refused_prepared_statement_is_sent_again_and_preparing_stops(
    refusal: str, caplog: pytest.LogCaptureFixture
) -> None:
    """As a pooler in transaction mode refuses them (another client's server connection
    does not know the statement, or already has one of that name): the statement runs
    anyway, unprepared, and the alias prepares nothing more (said once in the log)."""
    connection.close()
    connection.ensure_connection()
    raw = connection.connection
    if refusal == "already exists":
        raw.execute('PREPARE "_pg3_0" AS SELECT 1')  # the name psycopg gives its first one
    else:
        with db.cursor(connection) as cursor:
            cursor.execute("SELECT %s::int + 1", [1])
        raw.execute("DEALLOCATE ALL")  # behind psycopg's back
    with caplog.at_level(logging.WARNING, logger="django_leases.db"):
        for _ in range(3):
            with db.cursor(connection) as cursor:
                assert cursor.execute("SELECT %s::int + 1", [1]).fetchone() == (2,)
    assert not db.prepares(connection)
    warnings = [r for r in caplog.records if "refused a prepared statement" in r.getMessage()]
    assert len(warnings) == 1, caplog.text


@pytest.mark.psycopg3_only
def test_a_connection_through_a_proxy_prepares_nothing_from_its_first_statement(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Behind a transaction-mode pooler another client's prepared statement may carry our
    statement's name: preparing stops before the first one, not after a refusal."""
    asked: list[str] = []

    def ports(conn: object) -> tuple[int, int]:
        asked.append("ports")
        return 6432, 5432

    monkeypatch.setattr(db, "_ports", ports)
    connection.close()
    before = _prepared_count()
    with caplog.at_level(logging.WARNING, logger="django_leases.db"):
        for _ in range(3):
            with db.cursor(connection) as cursor:
                assert cursor.execute("SELECT %s::int + 1", [1]).fetchone() == (2,)
    assert _prepared_count() == before
    assert not db.prepares(connection)
    assert asked == ["ports"], "asked once per alias and process"
    warnings = [r for r in caplog.records if "a pooler or a tunnel in between" in r.getMessage()]
    assert len(warnings) == 1, caplog.text


@pytest.mark.psycopg3_only
def test_a_direct_connection_is_found_direct_once() -> None:
    assert db.prepares(connection)
    assert db._direct == {connection.alias: True}


def test_a_transaction_rolled_back_whole_runs_again_only_where_that_is_safe() -> None:
    """``again_after_whole_rollback`` calls a transaction again after a MariaDB / MySQL
    deadlock rollback, at most ``rounds`` calls in all, and only for a caller in no
    transaction of its own (inside one, the rollback took the caller's work too). Any other
    error, and the same error on another database (where it is no such rollback), is raised
    at once."""
    calls: list[int] = []

    def deadlocking(times: int) -> Any:
        def run() -> str:
            calls.append(1)
            if len(calls) <= times:
                raise OperationalError(1213, "Deadlock found when trying to get lock")
            return "done"

        return run

    mysql = connection.vendor == "mysql"
    if mysql:
        assert db.again_after_whole_rollback("default", deadlocking(2), rounds=3) == "done"
        assert len(calls) == 3
    calls.clear()
    with pytest.raises(OperationalError):
        db.again_after_whole_rollback("default", deadlocking(3), rounds=3)
    assert len(calls) == (3 if mysql else 1)
    calls.clear()
    with transaction.atomic(), pytest.raises(OperationalError):
        db.again_after_whole_rollback("default", deadlocking(1))
    assert len(calls) == 1
    calls.clear()

    def failing() -> None:
        calls.append(1)
        raise OperationalError(2006, "MySQL server has gone away")

    with pytest.raises(OperationalError):
        db.again_after_whole_rollback("default", failing)
    assert len(calls) == 1

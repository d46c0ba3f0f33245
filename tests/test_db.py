"""``django_leases.db``: the tuned-SQL switch and prepared statements where they are safe."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_leases import db
from tests.helpers import tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _forget_refusals() -> Iterator[None]:
    db._unprepared.clear()
    db._direct.clear()
    yield
    db._unprepared.clear()
    db._direct.clear()


def test_the_switch_names_the_vendors_a_statement_is_written_for() -> None:
    assert db.tuned(connection, connection.vendor)
    assert not db.tuned(connection, "some-other-vendor")
    with tuned_sql(False):
        assert not db.tuned(connection, connection.vendor)


@pytest.mark.postgres_only
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


@pytest.mark.postgres_only
def test_a_prepared_statement_is_prepared_on_the_server() -> None:
    connection.close()
    before = _prepared_count()
    with db.cursor(connection) as cursor:
        assert cursor.execute("SELECT %s::int + 1", [1]).fetchone() == (2,)
    assert _prepared_count() == before + 1


@pytest.mark.postgres_only
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


@pytest.mark.postgres_only
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
    warnings = [r for r in caplog.records if "a pooler in between" in r.getMessage()]
    assert len(warnings) == 1, caplog.text


@pytest.mark.postgres_only
def test_a_direct_connection_is_found_direct_once() -> None:
    assert db.prepares(connection)
    assert db._direct == {connection.alias: True}

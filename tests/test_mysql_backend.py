"""MariaDB / MySQL: what the rest of the suite takes for granted there.

The whole suite runs on MariaDB too (``make test-mariadb``); these tests pin what is particular
to it: the clock functions (statement time vs. evaluation time, UTC whatever the session's time
zone), matched-row counting (``CLIENT.FOUND_ROWS``), four-byte keys and an exact collation, the
upsert acquire, and the system checks for settings that break leases.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings

from django_leases import checks, clock
from django_leases.models import Lease
from tests.helpers import on_another_thread, race, tuned_sql, unique_key

pytestmark = [pytest.mark.mysql_only, pytest.mark.django_db(transaction=True)]


def _one(sql: str, params: Any = ()) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


@contextmanager
def _session(*statements: str) -> Iterator[None]:
    """The calling thread's connection with ``statements`` run on it; a fresh connection
    afterwards (session variables do not outlive the block)."""
    connection.close()
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
    try:
        yield
    finally:
        connection.close()


@contextmanager
def _options(**options: Any) -> Iterator[None]:
    """New connections of this thread (and threads started inside) get ``options`` added to
    ``OPTIONS``."""
    settings_dict = connections["default"].settings_dict
    saved = dict(settings_dict["OPTIONS"])
    connection.close()
    settings_dict["OPTIONS"].update(options)
    try:
        yield
    finally:
        connection.close()
        settings_dict["OPTIONS"].clear()
        settings_dict["OPTIONS"].update(saved)


# -- the clock ---------------------------------------------------------------------------------


def test_utc_timestamp_is_statement_time_and_sysdate_evaluation_time() -> None:
    """What clock.py's docstring says of the two kinds of clock function: within one
    statement, UTC_TIMESTAMP(6) (like NOW(6)) keeps the time the statement began, SYSDATE(6)
    moves on with each evaluation (here across a SLEEP between two calls)."""
    first, _, second, evaluated, _, later = _one(
        "SELECT UTC_TIMESTAMP(6), SLEEP(0.01), UTC_TIMESTAMP(6), "
        "SYSDATE(6), SLEEP(0.01), SYSDATE(6)"
    )
    assert first == second
    assert evaluated < later


def test_db_now_is_utc_whatever_the_session_time_zone() -> None:
    """The session's time zone moves NOW() (what Django's Now() is on MySQL) but not the
    lease clock: a 60 s lease taken in a +05:00 session lapses 60 s after UTC now."""
    with _session("SET time_zone = '+05:00'"):
        utc, local = _one("SELECT UTC_TIMESTAMP(6), NOW(6)")
        assert local - utc == timedelta(hours=5)
        lease = Lease.objects.acquire(unique_key("mysql"), "a", 60)
        assert lease is not None
        with tuned_sql(False):
            portable = Lease.objects.acquire(unique_key("mysql"), "a", 60)
        assert portable is not None
        (after,) = _one("SELECT UTC_TIMESTAMP(6)")
    for taken in (lease, portable):
        left = taken.expires_at.replace(tzinfo=None) - after
        assert timedelta(seconds=50) < left <= timedelta(seconds=60), left
        assert Lease.objects.current(taken.key) is not None


def test_db_now_sql() -> None:
    assert clock.now_sql(connection) == "UTC_TIMESTAMP(6)"
    assert clock.seconds_param(connection, 1.5) == 1_500_000
    # Naive times (USE_TZ = False) are UTC, whatever TIME_ZONE says: a wall clock with
    # daylight saving would repeat an hour.
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        assert clock.mysql_zone(connection) is None
        assert clock.now_sql(connection) == "UTC_TIMESTAMP(6)"
    assert clock.mysql_zone(connection) is None
    # A database TIME_ZONE (USE_TZ = True): Django reads that database in that zone.
    paris = SimpleNamespace(vendor="mysql", timezone_name="Europe/Paris")
    assert clock.mysql_zone(paris) == "Europe/Paris"  # type: ignore[arg-type]
    expected = "CONVERT_TZ(UTC_TIMESTAMP(6), '+00:00', 'Europe/Paris')"
    assert clock.now_sql(paris) == expected  # type: ignore[arg-type]


def test_a_zone_name_that_is_not_one_is_refused() -> None:
    fake = SimpleNamespace(timezone_name="UTC'; DROP TABLE x; --")
    with pytest.raises(ValueError, match="Not a time zone name"):
        clock.mysql_zone(fake)  # type: ignore[arg-type]


# -- matched rows ------------------------------------------------------------------------------


@contextmanager
def _frozen_clock() -> Iterator[None]:
    """This thread's session with its clock stopped (``SET timestamp``): every statement sees
    the same UTC_TIMESTAMP(6), so a renewal right after a grant writes the values already
    there, an UPDATE that matches a row and changes nothing."""
    (now,) = _one("SELECT UNIX_TIMESTAMP(NOW(6))")
    with _session(f"SET timestamp = {now}"):
        yield


def test_a_renewal_that_changes_nothing_is_counted_as_matched(sql_path: str) -> None:
    """Django connects with CLIENT.FOUND_ROWS, so a guarded UPDATE counts the row it matched:
    refreshing a lease within the same microsecond is a success, not a lost lease."""
    with _frozen_clock():
        lease = Lease.objects.acquire(unique_key("mysql"), "a", 60)
        assert lease is not None
        again = Lease.objects.refresh(lease, 60)
        assert again is not None
        assert (again.expires_at, again.renewed_at) == (lease.expires_at, lease.renewed_at)
        assert Lease.objects.refresh(again, 60) is not None
        assert Lease.objects.release(again) is True


def test_without_found_rows_the_same_renewal_reads_as_lost(sql_path: str) -> None:
    """The counter-test: the connection without CLIENT.FOUND_ROWS (what E018 reports) counts
    changed rows, and the no-op renewal above comes back as "not held"."""
    with _options(client_flag=0), _frozen_clock():
        lease = Lease.objects.acquire(unique_key("mysql"), "a", 60)
        assert lease is not None
        assert Lease.objects.refresh(lease, 60) is None
    messages = checks.check_mysql_settings("default", {"OPTIONS": {"client_flag": 0}})
    assert [m.id for m in messages] == ["django_leases.E018"]


def test_found_rows_constant_is_mysqldbs() -> None:
    from MySQLdb.constants import CLIENT

    assert checks.MYSQL_FOUND_ROWS == CLIENT.FOUND_ROWS


# -- keys --------------------------------------------------------------------------------------


def test_255_four_byte_characters_fit_the_key_index(sql_path: str) -> None:
    key = "😀" * 255
    holder = "𝄞" * 255
    lease = Lease.objects.acquire(key, holder, 60)
    assert lease is not None and lease.token == 1
    stored = Lease.objects.get(pk=lease.pk)
    assert (stored.key, stored.holder) == (key, holder)
    assert Lease.objects.acquire(key, "other", 60) is None
    (length,) = _one(
        "SELECT OCTET_LENGTH(`key`) FROM django_leases_lease WHERE id = %s", [lease.pk]
    )
    assert length == 255 * 4


def test_keys_match_exactly(sql_path: str) -> None:
    """The test database's collation is binary and NO PAD (as W022 asks): "a", "A" and
    "a " are three keys."""
    base = unique_key("mysql")
    keys = [base, base.upper(), base + " "]
    leases = [Lease.objects.acquire(key, f"holder-{i}", 60) for i, key in enumerate(keys)]
    assert all(lease is not None and lease.token == 1 for lease in leases)
    assert [Lease.objects.current(key).holder for key in keys] == [  # type: ignore[union-attr]
        "holder-0",
        "holder-1",
        "holder-2",
    ]


# -- the upsert acquire ------------------------------------------------------------------------


def test_upsert_acquire_refused_changes_nothing() -> None:
    key = unique_key("mysql")
    first = Lease.objects.acquire(key, "a", 60)
    assert first is not None
    assert Lease.objects.acquire(key, "b", 60) is None
    row = Lease.objects.get(key=key)
    assert (row.holder, row.token, row.expires_at, row.renewed_at, row.acquired_at) == (
        "a",
        1,
        first.expires_at,
        first.renewed_at,
        first.acquired_at,
    )


def test_upsert_acquire_without_returning_as_on_mysql8(monkeypatch: pytest.MonkeyPatch) -> None:
    """The MySQL 8 form (no RETURNING: the row read under the upsert's lock), run here."""
    monkeypatch.setattr(connections["default"], "mysql_is_mariadb", False)
    key = unique_key("mysql")
    first = Lease.objects.acquire(key, "a", 60)
    assert first is not None and first.token == 1
    assert Lease.objects.acquire(key, "b", 60) is None
    same = Lease.objects.acquire(key, "a", 60)
    assert same is not None and same.token == 1
    Lease.objects.release(same)
    taken = Lease.objects.acquire(key, "b", 60)
    assert taken is not None and (taken.token, taken.holder) == (2, "b")


# -- system checks -----------------------------------------------------------------------------


def test_the_test_database_passes_every_mysql_check() -> None:
    assert checks.check_mysql_database(connection) == []
    assert checks.check_mysql_settings("default", connection.settings_dict) == []


def test_e017_session_isolation_level() -> None:
    with _session("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"):
        assert [m.id for m in checks.check_mysql_database(connection)] == ["django_leases.E017"]


def test_w020_sql_mode_without_strict_trans_tables() -> None:
    with _session("SET SESSION sql_mode = 'NO_ENGINE_SUBSTITUTION'"):
        assert [m.id for m in checks.check_mysql_database(connection)] == ["django_leases.W020"]


def test_e019_a_table_that_is_not_innodb(monkeypatch: pytest.MonkeyPatch) -> None:
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE dl_check_myisam (id INT PRIMARY KEY) ENGINE=MyISAM")
    try:
        ours = checks._our_models()
        fake = SimpleNamespace(_meta=SimpleNamespace(db_table="dl_check_myisam"))
        monkeypatch.setattr(checks, "_our_models", lambda: [*ours, fake])
        messages = checks.check_mysql_database(connection)
        assert [m.id for m in messages] == ["django_leases.E019"]
        assert "dl_check_myisam (MyISAM)" in messages[0].msg
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE dl_check_myisam")


def test_e021_a_storage_zone_the_server_does_not_know(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "mysql_zone", lambda connection: "Atlantis/Nowhere")
    messages = checks.check_mysql_database(connection)
    assert [m.id for m in messages] == ["django_leases.E021"]
    assert "Atlantis/Nowhere" in messages[0].msg
    # An offset needs no time zone tables.
    monkeypatch.setattr(clock, "mysql_zone", lambda connection: "+02:00")
    assert checks.check_mysql_database(connection) == []


def test_w041_a_storage_zone_with_daylight_saving(monkeypatch: pytest.MonkeyPatch) -> None:
    """A database TIME_ZONE with daylight saving (its wall clock skips and repeats an hour)
    is warned of; a zone without it, or a fixed offset, is not."""
    monkeypatch.setattr(clock, "mysql_zone", lambda connection: "Europe/Paris")
    # (E021 too where the server's time zone tables were never loaded.)
    messages = [m for m in checks.check_mysql_database(connection) if not m.id.endswith("E021")]
    assert [m.id for m in messages] == ["django_leases.W041"]
    assert "Europe/Paris" in messages[0].msg
    for steady in ("Asia/Kolkata", "+05:30"):
        monkeypatch.setattr(clock, "mysql_zone", functools.partial(_zone_named, steady))
        assert checks.check_mysql_database(connection) == []


def _zone_named(zone: str, connection: object) -> str:
    return zone


@pytest.mark.parametrize(
    ("collation", "exact"),
    [
        ("utf8mb4_general_ci", False),
        ("utf8mb4_unicode_ci", False),
        ("utf8mb4_bin", False),  # PAD SPACE on MariaDB
        ("utf8mb4_nopad_bin", True),
    ],
)
def test_w022_collations(collation: str, exact: bool) -> None:
    with connection.cursor() as cursor:
        assert checks._exact_collation(cursor, connection, collation) is exact


# -- what REPEATABLE READ does -----------------------------------------------------------------


def test_concurrent_acquires_under_read_committed_admit_exactly_one(sql_path: str) -> None:
    key = unique_key("mysql")
    results = race([lambda i=i: Lease.objects.acquire(key, f"h{i}", 60) for i in range(8)])
    assert not [r for r in results if isinstance(r, BaseException)]
    assert len([r for r in results if r is not None]) == 1


@pytest.mark.parametrize(("level", "stale"), [("read committed", False), ("repeatable read", True)])
def test_what_repeatable_read_does_to_a_read_inside_a_transaction(level: str, stale: bool) -> None:
    """Why E017 asks for READ COMMITTED: under REPEATABLE READ, ``current()`` inside a
    transaction answers from the snapshot of the transaction's first read, so a lease that
    passed on meanwhile still shows its old holder and token. A locking read (what fenced(),
    claims and the guarded UPDATEs do) sees the new holder at either level."""
    key = unique_key("mysql")
    first = Lease.objects.acquire(key, "a", 60)
    assert first is not None

    def pass_on() -> Lease | None:
        Lease.objects.release(first)
        return Lease.objects.acquire(key, "b", 60)

    with _options(isolation_level=level), transaction.atomic():
        before = Lease.objects.current(key)
        assert before is not None and before.holder == "a"
        taken = on_another_thread(pass_on)
        assert taken is not None and (taken.holder, taken.token) == ("b", 2)
        seen = Lease.objects.current(key)
        locked = Lease.objects.select_for_update().get(key=key)
    assert seen is not None
    assert (seen.holder, seen.token) == (("a", 1) if stale else ("b", 2))
    assert (locked.holder, locked.token) == ("b", 2)


def test_w022_names_every_text_column_whose_collation_blurs_strings() -> None:
    """Not only the lease key: a run key, a name or a webhook delivery id compared with a
    case-insensitive collation would merge distinct values (a delivery whose id differs from
    an earlier one only in case dropped as its repeat). Each such column is named."""
    table = "django_leases_triggerevent"
    column_type, nullable, collation = _one(
        "SELECT COLUMN_TYPE, IS_NULLABLE, COLLATION_NAME FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = 'delivery_id'",
        [table],
    )
    null = "NULL" if nullable == "YES" else "NOT NULL"

    def collate(name: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"ALTER TABLE {table} MODIFY delivery_id {column_type} "
                f"CHARACTER SET utf8mb4 COLLATE {name} {null}"
            )

    collate("utf8mb4_general_ci")
    try:
        messages = checks.check_mysql_database(connection)
        assert [m.id for m in messages] == ["django_leases.W022"], messages
        assert f"{table}.delivery_id" in messages[0].msg
        assert "utf8mb4_general_ci" in messages[0].msg
    finally:
        collate(collation)
    assert checks.check_mysql_database(connection) == []

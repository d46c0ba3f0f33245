"""Shared fixtures. The suite runs on SQLite, PostgreSQL and MariaDB (``make test`` does all
three)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import pytest
from django.core.management.color import no_style
from django.db import connection, connections
from django.test import TransactionTestCase

from tests import payloads as payload_sets
from tests.helpers import reap_started_processes, tuned_sql
from tests.hold_command import Holders


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say whether the extra run over the real payloads (``../shared/fixtures/``) is in, and
    which PostgreSQL driver Django would use."""
    root = payload_sets.SHARED_DIR / "fixtures"
    if "shared" in payload_sets.set_names():
        payloads = f"real webhook payloads: {root} (an extra run of the payload tests)"
    else:
        payloads = f"real webhook payloads: {root} is not here; their extra run is not collected"
    driver = "psycopg 3" if find_spec("psycopg") else "psycopg2" if find_spec("psycopg2") else None
    return [payloads, f"PostgreSQL driver: {driver or 'none installed'}"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    on_postgres = engine.endswith("postgresql")
    on_mysql = engine.endswith("mysql")
    skip = pytest.mark.skip(reason="needs PostgreSQL (run with DATABASE_URL=postgres://...)")
    skip_mysql = pytest.mark.skip(
        reason="needs MariaDB or MySQL (run with DATABASE_URL=mysql://...)"
    )
    # Django's PostgreSQL backend takes psycopg 3 when it is importable, else psycopg2.
    on_psycopg3 = on_postgres and find_spec("psycopg") is not None
    skip_psycopg3 = pytest.mark.skip(
        reason="needs PostgreSQL through psycopg 3 (this pass runs on psycopg2)"
        if on_postgres
        else "needs PostgreSQL through psycopg 3 (run with DATABASE_URL=postgres://...)"
    )
    for item in items:
        if "psycopg3_only" in item.keywords and not on_psycopg3:
            item.add_marker(skip_psycopg3)
        elif "postgres_only" in item.keywords and not on_postgres:
            item.add_marker(skip)
        if "mysql_only" in item.keywords and not on_mysql:
            item.add_marker(skip_mysql)


#: Tables the post_migrate signal fills (content types, permissions) and no test writes: kept
#: between transactional tests, so that they need no post_migrate to fill them again.
KEPT_TABLES = frozenset({"django_content_type", "auth_permission"})


def _empty_tables(self: TransactionTestCase) -> None:
    """``TransactionTestCase._fixture_teardown`` for this suite: every table emptied with
    ``DELETE``, but for :data:`KEPT_TABLES`, and no post_migrate signal.

    Django's own teardown flushes with ``TRUNCATE`` on PostgreSQL (a new file for every table
    and index: ~1 s per test under load, against ~12 ms to delete the few rows a test leaves)
    and then sends post_migrate to create the content types and permissions it just deleted
    (another 0.1-0.3 s on PostgreSQL and MariaDB). Foreign keys: PostgreSQL's and SQLite's are
    deferred to the commit, by which time every table is empty; MySQL's checks are off for the
    flush (its ``sql_flush`` says so)."""
    for alias in self._databases_names(include_mirrors=False):
        connection = connections[alias]
        tables = [
            table
            for table in connection.introspection.django_table_names(
                only_existing=True, include_views=False
            )
            if table not in KEPT_TABLES
        ]
        if connection.vendor == "postgresql":
            statements = [f"DELETE FROM {connection.ops.quote_name(t)}" for t in tables]
        else:  # SQLite and MySQL delete already (MySQL with its foreign key checks off)
            statements = connection.ops.sql_flush(no_style(), tables)
        connection.ops.execute_sql_flush(statements)


TransactionTestCase._fixture_teardown = _empty_tables  # type: ignore[method-assign]


@pytest.fixture
def payloads() -> payload_sets.PayloadSet:
    """Our own webhook deliveries (``tests/fixtures/``), signed; see ``tests/payloads.py``."""
    return payload_sets.ours()


@pytest.fixture(params=payload_sets.set_names())
def payload_set(request: pytest.FixtureRequest) -> payload_sets.PayloadSet:
    """Each payload set in turn: ``ours`` (``tests/fixtures/``), then ``shared`` (the real
    payloads in ``../shared/fixtures/``: not collected when absent on a user's machine, a
    failure when absent under ``CI=true``)."""
    return payload_sets.payload_set(request.param)


@pytest.fixture(params=["tuned", "portable"])
def sql_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each path of the rules in turn: ``tuned`` (the hand-written statements PostgreSQL and
    SQLite get), then ``portable`` (``TUNED_SQL = False``: the ORM path other vendors take)."""
    with tuned_sql(request.param == "tuned"):
        yield str(request.param)


@pytest.fixture
def renewal_outcomes() -> Iterator[list[str]]:
    """The renewal outcomes the process's renewers report (``held``, ``lost``, ``failed``,
    ``skipped``), in order, while the test runs."""
    from django_leases import renewal

    seen: list[str] = []
    renewal.observers.append(seen.append)
    try:
        yield seen
    finally:
        renewal.observers.remove(seen.append)


@pytest.fixture
def vendor() -> str:
    """``"postgresql"``, ``"sqlite"`` or ``"mysql"``: the database the suite runs on."""
    return connection.vendor


@pytest.fixture
def subprocess_env(transactional_db: None) -> dict[str, str]:
    """Environment for a child process (``manage.py …``) that uses this test's database.

    Needs real commits, so it asks for ``transactional_db``; the child sees the test
    database as its default database.
    """
    settings_dict = connection.settings_dict
    env = dict(os.environ)
    if connection.vendor == "sqlite":
        env["DATABASE_URL"] = f"sqlite:///{settings_dict['NAME']}"
    elif connection.vendor == "mysql":
        user = settings_dict.get("USER") or "root"
        password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
        host = settings_dict.get("HOST") or "127.0.0.1"
        port = settings_dict.get("PORT") or 3306
        env["DATABASE_URL"] = f"mysql://{user}{password}@{host}:{port}/{settings_dict['NAME']}"
    else:
        user = settings_dict.get("USER") or "postgres"
        host = settings_dict.get("HOST") or "127.0.0.1"
        port = settings_dict.get("PORT") or 5432
        env["DATABASE_URL"] = f"postgres://{user}@{host}:{port}/{settings_dict['NAME']}"
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(autouse=True)
def _reap_started_processes() -> Iterator[None]:
    """No test leaves a process it started, or its pipes, behind."""
    yield
    reap_started_processes()


@pytest.fixture
def holders(subprocess_env: dict[str, str], tmp_path: Path) -> Iterator[Holders]:
    """Starts ``manage.py hold_lease`` processes (:class:`~tests.hold_command.Holders`); kills
    what is left of them at the end."""
    helper = Holders(subprocess_env, tmp_path)
    try:
        yield helper
    finally:
        helper.cleanup()

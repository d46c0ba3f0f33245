"""Lease benchmark: django-leases side by side with a raw-SQL floor and the peers a user would pick.

Run with ``make bench`` (or ``python bench/leases.py --help``). On PostgreSQL, in one run, it
measures for each contender:

1. acquire+release cycles/s on one connection (one key, acquire then release, repeatedly);
2. renewals/s on one connection (refresh of a held lease);
3. contended acquire: N processes (default 8) hammering one key for a fixed time, each loop
   "try to acquire; if granted, release" -- total attempts/s and grants/s.

Contenders:

* ``ours``: ``Lease.objects.acquire / refresh / release`` through Django (persistent connection,
  ``CONN_MAX_AGE=None``, ``DEBUG=False``, Django's default client-side binding);
* ``ours+ssb`` and ``ours+ssb+prep`` (options, not defaults): the same code with the psycopg
  ``server_side_binding`` option, without and with prepared statements (``prepare_threshold``);
* ``floor``: raw psycopg doing the least work per operation on its own minimal table (key,
  holder, token, expires_at): one ``INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING token``
  to acquire, one guarded ``UPDATE`` to refresh and one to release, autocommit, one reused
  cursor, psycopg's defaults (server-side binding, statements prepared after 5 executions);
* ``pglock``: django-pglock session advisory locks (``pglock.advisory(key, timeout=0)``, i.e.
  ``pg_try_advisory_lock`` / ``pg_advisory_unlock``); it has no TTL, token or refresh (n/a);
* ``redis``: redis-py ``Lock`` (``SET NX PX`` to acquire, Lua scripts to release and to renew
  with ``reacquire()``) on the local Redis.

Every PostgreSQL contender uses the same database, host, user and persistent autocommit
connection; every measurement runs in fresh processes, after a warm-up, for a fixed time, and
each figure is the best of ``--repeat`` repetitions (contenders interleaved within each
repetition so drifting load hits all of them alike). Statements per operation are counted with
``CaptureQueriesContext`` for the Django contenders, and by counting ``execute`` calls for the
floor and Redis commands for Redis. Each single-connection window also records CPU per
operation in the client and in the server process serving it (read from ``/proc`` when the
server is local), which says where a gap to the floor comes from.

``--breakdown`` then takes ours apart in one process (see :func:`run_breakdown`), and
``--profile CONTENDER`` prints a cProfile of one contender's loops instead of benchmarking.

**Held leases** (``--held N``, default 1,000; 0 skips it): one process holds N leases through
``hold_lease`` (TTL ``--held-ttl``, 30 s) for two renewal intervals and the stage records its
connections to the database, its threads, the renewal statements sent per renewal tick, the
CPU of the server processes serving it per lease renewed, and how long after a takeover of
one of the leases its holder was told (the bound: one renewal interval, TTL/3). ``--held-tree
TREE`` measures another source tree's ``django_leases`` the same way in the same run (the
code before the renewer held each lease on a connection and two threads of its own: 1,001
connections, more than a shared server's ``max_connections``; ``--held-private-cluster``
runs the stage on a private PostgreSQL cluster with ``max_connections`` 1,300, made with
``tests/pgcluster.py`` on a port of 5441-5449 and removed after).

The figures go to stdout as a table (each with its ratio to the floor) and to
``bench/results/leases-<date>-<HHMM>.json``. Nothing here is a test: timing never fails a build.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import io
import multiprocessing as mp
import os
import pstats
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    RESULTS_DIR,
    BenchError,
    add_settle_argument,
    libpq_conninfo,
    load_average,
    machine_facts,
    process_cpu_seconds,
    settle,
    versions,
    write_report,
)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/django_leases_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
FLOOR_TABLE = "bench_floor_lease"

CYCLE_KEY = "bench:acquire-release"
RENEW_KEY = "bench:renew"
TARGET = 0.85  # ours / floor, for acquire+release and renewals (issue 14)
CONTENDED_KEY = "bench:contended"


# -- contenders ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One contender: how to build its client and how to describe it."""

    name: str
    kind: str  # "django", "floor", "pglock" or "redis"
    description: str
    role: str = "contender"  # "contender", "floor" or "option"
    django_options: dict[str, Any] = field(default_factory=dict)
    renews: bool = True
    #: A source tree whose ``django_leases`` this contender imports instead (``--candidate``),
    #: on its own database: ``<bench database>_candidate`` (``_candidate2``… for the second
    #: and later ones), migrated by that tree.
    tree: str | None = None
    database_suffix: str = "_candidate"

    def database_url(self, config: Config) -> str:
        """The database this contender uses."""
        if not self.tree:
            return config.database_url
        return suffixed_url(config.database_url, self.database_suffix)

    def enter(self) -> None:
        """Make this process import ``django_leases`` from :attr:`tree` (call before Django)."""
        if self.tree and sys.path[0] != self.tree:
            sys.path.insert(0, self.tree)


SPECS: dict[str, Spec] = {
    spec.name: spec
    for spec in (
        Spec(
            "ours",
            "django",
            "django-leases Lease.objects.acquire/refresh/release through Django "
            "(client-side binding, Django's default)",
        ),
        Spec(
            "ours+ssb",
            "django",
            "ours with OPTIONS server_side_binding=True (no prepared statements)",
            role="option",
            django_options={"server_side_binding": True},
        ),
        Spec(
            "ours+ssb+prep",
            "django",
            "ours with OPTIONS server_side_binding=True, prepare_threshold=5 (prepared statements)",
            role="option",
            django_options={"server_side_binding": True, "prepare_threshold": 5},
        ),
        Spec(
            "floor",
            "floor",
            "raw psycopg, one statement per operation on a minimal table, autocommit, "
            "server-side binding, prepared after 5 executions (psycopg defaults)",
            role="floor",
        ),
        Spec(
            "pglock",
            "pglock",
            "django-pglock session advisory lock, pglock.advisory(key, timeout=0) "
            "(no TTL, no token, no refresh)",
            renews=False,
        ),
        Spec(
            "redis",
            "redis",
            "redis-py Lock(timeout=TTL), acquire(blocking=False) / release / reacquire",
        ),
    )
}


@dataclass(frozen=True)
class Config:
    """What every worker process needs to know (picklable)."""

    database_url: str
    redis_url: str
    ttl: float
    seconds: float
    warmup: float
    repeat: int = 3


def suffixed_url(database_url: str, suffix: str) -> str:
    """``database_url`` with ``suffix`` appended to the database name."""
    base, _, name = database_url.rpartition("/")
    name, sep, query = name.partition("?")
    return f"{base}/{name}{suffix}{sep}{query}"


def configure_django(database_url: str, options: dict[str, Any]) -> None:
    """Set Django up in this process on ``database_url`` with extra database ``options``."""
    import django
    from django.conf import settings

    from demo_project.settings import database_from_url

    database = database_from_url(database_url)
    database["CONN_MAX_AGE"] = None
    database.setdefault("OPTIONS", {}).update(options)
    settings.configure(
        DEBUG=False,
        INSTALLED_APPS=["django_leases"],
        DATABASES={"default": database},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        USE_TZ=True,
        TIME_ZONE="UTC",
        LOGGING_CONFIG=None,
    )
    django.setup()


class Client:
    """The operations the measurements call; one instance per process and connection."""

    def __init__(self, spec: Spec, config: Config, holder: str) -> None:
        self.spec = spec
        self.config = config
        self.holder = holder

    def cycle(self, key: str) -> None:
        """Acquire ``key`` (must be granted) and release it."""
        raise NotImplementedError

    def try_cycle(self, key: str) -> bool:
        """Try to acquire ``key``; if granted, release it. Returns whether it was granted."""
        raise NotImplementedError

    def hold(self, key: str) -> None:
        """Acquire ``key`` for the renewal measurement (must be granted)."""
        raise NotImplementedError

    def renew(self) -> None:
        """Refresh the lease taken by :meth:`hold` (must still be held)."""
        raise NotImplementedError

    def unhold(self) -> None:
        """Release the lease taken by :meth:`hold`."""
        raise NotImplementedError

    def statement_counts(self, key: str) -> dict[str, Any]:
        """Statements (or commands) sent per acquire, refresh and release, plus their text."""
        raise NotImplementedError

    def server_pid(self) -> int | None:
        """The server process serving this client, when it runs on this machine."""
        return None

    def close(self) -> None:
        """Close the connection."""


class OursClient(Client):
    """django-leases through the ORM manager, exactly as an application calls it."""

    def __init__(self, spec: Spec, config: Config, holder: str) -> None:
        super().__init__(spec, config, holder)
        configure_django(spec.database_url(config), spec.django_options)
        from django_leases.models import Lease

        self.objects = Lease.objects
        self.held: Any = None

    def cycle(self, key: str) -> None:
        lease = self.objects.acquire(key, self.holder, self.config.ttl)
        if lease is None:
            raise BenchError(f"{self.spec.name}: acquire of a free key was refused")
        self.objects.release(lease)

    def try_cycle(self, key: str) -> bool:
        lease = self.objects.acquire(key, self.holder, self.config.ttl)
        if lease is None:
            return False
        self.objects.release(lease)
        return True

    def hold(self, key: str) -> None:
        self.held = self.objects.acquire(key, self.holder, self.config.ttl)
        if self.held is None:
            raise BenchError(f"{self.spec.name}: could not take {key!r} to renew it")

    def renew(self) -> None:
        self.held = self.objects.refresh(self.held, self.config.ttl)
        if self.held is None:
            raise BenchError(f"{self.spec.name}: a refresh of a held lease was refused")

    def unhold(self) -> None:
        self.objects.release(self.held)

    def statement_counts(self, key: str) -> dict[str, Any]:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        counts: dict[str, Any] = {}
        with CaptureQueriesContext(connection) as acquired:
            lease = self.objects.acquire(key, self.holder, self.config.ttl)
        with CaptureQueriesContext(connection) as refreshed:
            lease = self.objects.refresh(lease, self.config.ttl)
        with CaptureQueriesContext(connection) as released:
            self.objects.release(lease)
        for op, captured in (("acquire", acquired), ("refresh", refreshed), ("release", released)):
            counts[op] = len(captured.captured_queries)
            counts[f"{op}_sql"] = [q["sql"] for q in captured.captured_queries]
        return counts

    def server_pid(self) -> int | None:
        return _django_backend_pid()

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


class FloorClient(Client):
    """The least work per operation: one prepared statement each, autocommit, raw psycopg."""

    ACQUIRE = (
        f"INSERT INTO {FLOOR_TABLE} AS l (key, holder, token, expires_at) "
        "VALUES (%s, %s, 1, statement_timestamp() + %s) "
        "ON CONFLICT (key) DO UPDATE SET "
        "token = CASE WHEN l.holder = excluded.holder AND l.expires_at > statement_timestamp() "
        "THEN l.token ELSE l.token + 1 END, "
        "holder = excluded.holder, expires_at = excluded.expires_at "
        "WHERE l.expires_at <= statement_timestamp() OR l.holder = excluded.holder "
        "RETURNING token"
    )
    REFRESH = (
        f"UPDATE {FLOOR_TABLE} SET expires_at = statement_timestamp() + %s "
        "WHERE key = %s AND holder = %s AND token = %s AND expires_at > statement_timestamp()"
    )
    RELEASE = (
        f"UPDATE {FLOOR_TABLE} SET expires_at = statement_timestamp() "
        "WHERE key = %s AND holder = %s AND token = %s AND expires_at > statement_timestamp()"
    )

    def __init__(self, spec: Spec, config: Config, holder: str) -> None:
        super().__init__(spec, config, holder)
        import psycopg

        self.connection = psycopg.connect(libpq_conninfo(config.database_url), autocommit=True)
        self.cursor = self.connection.cursor()
        self.ttl = dt.timedelta(seconds=config.ttl)
        self.executed = 0
        self.held: tuple[str, int] | None = None

    def _execute(self, sql: str, params: tuple[Any, ...]) -> None:
        self.executed += 1
        self.cursor.execute(sql, params, prepare=None)

    def acquire(self, key: str) -> int | None:
        self._execute(self.ACQUIRE, (key, self.holder, self.ttl))
        row = self.cursor.fetchone()
        return None if row is None else row[0]

    def release(self, key: str, token: int) -> None:
        self._execute(self.RELEASE, (key, self.holder, token))

    def cycle(self, key: str) -> None:
        token = self.acquire(key)
        if token is None:
            raise BenchError("floor: acquire of a free key was refused")
        self.release(key, token)

    def try_cycle(self, key: str) -> bool:
        token = self.acquire(key)
        if token is None:
            return False
        self.release(key, token)
        return True

    def hold(self, key: str) -> None:
        token = self.acquire(key)
        if token is None:
            raise BenchError(f"floor: could not take {key!r} to renew it")
        self.held = (key, token)

    def renew(self) -> None:
        assert self.held is not None
        key, token = self.held
        self._execute(self.REFRESH, (self.ttl, key, self.holder, token))
        if self.cursor.rowcount != 1:
            raise BenchError("floor: a refresh of a held lease was refused")

    def unhold(self) -> None:
        assert self.held is not None
        self.release(*self.held)

    def statement_counts(self, key: str) -> dict[str, Any]:
        counts: dict[str, Any] = {}
        before = self.executed
        token = self.acquire(key)
        counts["acquire"] = self.executed - before
        assert token is not None
        before = self.executed
        self._execute(self.REFRESH, (self.ttl, key, self.holder, token))
        counts["refresh"] = self.executed - before
        before = self.executed
        self.release(key, token)
        counts["release"] = self.executed - before
        counts.update(
            acquire_sql=[self.ACQUIRE], refresh_sql=[self.REFRESH], release_sql=[self.RELEASE]
        )
        return counts

    def server_pid(self) -> int | None:
        return _local_pid(self.connection.info.backend_pid, "postgres", self.connection.info.host)

    def close(self) -> None:
        self.connection.close()


class PglockClient(Client):
    """django-pglock's advisory lock, used as its documented context manager."""

    def __init__(self, spec: Spec, config: Config, holder: str) -> None:
        super().__init__(spec, config, holder)
        configure_django(config.database_url, spec.django_options)
        import pglock

        self.advisory = pglock.advisory

    def cycle(self, key: str) -> None:
        with self.advisory(key, timeout=0) as acquired:
            if not acquired:
                raise BenchError("pglock: acquire of a free key was refused")

    def try_cycle(self, key: str) -> bool:
        with self.advisory(key, timeout=0) as acquired:
            return bool(acquired)

    def statement_counts(self, key: str) -> dict[str, Any]:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        lock = self.advisory(key, timeout=0)
        with CaptureQueriesContext(connection) as acquired:
            lock.acquire()
        with CaptureQueriesContext(connection) as released:
            lock.release()
        return {
            "acquire": len(acquired.captured_queries),
            "refresh": None,
            "release": len(released.captured_queries),
            "acquire_sql": [q["sql"] for q in acquired.captured_queries],
            "release_sql": [q["sql"] for q in released.captured_queries],
        }

    def server_pid(self) -> int | None:
        return _django_backend_pid()

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


class RedisClient(Client):
    """redis-py's ``Lock``: ``SET NX PX`` to acquire, Lua scripts to release and renew."""

    def __init__(self, spec: Spec, config: Config, holder: str) -> None:
        super().__init__(spec, config, holder)
        import redis

        self.redis = redis.Redis.from_url(config.redis_url)
        self.commands = 0
        send = self.redis.execute_command

        def counting(*args: Any, **options: Any) -> Any:
            self.commands += 1
            return send(*args, **options)

        self.redis.execute_command = counting  # type: ignore[method-assign]
        self.locks: dict[str, Any] = {}
        self.held: Any = None

    def _lock(self, key: str) -> Any:
        lock = self.locks.get(key)
        if lock is None:
            lock = self.locks[key] = self.redis.lock(key, timeout=self.config.ttl)
        return lock

    def cycle(self, key: str) -> None:
        lock = self._lock(key)
        if not lock.acquire(blocking=False):
            raise BenchError("redis: acquire of a free key was refused")
        lock.release()

    def try_cycle(self, key: str) -> bool:
        lock = self._lock(key)
        if not lock.acquire(blocking=False):
            return False
        lock.release()
        return True

    def hold(self, key: str) -> None:
        self.held = self._lock(key)
        if not self.held.acquire(blocking=False):
            raise BenchError(f"redis: could not take {key!r} to renew it")

    def renew(self) -> None:
        self.held.reacquire()

    def unhold(self) -> None:
        self.held.release()

    def statement_counts(self, key: str) -> dict[str, Any]:
        lock = self._lock(key)
        counts: dict[str, Any] = {}
        for op, call in (
            ("acquire", lambda: lock.acquire(blocking=False)),
            ("refresh", lock.reacquire),
            ("release", lock.release),
        ):
            before = self.commands
            call()
            counts[op] = self.commands - before
        counts.update(
            acquire_sql=["SET key token NX PX ttl"],
            refresh_sql=["EVALSHA <reacquire script>"],
            release_sql=["EVALSHA <release script>"],
        )
        return counts

    def server_pid(self) -> int | None:
        info = self.redis.info("server")
        host = self.redis.connection_pool.connection_kwargs.get("host", "")
        return _local_pid(info.get("process_id"), "redis-server", host)

    def close(self) -> None:
        self.redis.close()


def is_mysql(database_url: str) -> bool:
    """Whether ``database_url`` names a MariaDB / MySQL database (``mysql://``)."""
    return database_url.startswith(("mysql://", "mysql2://", "mariadb://"))


def _mysqldb_connect(database_url: str, database: bool = True) -> Any:
    """A raw MySQLdb connection (autocommit, utf8mb4, matched rows counted, as Django's)."""
    from urllib.parse import unquote, urlsplit

    import MySQLdb
    from MySQLdb.constants import CLIENT

    url = urlsplit(database_url)
    options: dict[str, Any] = {
        "host": url.hostname or "127.0.0.1",
        "port": url.port or 3306,
        "user": unquote(url.username or "root"),
        "password": unquote(url.password or ""),
        "charset": "utf8mb4",
        "client_flag": CLIENT.FOUND_ROWS,
        "autocommit": True,
    }
    if database:
        options["database"] = url.path.lstrip("/")
    return MySQLdb.connect(**options)


class MysqlFloorClient(FloorClient):
    """The MariaDB floor: raw MySQLdb, one ``INSERT … ON DUPLICATE KEY UPDATE … RETURNING
    token`` to acquire and one guarded ``UPDATE`` to refresh and to release, autocommit, one
    reused cursor, on its own minimal table (key, holder, token, expires_at)."""

    NOW = "UTC_TIMESTAMP(6)"
    _GRANT = f"(expires_at <= {NOW} OR holder = VALUES(holder))"
    ACQUIRE = (
        f"INSERT INTO {FLOOR_TABLE} (`key`, holder, token, expires_at) "
        f"VALUES (%s, %s, 1, {NOW} + INTERVAL %s MICROSECOND) ON DUPLICATE KEY UPDATE "
        f"token = IF({_GRANT}, IF(holder = VALUES(holder) AND expires_at > {NOW}, token, "
        "token + 1), token), "
        f"holder = IF({_GRANT}, VALUES(holder), holder), "
        "expires_at = IF(holder = VALUES(holder), VALUES(expires_at), expires_at) "
        "RETURNING token, holder"
    )
    REFRESH = (
        f"UPDATE {FLOOR_TABLE} SET expires_at = {NOW} + INTERVAL %s MICROSECOND "
        f"WHERE `key` = %s AND holder = %s AND token = %s AND expires_at > {NOW}"
    )
    RELEASE = (
        f"UPDATE {FLOOR_TABLE} SET expires_at = {NOW} "
        f"WHERE `key` = %s AND holder = %s AND token = %s AND expires_at > {NOW}"
    )

    def __init__(self, spec: Spec, config: Config, holder: str) -> None:
        Client.__init__(self, spec, config, holder)
        self.connection = _mysqldb_connect(config.database_url)
        self.cursor = self.connection.cursor()
        self.ttl = round(config.ttl * 1_000_000)  # type: ignore[assignment]
        self.executed = 0
        self.held = None

    def _execute(self, sql: str, params: tuple[Any, ...]) -> None:
        self.executed += 1
        self.cursor.execute(sql, params)

    def acquire(self, key: str) -> int | None:
        self._execute(self.ACQUIRE, (key, self.holder, self.ttl))
        row = self.cursor.fetchone()
        return None if row is None or row[1] != self.holder else int(row[0])

    def server_pid(self) -> int | None:
        return None  # mysqld serves every connection from one process: no per-connection CPU

    def close(self) -> None:
        self.connection.close()


def prepare_mysql_database(config: Config) -> dict[str, Any]:
    """MariaDB / MySQL: create the bench database if missing (utf8mb4, binary NO PAD), migrate
    it, create the floor's table; returns the server's version and settings."""
    name = config.database_url.rsplit("/", 1)[1].partition("?")[0]
    if not name:
        raise SystemExit("the bench database URL must name a database")
    with contextlib.closing(_mysqldb_connect(config.database_url, database=False)) as server:
        cursor = server.cursor()
        cursor.execute("SELECT @@version, @@version_comment")
        version, comment = cursor.fetchone()
        collation = (
            "utf8mb4_nopad_bin"
            if "mariadb" in f"{version} {comment}".lower()
            else ("utf8mb4_0900_bin")
        )
        cursor.execute(
            f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE {collation}"
        )
    configure_django(config.database_url, {})
    from django.core.management import call_command
    from django.db import connection as django_connection

    call_command("migrate", "django_leases", "zero", verbosity=0, interactive=False)
    call_command("migrate", verbosity=0, interactive=False)
    django_connection.close()
    with contextlib.closing(_mysqldb_connect(config.database_url)) as connection:
        cursor = connection.cursor()
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} (`key` varchar(255) PRIMARY KEY, "
            "holder varchar(255) NOT NULL, token bigint NOT NULL, expires_at datetime(6) NOT "
            "NULL) ENGINE=InnoDB"
        )
        cursor.execute(f"TRUNCATE {FLOOR_TABLE}")
        facts: dict[str, Any] = {"database": name, "server_version": version}
        for setting in (
            "innodb_flush_log_at_trx_commit",
            "innodb_buffer_pool_size",
            "max_connections",
            "tx_isolation" if "mariadb" in str(version).lower() else "transaction_isolation",
        ):
            cursor.execute(f"SELECT @@GLOBAL.{setting}")
            facts[setting] = cursor.fetchone()[0]
    from urllib.parse import urlsplit

    url = urlsplit(config.database_url)
    facts.update(host=url.hostname, port=url.port or 3306, user=url.username or "root")
    return facts


CLIENTS: dict[str, type[Client]] = {
    "django": OursClient,
    "floor": FloorClient,
    "mysqlfloor": MysqlFloorClient,
    "pglock": PglockClient,
    "redis": RedisClient,
}


def _local_pid(pid: Any, name: str, host: Any) -> int | None:
    """``pid`` if the server is on this machine and ``/proc/<pid>`` really is ``name``."""
    local = str(host) in ("127.0.0.1", "localhost", "::1") or str(host).startswith("/")
    if not isinstance(pid, int) or not local:
        return None
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return None
    return pid if name in command else None


def _django_backend_pid(alias: str = "default") -> int | None:
    from django.db import connections

    connection = connections[alias]
    if connection.vendor != "postgresql":
        return None
    connection.ensure_connection()
    info = connection.connection.info
    return _local_pid(info.backend_pid, "postgres", info.host)


def make_client(spec: Spec, config: Config) -> Client:
    holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    return CLIENTS[spec.kind](spec, config, holder)


# -- measurement loops (run in worker processes) ----------------------------------------------


def run_for(operation: Callable[[], Any], seconds: float) -> tuple[int, float]:
    """Call ``operation`` back to back for ``seconds``; return (calls, elapsed seconds)."""
    clock = time.perf_counter
    calls = 0
    start = clock()
    deadline = start + seconds
    now = start
    while now < deadline:
        operation()
        calls += 1
        now = clock()
    return calls, now - start


def timed(operation: Callable[[], Any], seconds: float, server_pid: int | None) -> dict[str, Any]:
    """Run ``operation`` for ``seconds``: its rate, and wall and CPU microseconds per call.

    CPU is the client's (this process) and the server's (the backend serving the connection,
    read from ``/proc`` when the server runs on this machine). CPU per call hardly depends on
    what else runs on the machine, so it explains ratios that wall-clock rates on a busy
    machine can blur.
    """
    server_before = process_cpu_seconds(server_pid)
    client_before = time.process_time()
    calls, elapsed = run_for(operation, seconds)
    client = time.process_time() - client_before
    server_after = process_cpu_seconds(server_pid)
    server = None if server_before is None or server_after is None else server_after - server_before
    return {
        "rate": calls / elapsed,
        "wall_us": 1e6 * elapsed / calls,
        "client_cpu_us": 1e6 * client / calls,
        "server_cpu_us": None if server is None else 1e6 * server / calls,
    }


def single_connection_worker(spec: Spec, config: Config, results: Any) -> None:
    """One process, one connection: acquire+release cycles/s, then renewals/s."""
    try:
        spec.enter()
        client = make_client(spec, config)
        out: dict[str, Any] = {}
        client.cycle(CYCLE_KEY)  # connect (and create the row) outside the timings
        pid = client.server_pid()
        run_for(lambda: client.cycle(CYCLE_KEY), config.warmup)
        out["acquire_release"] = timed(lambda: client.cycle(CYCLE_KEY), config.seconds, pid)
        if spec.renews:
            client.hold(RENEW_KEY)
            run_for(client.renew, config.warmup)
            out["renew"] = timed(client.renew, config.seconds, pid)
            client.unhold()
        out["counts"] = client.statement_counts(CYCLE_KEY)
        client.close()
        results.put(("ok", out))
    except BaseException as error:
        results.put(("error", f"{type(error).__name__}: {error}"))
        raise


def contended_worker(spec: Spec, config: Config, barrier: Any, results: Any) -> None:
    """One of N processes: "try to acquire; if granted, release" on one key, in a loop."""
    try:
        spec.enter()
        client = make_client(spec, config)
        client.try_cycle(CONTENDED_KEY)  # connect outside the timings
        granted = 0

        def attempt() -> None:
            nonlocal granted
            if client.try_cycle(CONTENDED_KEY):
                granted += 1

        barrier.wait(timeout=120)
        run_for(attempt, config.warmup)
        barrier.wait(timeout=120)
        granted = 0
        attempts, elapsed = run_for(attempt, config.seconds)
        client.close()
        results.put(("ok", {"attempts": attempts, "grants": granted, "elapsed": elapsed}))
    except BaseException as error:
        results.put(("error", f"{type(error).__name__}: {error}"))
        raise


def _collect(processes: list[Any], results: Any, timeout: float) -> list[dict[str, Any]]:
    collected = []
    try:
        for _ in processes:
            status, payload = results.get(timeout=timeout)
            if status != "ok":
                raise BenchError(payload)
            collected.append(payload)
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
    return collected


def measure_single(spec: Spec, config: Config) -> dict[str, Any]:
    context = mp.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=single_connection_worker, args=(spec, config, results))
    process.start()
    budget = 2 * (config.seconds + config.warmup) + 120
    return _collect([process], results, budget)[0]


def measure_contended(spec: Spec, config: Config, processes: int) -> dict[str, float]:
    context = mp.get_context("spawn")
    results = context.Queue()
    barrier = context.Barrier(processes)
    workers = [
        context.Process(target=contended_worker, args=(spec, config, barrier, results))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    outcomes = _collect(workers, results, config.seconds + config.warmup + 240)
    return {
        "attempts": sum(o["attempts"] / o["elapsed"] for o in outcomes),
        "grants": sum(o["grants"] / o["elapsed"] for o in outcomes),
    }


# -- set-up, facts about the machine ----------------------------------------------------------


def prepare_database(config: Config) -> dict[str, Any]:
    """Create the bench database if missing, migrate it, create the floor's table.

    Returns the server's version and settings that matter for the figures.
    """
    if is_mysql(config.database_url):
        return prepare_mysql_database(config)
    import psycopg
    from psycopg import sql

    conninfo = libpq_conninfo(config.database_url)
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    name = str(params.get("dbname") or "")
    if not name:
        raise SystemExit("the bench database URL must name a database")
    admin = psycopg.conninfo.make_conninfo(conninfo, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as connection:
        exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
        if exists.fetchone() is None:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            print(f"created database {name}")

    configure_django(config.database_url, {})
    from django.core.management import call_command
    from django.db import connection as django_connection

    # The project regenerates its initial migration while it is young, so a database migrated
    # by an older checkout can look up to date and still hold the old schema: recreate the
    # django_leases tables from the current migrations on every run.
    call_command("migrate", "django_leases", "zero", verbosity=0, interactive=False)
    call_command("migrate", verbosity=0, interactive=False)
    django_connection.close()

    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} ("
            "key varchar(255) PRIMARY KEY, holder varchar(255) NOT NULL, "
            "token bigint NOT NULL, expires_at timestamptz NOT NULL)"
        )
        connection.execute(f"TRUNCATE {FLOOR_TABLE}")
        connection.execute(f"VACUUM ANALYZE {FLOOR_TABLE}")
        facts: dict[str, Any] = {"database": name}
        for setting in (
            "server_version",
            "synchronous_commit",
            "fsync",
            "shared_buffers",
            "max_connections",
        ):
            row = connection.execute(f"SHOW {setting}").fetchone()
            facts[setting] = row[0] if row else None
        facts["host"] = connection.info.host
        facts["port"] = connection.info.port
        facts["user"] = connection.info.user
    return facts


def redis_facts(config: Config) -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(config.redis_url)
    try:
        info = client.info("server")
        client.delete(CYCLE_KEY, RENEW_KEY, CONTENDED_KEY)
        return {"url": config.redis_url, "redis_version": info.get("redis_version")}
    finally:
        client.close()


# -- report ----------------------------------------------------------------------------------

METRICS = (
    ("acquire_release", "acquire+release/s"),
    ("renew", "renewals/s"),
    ("contended_attempts", "contended attempts/s"),
    ("contended_grants", "contended grants/s"),
)


def best(values: list[float]) -> float | None:
    return max(values) if values else None


def render_table(figures: dict[str, dict[str, float | None]], ratios: dict[str, Any]) -> str:
    names = list(figures)
    header = ["contender"] + [label for _, label in METRICS]
    rows = [header]
    for name in names:
        row = [name]
        for metric, _ in METRICS:
            value = figures[name].get(metric)
            ratio = ratios[name].get(metric)
            row.append("n/a" if value is None else f"{value:,.0f} ({ratio:.2f}×)")
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for index, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_cpu(cpu: dict[str, dict[str, Any]]) -> str:
    """CPU microseconds per operation, client + server, next to the wall time."""

    def cell(found: dict[str, Any] | None) -> str:
        if not found:
            return "n/a"
        client, server = found["client_cpu_us"], found["server_cpu_us"]
        total = "" if server is None else f" = {client + server:5.0f}"
        server_text = "    ?" if server is None else f"{server:5.0f}"
        return f"{client:5.0f} + {server_text}{total} of {found['wall_us']:5.0f}"

    lines = [
        "CPU µs per operation, client + server (= total) of wall µs; lowest of the repetitions:",
        "  " + "contender".ljust(24) + "acquire+release".ljust(34) + "renewal",
    ]
    for name, found in cpu.items():
        lines.append(
            "  "
            + name.ljust(24)
            + cell(found.get("acquire_release")).ljust(34)
            + cell(found.get("renew"))
        )
    return "\n".join(lines)


def render_counts(counts: dict[str, dict[str, Any]]) -> str:
    lines = ["statements (round trips) per operation, steady state:"]
    ops = ("acquire", "refresh", "release")
    lines.append("  " + "contender".ljust(24) + "".join(op.rjust(9) for op in ops))
    for name, found in counts.items():
        cells = ["n/a" if found.get(op) is None else str(found[op]) for op in ops]
        lines.append("  " + name.ljust(24) + "".join(c.rjust(9) for c in cells))
    return "\n".join(lines)


# -- profiling and breakdown ----------------------------------------------------------------


def profile_contender(config: Config, spec: Spec, top: int) -> None:
    """cProfile ``spec``'s acquire+release and refresh loops in this process; print stats."""
    spec.enter()
    spec_name = spec.name
    client = make_client(spec, config)
    client.cycle(CYCLE_KEY)
    run_for(lambda: client.cycle(CYCLE_KEY), config.warmup)
    loops: list[tuple[str, Callable[[], Any] | None, Callable[[], Any], Callable[[], Any] | None]]
    loops = [("acquire+release", None, lambda: client.cycle(CYCLE_KEY), None)]
    if spec.renews:
        loops.append(("refresh", lambda: client.hold(RENEW_KEY), client.renew, client.unhold))
    for label, setup, operation, teardown in loops:
        if setup:
            setup()
        profiler = cProfile.Profile()
        cpu_start = time.process_time()
        profiler.enable()
        calls, elapsed = run_for(operation, config.seconds)
        profiler.disable()
        cpu = time.process_time() - cpu_start
        if teardown:
            teardown()
        print(
            f"\n== {spec_name} {label}: {calls / elapsed:,.0f}/s under cProfile, "
            f"client CPU {1e6 * cpu / calls:.0f} µs/op (profiler included) =="
        )
        stream = io.StringIO()
        stats = pstats.Stats(profiler, stream=stream)
        stats.sort_stats("tottime").print_stats(top)
        print(stream.getvalue())
    client.close()


def profile_worker(spec: Spec, config: Config, top: int) -> None:
    profile_contender(config, spec, top)


def breakdown_worker(config: Config, results: Any) -> None:
    """Peel ours apart: its own SQL without Django and without the Lease layer, prepared."""
    try:
        results.put(("ok", _breakdown(config)))
    except BaseException as error:
        results.put(("error", f"{type(error).__name__}: {error}"))
        raise


def _breakdown(config: Config) -> dict[str, Any]:
    import django
    from django.conf import settings

    from demo_project.settings import database_from_url

    prepared = {"server_side_binding": True, "prepare_threshold": 5}
    databases: dict[str, Any] = {}
    for alias, url, options in (
        ("default", config.database_url, {}),
        ("prepared", config.database_url, prepared),
    ):
        database = database_from_url(url)
        database["CONN_MAX_AGE"] = None
        database.setdefault("OPTIONS", {}).update(options)
        databases[alias] = database
    settings.configure(
        DEBUG=False,
        INSTALLED_APPS=["django_leases"],
        DATABASES=databases,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        USE_TZ=True,
        TIME_ZONE="UTC",
        LOGGING_CONFIG=None,
    )
    django.setup()
    import psycopg
    from django.db import connections

    from django_leases.models import Lease

    ttl = config.ttl
    holder = f"{socket.gethostname()}:{os.getpid()}:breakdown"

    # Record the exact statements ours sends (text and parameters) so the raw-psycopg rows
    # replay ours' own SQL, whatever lease.py currently generates.
    recorded: list[tuple[str, tuple[Any, ...]]] = []

    def recorder(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        recorded.append((sql, tuple(params or ())))
        return execute(sql, params, many, context)

    record_key = "bench:breakdown-record"
    with connections["default"].execute_wrapper(recorder):
        lease = Lease.objects.acquire(record_key, holder, ttl)
        assert lease is not None
        lease = Lease.objects.refresh(lease, ttl)
        assert lease is not None
        Lease.objects.release(lease)
    if len(recorded) != 3:
        raise BenchError(f"expected 3 statements from ours, recorded {len(recorded)}")
    (acquire_sql, acquire_params), (refresh_sql, refresh_params), (release_sql, release_params) = (
        recorded
    )

    def token_position(params: tuple[Any, ...], token: int) -> int:
        """Where the fencing token sits in ``params`` (an int equal to it, the last one)."""
        found = [i for i, value in enumerate(params) if type(value) is int and value == token]
        if not found:
            raise BenchError(f"no token {token} in the recorded parameters {params!r}")
        return found[-1]

    token_at_refresh = token_position(refresh_params, lease.token)
    token_at_release = token_position(release_params, lease.token)

    def replay(template: tuple[Any, ...], at: int, key: str, token: int) -> tuple[Any, ...]:
        """``template`` with the recorded key replaced by ``key`` and the token by ``token``."""
        params = [key if value == record_key else value for value in template]
        params[at] = token
        return tuple(params)

    Statement = tuple[str, tuple[Any, ...]]

    Loops = tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]

    def sql_loops(
        source: Callable[[], Any],
        key: str,
        acquire_for: Callable[[str], Statement],
        release_for: Callable[[str, int], Statement],
        refresh_for: Callable[[str, int], Statement],
    ) -> Loops:
        """(acquire+release, refresh, forget the held lease) loops sending the given statements.

        ``source()`` gives a context manager yielding the cursor for one statement. The held
        lease is forgotten before each renewal window, so it never lapses between windows.
        """
        token_at: list[int] = []

        def acquire(key: str) -> int:
            sql, params = acquire_for(key)
            with source() as cursor:
                cursor.execute(sql, params)
                if not token_at:  # "token" from a statement, "r_token" from the function
                    names = [c.name for c in cursor.description]
                    found = [names.index(n) for n in ("token", "r_token") if n in names]
                    token_at.append(found[0])
                row = cursor.fetchone()
            if row is None:
                raise BenchError("breakdown: acquire refused")
            return int(row[token_at[0]])

        def cycle() -> None:
            sql, params = release_for(key, acquire(key))
            with source() as cursor:
                cursor.execute(sql, params)

        held: list[int] = []
        renew_key = key + ":renew"

        def renew() -> None:
            if not held:
                held.append(acquire(renew_key))
            sql, params = refresh_for(renew_key, held[0])
            with source() as cursor:
                cursor.execute(sql, params)
                refreshed = cursor.rowcount
            if refreshed != 1:
                raise BenchError("breakdown: refresh refused")

        return cycle, renew, held.clear

    def ours_sql(
        source: Callable[[], Any],
        key: str,
        texts: tuple[str, str, str] = (acquire_sql, release_sql, refresh_sql),
    ) -> Loops:
        """Loops replaying ours' own recorded statements (or ``texts`` with their parameters)."""
        acquire_text, release_text, refresh_text = texts
        return sql_loops(
            source,
            key,
            lambda k: (acquire_text, tuple(k if v == record_key else v for v in acquire_params)),
            lambda k, t: (release_text, replay(release_params, token_at_release, k, t)),
            lambda k, t: (refresh_text, replay(refresh_params, token_at_refresh, k, t)),
        )

    def dollar_numbered(sql: str) -> str:
        """``sql`` with its ``%s`` placeholders as ``$1``, ``$2``, … for ``PREPARE``."""
        parts = sql.split("%s")
        return parts[0] + "".join(f"${n}{part}" for n, part in enumerate(parts[1:], 1))

    def sql_prepared(alias: str, key: str) -> Loops:
        """Ours' statements as SQL-level prepared statements (``PREPARE``), run with
        ``EXECUTE`` through Django's cursor with Django's default (client-side) binding."""
        connection = connections[alias]
        texts = []
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE ALL")
            for name, sql, params in (
                ("acquire", acquire_sql, acquire_params),
                ("release", release_sql, release_params),
                ("refresh", refresh_sql, refresh_params),
            ):
                cursor.execute(f"PREPARE bench_lease_{name} AS {dollar_numbered(sql)}")
                texts.append(f"EXECUTE bench_lease_{name}({', '.join(['%s'] * len(params))})")
        return ours_sql(connection.cursor, key, (texts[0], texts[1], texts[2]))

    interval = dt.timedelta(seconds=ttl)

    def floor_sql(source: Callable[[], Any], key: str) -> Loops:
        """Loops sending the floor's statements."""
        return sql_loops(
            source,
            key,
            lambda k: (FloorClient.ACQUIRE, (k, holder, interval)),
            lambda k, t: (FloorClient.RELEASE, (k, holder, t)),
            lambda k, t: (FloorClient.REFRESH, (interval, k, holder, t)),
        )

    def reuse(cursor: Any) -> Callable[[], Any]:
        return lambda: contextlib.nullcontext(cursor)

    raw = psycopg.connect(libpq_conninfo(config.database_url), autocommit=True)
    floor = FloorClient(SPECS["floor"], config, holder)

    def via_manager(alias: str, key: str) -> Loops:
        manager = Lease.objects.db_manager(alias)
        held: dict[str, Any] = {}

        def cycle() -> None:
            got = manager.acquire(key, holder, ttl)
            if got is None:
                raise BenchError("breakdown: acquire refused")
            manager.release(got)

        def renew() -> None:
            if "lease" not in held:
                held["lease"] = manager.acquire(key + ":renew", holder, ttl)
            held["lease"] = manager.refresh(held["lease"], ttl)
            if held["lease"] is None:
                raise BenchError("breakdown: refresh refused")

        return cycle, renew, held.clear

    floor_state: dict[str, int] = {}

    def floor_renew() -> None:
        if not floor_state:
            floor.hold("bench:breakdown-floor-renew")
            floor_state["held"] = 1
        floor.renew()

    raw_pid = _local_pid(raw.info.backend_pid, "postgres", raw.info.host)
    variants: dict[str, tuple[str, Loops, int | None]] = {
        "floor": (
            "raw psycopg, minimal table, prepared",
            (lambda: floor.cycle("bench:breakdown-floor"), floor_renew, floor_state.clear),
            floor.server_pid(),
        ),
        "floor-sql/django": (
            "the floor's SQL through Django's connection.cursor() (Django defaults)",
            floor_sql(connections["default"].cursor, "bench:bd-floor-django"),
            _django_backend_pid("default"),
        ),
        "ours-sql/prepared": (
            "ours' SQL, raw psycopg Cursor, prepared",
            ours_sql(reuse(raw.cursor()), "bench:bd-ours-prepared"),
            raw_pid,
        ),
        "ours-sql/django": (
            "ours' SQL through Django's connection.cursor(), no Lease layer",
            ours_sql(connections["default"].cursor, "bench:bd-ours-django"),
            _django_backend_pid("default"),
        ),
        "ours": (
            "Lease.objects, Django defaults",
            via_manager("default", "bench:bd-ours"),
            _django_backend_pid("default"),
        ),
        "ours/prepared": (
            "Lease.objects, server_side_binding + prepare_threshold=5",
            via_manager("prepared", "bench:bd-ours-prep"),
            _django_backend_pid("prepared"),
        ),
        "ours-sql/django/PREPARE": (
            "ours' SQL as SQL-level PREPAREd statements, EXECUTE through Django's cursor "
            "(Django defaults)",
            sql_prepared("default", "bench:bd-sql-prepare"),
            _django_backend_pid("default"),
        ),
    }
    windows: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {"acquire_release": [], "renew": []} for name in variants
    }
    for _ in range(config.repeat):
        for name, (_, (cycle, renew, forget), pid) in variants.items():
            run_for(cycle, config.warmup)
            windows[name]["acquire_release"].append(timed(cycle, config.seconds, pid))
            forget()
            run_for(renew, config.warmup)
            windows[name]["renew"].append(timed(renew, config.seconds, pid))
    raw.close()
    floor.close()
    connections.close_all()
    return {
        "descriptions": {name: description for name, (description, _, _) in variants.items()},
        "repetitions": windows,
        "best": {
            name: {
                metric: {
                    "rate": max(w["rate"] for w in found[metric]),
                    **cheapest(found)[metric],
                }
                for metric in ("acquire_release", "renew")
            }
            for name, found in windows.items()
        },
    }


# -- main ----------------------------------------------------------------------------------------


DEFAULT_CONTENDERS = ",".join(SPECS)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark django-leases against a raw-SQL floor, django-pglock and Redis.",
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL),
        help="PostgreSQL (or MariaDB / MySQL: mysql://...) URL of the bench database, "
        "created if missing "
        "(default: $BENCH_DATABASE_URL or %(default)s)",
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS_URL),
        help="Redis URL for the redis contender (default: %(default)s)",
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds, discarded")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; the best is kept")
    parser.add_argument("--processes", type=int, default=8, help="contended processes")
    parser.add_argument("--ttl", type=float, default=30.0, help="lease TTL in seconds")
    parser.add_argument(
        "--contenders",
        default=DEFAULT_CONTENDERS,
        help="comma-separated subset of: " + ", ".join(SPECS) + " (floor is always run; "
        "on MariaDB / MySQL only floor and ours)",
    )
    add_settle_argument(parser)
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="JSON file to write (default: bench/results/leases-<date>-<HHMM>.json)",
    )
    parser.add_argument(
        "--profile",
        metavar="CONTENDER",
        default=None,
        help="instead of the benchmark, cProfile one Django contender (e.g. ours) and print stats",
    )
    parser.add_argument("--profile-top", type=int, default=25, help="rows of profile output")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="after the benchmark, peel ours apart: its SQL without the Lease layer, without "
        "Django, and as prepared statements",
    )
    parser.add_argument("--breakdown-only", action="store_true", help="run only the breakdown")
    parser.add_argument(
        "--candidate",
        metavar="TREE",
        action="append",
        default=[],
        help="also run 'candidate': ours imported from another source tree (a changed "
        "django_leases, e.g. a git worktree), on its own database <bench database>_candidate; "
        "repeat it to compare several trees in one run (a bisect): they are named "
        "candidate:<directory name>, on databases _candidate, _candidate2, …",
    )
    parser.add_argument(
        "--no-contended",
        action="store_true",
        help="skip the contended measurement (single-connection figures only, e.g. a bisect)",
    )
    parser.add_argument(
        "--held",
        type=int,
        default=1000,
        metavar="N",
        help="held-leases stage: one process holding N leases (0: skip; default %(default)s)",
    )
    parser.add_argument(
        "--held-ttl", type=float, default=30.0, help="TTL of the held leases, s (%(default)s)"
    )
    parser.add_argument(
        "--held-tree",
        metavar="TREE",
        action="append",
        default=[],
        help="also measure the held-leases stage with another tree's django_leases (repeatable)",
    )
    parser.add_argument(
        "--held-private-cluster",
        action="store_true",
        help="run the held-leases stage on a private PostgreSQL cluster with max_connections "
        "1300 (tests/pgcluster.py; needs PostgreSQL's server programs)",
    )
    parser.add_argument("--held-only", action="store_true", help="run only the held-leases stage")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.warmup < 0 or args.repeat < 1 or args.processes < 1:
        parser.error("--seconds must be > 0, --warmup >= 0, --repeat and --processes >= 1")
    args.candidates = []
    for number, candidate in enumerate(args.candidate, start=1):
        tree = str(Path(candidate).resolve())
        if not (Path(tree) / "django_leases" / "__init__.py").is_file():
            parser.error(f"--candidate {tree} has no django_leases package")
        name = "candidate" if len(args.candidate) == 1 else f"candidate:{Path(tree).name}"
        if name in SPECS:
            parser.error(f"two candidates named {name!r}: give the trees distinct names")
        SPECS[name] = Spec(
            name,
            "django",
            f"ours imported from {tree} (Django defaults, its own database)",
            role="option",
            tree=tree,
            database_suffix="_candidate" + ("" if number == 1 else str(number)),
        )
        args.candidates.append(name)
        args.contenders += f",{name}"
    if is_mysql(args.database_url):
        # MariaDB / MySQL: ours against the raw MySQLdb floor (the other contenders are
        # PostgreSQL's or Redis's).
        SPECS["floor"] = Spec(
            "floor",
            "mysqlfloor",
            "raw MySQLdb, one statement per operation on a minimal table, autocommit "
            "(INSERT … ON DUPLICATE KEY UPDATE … RETURNING, guarded UPDATEs)",
            role="floor",
        )
        for name in list(SPECS):
            if name not in ("floor", "ours", *args.candidates):
                del SPECS[name]
        if args.contenders.startswith(DEFAULT_CONTENDERS):
            args.contenders = ",".join(("floor", "ours", *args.candidates))
    chosen = [name.strip() for name in args.contenders.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(SPECS))
    if unknown:
        parser.error(f"unknown contenders: {', '.join(unknown)}")
    if "floor" not in chosen:
        chosen.insert(0, "floor")
    args.chosen = [name for name in SPECS if name in chosen]
    if args.profile is not None and args.profile not in SPECS:
        parser.error(f"unknown contender for --profile: {args.profile}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = Config(
        database_url=args.database_url,
        redis_url=args.redis_url,
        ttl=args.ttl,
        seconds=args.seconds,
        warmup=args.warmup,
        repeat=args.repeat,
    )
    context = mp.get_context("spawn")
    database = _run_in_child(context, _prepare_worker, config)
    for name in args.candidates:
        results = context.Queue()
        process = context.Process(target=_prepare_worker, args=(config, results, SPECS[name]))
        process.start()
        _collect([process], results, 600)
    if args.profile:
        process = context.Process(
            target=profile_worker, args=(SPECS[args.profile], config, args.profile_top)
        )
        process.start()
        process.join()
        return process.exitcode or 0

    redis_info = redis_facts(config) if "redis" in args.chosen else None
    settle(within=args.settle)
    machine = machine_facts()
    started = dt.datetime.now(dt.UTC)
    print(
        f"django-leases lease benchmark: "
        f"{'MariaDB/MySQL' if is_mysql(config.database_url) else 'PostgreSQL'} "
        f"{database['server_version']} at "
        f"{database['host']}:{database['port']}/{database['database']} (user {database['user']}), "
        f"Redis {redis_info['redis_version'] if redis_info else 'skipped'}; "
        f"{machine['cpu_count']} CPUs ({machine['cpu']}), Python {machine['python']}, "
        f"load average {machine.get('load_average_at_start', ['?'])[0]:.2f}"
    )
    print(
        f"every PostgreSQL contender: same database, one persistent autocommit connection per "
        f"process (Django: CONN_MAX_AGE=None, DEBUG=False); TTL {args.ttl:g} s; "
        f"{args.seconds:g} s per measurement after {args.warmup:g} s warm-up, "
        f"best of {args.repeat}; contended: {args.processes} processes, 1 key"
    )
    report: dict[str, Any] = {
        "benchmark": "django-leases leases",
        "started_at": started.isoformat(),
        "machine": machine,
        "versions": versions(("django-pglock", "redis", "mysqlclient")),
        ("mysql" if is_mysql(config.database_url) else "postgresql"): database,
        "redis": redis_info,
        "settings": {
            "seconds": args.seconds,
            "warmup": args.warmup,
            "repeat": args.repeat,
            "processes": args.processes,
            "ttl": args.ttl,
            "best_of": "each figure is the maximum over the repetitions",
            "connections": (
                "same database; one persistent autocommit connection per process for every "
                "PostgreSQL contender; Django contenders: CONN_MAX_AGE=None, DEBUG=False"
            ),
            "contenders": {name: SPECS[name].description for name in args.chosen},
            "roles": {name: SPECS[name].role for name in args.chosen},
            "django_options": {name: SPECS[name].django_options for name in args.chosen},
        },
        "units": {
            "acquire_release": "acquire+release cycles per second, 1 connection",
            "renew": "refreshes of a held lease per second, 1 connection",
            "contended_attempts": "acquire attempts per second, all processes together",
            "contended_grants": "granted acquires per second, all processes together",
            "wall_us": "wall-clock microseconds per operation",
            "client_cpu_us": "CPU microseconds per operation in the benchmark process",
            "server_cpu_us": (
                "CPU microseconds per operation in the server process serving the connection "
                "(PostgreSQL backend or redis-server, from /proc; null when not local)"
            ),
        },
    }
    if not args.breakdown_only and not args.held_only:
        report.update(run_contenders(args, config, context))
    if args.breakdown or args.breakdown_only:
        report["breakdown"] = run_breakdown(config, context)
    if args.held and not args.breakdown_only and not is_mysql(config.database_url):
        report["held"] = run_held(args, config, context)

    machine["load_average_at_end"] = load_average()
    report["finished_at"] = dt.datetime.now(dt.UTC).isoformat()
    vendor = "-mysql" if is_mysql(config.database_url) else ""
    stamp = started.strftime("%Y-%m-%d-%H%M")  # a second run the same day keeps the first
    output = args.output or RESULTS_DIR / f"leases{vendor}-{stamp}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    write_report(output, report)
    print(f"\nwrote {output}")
    return 0


def run_contenders(args: argparse.Namespace, config: Config, context: Any) -> dict[str, Any]:
    """The benchmark proper: every contender, every metric, interleaved repetitions."""
    for name in args.chosen:
        print(f"  {name:<24} {SPECS[name].description}")
    print()
    runs: dict[str, dict[str, list[float]]] = {
        name: {metric: [] for metric, _ in METRICS} for name in args.chosen
    }
    costs: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {"acquire_release": [], "renew": []} for name in args.chosen
    }
    counts: dict[str, dict[str, Any]] = {}
    for repetition in range(args.repeat):
        # Rotate the order so no contender always runs first (or last) in a repetition.
        shift = repetition % len(args.chosen)
        order = args.chosen[shift:] + args.chosen[:shift]
        for name in order:
            spec = SPECS[name]
            single = measure_single(spec, config)
            for metric in ("acquire_release", "renew"):
                if metric in single:
                    runs[name][metric].append(single[metric]["rate"])
                    costs[name][metric].append(single[metric])
            counts[name] = single["counts"]
            if args.no_contended:
                contended = {"attempts": float("nan"), "grants": float("nan")}
            else:
                contended = measure_contended(spec, config, args.processes)
                runs[name]["contended_attempts"].append(contended["attempts"])
                runs[name]["contended_grants"].append(contended["grants"])
            print(
                f"  [{repetition + 1}/{args.repeat}] {name:<24} "
                f"acquire+release {single['acquire_release']['rate']:7,.0f}/s  "
                f"renew {single.get('renew', {}).get('rate', float('nan')):7,.0f}/s  "
                f"contended {contended['attempts']:7,.0f} attempts/s "
                f"{contended['grants']:6,.0f} grants/s",
                flush=True,
            )

    figures = {name: {m: best(v) for m, v in metrics.items()} for name, metrics in runs.items()}
    ratios = ratios_to_floor(figures)

    cpu = {name: cheapest(found) for name, found in costs.items()}

    print()
    print(render_table(figures, ratios))
    print()
    print(render_counts(counts))
    print()
    print(render_cpu(cpu))
    ours = ratios.get("ours", {})
    if ours:
        verdicts = [
            f"{label} {ours[metric]:.2f}× ({'meets' if ours[metric] >= TARGET else 'below'} "
            f"the {TARGET}× target)"
            for metric, label in (("acquire_release", "acquire+release"), ("renew", "renewals"))
            if ours.get(metric) is not None
        ]
        print("\nours vs floor: " + "; ".join(verdicts))
    return {
        "figures": figures,
        "ratios_to_floor": ratios,
        "target": {"ours_vs_floor": TARGET, "metrics": ["acquire_release", "renew"]},
        "repetitions": runs,
        "statements_per_operation": counts,
        "cpu_per_operation": cpu,
        "cpu_repetitions": costs,
    }


def run_breakdown(config: Config, context: Any) -> dict[str, Any]:
    """Peel ours apart layer by layer (one process, variants interleaved); print and return."""
    result = _run_in_child(context, breakdown_worker, config)
    print(
        f"\nbreakdown (one process, variants interleaved, best of {config.repeat}; "
        "CPU µs per operation = client + server, lowest of the repetitions):"
    )
    best_figures = result["best"]
    floor = best_figures["floor"]

    def cell(found: dict[str, Any], base: dict[str, Any]) -> str:
        server = found["server_cpu_us"]
        cpu = f"{found['client_cpu_us']:4.0f}" + ("" if server is None else f" + {server:4.0f}")
        return f"{found['rate']:6,.0f}/s {found['rate'] / base['rate']:4.2f}× (CPU {cpu})"

    print("  " + "variant".ljust(40) + "acquire+release".ljust(36) + "renewal")
    for name, found in best_figures.items():
        print(
            "  "
            + name.ljust(40)
            + cell(found["acquire_release"], floor["acquire_release"]).ljust(36)
            + cell(found["renew"], floor["renew"])
        )
    for name, description in result["descriptions"].items():
        print(f"    {name:<40} {description}")
    return result


def cheapest(found: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per metric, the lowest CPU per operation seen over the repetitions (the least disturbed)."""
    result: dict[str, Any] = {}
    for metric, windows in found.items():
        if not windows:
            continue
        result[metric] = {
            part: min((w[part] for w in windows if w[part] is not None), default=None)
            for part in ("wall_us", "client_cpu_us", "server_cpu_us")
        }
    return result


def ratios_to_floor(figures: dict[str, dict[str, float | None]]) -> dict[str, Any]:
    floor = figures["floor"]
    ratios: dict[str, dict[str, float | None]] = {}
    for name, found in figures.items():
        ratios[name] = {}
        for metric, value in found.items():
            base = floor.get(metric)
            ratios[name][metric] = None if value is None or not base else value / base
    return ratios


# -- held leases -------------------------------------------------------------------------------


def _pss_kib(pid: int) -> int | None:
    """Proportional set size of process ``pid`` in KiB (``/proc/<pid>/smaps_rollup``)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def held_worker(database_url: str, tree: str | None, count: int, ttl: float, results: Any) -> None:
    """One process holding ``count`` leases (``hold_lease``, TTL ``ttl``) for two renewal
    intervals, with the django_leases of ``tree`` (``None``: this one); puts its figures."""
    try:
        if tree:
            sys.path.insert(0, tree)
        results.put(("ok", _held(database_url, count, ttl)))
    except BaseException as error:
        results.put(("error", f"{type(error).__name__}: {error}"))
        raise


def _held(database_url: str, count: int, ttl: float) -> dict[str, Any]:
    import threading
    from contextlib import ExitStack
    from unittest import mock

    import psycopg

    configure_django(database_url, {})
    import django_leases
    from django_leases import hold_lease
    from django_leases.models import LeaseQuerySet

    monitor = psycopg.connect(libpq_conninfo(database_url), autocommit=True)

    def backends() -> list[int]:
        rows = monitor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ).fetchall()
        return [int(pid) for (pid,) in rows]

    (table_exists,) = monitor.execute(
        "SELECT to_regclass('django_leases_lease') IS NOT NULL"
    ).fetchone()  # type: ignore[misc]
    if not table_exists:
        from tests.failover import install_schema

        install_schema("default")
    counted = {"statements": 0, "renewals": 0}
    lock = threading.Lock()
    real_refresh = LeaseQuerySet.refresh
    real_many = getattr(LeaseQuerySet, "refresh_many", None)

    def on_renewal_thread() -> bool:
        return threading.current_thread().name.startswith(("lease-renewal:", "lease-renewer:"))

    def refresh(queryset: Any, lease: Any, ttl: Any) -> Any:
        if on_renewal_thread():
            with lock:
                counted["statements"] += 1
                counted["renewals"] += 1
        return real_refresh(queryset, lease, ttl)

    def refresh_many(queryset: Any, held: Any) -> Any:
        if on_renewal_thread():
            with lock:
                counted["statements"] += 1
                counted["renewals"] += len(held)
        assert real_many is not None
        return real_many(queryset, held)

    interval = max(ttl / 3, 0.05)
    stamp = uuid.uuid4().hex[:8]
    patches = [mock.patch.object(LeaseQuerySet, "refresh", refresh)]
    if real_many is not None:
        patches.append(mock.patch.object(LeaseQuerySet, "refresh_many", refresh_many))
    with ExitStack() as patched:
        for patch in patches:
            patched.enter_context(patch)
        stack = ExitStack()
        holds = []
        started = time.monotonic()
        for number in range(count):
            holds.append(stack.enter_context(hold_lease(f"bench:held:{stamp}:{number}", ttl)))
        acquired_in = time.monotonic() - started
        pids = backends()
        with lock:
            counted.update(statements=0, renewals=0)
        ticks_before = _renewer_ticks()
        cpu_before = {pid: process_cpu_seconds(pid) for pid in pids}
        client_before = process_cpu_seconds(os.getpid())
        window_started = time.monotonic()
        most_threads = threading.active_count()
        most_connections = len(pids)
        while time.monotonic() - window_started < 2 * interval + 1:
            time.sleep(0.5)
            most_threads = max(most_threads, threading.active_count())
        window = time.monotonic() - window_started
        most_connections = max(most_connections, len(backends()))
        cpu_after = {pid: process_cpu_seconds(pid) for pid in pids}
        client_after = process_cpu_seconds(os.getpid())
        with lock:
            statements, renewals = counted["statements"], counted["renewals"]
        server_cpu = sum(
            (cpu_after[pid] or 0.0) - (before or 0.0)
            for pid, before in cpu_before.items()
            if cpu_after.get(pid) is not None
        )
        ticks = None if ticks_before is None else _renewer_ticks() - ticks_before
        cpu_loop = _renewal_cpu(holds, ttl)
        pss = [_pss_kib(pid) for pid in backends()]
        # A takeover of one lease by another holder, from the monitor's connection: how long
        # until its holder is told (bound: its next renewal, one interval).
        victim = holds[count // 2]
        monitor.execute(
            "UPDATE django_leases_lease SET holder = 'bench-thief', token = token + 1, "
            "renewed_at = statement_timestamp(), acquired_at = statement_timestamp(), "
            "expires_at = statement_timestamp() + interval '1 hour' WHERE key = %s",
            [victim.key],
        )
        taken = time.monotonic()
        told = victim.lost.wait(3 * interval + 10)
        seen_after = time.monotonic() - taken if told else None
        others_lost = sum(held.lost.is_set() for held in holds) - (1 if told else 0)
        closing = time.monotonic()
        with contextlib.suppress(Exception):
            stack.close()  # the victim's exit raises LeaseLostError
        closed_in = time.monotonic() - closing
    monitor.close()
    return {
        "django_leases": str(Path(django_leases.__file__).parent),
        "leases": count,
        "ttl": ttl,
        "renewal_interval": interval,
        "acquired_in_s": round(acquired_in, 2),
        "window_s": round(window, 2),
        "connections": most_connections,
        "threads": most_threads,
        "renewal_statements": statements,
        "lease_renewals": renewals,
        "renewer_ticks": ticks,
        "statements_per_tick": None if not ticks else statements / ticks,
        "statements_per_second": statements / window,
        "server_cpu_s": round(server_cpu, 3),
        "server_cpu_us_per_renewal_in_window": (
            None if not renewals else server_cpu / renewals * 1e6
        ),
        "server_cpu_us_per_renewal": cpu_loop["server_cpu_us_per_renewal"],
        "renewal_loop": cpu_loop,
        "client_cpu_us_per_renewal": (
            None
            if not renewals or client_before is None or client_after is None
            else (client_after - client_before) / renewals * 1e6
        ),
        "backends_pss_mib": round(sum(p for p in pss if p) / 1024, 1) if pss else None,
        "loss_seen_after_s": None if seen_after is None else round(seen_after, 3),
        "loss_bound_s": interval,
        "other_leases_lost": others_lost,
        "released_in_s": round(closed_in, 2),
        "load_average": load_average(),
    }


def _renewer_ticks() -> int | None:
    """The ticks this process's renewers have made (``None``: a tree without renewers)."""
    renewal_module = sys.modules.get("django_leases.renewal")
    renewers = getattr(renewal_module, "renewers", None)
    return None if renewers is None else sum(r.ticks for r in renewers())


def _renewal_cpu(holds: list[Any], ttl: float, seconds: float = 4.0) -> dict[str, Any]:
    """Server CPU per lease renewal the way the tree renews: ``refresh_many`` of every held
    lease at once where it has it, else ``refresh`` of one lease per statement, in a loop on
    this thread's connection for ``seconds`` (the renewer's own ticks are too few for the
    10 ms resolution of ``/proc``)."""
    from django.db import connection

    from django_leases.models import Lease

    leases = Lease.objects
    batch = hasattr(leases, "refresh_many")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = int(cursor.fetchone()[0])
    renewed = 0
    server_before, client_before = process_cpu_seconds(pid), process_cpu_seconds(os.getpid())
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if batch:
            answers = leases.refresh_many([(held.lease, ttl) for held in holds])
            renewed += sum(answer is not None for answer in answers)
        else:
            for held in holds[:200]:
                renewed += leases.refresh(held.lease, ttl) is not None
    elapsed = time.monotonic() - started
    server_after, client_after = process_cpu_seconds(pid), process_cpu_seconds(os.getpid())
    server = None if server_before is None or server_after is None else server_after - server_before
    client = None if client_before is None or client_after is None else client_after - client_before
    return {
        "method": "refresh_many (all held leases per statement)" if batch else "refresh (one each)",
        "seconds": round(elapsed, 2),
        "lease_renewals": renewed,
        "server_cpu_us_per_renewal": None
        if server is None or not renewed
        else server / renewed * 1e6,
        "client_cpu_us_per_renewal": None
        if client is None or not renewed
        else client / renewed * 1e6,
        "wall_us_per_renewal": elapsed / renewed * 1e6 if renewed else None,
    }


def run_held(args: argparse.Namespace, config: Config, context: Any) -> dict[str, Any]:
    """The held-leases stage for this tree and each ``--held-tree``; prints and returns."""
    trees: list[tuple[str, str | None]] = [("ours", None)]
    trees += [(f"tree:{Path(tree).name}", str(Path(tree).resolve())) for tree in args.held_tree]
    found: dict[str, Any] = {}
    with contextlib.ExitStack() as cleanup:
        database_url = config.database_url
        if args.held_private_cluster:
            database_url = cleanup.enter_context(_private_cluster())
        for name, tree in trees:
            settle(within=args.settle)
            results = context.Queue()
            process = context.Process(
                target=held_worker, args=(database_url, tree, args.held, args.held_ttl, results)
            )
            process.start()
            found[name] = _collect([process], results, 900)[0]
    print(f"\nheld leases: one process, {args.held} leases, TTL {args.held_ttl:g} s")
    rows = (
        ("connections", "connections", "{:.0f}"),
        ("threads", "threads", "{:.0f}"),
        ("statements_per_second", "renewal statements/s", "{:.1f}"),
        ("statements_per_tick", "statements per tick", "{:.2f}"),
        ("server_cpu_us_per_renewal", "server CPU µs per renewed lease", "{:.1f}"),
        ("client_cpu_us_per_renewal", "client CPU µs per renewed lease", "{:.1f}"),
        ("backends_pss_mib", "server processes' PSS, MiB", "{:.1f}"),
        ("loss_seen_after_s", "a lost lease seen after, s", "{:.2f}"),
        ("loss_bound_s", "  (bound: one renewal interval, s)", "{:.2f}"),
        ("other_leases_lost", "other leases lost", "{:.0f}"),
        ("load_average", "load average (1 min)", "{:.2f}"),
    )
    print("  " + "".ljust(36) + "".join(name.rjust(14) for name in found))
    for key, label, form in rows:
        cells = []
        for figures in found.values():
            value = figures.get(key)
            if isinstance(value, list):
                value = value[0]
            cells.append("n/a" if value is None else form.format(value))
        print("  " + label.ljust(36) + "".join(cell.rjust(14) for cell in cells))
    return found


@contextlib.contextmanager
def _private_cluster() -> Any:
    """A private PostgreSQL cluster (``max_connections`` 1,300) with a database ``bench``;
    yields its URL, stops and removes it after."""
    from tests.pgcluster import Clusters, server_bindir

    bindir = server_bindir(None)
    if bindir is None:
        raise BenchError("no PostgreSQL server programs for --held-private-cluster")
    with Clusters(bindir) as clusters:
        cluster = clusters.primary("held").start(
            {"max_connections": "1300", "shared_buffers": "'256MB'"}
        )
        cluster.execute("CREATE DATABASE bench")
        yield f"postgres://postgres@127.0.0.1:{cluster.port}/bench"


def _prepare_worker(config: Config, results: Any, spec: Spec | None = None) -> None:
    try:
        if spec is not None:
            spec.enter()
            config = Config(
                spec.database_url(config),
                config.redis_url,
                config.ttl,
                config.seconds,
                config.warmup,
                config.repeat,
            )
        results.put(("ok", prepare_database(config)))
    except BaseException as error:
        results.put(("error", f"{type(error).__name__}: {error}"))
        raise


def _run_in_child(context: Any, target: Callable[..., None], *args: Any) -> Any:
    """Run ``target(*args, queue)`` in a fresh process and return what it put on the queue."""
    results = context.Queue()
    process = context.Process(target=target, args=(*args, results))
    process.start()
    return _collect([process], results, 600)[0]


if __name__ == "__main__":
    sys.exit(main())

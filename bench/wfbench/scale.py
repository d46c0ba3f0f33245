"""The workflow benchmark's scale stage: tables filled as a long-lived deployment leaves them.

:func:`ensure_filled` fills the django_leases tables of a bench-only database with ``runs``
finished runs shaped as the engine leaves a one-step run of ``bench-noop`` (the drain's own
shape): the run ``completed`` with its JSON ``null`` output and no pass due, its step
``succeeded`` after one attempt, the attempt row, and the run lease ``workflow-run:<id>``
released at the completion. Run ids are version 7 UUIDs (``django_leases.ids``: 48 bits of
Unix milliseconds, version 7, 12 bits of counter, the variant, random bits), created over the
90 days before the fill, one after another, so the rows sit in the tables and their indexes
in time order as they would have arrived. The fill is server-side (``INSERT … SELECT`` over
``generate_series``, in batches, foreign-key triggers off for the session as a restore does),
followed by ``VACUUM (ANALYZE)`` of each table, as autovacuum would have left them.

The database is kept between runs: a marker table, ``bench_scale_fill``, records how many runs
it holds, the django_leases migrations it was filled under, when, and how long the fill took.
A later run with the same size and migrations deletes whatever was added after the fill (the
drains' runs) and vacuums instead of filling again.

:func:`table_stats` reads ``pg_stat_user_tables`` (updates, HOT updates, inserts), once the
counters have settled; :func:`hot_shares` turns two readings into the HOT share per table.
:func:`capture_plans` runs units of work of ours' worker in this process with ``auto_explain``
loaded into the connection (nested statements, ``ANALYZE``, ``BUFFERS``, sent back as
notices), so the plans are those the PL/pgSQL functions' plan cache actually uses.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

#: The spread of the filled runs' creation times: the 90 days before the fill.
FILL_DAYS = 90
#: Runs inserted per statement (each batch its own transaction).
FILL_BATCH = 250_000
#: The marker table the fill leaves in the bench database.
MARKER = "bench_scale_fill"
#: Offsets in milliseconds from a run's creation, as a real one-step run's rows have them:
#: the pick (run lease acquired), the step inserted already claimed, the completion.
PICKED_MS, STEP_MS, DONE_MS = 37, 48, 57

# One run per ``i``: its id is a version 7 UUID of millisecond ``ms``, the rest of the bits
# from md5(i) (so the step, attempt and lease rows recompute the same id).
UUID7_FUNCTION = """
CREATE OR REPLACE FUNCTION bench_fill_uuid7(ms bigint, i bigint) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (lpad(to_hex(ms), 12, '0') || '7' || substr(h, 1, 3)
            || substr('89ab', 1 + get_byte(decode(substr(h, 4, 2), 'hex'), 0) % 4, 1)
            || substr(h, 6, 3) || substr(h, 9, 12))::uuid
    FROM (SELECT md5('bench-fill:' || i::text) AS h) AS r
$$
"""

# The batch's runs: ``i`` from %(low)s to %(high)s, created at ``start_ms + i * spacing_ms``.
RUNS = """
WITH src AS (
    SELECT i, ms, bench_fill_uuid7(ms, i) AS id, to_timestamp(ms / 1000.0) AS t
    FROM (SELECT i, %(start_ms)s::bigint + (i * %(spacing_ms)s)::bigint AS ms
          FROM generate_series(%(low)s::bigint, %(high)s::bigint) AS i) AS g
), runs AS (
    INSERT INTO django_leases_workflowrun (
        id, workflow, status, input, output, error, pass_due_at, pass_requests,
        created_at, updated_at, finished_at, key, parent_id, branches_left)
    SELECT id, 'bench-noop', 'completed', '{}'::jsonb, 'null'::jsonb, NULL, NULL, 1,
           t, t + interval '%(done)s ms', t + interval '%(done)s ms', NULL, NULL, 0
    FROM src ORDER BY i
), steps AS (
    INSERT INTO django_leases_workflowstep (
        id, step_name, function_name, data, status, result, error, attempt, retries,
        retry_delay, lease_expires_at, available_at, created_at, updated_at, run_id,
        deadline_at, timeout, priority, queue)
    SELECT i, 'noop', 'bench.noop', '{}'::jsonb, 'succeeded', 'null'::jsonb, NULL, 1, 5,
           0.0, NULL, t + interval '%(step)s ms', t + interval '%(step)s ms',
           t + interval '%(done)s ms', id, NULL, NULL, 0, 'default'
    FROM src ORDER BY i
), attempts AS (
    INSERT INTO django_leases_workflowstepattempt (
        id, attempt, status, result, error, started_at, finished_at, step_id)
    SELECT i, 1, 'succeeded', 'null'::jsonb, NULL, t + interval '%(step)s ms',
           t + interval '%(done)s ms', i
    FROM src ORDER BY i
)
INSERT INTO django_leases_lease (
    id, key, holder, token, expires_at, acquired_at, renewed_at, released_at)
SELECT i, 'workflow-run:' || id::text,
       'vm:' || (11000 + i %% 4)::text || ':' || substr(md5('holder:' || i::text), 1, 16), 1,
       t + interval '%(done)s ms', t + interval '%(picked)s ms', t + interval '%(picked)s ms',
       t + interval '%(done)s ms'
FROM src ORDER BY i
"""

#: The tables the fill writes, in the order rows are deleted.
TABLES = (
    "django_leases_workflowstepattempt",
    "django_leases_workflowstep",
    "django_leases_lease",
    "django_leases_workflowrun",
)

# What a later run added (the drains' runs, their steps, attempts and leases).
DELETE_ADDED = (
    "DELETE FROM django_leases_workflowstepattempt a USING django_leases_workflowstep s "
    "WHERE a.step_id = s.id AND s.id > %(runs)s",
    "DELETE FROM django_leases_workflowstepattempt WHERE id > %(runs)s",
    "DELETE FROM django_leases_workflowstep WHERE id > %(runs)s",
    "DELETE FROM django_leases_lease WHERE id > %(runs)s",
    "DELETE FROM django_leases_workflowwait w USING django_leases_workflowrun r "
    "WHERE w.run_id = r.id AND r.created_at > %(filled_at)s",
    "DELETE FROM django_leases_workflowrun WHERE created_at > %(filled_at)s",
)


def _connect(conninfo: str) -> Any:
    import psycopg

    return psycopg.connect(conninfo, autocommit=True)


def vacuum_analyze(conninfo: str, tables: Iterable[str] = TABLES) -> float:
    """``VACUUM (ANALYZE)`` each of ``tables``; the seconds it took."""
    began = time.perf_counter()
    with _connect(conninfo) as connection:
        for table in tables:
            connection.execute(f"VACUUM (ANALYZE) {table}")
    return time.perf_counter() - began


def marker(conninfo: str) -> dict[str, Any] | None:
    """What the last fill of this database recorded, or ``None`` (never filled)."""
    with _connect(conninfo) as connection:
        found = connection.execute("SELECT to_regclass(%s) IS NOT NULL", (MARKER,)).fetchone()
        if not found or not found[0]:
            return None
        row = connection.execute(
            f"SELECT runs, migrations, filled_at, fill_seconds FROM {MARKER}"
        ).fetchone()
    if row is None:
        return None
    return {"runs": row[0], "migrations": row[1], "filled_at": row[2], "fill_seconds": row[3]}


def applied_migrations(conninfo: str) -> str:
    """The django_leases migrations applied to this database, in order, one string."""
    with _connect(conninfo) as connection:
        found = connection.execute(
            "SELECT string_agg(name, ',' ORDER BY id) FROM django_migrations "
            "WHERE app = 'django_leases'"
        ).fetchone()
    return str(found[0] if found else "")


def fill(conninfo: str, runs: int, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Fill the (freshly migrated, empty) django_leases tables with ``runs`` finished runs.

    Returns the marker written: ``runs``, ``migrations``, ``filled_at``, ``fill_seconds``
    (insert) and ``vacuum_seconds``.
    """
    now_ms = int(time.time() * 1000)
    spacing = FILL_DAYS * 86_400_000 / max(runs, 1)
    start_ms = now_ms - int(runs * spacing) - 3_600_000  # the last an hour before the fill
    began = time.perf_counter()
    with _connect(conninfo) as connection:
        connection.execute(UUID7_FUNCTION)
        # Foreign-key checks off for this session, as pg_restore does: the rows are built
        # consistent, and a million deferred checks would dominate the fill.
        connection.execute("SET session_replication_role = replica")
        connection.execute("SET synchronous_commit = off")
        for low in range(1, runs + 1, FILL_BATCH):
            high = min(runs, low + FILL_BATCH - 1)
            with connection.transaction():
                connection.execute(
                    RUNS,
                    {
                        "low": low,
                        "high": high,
                        "start_ms": start_ms,
                        "spacing_ms": spacing,
                        "picked": PICKED_MS,
                        "step": STEP_MS,
                        "done": DONE_MS,
                    },
                )
            progress(f"  filled {high:,} of {runs:,} runs ({time.perf_counter() - began:.0f} s)")
        for table in TABLES[:3]:
            connection.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                f"greatest((SELECT max(id) FROM {table}), 1))"
            )
        connection.execute("RESET session_replication_role")
    inserted = time.perf_counter() - began
    vacuumed = vacuum_analyze(conninfo)
    migrations = applied_migrations(conninfo)
    with _connect(conninfo) as connection:
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {MARKER} (runs bigint NOT NULL, migrations text NOT "
            "NULL, filled_at timestamptz NOT NULL, fill_seconds double precision NOT NULL, "
            "vacuum_seconds double precision NOT NULL)"
        )
        connection.execute(f"TRUNCATE {MARKER}")
        row = connection.execute(
            f"INSERT INTO {MARKER} VALUES (%s, %s, statement_timestamp(), %s, %s) "
            "RETURNING filled_at",
            (runs, migrations, inserted, vacuumed),
        ).fetchone()
    return {
        "runs": runs,
        "migrations": migrations,
        "filled_at": row[0] if row else None,
        "fill_seconds": inserted,
        "vacuum_seconds": vacuumed,
    }


def trim_to_fill(conninfo: str, found: dict[str, Any]) -> float:
    """Delete what was added to a filled database after its fill (earlier runs' drains),
    then vacuum; the seconds it took."""
    began = time.perf_counter()
    with _connect(conninfo) as connection, connection.transaction():
        for statement in DELETE_ADDED:
            connection.execute(statement, found)
    vacuum_analyze(conninfo, (*TABLES, "django_leases_workflowwait"))
    return time.perf_counter() - began


def sizes(conninfo: str, tables: Iterable[str] = TABLES) -> dict[str, dict[str, Any]]:
    """Rows (the planner's estimate) and total size in bytes (indexes included) per table."""
    out = {}
    with _connect(conninfo) as connection:
        for table in tables:
            row = connection.execute(
                "SELECT c.reltuples::bigint, pg_total_relation_size(c.oid), "
                "pg_indexes_size(c.oid) FROM pg_class c WHERE c.oid = %s::regclass",
                (table,),
            ).fetchone()
            if row:
                out[table] = {"rows": row[0], "bytes": row[1], "index_bytes": row[2]}
    return out


# -- HOT updates --------------------------------------------------------------------------------


def _read_stats(scalar_rows: Callable[..., list[tuple[Any, ...]]], tables: list[str]) -> dict:
    found = scalar_rows(
        "SELECT relname, n_tup_upd, n_tup_hot_upd, n_tup_ins, n_tup_del "
        "FROM pg_stat_user_tables WHERE relname = ANY(%s)",
        (tables,),
    )
    return {
        name: {"updates": upd, "hot_updates": hot, "inserts": ins, "deletes": dele}
        for name, upd, hot, ins, dele in found
    }


def table_stats(
    rows: Callable[..., list[tuple[Any, ...]]], tables: list[str], settle: float = 1.2
) -> dict[str, dict[str, int]]:
    """``pg_stat_user_tables``' counters of ``tables``, read again every ``settle`` seconds
    until two readings agree (a backend reports its counters up to a second after it goes
    idle), at most five times."""
    rows("SELECT pg_stat_clear_snapshot()")
    found = _read_stats(rows, tables)
    for _ in range(5):
        time.sleep(settle)
        rows("SELECT pg_stat_clear_snapshot()")
        again = _read_stats(rows, tables)
        if again == found:
            break
        found = again
    return found


def hot_shares(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
) -> dict[str, dict[str, Any]]:
    """Per table: updates, HOT updates and inserts between two readings, and the HOT share
    (HOT updates ÷ updates; ``None`` without updates)."""
    out = {}
    for table, now in after.items():
        then = before.get(table, {})
        delta = {key: now[key] - then.get(key, 0) for key in now}
        delta["hot_share"] = (
            delta["hot_updates"] / delta["updates"] if delta["updates"] > 0 else None
        )
        out[table] = delta
    return out


# -- plans ---------------------------------------------------------------------------------------


def _walk(node: dict[str, Any], depth: int, lines: list[str], scans: list[dict[str, Any]]) -> None:
    kind = node.get("Node Type", "?")
    label = kind
    if node.get("Operation"):
        label += f" ({node['Operation']})"
    if node.get("Index Name"):
        label += f" using {node['Index Name']}"
    if node.get("Relation Name"):
        label += f" on {node['Relation Name']}"
    if node.get("CTE Name"):
        label += f" [{node['CTE Name']}]"
    if node.get("Subplan Name"):
        label = f"{node['Subplan Name']}: {label}"
    details = []
    for key in ("Index Cond", "Filter", "Recheck Cond", "One-Time Filter"):
        if node.get(key):
            details.append(f"{key.lower()} {node[key]}")
    rows = node.get("Actual Rows")
    loops = node.get("Actual Loops")
    hit = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
    line = f"{'  ' * depth}{label}  (rows {rows}, loops {loops}, buffers {hit}"
    if node.get("Rows Removed by Filter"):
        line += f", removed by filter {node['Rows Removed by Filter']}"
    line += ")"
    if details:
        line += "  " + "; ".join(details)
    lines.append(line)
    if kind in ("Index Scan", "Index Only Scan", "Bitmap Index Scan", "Seq Scan"):
        scans.append(
            {
                "scan": kind,
                "index": node.get("Index Name"),
                "table": node.get("Relation Name"),
                "index_cond": node.get("Index Cond"),
                "filter": node.get("Filter"),
                "rows": rows,
                "loops": loops,
                "removed_by_filter": node.get("Rows Removed by Filter", 0),
                "buffers": hit,
            }
        )
    for child in node.get("Plans", ()):
        _walk(child, depth + 1, lines, scans)


def summarise_plan(message: str) -> dict[str, Any]:
    """One ``auto_explain`` notice (JSON format): the query, its duration (ms), the plan
    drawn as indented text, its scans (kind, index, table, conditions, rows, buffers) and the
    top node's shared buffers (hit + read)."""
    head, _, body = message.partition("plan:")
    duration = re.search(r"duration: ([\d.]+) ms", head)
    plan = json.loads(body)
    top = plan.get("Plan", {})
    lines: list[str] = []
    scans: list[dict[str, Any]] = []
    _walk(top, 0, lines, scans)
    return {
        "query": " ".join(str(plan.get("Query Text", "")).split()),
        "duration_ms": float(duration.group(1)) if duration else None,
        "top_buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
        "plan": lines,
        "scans": scans,
    }


def capture_plans(action: Callable[[], Any]) -> list[dict[str, Any]]:
    """Run ``action`` with ``auto_explain`` on the harness's connection (every statement,
    ``ANALYZE``, ``BUFFERS``, the nested statements of functions included, sent back as
    notices); the plans it produced, in order (see :func:`summarise_plan`)."""
    from django.db import connection

    connection.ensure_connection()
    raw = connection.connection
    found: list[str] = []

    def keep(diagnostic: Any) -> None:
        message = diagnostic.message_primary or ""
        if "plan:" in message:
            found.append(message)

    with connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        for setting, value in (
            ("auto_explain.log_min_duration", "0"),
            ("auto_explain.log_analyze", "on"),
            ("auto_explain.log_buffers", "on"),
            ("auto_explain.log_timing", "on"),
            ("auto_explain.log_nested_statements", "on"),
            ("auto_explain.log_format", "json"),
            ("auto_explain.log_level", "notice"),
            ("client_min_messages", "notice"),
        ):
            cursor.execute(f"SET {setting} = '{value}'")
    raw.add_notice_handler(keep)
    try:
        action()
    finally:
        raw.remove_notice_handler(keep)
        with connection.cursor() as cursor:
            cursor.execute("SET auto_explain.log_min_duration = -1")
            cursor.execute("RESET client_min_messages")
    return [summarise_plan(message) for message in found]

"""One-off check: is "find due work" an index scan with a million workflow steps on PostgreSQL?

Not a test and not part of ``make bench``: it creates a scratch database, migrates it, fills
it with 250 000 runs and 1 000 000 steps (and as many attempt rows) shaped like a long-lived
deployment — almost everything finished, a few runs in flight — then captures the exact SQL
the worker sends to find work (``WorkflowStep.objects.claim_due``,
``WorkflowRun.objects.claim_due_pass``, ``WorkflowRun.objects.work_due_within``) and runs
``EXPLAIN (ANALYZE, BUFFERS)`` on each SELECT, inside a transaction that is rolled back.
It prints the plans and says whether any of them reads a workflow table sequentially.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/django_leases \\
        .venv/bin/python bench/explain_workflow_due_work.py [--keep]

The scratch database is ``<name>_explain_due_work``; it is dropped at the end unless
``--keep``. Two cases are explained: an idle system (nothing due: the query every idle
worker thread sends each poll interval) and one with a handful of due steps and passes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
RUNS = 250_000
STEPS_PER_RUN = 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="Keep the scratch database.")
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/django_leases")
    parsed = urlparse(url)
    if not parsed.scheme.startswith("postgres"):
        print("DATABASE_URL must name a PostgreSQL database", file=sys.stderr)
        return 2
    scratch = (parsed.path.lstrip("/") or "django_leases") + "_explain_due_work"
    admin_url = urlunparse(parsed._replace(path="/postgres"))

    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{scratch}"')
        conn.execute(f'CREATE DATABASE "{scratch}"')
    os.environ["DATABASE_URL"] = urlunparse(parsed._replace(path="/" + scratch))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
    sys.path.insert(0, str(ROOT))
    try:
        return explain(scratch)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{scratch}"')


def explain(scratch: str) -> int:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from django_leases.models import WorkflowRun, WorkflowStep

    call_command("migrate", "django_leases", verbosity=0)
    started = time.monotonic()
    fill(connection)
    print(f"filled {scratch} in {time.monotonic() - started:.0f} s")
    with connection.cursor() as cursor:
        for table in ("workflowrun", "workflowstep", "workflowstepattempt"):
            cursor.execute(f"SELECT count(*) FROM django_leases_{table}")
            print(f"  django_leases_{table}: {cursor.fetchone()[0]:,} rows")

    seq_scans: list[str] = []
    for case in ("idle", "some work due"):
        if case == "some work due":
            make_some_work_due(connection)
        print(f"\n=== {case} ===")
        with transaction.atomic(), CaptureQueriesContext(connection) as captured:
            WorkflowStep.objects.claim_due(60)
            WorkflowRun.objects.claim_due_pass(60)
            WorkflowRun.objects.work_due_within(1.0)
            transaction.set_rollback(True)
        selects = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("SELECT")]
        for sql in selects:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql)
                plan = "\n".join(row[0] for row in cursor.fetchall())
                transaction.set_rollback(True)
            print("\n-- " + " ".join(sql.split())[:300])
            print(plan)
            for line in plan.splitlines():
                if "Seq Scan on django_leases_workflow" in line:
                    seq_scans.append(line.strip())
    print()
    if seq_scans:
        print("SEQUENTIAL SCANS:", *seq_scans, sep="\n  ")
        return 1
    print("every due-work query reads the workflow tables through an index")
    return 0


def fill(connection: object) -> None:
    """250k runs (≈99% completed, some failed / cancelled / suspended, 1000 running), 4 steps
    each (1M), one attempt row per step; ANALYZE at the end."""
    from django.db import connection as conn

    total_steps = RUNS * STEPS_PER_RUN
    with conn.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO django_leases_workflowrun
                (id, workflow, status, input, output, error, pass_due_at, pass_requests,
                 created_at, updated_at, finished_at)
            SELECT md5('run' || g)::uuid,
                   'wf-' || (g %% 20),
                   CASE WHEN g <= 1000 THEN 'running'
                        WHEN g %% 97 = 0 THEN 'failed'
                        WHEN g %% 89 = 0 THEN 'cancelled'
                        WHEN g %% 83 = 0 THEN 'suspended'
                        ELSE 'completed' END,
                   '{}'::jsonb, NULL, NULL, NULL, g %% 7 + 1,
                   now() - (g || ' seconds')::interval, now(), now()
            FROM generate_series(1, %s) AS g
            """,
            [RUNS],
        )
        # Step n of run g. Completed runs: all succeeded. Running runs: steps 1-3 succeeded,
        # step 4 running under a live lease. Failed: step 4 failed on its last attempt.
        # Cancelled / suspended: step 4 failed with no due time.
        cursor.execute(
            """
            INSERT INTO django_leases_workflowstep
                (run_id, step_name, function_name, data, status, result, error, attempt,
                 retries, retry_delay, lease_expires_at, available_at, created_at, updated_at)
            SELECT md5('run' || r)::uuid,
                   'step-' || n,
                   'fn-' || n,
                   '{}'::jsonb,
                   CASE WHEN n < 4 THEN 'succeeded'
                        WHEN r <= 1000 THEN 'running'
                        WHEN r %% 97 = 0 OR r %% 89 = 0 OR r %% 83 = 0 THEN 'failed'
                        ELSE 'succeeded' END,
                   '1'::jsonb, NULL, 1, 5, 0,
                   CASE WHEN n = 4 AND r <= 1000 THEN now() + interval '1 hour' END,
                   NULL,
                   now(), now()
            FROM generate_series(0, %s - 1) AS s,
                 LATERAL (SELECT s / 4 + 1 AS r, s %% 4 + 1 AS n) AS k
            """,
            [total_steps],
        )
        cursor.execute(
            """
            INSERT INTO django_leases_workflowstepattempt
                (step_id, attempt, status, result, error, started_at, finished_at)
            SELECT id, 1, CASE status WHEN 'running' THEN 'running' WHEN 'failed' THEN 'failed'
                                      ELSE 'succeeded' END,
                   result, error, now(), now()
            FROM django_leases_workflowstep
            """
        )
        cursor.execute(
            "ANALYZE django_leases_workflowrun, django_leases_workflowstep, "
            "django_leases_workflowstepattempt"
        )


def make_some_work_due(connection: object) -> None:
    """Ten pending steps due now, five lapsed step leases, ten runs due for a pass."""
    from django.db import connection as conn

    with conn.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO django_leases_workflowstep
                (run_id, step_name, function_name, data, status, attempt, retries,
                 retry_delay, available_at, created_at, updated_at)
            SELECT md5('run' || g)::uuid, 'step-5', 'fn-5', '{}'::jsonb, 'pending', 1, 5, 0,
                   now(), now(), now()
            FROM generate_series(1, 10) AS g
            """
        )
        cursor.execute(
            "UPDATE django_leases_workflowstep SET lease_expires_at = now() - interval '1 s' "
            "WHERE status = 'running' AND run_id IN "
            "(SELECT md5('run' || g)::uuid FROM generate_series(11, 15) AS g)"
        )
        cursor.execute(
            "UPDATE django_leases_workflowrun SET pass_due_at = now() "
            "WHERE id IN (SELECT md5('run' || g)::uuid FROM generate_series(21, 30) AS g)"
        )


if __name__ == "__main__":
    raise SystemExit(main())

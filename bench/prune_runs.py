"""Pruning finished runs with their children on PostgreSQL (``WorkflowRun.objects.prune``).

Not part of ``make bench``: it recreates a scratch database (``django_leases_bench_prune``),
migrates it and fills it with ``--families`` (100 000) finished families: a parent that read
its child through a ``run.child`` wait, both finished 40 days ago; and as many again finished
an hour ago, which a 30-day prune keeps (with their child waits: every child wait in the
table is one the prune's "no run reads it as a child" test looks at). Then it runs
``prune(30 days, batch_size=--batch)`` and reports the time, the statements it sent, and
the plan and time of its first choice of a batch (``EXPLAIN ANALYZE`` of that ``SELECT``).
Parents go in their batches, their children a batch later. The load average is printed
beside the figures and written with them to ``bench/results/prune-runs-<date>-<HHMM>.json``.

    .venv/bin/python bench/prune_runs.py [--families 100000] [--batch 500]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    RESULTS_DIR,
    add_settle_argument,
    load_average,
    machine_facts,
    recreate_database,
    settle,
    write_report,
)

DATABASE_URL = "postgres://postgres@127.0.0.1:5432/django_leases_bench_prune"
DAY = 86_400.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", type=int, default=100_000, help="Old families (100000).")
    parser.add_argument("--batch", type=int, default=500, help="prune's batch_size (500).")
    add_settle_argument(parser)
    args = parser.parse_args()
    url = os.environ.get("BENCH_PRUNE_DATABASE_URL", DATABASE_URL)
    scratch = recreate_database(url)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from django_leases.models import WorkflowRun

    call_command("migrate", verbosity=0)
    begin = time.monotonic()
    fill(args.families)
    filled = time.monotonic() - begin
    total = WorkflowRun.objects.count()
    print(f"filled {scratch}: {total:,} runs, {2 * args.families:,} child waits, {filled:.0f} s")
    load = settle(within=args.settle)
    first: dict[str, Any] = {}
    statements = 0
    choosing = 0.0  # seconds in the statements that choose a batch

    def watch(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal statements, choosing
        statements += 1
        chooses = sql.startswith("SELECT") and "NOT (EXISTS" in sql
        if chooses and not first:
            begin = time.perf_counter()
            execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params, many, context)
            first["plan"] = [row[0] for row in context["cursor"].fetchall()]
            first["explain_ms"] = (time.perf_counter() - begin) * 1000
        begin = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            if chooses:
                choosing += time.perf_counter() - begin

    begin = time.perf_counter()
    with connection.execute_wrapper(watch):
        pruned = WorkflowRun.objects.prune(30 * DAY, batch_size=args.batch)
    seconds = time.perf_counter() - begin
    after = load_average()
    left = WorkflowRun.objects.count()
    print(f"load average {load} → {after}")
    print(
        f"prune(30 days, batch_size={args.batch}): {pruned:,} runs in {seconds:.1f} s "
        f"({seconds / max(pruned, 1) * 1e6:.0f} µs a run), {statements:,} statements; "
        f"{left:,} runs kept; {choosing:.1f} s of it choosing the batches"
    )
    print(f"first choice of a batch, EXPLAIN ANALYZE: {first.get('explain_ms', 0):.0f} ms")
    for line in first.get("plan", []):
        print("   ", line)
    report = {
        "benchmark": "prune_runs",
        "families": args.families,
        "batch_size": args.batch,
        "runs": total,
        "fill_seconds": filled,
        "pruned": pruned,
        "kept": left,
        "seconds": seconds,
        "statements": statements,
        "choosing_seconds": choosing,
        "first_batch_explain_ms": first.get("explain_ms"),
        "first_batch_plan": first.get("plan"),
        "load_average_before": load,
        "load_average_after": after,
        "machine": machine_facts(),
    }
    path = RESULTS_DIR / f"prune-runs-{datetime.now():%Y-%m-%d-%H%M}.json"
    write_report(path, report)
    print(f"written to {path.relative_to(ROOT)}")
    return 0


def fill(families: int) -> None:
    """``families`` old families and as many recent ones (parent, child, the parent's child
    wait), in three statements; ANALYZE."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO django_leases_workflowrun
                (id, workflow, status, input, pass_requests, branches_left, parent_id,
                 created_at, updated_at, finished_at)
            SELECT md5(kind || g)::uuid, 'wf', 'completed', '{}'::jsonb, 1, 0,
                   CASE kind WHEN 'child' THEN md5('parent' || g)::uuid END,
                   now() - interval '41 days', now(),
                   now() - CASE WHEN g %% 2 = 0 THEN interval '40 days' ELSE interval '1 hour' END
            FROM generate_series(1, 2 * %s) AS g, (VALUES ('parent'), ('child')) AS k(kind)
            ORDER BY kind DESC
            """,
            [families],
        )
        cursor.execute(
            """
            INSERT INTO django_leases_workflowwait
                (run_id, name, kind, status, child_id, reached_at, done_at, created_at)
            SELECT md5('parent' || g)::uuid, 'kid', 'child', 'done', md5('child' || g)::uuid,
                   now() - interval '41 days', now() - interval '40 days',
                   now() - interval '41 days'
            FROM generate_series(1, 2 * %s) AS g
            """,
            [families],
        )
        cursor.execute("VACUUM ANALYZE django_leases_workflowrun")
        cursor.execute("VACUUM ANALYZE django_leases_workflowwait")


if __name__ == "__main__":
    raise SystemExit(main())

"""``workflow_runs check-replay`` on many live runs: is it fast enough for a CI job?

Fills a database of its own (``django_leases_bench_replay`` on the PostgreSQL server of
``--database-url``; dropped and recreated on every run) with ``--runs`` live runs of one
workflow, each having recorded ``--steps`` succeeded steps and waiting for an event (what a
deploy meets: runs parked at a wait), plus a tenth as many finished runs the check must skip;
then times the check ``--repeat`` times, in this process, on the code of this checkout:

* ``check_replay()`` itself (reads in batches of 1,000 runs: three statements a batch), and
* ``manage.py workflow_runs check-replay --format json`` through ``call_command``,

each with the statements it sent, the load average beside the figures. Prints a table and
writes ``bench/results/check-replay-<date>-<HHMM>.json``. ::

    .venv/bin/python bench/check_replay.py                      # 10,000 runs of 5 steps
    .venv/bin/python bench/check_replay.py --runs 50000 --steps 20
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    RESULTS_DIR,
    add_settle_argument,
    libpq_conninfo,
    load_average,
    machine_facts,
    settle,
    versions,
    write_report,
)

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/django_leases_bench_replay"
WORKFLOW = "bench.replay.flow"
FUNCTION = "bench.replay.step"


def prepare(database_url: str) -> None:
    """Recreate the bench database, set Django up on it and migrate it."""
    import psycopg
    from psycopg import sql

    conninfo = libpq_conninfo(database_url)
    name = str(psycopg.conninfo.conninfo_to_dict(conninfo).get("dbname") or "")
    if not name.startswith("django_leases_bench"):
        raise SystemExit("the database URL must name a django_leases_bench… database")
    admin = psycopg.conninfo.make_conninfo(conninfo, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    import django
    from django.conf import settings

    from demo_project.settings import database_from_url

    database = database_from_url(database_url)
    database["CONN_MAX_AGE"] = None
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
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def register(steps: int) -> None:
    """The workflow the runs are of: ``steps`` steps, then an event wait, then one more."""
    from django_leases.workflows import step_function, workflow

    @step_function(FUNCTION)
    def step(data: Any, ctx: Any) -> Any:
        return data

    @workflow(WORKFLOW)
    def flow(run: Any, input: Any) -> Any:
        done = [run.step(f"s{i}", FUNCTION, i) for i in range(steps)]
        done.append(run.wait_for_event("go"))
        return [*done, run.step("last", FUNCTION, "last")]


def fill(runs: int, steps: int) -> None:
    """``runs`` live runs waiting at event "go" with ``steps`` steps recorded, and a tenth as
    many completed runs; rows inserted in bulk (as passes would have left them)."""
    from django.db import transaction

    from django_leases.clock import db_now_plus
    from django_leases.ids import uuid7
    from django_leases.models import WorkflowRun, WorkflowStep, WorkflowWait

    now = db_now_plus(0)
    chunk = 2000
    made = 0
    while made < runs:
        count = min(chunk, runs - made)
        with transaction.atomic():
            live = [
                WorkflowRun(id=uuid7(), workflow=WORKFLOW, input={"n": made + i})
                for i in range(count)
            ]
            done = [
                WorkflowRun(id=uuid.uuid4(), workflow=WORKFLOW, status="completed", output=[])
                for _ in range(count // 10)
            ]
            WorkflowRun.objects.bulk_create(live + done)
            WorkflowStep.objects.bulk_create(
                WorkflowStep(
                    run_id=run.id,
                    step_name=f"s{i}",
                    function_name=FUNCTION,
                    data=i,
                    status="succeeded",
                    result=i,
                )
                for run in live
                for i in range(steps)
            )
            WorkflowWait.objects.bulk_create(
                WorkflowWait(run_id=run.id, name="go", kind="event", reached_at=now) for run in live
            )
        made += count


def timed(call: Any) -> tuple[float, int, Any]:
    """Seconds ``call()`` took, the statements it sent, and what it returned."""
    from django.db import connection

    connection.force_debug_cursor = True
    connection.queries_log.clear()
    started = time.perf_counter()
    value = call()
    seconds = time.perf_counter() - started
    statements = len(connection.queries_log)
    connection.force_debug_cursor = False
    return seconds, statements, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    add_settle_argument(parser)
    args = parser.parse_args(argv)

    prepare(args.database_url)
    register(args.steps)
    started = time.perf_counter()
    fill(args.runs, args.steps)
    fill_seconds = time.perf_counter() - started
    from django.core.management import CommandError, call_command

    from django_leases.workflows.replay_check import check_replay

    load_before = settle(within=args.settle)
    rows: list[dict[str, Any]] = []
    for label, call in (
        ("check_replay()", check_replay),
        (
            "workflow_runs check-replay --format json",
            lambda: call_command(
                "workflow_runs", "check-replay", "--format", "json", stdout=io.StringIO()
            ),
        ),
    ):
        samples = []
        for _ in range(args.repeat):
            try:
                seconds, statements, value = timed(call)
            except CommandError as exc:  # a run would not replay: the bench is wrong
                raise SystemExit(f"check-replay failed: {exc}") from None
            if hasattr(value, "checked") and (value.checked != args.runs or not value.ok):
                raise SystemExit(f"check_replay() saw {value.checked} runs, ok={value.ok}")
            samples.append((seconds, statements))
        times = [seconds for seconds, _ in samples]
        rows.append(
            {
                "what": label,
                "best_seconds": min(times),
                "median_seconds": statistics.median(times),
                "runs_per_second": args.runs / min(times),
                "statements": samples[0][1],
                "load_average": load_average(),
            }
        )
    print(
        f"{args.runs:,} live runs of {args.steps} steps + an event wait "
        f"(filled in {fill_seconds:.1f} s); load before: {load_before}"
    )
    print(f"{'':44} {'best s':>8} {'median s':>9} {'runs/s':>9} {'stmts':>6}  load")
    for row in rows:
        print(
            f"{row['what']:44} {row['best_seconds']:8.2f} {row['median_seconds']:9.2f} "
            f"{row['runs_per_second']:9,.0f} {row['statements']:6}  {row['load_average']}"
        )
    report = {
        "benchmark": "check-replay",
        "runs": args.runs,
        "steps": args.steps,
        "repeat": args.repeat,
        "fill_seconds": fill_seconds,
        "load_average_before": load_before,
        "results": rows,
        "machine": machine_facts(),
        "versions": versions([]),
    }
    path = RESULTS_DIR / f"check-replay-{datetime.now():%Y-%m-%d-%H%M}.json"
    write_report(path, report)
    print(f"written to {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

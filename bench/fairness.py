"""Fairness benchmark: per-key limits and round-robin claims (DESIGN §5c, issue 27 item 1).

``python bench/fairness.py`` (``make bench-fairness``; part of ``make bench``) on PostgreSQL,
in a database of its own (``django_leases_bench_fairness``, created and migrated if missing).

Two stages, written to ``bench/results/fairness-<date>-<HHMM>.json`` with the load average:

1. **backlog**: ``--big`` (10,000) steps of key ``big`` are queued (one ``run.parallel``)
   ahead of ``--small`` (100) of key ``small``, in a queue with ``key_concurrency`` =
   ``--concurrency`` (8); then ``--workers`` (4) worker processes of ``--threads`` (2)
   threads drain it. Reported: each key's wait (an attempt's ``started_at`` less the moment
   the workers were started, database clock) p50 / p99 / max, where in the claim order the
   small key's last step started, and the drain's steps per second. Steps do nothing.
   Beside it, where ``dbos`` is importable (``make bench-fairness`` runs under the bench
   venv), **DBOS Transact's partitioned queue** (``wfbench/dbos_fair_app.py``, its own
   system database ``dl_bench_dbos_fair`` on the same server): the same items as one-step
   workflows, enqueued with ``DBOSClient`` (``queue_partition_key`` big / small) while its
   ``--workers`` worker processes are frozen (SIGSTOP), then released together (SIGCONT);
   ``partition_concurrency`` = ``--concurrency``, ``polling_interval_sec`` 0.1; the wait is
   a workflow's ``started_at_epoch_ms`` less the release.
2. **claim cost**: one thread claims ``--claims`` (2,000) due steps one at a time
   (``WorkflowStep.objects.claim_due``) from a queue without limits (the plain claim: on
   PostgreSQL one statement) and ``--claims`` from a keyed queue (``--keys`` (2) keys in
   turn), a plain claim and a keyed one in turn so that both meet the same load, each
   claimed step finished at once (``execute_step``). Reported per claim: statements sent,
   and CPU seconds of this thread plus its PostgreSQL backend (``/proc/<pid>/schedstat``,
   nanoseconds), during the claims only. ``--only-claim-cost --repeat N`` runs this stage
   alone N times and reports the best of each figure too.

"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path[:0] = [str(ROOT), str(BENCH_DIR)]

from common import (  # noqa: E402
    libpq_conninfo,
    load_average,
    machine_facts,
    process_cpu_seconds,
    settle,
    versions,
    write_report,
)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/django_leases_bench_fairness"
FAIR = "bench-fair"
PLAIN = "bench-plain"
NOOP = "bench.fair.noop"
PLAIN_NOOP = "bench.plain.noop"
LEASE = 60.0


def _configure(database_url: str, concurrency: int) -> None:
    import django
    from django.conf import settings

    from demo_project.settings import database_from_url

    database = database_from_url(database_url)
    database["CONN_MAX_AGE"] = None
    settings.configure(
        SECRET_KEY="bench-only",
        DEBUG=False,
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_leases"],
        DATABASES={"default": database},
        DJANGO_LEASES={"QUEUES": {FAIR: {"key_concurrency": concurrency}, PLAIN: {}}},
        LOGGING_CONFIG=None,
    )
    django.setup()
    from django_leases.workflows import step_function, workflow

    step_function(NOOP, queue=FAIR)(lambda data, ctx: None)
    step_function(PLAIN_NOOP, queue=PLAIN)(lambda data, ctx: None)

    @workflow("bench-fair-fan")
    def fan(run: Any, input: Any) -> Any:
        calls = [(f"s{n:05}", input["function"], None) for n in range(input["n"])]
        return len(run.parallel(calls, retries=0))

    @workflow("bench-fair-idle")
    def idle(run: Any, input: Any) -> Any:
        return None


def _create_database(database_url: str) -> None:
    import psycopg

    conninfo = libpq_conninfo(database_url)
    name = conninfo.rsplit("/", 1)[1].split("?", 1)[0]
    admin = conninfo.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as connection:
        found = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        if found.fetchone() is None:
            connection.execute(f'CREATE DATABASE "{name}"')


def _empty() -> None:
    from django.db import connection

    from django_leases.models import Lease, WorkflowQueue, WorkflowQueueKey, WorkflowRun

    with connection.cursor() as cursor:
        tables = [
            model._meta.db_table for model in (WorkflowRun, WorkflowQueue, WorkflowQueueKey, Lease)
        ]
        cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _serve(threads: int) -> None:
    from django.db import connections

    from django_leases.workflows.worker import Worker

    try:
        Worker(threads, step_lease_ttl=LEASE, poll_interval=0.05, queues=[FAIR]).run(
            once=True, handle_signals=False
        )
    finally:
        connections.close_all()
        os._exit(0)


def backlog(args: argparse.Namespace) -> dict[str, Any]:
    """Stage 1: the small key's wait behind the big key's backlog."""
    from django.db import connections

    from django_leases.models.workflow import WorkflowStepAttempt
    from django_leases.workflows import start_workflow
    from django_leases.workflows.worker import Worker

    _empty()
    start_workflow("bench-fair-fan", {"n": args.big, "function": NOOP}, queue_key="big")
    start_workflow("bench-fair-fan", {"n": args.small, "function": NOOP}, queue_key="small")
    queuer = Worker(step_lease_ttl=LEASE, queues=["default"])
    while queuer.work_once():  # the two first passes queue the steps, nothing else
        pass
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        released = cursor.fetchone()[0]
    connections.close_all()
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_serve, args=(args.threads,)) for _ in range(args.workers)]
    began = time.monotonic()
    for process in workers:
        process.start()
    for process in workers:
        process.join()
    elapsed = time.monotonic() - began
    rows = list(
        WorkflowStepAttempt.objects.filter(step__queue=FAIR)
        .order_by("pk")
        .values_list("step__queue_key", "started_at", "step__available_at")
    )
    waits: dict[str, list[float]] = {"big": [], "small": []}
    for key, started, available in rows:
        waits[key].append((started - max(available, released)).total_seconds())
    order = [key for key, _, _ in rows]
    last_small = max((i for i, key in enumerate(order) if key == "small"), default=None)
    return {
        "steps": len(rows),
        "drain_seconds": round(elapsed, 3),
        "steps_per_second": round(len(rows) / elapsed, 1) if elapsed else None,
        "small_key_wait_seconds": {
            "p50": _percentile(waits["small"], 0.5),
            "p99": _percentile(waits["small"], 0.99),
            "max": max(waits["small"], default=None),
        },
        "big_key_wait_seconds": {
            "p50": _percentile(waits["big"], 0.5),
            "p99": _percentile(waits["big"], 0.99),
            "max": max(waits["big"], default=None),
        },
        "small_key_last_start_in_claim_order": last_small,
        "big_key_starts_before_small_key_done": (
            None if last_small is None else order[:last_small].count("big")
        ),
    }


def _cpu_seconds(pid: int) -> float:
    """CPU seconds process ``pid`` has run so far: ``/proc/<pid>/schedstat`` (nanoseconds),
    else ``/proc/<pid>/stat`` (clock ticks, 10 ms: too coarse for one claim's cost)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        return process_cpu_seconds(pid) or 0.0


def _queued(queue: str, function: str, keys: list[str], count: int) -> None:
    """``count`` due steps of ``queue`` (step function ``function``), their keys ``keys`` in
    turn, each key's under a run of its own."""
    from django_leases.models import WorkflowStep
    from django_leases.workflows import start_workflow
    from django_leases.workflows.values import StepOptions

    runs = {key: start_workflow("bench-fair-idle", {}, queue_key=key) for key in keys}
    for index, key in enumerate(keys):
        share = [(f"s{n:05}", function, None) for n in range(index, count, len(keys))]
        WorkflowStep.objects.schedule_many(
            runs[key], share, StepOptions(queue=queue, retries=0, queue_key=key)
        )


def claim_cost(args: argparse.Namespace) -> dict[str, Any]:
    """Stage 2: the keyed claim beside the plain claim, taken in turn (a plain claim, then
    a keyed one, …) so that both meet the same load."""
    from django.db import connection

    from django_leases.models import WorkflowStep
    from django_leases.workflows.engine import execute_step

    _empty()
    keys = [f"k{n:03}" for n in range(args.keys)]
    _queued(PLAIN, PLAIN_NOOP, ["plain"], args.claims)
    _queued(FAIR, NOOP, keys, args.claims)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    statements = [0]

    def counted(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements[0] += 1
        return execute(sql, params, many, context)

    figures = {
        queue: {"claims": 0, "statements": 0, "cpu": 0.0, "backend": 0.0} for queue in (PLAIN, FAIR)
    }
    left = [PLAIN, FAIR]
    while left:
        for queue in list(left):
            statements[0] = 0
            before = time.thread_time(), _cpu_seconds(backend)
            with connection.execute_wrapper(counted):
                claim = WorkflowStep.objects.claim_due(LEASE, queues=[queue])
            after = time.thread_time(), _cpu_seconds(backend)
            if claim is None:
                left.remove(queue)
                continue
            figure = figures[queue]
            figure["claims"] += 1
            figure["statements"] += statements[0]
            figure["cpu"] += (after[0] - before[0]) + (after[1] - before[1])
            figure["backend"] += after[1] - before[1]
            execute_step(claim)
    plain, keyed = (
        {
            "claims": figure["claims"],
            "statements_per_claim": round(figure["statements"] / figure["claims"], 3),
            "cpu_ms_per_claim": round(figure["cpu"] * 1000 / figure["claims"], 3),
            "of_which_backend_ms": round(figure["backend"] * 1000 / figure["claims"], 3),
        }
        for figure in (figures[PLAIN], figures[FAIR])
    )
    ratio = {
        figure: round(keyed[figure] / plain[figure], 2)
        for figure in ("statements_per_claim", "cpu_ms_per_claim")
    }
    return {
        "keys": args.keys,
        "plain": plain,
        "keyed": keyed,
        "keyed_over_plain": ratio,
        "target": 1.2,
    }


DEFAULT_DBOS_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/dl_bench_dbos_fair"


def dbos_backlog(args: argparse.Namespace) -> dict[str, Any]:
    """Stage 1 for DBOS Transact's partitioned queue (see the module's docstring)."""
    import signal
    import subprocess

    import psycopg
    import sqlalchemy
    from dbos import DBOSClient
    from wfbench.dbos_fair_app import APP_NAME, ITEM, QUEUE, dbos_url

    url = args.dbos_database_url
    conninfo = libpq_conninfo(url)
    name = conninfo.rsplit("/", 1)[1]
    with psycopg.connect(conninfo.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    env = {
        **os.environ,
        "BENCH_DBOS_DATABASE_URL": url,
        "BENCH_DBOS_PARTITION_CONCURRENCY": str(args.concurrency),
        "PYTHONPATH": str(BENCH_DIR),
    }
    logs = [Path(f"/tmp/dl-bench-fair-dbos-{n}.log") for n in range(args.workers)]
    workers = []
    for log in logs:
        workers.append(
            subprocess.Popen(
                [sys.executable, str(BENCH_DIR / "wfbench" / "dbos_fair_app.py")],
                env=env,
                stdout=log.open("w"),
                stderr=subprocess.STDOUT,
            )
        )
        # One at a time: the first migrates the system database.
        deadline = time.monotonic() + 120
        while "dbos worker launched" not in log.read_text(errors="replace"):
            if time.monotonic() > deadline or workers[-1].poll() is not None:
                raise SystemExit(f"a DBOS worker did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
    try:
        for worker in workers:
            os.kill(worker.pid, signal.SIGSTOP)
        engine = sqlalchemy.create_engine(dbos_url(url))
        client = DBOSClient(system_database_engine=engine, application_name=APP_NAME)
        options = {"workflow_name": ITEM, "queue_name": QUEUE, "app_version": "wffair"}
        with engine.begin() as connection:
            for key, count in (("big", args.big), ("small", args.small)):
                for _ in range(count):
                    client.enqueue_in_transaction(
                        connection, {**options, "queue_partition_key": key}
                    )
        with psycopg.connect(conninfo, autocommit=True) as db:
            released = db.execute("SELECT extract(epoch FROM clock_timestamp()) * 1000").fetchone()[
                0
            ]
            began = time.monotonic()
            for worker in workers:
                os.kill(worker.pid, signal.SIGCONT)
            total = args.big + args.small
            deadline = time.monotonic() + 1800
            while True:
                done = db.execute(
                    "SELECT count(*) FROM dbos.workflow_status "
                    "WHERE name = %s AND status = 'SUCCESS'",
                    [ITEM],
                ).fetchone()[0]
                if done >= total:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"DBOS finished {done} of {total} in 30 minutes")
                time.sleep(0.05)
            elapsed = time.monotonic() - began
            rows = db.execute(
                "SELECT queue_partition_key, started_at_epoch_ms FROM dbos.workflow_status "
                "WHERE name = %s ORDER BY started_at_epoch_ms, workflow_uuid",
                [ITEM],
            ).fetchall()
    finally:
        for worker in workers:
            if worker.poll() is None:
                os.kill(worker.pid, signal.SIGCONT)
                worker.terminate()
        for worker in workers:
            worker.wait(60)
    waits: dict[str, list[float]] = {"big": [], "small": []}
    for key, started in rows:
        waits[key].append((float(started) - float(released)) / 1000)
    order = [key for key, _ in rows]
    last_small = max((i for i, key in enumerate(order) if key == "small"), default=None)
    return {
        "steps": len(rows),
        "drain_seconds": round(elapsed, 3),
        "steps_per_second": round(len(rows) / elapsed, 1) if elapsed else None,
        "small_key_wait_seconds": {
            "p50": _percentile(waits["small"], 0.5),
            "p99": _percentile(waits["small"], 0.99),
            "max": max(waits["small"], default=None),
        },
        "big_key_wait_seconds": {
            "p50": _percentile(waits["big"], 0.5),
            "p99": _percentile(waits["big"], 0.99),
            "max": max(waits["big"], default=None),
        },
        "small_key_last_start_in_start_order": last_small,
        "settings": f"partition_concurrency={args.concurrency}, polling_interval_sec=0.1, "
        f"{args.workers} worker processes (DBOS.launch), default worker thread pool",
    }


def _claim_cost_alone(args: argparse.Namespace, report: dict[str, Any]) -> int:
    """Stage 2 alone, ``--repeat`` times, with the best of each figure (load average
    read before each run)."""
    runs = []
    report["load_average_before_claims"] = settle(within=args.settle)
    for _ in range(max(1, args.repeat)):
        runs.append({"load_average": load_average(), **claim_cost(args)})
        print(f"claim cost: {runs[-1]}")
    best = {
        side: {
            figure: min(run[side][figure] for run in runs)
            for figure in ("statements_per_claim", "cpu_ms_per_claim")
        }
        for side in ("plain", "keyed")
    }
    best_ratio = {
        figure: round(best["keyed"][figure] / best["plain"][figure], 2)
        for figure in ("statements_per_claim", "cpu_ms_per_claim")
    }
    report["claim_cost_runs"] = runs
    report["claim_cost_best"] = {**best, "keyed_over_plain": best_ratio, "target": 1.2}
    report["load_average_at_end"] = load_average()
    output = (
        args.output or BENCH_DIR / "results" / f"claim-cost-{datetime.now():%Y-%m-%d-%H%M}.json"
    )
    write_report(output, report)
    print(f"wrote {output}")
    print(f"best: {report['claim_cost_best']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    parser.add_argument("--big", type=int, default=10_000)
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--claims", type=int, default=2_000)
    parser.add_argument("--keys", type=int, default=2, help="keys of the keyed claim-cost queue")
    parser.add_argument("--settle", type=float, default=240.0)
    parser.add_argument(
        "--dbos-database-url",
        default=os.environ.get("BENCH_DBOS_DATABASE_URL", DEFAULT_DBOS_DATABASE_URL),
    )
    parser.add_argument("--no-dbos", action="store_true", help="leave DBOS Transact out")
    parser.add_argument(
        "--only-claim-cost",
        action="store_true",
        help="run the claim-cost stage alone (no backlog, no DBOS)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="claim-cost runs (each reported; best-of too)"
    )
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)

    _create_database(args.database_url)
    _configure(args.database_url, args.concurrency)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    report: dict[str, Any] = {
        "benchmark": "fairness",
        "machine": machine_facts(),
        "versions": versions(()),
        "parameters": {k: v for k, v in vars(args).items() if k not in ("database_url", "output")},
    }
    if args.only_claim_cost:
        return _claim_cost_alone(args, report)
    report["load_average_before_backlog"] = settle(within=args.settle)
    report["backlog"] = backlog(args)
    report["load_average_after_backlog"] = load_average()
    try:
        import dbos  # noqa: F401
    except ImportError:
        dbos_found = False
    else:
        dbos_found = True
    if dbos_found and not args.no_dbos:
        report["load_average_before_dbos"] = settle(within=args.settle)
        report["dbos_partitioned_queue"] = dbos_backlog(args)
        report["load_average_after_dbos"] = load_average()
    else:
        report["dbos_partitioned_queue"] = "not run: dbos is not installed here (or --no-dbos)"
    report["load_average_before_claims"] = settle(within=args.settle)
    report["claim_cost"] = claim_cost(args)
    report["load_average_at_end"] = load_average()
    report["dbos_partitioned_queues"] = "not measured: see bench/README.md, Fairness"
    output = args.output or BENCH_DIR / "results" / f"fairness-{datetime.now():%Y-%m-%d-%H%M}.json"
    write_report(output, report)
    print(f"wrote {output}")
    backlog_figures = report["backlog"]
    print(
        f"backlog: {backlog_figures['steps']} steps in {backlog_figures['drain_seconds']} s; "
        f"small key wait p50 {backlog_figures['small_key_wait_seconds']['p50']} s, "
        f"p99 {backlog_figures['small_key_wait_seconds']['p99']} s; its last start at claim "
        f"#{backlog_figures['small_key_last_start_in_claim_order']}"
    )
    print(f"dbos: {report['dbos_partitioned_queue']}")
    print(f"claim cost: {report['claim_cost']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

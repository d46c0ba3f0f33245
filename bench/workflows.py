"""Workflow benchmark: django-leases' workflow worker beside the task queues a Django user picks.

Run with ``make bench`` (or ``make bench-workflows``; ``python bench/workflows.py --help``). It
needs Python ≥ 3.12 and Django 6 (django-ox requires them), so the Makefile runs it from its own
venv, ``.venv-bench312``, where django-leases is installed (editable) beside the peers; every
contender runs under the same Python, the same Django, the same database and the same
connection settings (persistent connections, ``CONN_MAX_AGE=None``, Django's default
client-side binding, ``DEBUG=False``; Procrastinate's worker opens its own psycopg connections
from Django's settings and keeps them).

Contenders, each one no-op unit of work, enqueued with the library's public API and run by its
own worker command as real processes (``python -m django <command>``, package defaults):

* ``ours``: ``start_workflow("bench-noop")`` of a one-step workflow whose step function does
  nothing; ``run_workflow_worker`` (1 thread per process) runs the first pass, the step, and
  the pass that completes the run (on PostgreSQL: three statements, the last of which also
  picks the next run while a backlog lasts);
* ``django-ox``: a ``django.tasks`` ``@task`` on ``django_ox.backend.OxBackend``, ``ox_worker``;
* ``procrastinate``: an ``@app.task`` through ``procrastinate.contrib.django``,
  ``procrastinate worker``;
* ``django-tasks-db``: a ``django.tasks`` ``@task`` on ``django_tasks_db.DatabaseBackend``,
  ``db_worker``.

Measured for each, in one run (contenders interleaved, in a rotating order, in each of
``--repeat`` repetitions; throughputs are the best repetition, latencies pool every sample):

1. **end-to-end**: one worker; this process enqueues ``--e2e-tasks`` items one transaction each
   (as a web request would) while the worker runs them; items per second from the first
   enqueue to the last completion;
2. **drain**: ``--tasks`` items enqueued in one transaction, then run by 1 and by 4 worker
   processes; items per second from the moment the workers are released to the last
   completion;
3. **latency**: one idle worker waiting; one item enqueued at a random moment, the time from
   the enqueue call until its completion is visible to this process (polled every 2 ms);
   p50 / p99 over ``--latency-samples`` per repetition.

Idle workers and the drains: a worker that polls sleeps up to its poll interval (1 s for ours,
django-ox and django-tasks-db) before it sees new work, which is latency (measured in 3), not
throughput. So the workers are started, warmed up with a few items, left idle, then frozen
with SIGSTOP while the backlog is committed; after longer than any poll interval they are
released together with SIGCONT, and every sleeping worker wakes at once (its sleep's
deadline has passed; Procrastinate reads the NOTIFY that arrived meanwhile). Completion is
counted by this process every 20 ms (one ``count(*)``). The statements and transactions each
worker sends are counted below every library (psycopg's cursors and connections, see
``wfbench/counting.py``), and the CPU of the worker processes and of the PostgreSQL backends
serving them is read from ``/proc``, per item, during the 1-worker drain.

A second stage, the workflow shapes (``--only shapes``; both stages run by default), sets
ours beside **DBOS Transact** (``dbos``: worker processes of ``wfbench/dbos_app.py`` on DBOS's
own system database, ``dl_bench_dbos``, on the same server; its queue with its defaults and
with ``polling_interval_sec=0.1``) and the task peers: a backlog of ``--seq-workflows``
10-step workflows (workflows/s and steps/s; n/a for a task queue, which has no durable
multi-step workflow) and one fan-out of ``--fanout`` steps (``run.parallel``; DBOS:
``queue.enqueue`` of one-step workflows and every handle's result; a task peer: that many
tasks, the harness waiting for the last), each with 1 and ``--workers`` worker processes,
frozen and released as for the drains, best of ``--shape-repeat``.

A third stage, the sequential one (``--only sequential``; run by default), starts one run of
``k`` no-op steps at a time for each ``k`` of ``--seq-steps`` (10, 100, 1,000), one worker
process, ours beside DBOS Transact (and with ``--seq-candidate TREE`` ours from another source
tree, e.g. an older commit): ms per step overall and over each tenth of the run (from the
run's rows: ``wfbench/sequential.py``), so that growth along the run shows, and CPU per step
of the worker and of its PostgreSQL backends.

A fourth stage, ``--scale N`` (``make bench-scale``: ``--only scale --scale 1000000``), drains
``--tasks`` runs of ours (1 and ``--workers`` processes, persistent connections and
``CONN_MAX_AGE = 0``) on empty tables and on tables kept with N finished runs, filled
server-side as the engine leaves them (``wfbench/scale.py``; that database is kept between
runs), and reports the ratio kept ÷ empty, the HOT share of the updates per table and the
plans of the worker's statements on both (``auto_explain``). Every drain, in every stage,
records the HOT share per table; ``ours-cma0`` is ours with ``CONN_MAX_AGE = 0`` in its
workers.

The bench database (``django_leases_bench_workflows`` by default) is dropped and recreated
from the current migrations at the start of every run, and so is DBOS's when it takes part;
nothing else is touched. The table goes
to stdout (each figure with its ratio to the best peer) and the run to
``bench/results/workflows-<date>-<HHMM>.json``. ``--profile`` instead runs ours' worker loop in this
process under cProfile and counts its statements per run with ``CaptureQueriesContext``.
Nothing here is a test: timing never fails a build.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import datetime as dt
import io
import json
import os
import pstats
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
for _path in (str(ROOT), str(BENCH_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from wfbench.sequential import (  # noqa: E402
    DEFAULT_STEPS,
    SEQ,
    cpu_window,
    dbos_boundaries,
    ours_boundaries,
    tenths,
    thread_cpu_ns,
    threads_cpu_ns,
)

from bench.common import (  # noqa: E402
    RESULTS_DIR,
    BenchError,
    add_settle_argument,
    libpq_conninfo,
    load_average,
    machine_facts,
    process_cpu_seconds,
    recreate_database,
    settle,
    versions,
    write_report,
)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/django_leases_bench_workflows"
#: DBOS Transact's own system database, on the same server (dropped and recreated).
DEFAULT_DBOS_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/dl_bench_dbos"
SETTINGS = "wfbench.settings"
#: ours (and ours-tasks) / best peer, end-to-end and drain throughput: the target.
TARGET = 1.5
#: How long the workers stay frozen before a drain: longer than any contender's poll interval.
HOLD_SECONDS = 1.5
POLL_DONE = 0.02
POLL_LATENCY = 0.002


# -- contenders ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contender:
    """One library: how to enqueue its no-op item, run its worker, and see items finish."""

    name: str
    description: str
    worker_command: tuple[str, ...]
    wakes: str  # how an idle worker learns of new work, with package defaults

    def model(self) -> Any:
        raise NotImplementedError

    def enqueue(self) -> Any:
        """Enqueue one no-op item; return its id (the primary key of :meth:`model`'s row)."""
        raise NotImplementedError

    done_status: str = ""
    failed_statuses: tuple[str, ...] = ()
    extra_tables: tuple[str, ...] = ()
    #: Environment of its worker processes beyond the run's (e.g. ``BENCH_CONN_MAX_AGE``).
    env: tuple[tuple[str, str], ...] = ()
    #: The contender this one is a variant of ("" for none): its ratios are to that one.
    base: str = ""

    @property
    def table(self) -> str:
        return self.model()._meta.db_table

    def tables(self) -> list[str]:
        return [self.table, *self.extra_tables]


class Ours(Contender):
    def model(self) -> Any:
        from django_leases.models import WorkflowRun

        return WorkflowRun

    def enqueue(self) -> Any:
        from django_leases.workflows import start_workflow

        return start_workflow("bench-noop", {})

    def tables(self) -> list[str]:
        from django_leases.models import Lease, WorkflowStep, WorkflowStepAttempt

        return [
            self.table,
            WorkflowStep._meta.db_table,
            WorkflowStepAttempt._meta.db_table,
            Lease._meta.db_table,
        ]


class OursTasks(Ours):
    def enqueue(self) -> Any:
        import uuid

        from wfbench.tasks import leases_noop

        return uuid.UUID(leases_noop.enqueue().id)


class Ox(Contender):
    def model(self) -> Any:
        from django_ox.models import OxTask

        return OxTask

    def enqueue(self) -> Any:
        from wfbench.tasks import ox_noop

        return ox_noop.enqueue().id


class Procrastinate(Contender):
    def model(self) -> Any:
        from procrastinate.contrib.django.models import ProcrastinateJob

        return ProcrastinateJob

    def enqueue(self) -> Any:
        from wfbench.tasks import procrastinate_noop

        return procrastinate_noop.defer()


class TasksDb(Contender):
    def model(self) -> Any:
        from django_tasks_db.models import DBTaskResult

        return DBTaskResult

    def enqueue(self) -> Any:
        from wfbench.tasks import db_noop

        return db_noop.enqueue().id


CONTENDERS: dict[str, Contender] = {
    c.name: c
    for c in (
        Ours(
            "ours",
            "django-leases: start_workflow of a 1-step no-op workflow; "
            "manage.py run_workflow_worker (1 thread)",
            ("run_workflow_worker", "--concurrency", "1"),
            "see the worker's settings (WORKER_POLL_INTERVAL 1 s; LISTEN/NOTIFY where built)",
            done_status="completed",
            failed_statuses=("failed", "suspended", "cancelled"),
        ),
        OursTasks(
            "ours-tasks",
            "django-leases: the django.tasks @task no-op on django_leases.tasks.TaskBackend, "
            ".enqueue(); manage.py run_workflow_worker (1 thread)",
            ("run_workflow_worker", "--concurrency", "1"),
            "see the worker's settings (WORKER_POLL_INTERVAL 1 s; LISTEN/NOTIFY where built)",
            done_status="completed",
            failed_statuses=("failed", "suspended", "cancelled"),
        ),
        Ox(
            "django-ox",
            "django-ox: @task (django.tasks) .enqueue(); manage.py ox_worker (concurrency 1)",
            ("ox_worker",),
            "polls every 1 s (--interval default)",
            done_status="SUCCESSFUL",
            failed_statuses=("FAILED", "LOST"),
        ),
        Procrastinate(
            "procrastinate",
            "Procrastinate (contrib.django): @app.task .defer(); "
            "manage.py procrastinate worker (concurrency 1)",
            ("procrastinate", "worker"),
            "LISTEN/NOTIFY, polls every 5 s",
            done_status="succeeded",
            failed_statuses=("failed", "cancelled", "aborted"),
            extra_tables=("procrastinate_events",),
        ),
        TasksDb(
            "django-tasks-db",
            "django-tasks-db: @task (django.tasks, backend 'db') .enqueue(); "
            "manage.py db_worker --backend db",
            ("db_worker", "--backend", "db"),
            "polls every 1 s (--interval default)",
            done_status="SUCCESSFUL",
            failed_statuses=("FAILED",),
        ),
    )
}
#: Ours: a workflow run per item, and the same engine behind Django's Tasks API.
OURS_TASK_NAMES = ("ours", "ours-tasks")
PEERS = [name for name in CONTENDERS if name not in OURS_TASK_NAMES]
#: The suffix of a contender run with ``CONN_MAX_AGE = 0`` (Django's default: a connection
#: per unit of work) in its worker processes, whatever ``--conn-max-age`` says for the rest.
CMA0 = "-cma0"
for _name in [*OURS_TASK_NAMES[:1], *PEERS]:
    _contender = CONTENDERS[_name]
    CONTENDERS[_name + CMA0] = dataclasses.replace(
        _contender,
        name=_name + CMA0,
        description=_contender.description + "; CONN_MAX_AGE = 0 in the worker processes",
        env=(("BENCH_CONN_MAX_AGE", "0"),),
        base=_name,
    )
del _name, _contender
#: The variants: ratios to their base (persistent connections), never a "best peer".
VARIANTS = [name for name, c in CONTENDERS.items() if c.base]
#: The peers that are Django Tasks backends: ``ours-tasks`` runs the very same ``@task``.
TASK_BACKEND_PEERS = ("django-ox", "django-tasks-db")


# -- the database -------------------------------------------------------------------------------


def setup_django(database_url: str, application_name: str = "wfbench-harness") -> None:
    import django

    os.environ["BENCH_DATABASE_URL"] = database_url
    os.environ["BENCH_APPLICATION_NAME"] = application_name
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    django.setup()


def scalar(sql: str, params: tuple[Any, ...] = ()) -> Any:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else row[0]


def rows(sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def truncate(contender: Contender) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(contender.tables())} RESTART IDENTITY CASCADE")


def uuid7_floor(moment: dt.datetime) -> uuid.UUID:
    """The least version 7 UUID of the millisecond one second before ``moment``."""
    ms = int(moment.timestamp() * 1000) - 1000
    return uuid.UUID(int=(ms << 80) | (0x7 << 76) | (0b10 << 62))


def count_done(contender: Contender, since: Any = None) -> int:
    """Items done; with ``since`` (a database timestamp; ours only), only those whose
    time-ordered id is at most a second older (a range of the primary key, whatever the
    other indexes are: on the scale stage's filled tables a count of every finished run
    would cost more than the drain it watches)."""
    if since is None:
        return int(
            scalar(
                f"SELECT count(*) FROM {contender.table} WHERE status = %s",
                (contender.done_status,),
            )
        )
    return int(
        scalar(
            f"SELECT count(*) FROM {contender.table} WHERE id >= %s AND status = %s",
            (uuid7_floor(since), contender.done_status),
        )
    )


def count_failed(contender: Contender) -> int:
    if not contender.failed_statuses:
        return 0
    marks = ", ".join(["%s"] * len(contender.failed_statuses))
    return int(
        scalar(
            f"SELECT count(*) FROM {contender.table} WHERE status IN ({marks})",
            contender.failed_statuses,
        )
    )


def status_of(contender: Contender, item: Any) -> str | None:
    return scalar(f"SELECT status FROM {contender.table} WHERE id = %s", (item,))


# -- worker processes ---------------------------------------------------------------------------


class Workers:
    """``count`` worker processes of one contender, each in its own process group."""

    def __init__(
        self,
        contender: Contender,
        count: int,
        workdir: Path,
        database_url: str,
        *,
        argv: list[str] | None = None,
        extra_env: dict[str, str] | None = None,
        cwd: Path = ROOT,
    ):
        self.contender = contender
        self.count = count
        self.workdir = workdir
        self.database_url = database_url
        self.application_name = f"wfbench-worker-{contender.name}"
        # The command of one worker process (default: the contender's Django command).
        self.argv = argv or [sys.executable, "-m", "django", *contender.worker_command]
        self.extra_env = extra_env or {}
        # ``python -m`` puts the working directory first on sys.path: the source tree whose
        # django_leases the workers import (ours, or a --seq-candidate tree).
        self.cwd = cwd
        self.processes: list[subprocess.Popen[bytes]] = []
        self.count_files: list[Path] = []
        self.logs: list[Path] = []

    def start(self) -> None:
        env = dict(os.environ)
        env.update(
            BENCH_DATABASE_URL=self.database_url,
            BENCH_APPLICATION_NAME=self.application_name,
            DJANGO_SETTINGS_MODULE=SETTINGS,
            PYTHONPATH=os.pathsep.join([str(BENCH_DIR), str(ROOT)]),
        )
        env.update(dict(self.contender.env))
        env.update(self.extra_env)
        for index in range(self.count):
            stem = f"{self.contender.name}-{len(self.logs)}"
            counts = self.workdir / f"{stem}.counts.json"
            log = self.workdir / f"{stem}.log"
            counts.unlink(missing_ok=True)
            env["BENCH_COUNT_STATEMENTS"] = str(counts)
            with log.open("wb") as out:
                process = subprocess.Popen(
                    self.argv,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=self.cwd,
                )
            self.processes.append(process)
            self.count_files.append(counts)
            self.logs.append(log)
            del index

    def check_alive(self) -> None:
        for process, log in zip(self.processes, self.logs, strict=True):
            if process.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                raise BenchError(
                    f"{self.contender.name} worker exited with {process.returncode}:\n{tail}"
                )

    def cpu(self) -> float:
        return sum(process_cpu_seconds(p.pid, with_children=True) or 0.0 for p in self.processes)

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Wait until every worker is connected and their CPU use has settled."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            connected = scalar(
                "SELECT count(DISTINCT client_port) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (self.application_name,),
            )
            if connected >= self.count:
                before = self.cpu()
                time.sleep(0.5)
                if self.cpu() - before < 0.05 * self.count:
                    return
            else:
                time.sleep(0.2)
        raise BenchError(f"{self.contender.name} workers did not settle within {timeout:g} s")

    def backend_pids(self) -> list[int]:
        found = rows(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            (self.application_name,),
        )
        return [pid for (pid,) in found]

    def signal(self, signum: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signum)

    def counted(self) -> dict[str, int]:
        totals = {"statements": 0, "transactions": 0}
        for path in self.count_files:
            try:
                found = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            for key in totals:
                totals[key] += int(found.get(key, 0))
        return totals

    def stop(self, grace: float = 30.0) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()


# -- measurements -------------------------------------------------------------------------------


def wait_done(
    contender: Contender, target: int, timeout: float, since: Any = None
) -> list[tuple[float, int]]:
    """Poll the done count every 20 ms until it reaches ``target``; the (time, count) samples."""
    samples = []
    deadline = time.perf_counter() + timeout
    while True:
        now = time.perf_counter()
        done = count_done(contender, since)
        samples.append((now, done))
        if done >= target:
            return samples
        if now > deadline:
            raise BenchError(
                f"{contender.name}: {done} of {target} done after {timeout:g} s "
                f"({count_failed(contender)} failed)"
            )
        time.sleep(POLL_DONE)


def warm_up(contender: Contender, workers: Workers, items: int, since: Any = None) -> None:
    """Run ``items`` items through freshly started workers, then let them go idle."""
    workers.wait_idle()
    base = count_done(contender, since)
    for _ in range(items):
        contender.enqueue()
    wait_done(contender, base + items, 60, since)
    workers.wait_idle()


def check_no_failures(contender: Contender) -> None:
    failed = count_failed(contender)
    if failed:
        raise BenchError(f"{contender.name}: {failed} items failed")


def measure_end_to_end(contender: Contender, workers: Workers, items: int) -> dict[str, Any]:
    """One transaction per enqueue, the worker running meanwhile; items/s first enqueue → last
    completion. The idle worker is frozen and released at the first enqueue's commit."""
    base = count_done(contender)
    workers.signal(signal.SIGSTOP)
    time.sleep(HOLD_SECONDS)
    start = time.perf_counter()
    contender.enqueue()
    workers.signal(signal.SIGCONT)
    for _ in range(items - 1):
        contender.enqueue()
    enqueued = time.perf_counter()
    samples = wait_done(contender, base + items, 300 + items)
    end = samples[-1][0]
    check_no_failures(contender)
    return {
        "rate": items / (end - start),
        "seconds": end - start,
        "enqueue_rate": items / (enqueued - start),
    }


def db_now() -> Any:
    return scalar("SELECT statement_timestamp()")


def measure_drain(
    contender: Contender, workers: Workers, items: int, since: Any = None
) -> dict[str, Any]:
    """``items`` committed in one transaction while the idle workers are frozen; items/s from
    their release to the last completion, plus statements, transactions and CPU per item, and
    the updates, HOT updates and inserts per table of the contender (``pg_stat_user_tables``,
    read once settled before the freeze and after the last completion)."""
    from django.db import transaction
    from wfbench.scale import hot_shares, table_stats

    tables = contender.tables()
    stats_before = table_stats(rows, tables)
    base = count_done(contender, since)
    workers.signal(signal.SIGSTOP)
    frozen = time.perf_counter()
    time.sleep(0.1)  # let the counters' last write land
    counted_before = workers.counted()
    backends = workers.backend_pids()
    enqueue_start = time.perf_counter()
    with transaction.atomic():
        for _ in range(items):
            contender.enqueue()
    enqueue_end = time.perf_counter()
    time.sleep(max(0.2, HOLD_SECONDS - (enqueue_end - frozen)))
    client_before = workers.cpu()
    server_before = [process_cpu_seconds(pid, with_children=True) for pid in backends]
    start = time.perf_counter()
    workers.signal(signal.SIGCONT)
    samples = wait_done(contender, base + items, 300 + items, since)
    end = samples[-1][0]
    client = workers.cpu() - client_before
    server_after = [process_cpu_seconds(pid, with_children=True) for pid in backends]
    server = sum(
        (a - b) for a, b in zip(server_after, server_before, strict=True) if a is not None and b
    )
    stats_after = table_stats(rows, tables)
    counted_after = workers.counted()
    check_no_failures(contender)
    first = next((t for t, n in samples if n > base), end)
    return {
        "rate": items / (end - start),
        "seconds": end - start,
        "first_completion_ms": 1e3 * (first - start),
        "enqueue_rate_one_transaction": items / (enqueue_end - enqueue_start),
        "statements_per_item": (counted_after["statements"] - counted_before["statements"]) / items,
        "transactions_per_item": (counted_after["transactions"] - counted_before["transactions"])
        / items,
        "worker_cpu_us_per_item": 1e6 * client / items,
        "server_cpu_us_per_item": 1e6 * server / items if backends else None,
        "backends": len(backends),
        "tables": hot_shares(stats_before, stats_after),
    }


def measure_latency(contender: Contender, workers: Workers, samples: int) -> list[float]:
    """Milliseconds from the enqueue call to a visible completion, one item at a time, with the
    worker idle (random gaps, so the items land anywhere in a polling worker's sleep)."""
    found = []
    for _ in range(samples):
        time.sleep(random.uniform(0.2, 0.7))
        start = time.perf_counter()
        item = contender.enqueue()
        deadline = start + 30
        while status_of(contender, item) != contender.done_status:
            if time.perf_counter() > deadline:
                workers.check_alive()
                raise BenchError(f"{contender.name}: an item was not done within 30 s")
            time.sleep(POLL_LATENCY)
        found.append(1e3 * (time.perf_counter() - start))
    check_no_failures(contender)
    return found


class ConnectionKiller:
    """A thread that terminates every PostgreSQL backend of ``application_name`` each
    ``every`` seconds (the worker's own connections; the harness's are named otherwise)."""

    def __init__(self, database_url: str, application_name: str, every: float) -> None:
        import threading

        self.conninfo = libpq_conninfo(database_url)
        self.application_name = application_name
        self.every = every
        self.killed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-killer", daemon=True)

    def __enter__(self) -> ConnectionKiller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.conninfo, autocommit=True) as connection:
            while not self._stop.wait(self.every):
                found = connection.execute(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
                    "FROM pg_stat_activity WHERE application_name = %s",
                    (self.application_name,),
                ).fetchone()
                self.killed += int(found[0]) if found else 0


def measure_fault_latency(
    contender: Contender, workers: Workers, samples: int, kill_every: float
) -> dict[str, Any]:
    """Milliseconds from the enqueue call to a completion visible to this process (so the
    completing statement has ended and committed), one item at a time, while the worker's
    connections are terminated every ``kill_every`` seconds (0: never)."""
    found: list[float] = []
    killer = ConnectionKiller(workers.database_url, workers.application_name, kill_every or 1e9)
    started = time.perf_counter()
    with killer:
        for _ in range(samples):
            time.sleep(random.uniform(0.05, 0.2))
            start = time.perf_counter()
            item = contender.enqueue()
            deadline = start + 300
            while status_of(contender, item) != contender.done_status:
                if time.perf_counter() > deadline:
                    workers.check_alive()
                    raise BenchError(f"{contender.name}: an item was not done within 300 s")
                time.sleep(POLL_LATENCY)
            found.append(1e3 * (time.perf_counter() - start))
    check_no_failures(contender)
    return {
        "latency_ms": found,
        "p50_ms": percentile(found, 0.5),
        "p99_ms": percentile(found, 0.99),
        "max_ms": max(found),
        "over_1s": sum(1 for ms in found if ms > 1000),
        "connections_killed": killer.killed,
        "seconds": time.perf_counter() - started,
    }


def run_fault_latency(args: argparse.Namespace) -> dict[str, Any]:
    """``--fault-latency``: each chosen contender, one worker, ``--latency-samples`` items."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="wfbench-") as tmp:
        for name in args.chosen:
            contender = CONTENDERS[name]
            truncate(contender)
            workers = Workers(contender, 1, Path(tmp), args.database_url)
            workers.start()
            try:
                warm_up(contender, workers, 5)
                found = measure_fault_latency(
                    contender, workers, args.latency_samples, args.kill_every
                )
            finally:
                workers.stop()
            out[name] = found
            print(
                f"  {name:<16} p50 {found['p50_ms']:8.1f} ms  p99 {found['p99_ms']:8.1f} ms  "
                f"max {found['max_ms']:8.1f} ms  over 1 s: {found['over_1s']:3d} of "
                f"{len(found['latency_ms'])}  ({found['connections_killed']} connections "
                f"killed in {found['seconds']:.0f} s)",
                flush=True,
            )
    return out


def run_contender(contender: Contender, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One repetition's measurements of one contender (fresh tables, fresh workers)."""
    out: dict[str, Any] = {}
    truncate(contender)
    single = Workers(contender, 1, workdir, args.database_url)
    single.start()
    try:
        warm_up(contender, single, 20)
        out["end_to_end"] = measure_end_to_end(contender, single, args.e2e_tasks)
        single.wait_idle()
        out["drain_1"] = measure_drain(contender, single, args.tasks)
        single.wait_idle()
        out["latency_ms"] = measure_latency(contender, single, args.latency_samples)
    finally:
        single.stop()
    truncate(contender)
    several = Workers(contender, args.workers, workdir, args.database_url)
    several.start()
    try:
        warm_up(contender, several, 4 * args.workers)
        out[f"drain_{args.workers}"] = measure_drain(contender, several, args.tasks)
    finally:
        several.stop()
    return out


# -- workflow shapes: 10 sequential steps, a 100-way fan-out ------------------------------------
#
# The same harness tricks as above (workers warmed up, frozen with SIGSTOP while a backlog
# commits, released together with SIGCONT), applied to two workflow shapes, with DBOS Transact
# beside ours. A task queue has no durable multi-step workflow (no step results recorded and
# replayed, no run to resume), so the task peers run the fan-out only: ``width`` independent
# tasks committed at once, the harness waiting for the last (the join a workflow does itself).

SEQ_STEPS = 10
DBOS_FAILED = ("ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED")
NO_SEQ_REASON = (
    "a task queue has no durable multi-step workflow: no step results recorded and replayed, "
    "no run resumed after a crash (a chain of tasks would be another shape)"
)


class ShapeContender:
    """One contender of the shapes stage: its workers, how to enqueue each shape, when done."""

    name = ""
    description = ""
    seq_reason: str | None = None  # why the 10-step workflow is n/a (None: it runs)
    fanout_how = ""

    def workers(self, count: int, workdir: Path, args: argparse.Namespace) -> Workers:
        raise NotImplementedError

    def reset(self) -> None:
        """Empty this contender's tables (no worker is running)."""
        raise NotImplementedError

    def wait_ready(self, workers: Workers, timeout: float = 120.0) -> None:
        """Wait until the workers are up and idle."""
        workers.wait_idle()

    def enqueue_seq(self, count: int) -> None:
        """Start ``count`` 10-step workflows in one transaction."""
        raise NotImplementedError

    def seq_done(self) -> int:
        raise NotImplementedError

    def enqueue_fanout(self, width: int) -> Any:
        """Start one fan-out of ``width`` (committed on return); the handle to poll."""
        raise NotImplementedError

    def fanout_done(self, handle: Any) -> bool:
        raise NotImplementedError

    def failed(self) -> int:
        raise NotImplementedError

    # The sequential stage (one run of ``steps`` steps): ours and DBOS only.

    def start_seq(self, steps: int, result_bytes: int = 0) -> Any:
        """Start one run of ``steps`` no-op steps (each returning ``result_bytes`` bytes of
        JSON instead, when set) (committed on return); its id."""
        raise NotImplementedError

    def table_bytes(self) -> int:
        """Bytes of this contender's workflow tables (``pg_total_relation_size``: rows,
        TOAST and indexes)."""
        raise NotImplementedError

    def seq_finished_at(self, handle: Any) -> float | None:
        """When run ``handle`` completed (seconds since the epoch), ``None`` while it runs;
        :class:`BenchError` if it failed."""
        raise NotImplementedError

    def seq_boundaries(self, handle: Any, steps: int) -> list[float]:
        """The first step's start, then each step's end (seconds since the epoch)."""
        raise NotImplementedError


class OursShapes(ShapeContender):
    fanout_how = "run.parallel of width steps in one run; done when the run completes"

    def __init__(self, name: str = "ours", threads: int = 1) -> None:
        self.name = name
        self.threads = threads
        self.description = (
            "django-leases: start_workflow of bench-seq10 (10 × run.step) and bench-fanout "
            f"(run.parallel of width steps); manage.py run_workflow_worker --concurrency "
            f"{threads} per process"
        )
        self.tasks = CONTENDERS["ours"]

    def workers(self, count: int, workdir: Path, args: argparse.Namespace) -> Workers:
        if self.threads == 1:
            return Workers(self.tasks, count, workdir, args.database_url)
        command = ("run_workflow_worker", "--concurrency", str(self.threads))
        shape = Contender(self.name, self.description, command, self.tasks.wakes)
        return Workers(shape, count, workdir, args.database_url)

    def reset(self) -> None:
        from django.db import connection

        from django_leases.models import WorkflowWait

        tables = [*self.tasks.tables(), WorkflowWait._meta.db_table]
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")

    def enqueue_seq(self, count: int) -> None:
        from django.db import transaction

        from django_leases.workflows import start_workflow

        with transaction.atomic():
            for _ in range(count):
                start_workflow("bench-seq10", {})

    def seq_done(self) -> int:
        return int(
            scalar(
                f"SELECT count(*) FROM {self.tasks.table} WHERE workflow = %s AND status = %s",
                ("bench-seq10", "completed"),
            )
        )

    def enqueue_fanout(self, width: int) -> Any:
        from django_leases.workflows import start_workflow

        return start_workflow("bench-fanout", {"width": width})

    def fanout_done(self, handle: Any) -> bool:
        return status_of(self.tasks, handle) == "completed"

    def failed(self) -> int:
        return count_failed(self.tasks)

    # A backlog of 1-step runs (``bench-noop``), for the middle step's figure.

    def enqueue_noop(self, count: int) -> None:
        from django.db import transaction

        with transaction.atomic():
            for _ in range(count):
                self.tasks.enqueue()

    def noop_done(self) -> int:
        return int(
            scalar(
                f"SELECT count(*) FROM {self.tasks.table} WHERE workflow = %s AND status = %s",
                ("bench-noop", "completed"),
            )
        )

    def start_seq(self, steps: int, result_bytes: int = 0) -> Any:
        from django_leases.workflows import start_workflow

        return start_workflow(SEQ, seq_input(steps, result_bytes))

    def table_bytes(self) -> int:
        from django_leases.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt

        names = [m._meta.db_table for m in (WorkflowRun, WorkflowStep, WorkflowStepAttempt)]
        ((size,),) = self.read(
            "SELECT sum(pg_total_relation_size(name::regclass))::bigint FROM unnest(%s::text[]) "
            "AS name",
            (names,),
        )
        return int(size or 0)

    def read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """A query on this contender's database (the harness's)."""
        return rows(sql, params)

    def seq_finished_at(self, handle: Any) -> float | None:
        found = self.read(
            f"SELECT status, extract(epoch FROM finished_at)::float8 FROM {self.tasks.table} "
            "WHERE id = %s",
            (handle,),
        )
        status, finished = found[0] if found else (None, None)
        if status in self.tasks.failed_statuses:
            raise BenchError(f"{self.name}: run {handle} {status}")
        return float(finished) if status == "completed" else None

    def seq_boundaries(self, handle: Any, steps: int) -> list[float]:
        from django_leases.models import WorkflowStep

        return ours_boundaries(
            self.read, WorkflowStep._meta.db_table, self.tasks.table, handle, steps
        )


class OursCandidate(OursShapes):
    """Ours with ``django_leases`` imported from another source tree (``--seq-candidate``):
    its workers run in that tree, on a database of its own migrated by that tree; the harness
    starts its runs with a process of that tree and reads the rows with psycopg."""

    def __init__(self, tree: Path, database_url: str) -> None:
        super().__init__(f"ours@{tree.name}")
        self.tree = tree
        self.url = database_url
        self.description = (
            f"django-leases from {tree}: start_workflow (a process of that tree); manage.py "
            "run_workflow_worker --concurrency 1, working directory that tree, on its own "
            f"database {database_name(database_url)}"
        )
        self._connection: Any = None

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            BENCH_DATABASE_URL=self.url,
            BENCH_APPLICATION_NAME=f"wfbench-{self.name}",
            DJANGO_SETTINGS_MODULE=SETTINGS,
            PYTHONPATH=os.pathsep.join([str(self.tree), str(BENCH_DIR), str(ROOT)]),
        )
        env.pop("BENCH_COUNT_STATEMENTS", None)
        return env

    def in_tree(self, *argv: str) -> str:
        """Run ``python argv`` in the candidate tree; its stdout."""
        done = subprocess.run(
            [sys.executable, *argv],
            env=self.environment(),
            cwd=self.tree,
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise BenchError(f"{self.name}: {' '.join(argv)[:80]} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def prepare(self) -> None:
        """Recreate and migrate the candidate's database (with the candidate's migrations)."""
        recreate_database(self.url)
        self.in_tree("-m", "django", "migrate", "--verbosity", "0")
        found = self.in_tree(
            "-c", "import django_leases, sys; sys.stdout.write(django_leases.__file__)"
        )
        if not found.startswith(str(self.tree)):
            raise BenchError(f"{self.name}: django_leases imported from {found}, not the tree")

    def read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        import psycopg

        if self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(libpq_conninfo(self.url), autocommit=True)
        cursor = self._connection.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description is not None else []

    def workers(self, count: int, workdir: Path, args: argparse.Namespace) -> Workers:
        shape = Contender(self.name, self.description, self.tasks.worker_command, self.tasks.wakes)
        env = {"PYTHONPATH": self.environment()["PYTHONPATH"]}
        return Workers(shape, count, workdir, self.url, extra_env=env, cwd=self.tree)

    def reset(self) -> None:
        from django_leases.models import WorkflowWait

        tables = [*self.tasks.tables(), WorkflowWait._meta.db_table]
        self.read(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")

    def start_seq(self, steps: int, result_bytes: int = 0) -> Any:
        code = (
            "import django, sys; django.setup()\n"
            "from django_leases.workflows import start_workflow\n"
            f"sys.stdout.write(str(start_workflow({SEQ!r}, {seq_input(steps, result_bytes)!r})))"
        )
        return uuid.UUID(self.in_tree("-c", code).strip())

    def failed(self) -> int:
        marks = ", ".join(["%s"] * len(self.tasks.failed_statuses))
        ((count,),) = self.read(
            f"SELECT count(*) FROM {self.tasks.table} WHERE status IN ({marks})",
            self.tasks.failed_statuses,
        )
        return int(count)


class DbosShapes(ShapeContender):
    """DBOS Transact: worker processes of ``wfbench/dbos_app.py``, enqueued with DBOSClient."""

    seq_reason = None

    def __init__(self, name: str, polling_interval: float | None) -> None:
        self.name = name
        self.polling_interval = polling_interval
        poll = (
            "DBOS's defaults: the queue's polling_interval_sec and the handles' polling 1 s"
            if polling_interval is None
            else f"polling_interval_sec={polling_interval:g}, the handles polled as often"
        )
        self.description = (
            "DBOS Transact: @DBOS.workflow bench-seq10 (10 × @DBOS.step) and bench-fanout "
            f"(queue.enqueue of width one-step workflows, every handle's get_result()); one "
            f"Queue, {poll}; workers: DBOS.launch() processes, enqueued with DBOSClient"
        )
        self.fanout_how = (
            "a workflow enqueuing width one-step workflows on the queue and waiting for every "
            "handle; done when it succeeds"
        )
        self.url = ""
        self.worker_concurrency: int | None = None
        self._client: Any = None
        self._engine: Any = None
        self._connection: Any = None

    def configure(self, args: argparse.Namespace) -> None:
        self.url = args.dbos_database_url
        self.worker_concurrency = args.dbos_worker_concurrency

    # The harness's own connections to DBOS's system database: DBOSClient (no workflow runs
    # here) with a SQLAlchemy engine for enqueue_in_transaction, a psycopg one for the counts.
    def client(self) -> Any:
        if self._client is None:
            import sqlalchemy
            from dbos import DBOSClient
            from wfbench.dbos_app import APP_NAME, dbos_url

            self._engine = sqlalchemy.create_engine(dbos_url(self.url))
            self._client = DBOSClient(
                system_database_engine=self._engine, application_name=APP_NAME
            )
        return self._client

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        import psycopg

        if self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(libpq_conninfo(self.url), autocommit=True)
        return self._connection.execute(sql, params)

    def scalar(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        row = self.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def workers(self, count: int, workdir: Path, args: argparse.Namespace) -> Workers:
        env = {"BENCH_DBOS_DATABASE_URL": self.url}
        if self.polling_interval is not None:
            env["BENCH_DBOS_POLLING_INTERVAL"] = str(self.polling_interval)
        if self.worker_concurrency is not None:
            env["BENCH_DBOS_WORKER_CONCURRENCY"] = str(self.worker_concurrency)
        shape = Contender(self.name, self.description, (), "polls its queue")
        argv = [sys.executable, str(BENCH_DIR / "wfbench" / "dbos_app.py")]
        return Workers(shape, count, workdir, args.database_url, argv=argv, extra_env=env)

    def wait_ready(self, workers: Workers, timeout: float = 120.0) -> None:
        # A DBOS worker connects before it has migrated the system database and registered
        # the queue: wait for its own word (after DBOS.launch() and register_queue).
        deadline = time.monotonic() + timeout
        while not all(
            "dbos worker launched" in log.read_text(errors="replace") for log in workers.logs
        ):
            workers.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: workers not launched within {timeout:g} s")
            time.sleep(0.2)
        workers.wait_idle()

    def reset(self) -> None:
        # Every DBOS table but its migration record; the workers register their queue anew
        # when they launch.
        found = self.scalar(
            "SELECT string_agg(format('%%I.%%I', schemaname, tablename), ', ') FROM pg_tables "
            "WHERE schemaname = 'dbos' AND tablename <> 'dbos_migrations'"
        )
        if found:
            self.execute(f"TRUNCATE {found} CASCADE")

    def options(self, workflow: str) -> Any:
        from wfbench.dbos_app import QUEUE

        return {"workflow_name": workflow, "queue_name": QUEUE, "app_version": "wfbench"}

    def enqueue_seq(self, count: int) -> None:
        from wfbench.dbos_app import SEQ10

        client = self.client()
        with self._engine.begin() as connection:
            for _ in range(count):
                client.enqueue_in_transaction(connection, self.options(SEQ10))

    def seq_done(self) -> int:
        from wfbench.dbos_app import SEQ10

        return int(
            self.scalar(
                "SELECT count(*) FROM dbos.workflow_status WHERE name = %s AND status = 'SUCCESS'",
                (SEQ10,),
            )
        )

    def enqueue_fanout(self, width: int) -> Any:
        from wfbench.dbos_app import FANOUT

        return self.client().enqueue(self.options(FANOUT), width).get_workflow_id()

    def fanout_done(self, handle: Any) -> bool:
        status = self.scalar(
            "SELECT status FROM dbos.workflow_status WHERE workflow_uuid = %s", (handle,)
        )
        return status == "SUCCESS"

    def failed(self) -> int:
        return int(
            self.scalar(
                "SELECT count(*) FROM dbos.workflow_status WHERE status = ANY(%s)",
                (list(DBOS_FAILED),),
            )
        )

    def start_seq(self, steps: int, result_bytes: int = 0) -> Any:
        from wfbench.dbos_app import SEQ as DBOS_SEQ

        enqueued = self.client().enqueue(self.options(DBOS_SEQ), steps, result_bytes)
        return enqueued.get_workflow_id()

    def table_bytes(self) -> int:
        size = self.scalar(
            "SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'dbos' AND c.relkind = 'r'"
        )
        return int(size or 0)

    def seq_finished_at(self, handle: Any) -> float | None:
        found = self.execute(
            "SELECT status, updated_at FROM dbos.workflow_status WHERE workflow_uuid = %s",
            (handle,),
        ).fetchone()
        status, updated = found if found else (None, None)
        if status in DBOS_FAILED:
            raise BenchError(f"{self.name}: workflow {handle} {status}")
        return updated / 1e3 if status == "SUCCESS" else None

    def seq_boundaries(self, handle: Any, steps: int) -> list[float]:
        return dbos_boundaries(
            lambda sql, params: list(self.execute(sql, params).fetchall()), handle, steps
        )


class TaskShapes(ShapeContender):
    """A task peer: no 10-step workflow; the fan-out is ``width`` tasks committed at once."""

    seq_reason = NO_SEQ_REASON

    def __init__(self, contender: Contender) -> None:
        self.tasks = contender
        self.name = contender.name
        self.description = contender.description
        self.fanout_how = (
            "width no-op tasks committed in one transaction; done when the last completes "
            "(no join: the harness waits)"
        )

    def workers(self, count: int, workdir: Path, args: argparse.Namespace) -> Workers:
        return Workers(self.tasks, count, workdir, args.database_url)

    def reset(self) -> None:
        truncate(self.tasks)

    def enqueue_fanout(self, width: int) -> Any:
        from django.db import transaction

        target = count_done(self.tasks) + width
        with transaction.atomic():
            for _ in range(width):
                self.tasks.enqueue()
        return target

    def fanout_done(self, handle: Any) -> bool:
        return count_done(self.tasks) >= handle

    def failed(self) -> int:
        return count_failed(self.tasks)


SHAPE_CONTENDERS: dict[str, ShapeContender] = {
    c.name: c
    for c in (
        OursShapes(),
        # Not run by default: ours with as many threads per process as there are workers in
        # the wide runs, to set beside DBOS's worker (every dequeued workflow at once).
        OursShapes("ours-c4", 4),
        DbosShapes("dbos", None),
        DbosShapes("dbos-poll0.1", 0.1),
        *(TaskShapes(CONTENDERS[name]) for name in PEERS),
    )
}
DBOS_NAMES = [n for n, c in SHAPE_CONTENDERS.items() if isinstance(c, DbosShapes)]
ALL_CONTENDERS = [*CONTENDERS, *(n for n in SHAPE_CONTENDERS if n not in CONTENDERS)]
#: Named in --contenders to run: ours-c4, and the peers with CONN_MAX_AGE = 0 (ours-cma0 runs
#: by default).
OPTIONAL_CONTENDERS = ("ours-c4", *(n for n in VARIANTS if n != "ours" + CMA0))
OURS_NAMES = [n for n, c in SHAPE_CONTENDERS.items() if isinstance(c, OursShapes)]


def backend_cpu(workers: Workers) -> dict[int, float]:
    found = {}
    for pid in workers.backend_pids():
        used = process_cpu_seconds(pid, with_children=True)
        if used is not None:
            found[pid] = used
    return found


def measure_shape(
    workers: Workers, enqueue: Any, done: Any, steps: int, timeout: float
) -> dict[str, Any]:
    """Freeze the idle workers, ``enqueue()`` (committed on return), release them, poll
    ``done(handle)`` every 20 ms. Seconds from the release to done, and per step: statements,
    transactions, CPU µs of the workers and of their PostgreSQL backends (a backend opened
    during the window counts whole)."""
    workers.signal(signal.SIGSTOP)
    frozen = time.perf_counter()
    time.sleep(0.1)  # let the counters' last write land
    counted_before = workers.counted()
    handle = enqueue()
    committed = time.perf_counter()
    time.sleep(max(0.2, HOLD_SECONDS - (committed - frozen)))
    client_before = workers.cpu()
    server_before = backend_cpu(workers)
    start = time.perf_counter()
    workers.signal(signal.SIGCONT)
    deadline = start + timeout
    while not done(handle):
        if time.perf_counter() > deadline:
            workers.check_alive()
            raise BenchError(f"{workers.contender.name}: not done within {timeout:g} s")
        time.sleep(POLL_DONE)
    end = time.perf_counter()
    client = workers.cpu() - client_before
    server_after = backend_cpu(workers)
    server = sum(used - server_before.get(pid, 0.0) for pid, used in server_after.items())
    time.sleep(0.15)
    counted_after = workers.counted()
    seconds = end - start
    return {
        "seconds": seconds,
        "steps_per_second": steps / seconds,
        "enqueue_seconds": committed - frozen - 0.1,
        "statements_per_step": (counted_after["statements"] - counted_before["statements"]) / steps,
        "transactions_per_step": (counted_after["transactions"] - counted_before["transactions"])
        / steps,
        "worker_cpu_us_per_step": 1e6 * client / steps,
        "server_cpu_us_per_step": 1e6 * server / steps,
        "backends": len(server_after),
    }


def run_shapes_once(
    shape: ShapeContender, count: int, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """Fresh tables and ``count`` fresh workers: warm-up, the 10-step backlog, one fan-out."""
    out: dict[str, Any] = {}
    shape.reset()
    workers = shape.workers(count, workdir, args)
    workers.start()
    try:
        shape.wait_ready(workers)
        # Warm up: a few of each shape through the workers, not measured.
        if shape.seq_reason is None:
            base = shape.seq_done()
            shape.enqueue_seq(2 * count)
            wait_until(lambda: shape.seq_done() >= base + 2 * count, workers, 120)
        handle = shape.enqueue_fanout(10)
        wait_until(lambda: shape.fanout_done(handle), workers, 120)
        workers.wait_idle()
        if shape.seq_reason is None:
            items = args.seq_workflows
            base = shape.seq_done()
            found = measure_shape(
                workers,
                lambda: shape.enqueue_seq(items),
                lambda _: shape.seq_done() >= base + items,
                items * SEQ_STEPS,
                300 + items,
            )
            found["workflows_per_second"] = items / found["seconds"]
            out["seq10"] = found
            workers.wait_idle()
        if count == 1 and isinstance(shape, OursShapes):
            # The middle step's reference: a backlog of 1-step runs, as many runs as the
            # 10-step backlog has steps, through the same worker.
            runs = SEQ_STEPS * args.seq_workflows
            base = shape.noop_done()
            out["one_step"] = measure_shape(
                workers,
                lambda: shape.enqueue_noop(runs),
                lambda _: shape.noop_done() >= base + runs,
                runs,
                300 + runs,
            )
            workers.wait_idle()
        out["fanout"] = measure_shape(
            workers,
            lambda: shape.enqueue_fanout(args.fanout),
            shape.fanout_done,
            args.fanout,
            300 + args.fanout,
        )
        failed = shape.failed()
        if failed:
            raise BenchError(f"{shape.name}: {failed} runs or tasks failed")
    finally:
        workers.stop()
    return out


def wait_until(predicate: Any, workers: Workers, timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while not predicate():
        if time.perf_counter() > deadline:
            workers.check_alive()
            raise BenchError(f"{workers.contender.name}: warm-up not done within {timeout:g} s")
        time.sleep(POLL_DONE)


def run_shapes(args: argparse.Namespace, workdir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every chosen shape contender, 1 and ``--workers`` processes, ``--repeat`` times,
    interleaved in a rotating order."""
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in args.shape_chosen}
    for repetition in range(args.shape_repeat):
        shift = repetition % len(args.shape_chosen)
        for name in args.shape_chosen[shift:] + args.shape_chosen[:shift]:
            shape = SHAPE_CONTENDERS[name]
            found = {
                "workers_1": run_shapes_once(shape, 1, args, workdir),
                f"workers_{args.workers}": run_shapes_once(shape, args.workers, args, workdir),
            }
            runs[name].append(found)
            parts = []
            for key, label in (
                ("workers_1", "×1"),
                (f"workers_{args.workers}", f"×{args.workers}"),
            ):
                seq = found[key].get("seq10")
                if seq:
                    parts.append(
                        f"10-step{label} {seq['workflows_per_second']:6,.1f} wf/s "
                        f"{seq['steps_per_second']:6,.0f} steps/s"
                    )
                parts.append(f"fan-out{label} {found[key]['fanout']['seconds']:6.2f} s")
            print(
                f"  [{repetition + 1}/{args.shape_repeat}] {name:<16} " + "  ".join(parts),
                flush=True,
            )
    return runs


def summarise_shapes(
    runs: dict[str, list[dict[str, Any]]], workers: int
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Best repetition per figure; ratios: ours ÷ the best DBOS variant (10-step throughput)
    and the best other contender's fan-out time ÷ ours' (above 1: ours is faster)."""
    figures: dict[str, dict[str, Any]] = {}
    for name, repetitions in runs.items():
        found: dict[str, Any] = {}
        for count in (1, workers):
            key = f"workers_{count}"
            seqs = [r[key]["seq10"] for r in repetitions if "seq10" in r[key]]
            if seqs:
                best = max(seqs, key=lambda d: d["workflows_per_second"])
                found[f"seq10_wf_per_s_{count}"] = best["workflows_per_second"]
                found[f"seq10_steps_per_s_{count}"] = best["steps_per_second"]
                found[f"seq10_{count}_detail"] = best
            else:
                found[f"seq10_wf_per_s_{count}"] = None
                found[f"seq10_steps_per_s_{count}"] = None
            best = min((r[key]["fanout"] for r in repetitions), key=lambda d: d["seconds"])
            found[f"fanout_seconds_{count}"] = best["seconds"]
            found[f"fanout_{count}_detail"] = best
        # A middle step from each repetition's two backlogs (one worker, back to back: the
        # same conditions), then the median of each figure over the repetitions.
        pairs = [
            middle_step(r["workers_1"]["seq10"], r["workers_1"]["one_step"])
            for r in repetitions
            if "one_step" in r["workers_1"] and "seq10" in r["workers_1"]
        ]
        if pairs:
            found["middle_step_repetitions"] = pairs
            found["middle_step"] = median_of(pairs)
        figures[name] = found
    ratios: dict[str, Any] = {}
    others = [n for n in figures if n not in OURS_NAMES]
    for mine in (n for n in figures if n in OURS_NAMES):
        ours = figures[mine]
        prefix = "" if mine == "ours" else f"{mine}_"
        for count in (1, workers):
            key = f"seq10_wf_per_s_{count}"
            dbos = [n for n in figures if n in DBOS_NAMES and figures[n][key]]
            if dbos and ours[key]:
                best = max(dbos, key=lambda n, k=key: figures[n][k])
                ratios[f"{prefix}seq10_{count}_vs_best_dbos"] = ours[key] / figures[best][key]
                ratios[f"{prefix}seq10_{count}_best_dbos"] = best
            key = f"fanout_seconds_{count}"
            if others:
                best = min(others, key=lambda n, k=key: figures[n][k])
                ratios[f"{prefix}fanout_{count}_vs_best_other"] = figures[best][key] / ours[key]
                ratios[f"{prefix}fanout_{count}_best_other"] = best
            if dbos:
                best = min(dbos, key=lambda n, k=key: figures[n][k])
                ratios[f"{prefix}fanout_{count}_vs_best_dbos"] = figures[best][key] / ours[key]
                ratios[f"{prefix}fanout_{count}_best_dbos"] = best
    return figures, ratios


#: A middle step of a run ÷ a whole 1-step run, statements and CPU: at most this (issue 26).
MIDDLE_STEP_TARGET = 0.5


def middle_step(seq10: dict[str, Any], one_step: dict[str, Any]) -> dict[str, Any]:
    """What a middle step costs against a whole 1-step run, from the 1-worker backlogs of
    10-step runs (``seq10``, per step) and of 1-step runs (``one_step``, per run).

    A 10-step run is a 1-step run plus nine middle steps (its first step and its completion
    are written as a 1-step run's are; each later step is one write of the previous result
    that creates and claims it), so a middle step is ``(10-step run − 1-step run) ÷ 9``, for
    statements, transactions and CPU (worker, server, both); ``*_vs_run`` is that ÷ the
    1-step run. ``per_step_*`` is the older reading: the average step of the 10-step backlog
    (its first step and completion included) ÷ the 1-step run."""
    keys = (
        "statements_per_step",
        "transactions_per_step",
        "worker_cpu_us_per_step",
        "server_cpu_us_per_step",
    )
    run = {key: one_step[key] for key in keys}
    run["cpu_us_per_step"] = run["worker_cpu_us_per_step"] + run["server_cpu_us_per_step"]
    ten = {key: SEQ_STEPS * seq10[key] for key in keys}
    ten["cpu_us_per_step"] = ten["worker_cpu_us_per_step"] + ten["server_cpu_us_per_step"]
    out: dict[str, Any] = {"one_step_run": run}
    for key, value in run.items():
        name = key.removesuffix("_per_step")
        middle = (ten[key] - value) / (SEQ_STEPS - 1)
        out[name] = middle
        out[f"{name}_vs_run"] = middle / value if value else None
        out[f"per_step_{name}_vs_run"] = ten[key] / SEQ_STEPS / value if value else None
    return out


def median_of(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each number (of nested dicts too) over ``found``, which share their keys
    (``None`` where any is ``None``)."""
    out: dict[str, Any] = {}
    for key, first in found[0].items():
        if isinstance(first, dict):
            out[key] = median_of([d[key] for d in found])
        elif any(d[key] is None for d in found):
            out[key] = None
        else:
            out[key] = statistics.median(d[key] for d in found)
    return out


def render_middle_step(name: str, found: dict[str, Any]) -> list[str]:
    run = found["one_step_run"]

    def ratio(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}×"

    return [
        f"  {name}: a middle step (10-step run − 1-step run, ÷ 9): "
        f"{found['statements']:.2f} statements, CPU {found['worker_cpu_us']:,.0f} + "
        f"{found['server_cpu_us']:,.0f} µs; a 1-step run: {run['statements_per_step']:.2f} "
        f"statements, CPU {run['worker_cpu_us_per_step']:,.0f} + "
        f"{run['server_cpu_us_per_step']:,.0f} µs",
        f"  {name}: middle step ÷ 1-step run: statements {ratio(found['statements_vs_run'])}, "
        f"CPU worker + server {ratio(found['cpu_us_vs_run'])} (worker "
        f"{ratio(found['worker_cpu_us_vs_run'])}, server {ratio(found['server_cpu_us_vs_run'])})"
        f" — target ≤ {MIDDLE_STEP_TARGET:g}×; the average step of the 10-step backlog ÷ a "
        f"1-step run: statements {ratio(found['per_step_statements_vs_run'])}, CPU "
        f"{ratio(found['per_step_cpu_us_vs_run'])}",
    ]


def render_shapes(figures: dict[str, dict[str, Any]], workers: int, width: int) -> str:
    columns = [
        ("seq10_wf_per_s_1", "10-step wf/s ×1", "{:,.1f}"),
        ("seq10_steps_per_s_1", "steps/s ×1", "{:,.0f}"),
        (f"seq10_wf_per_s_{workers}", f"10-step wf/s ×{workers}", "{:,.1f}"),
        (f"seq10_steps_per_s_{workers}", f"steps/s ×{workers}", "{:,.0f}"),
        ("fanout_seconds_1", f"fan-out {width} ×1 s", "{:,.2f}"),
        (f"fanout_seconds_{workers}", f"fan-out {width} ×{workers} s", "{:,.2f}"),
    ]
    others = {
        key: [figures[n][key] for n in figures if n not in OURS_NAMES and figures[n][key]]
        for key, _, _ in columns
    }
    dbos = {
        key: [figures[n][key] for n in figures if n in DBOS_NAMES and figures[n][key]]
        for key, _, _ in columns
    }
    header = ["contender"] + [label for _, label, _ in columns]
    table = [header]
    for name, found in figures.items():
        row = [name]
        for key, _, fmt in columns:
            value = found[key]
            if value is None:
                row.append("n/a")
                continue
            cell = fmt.format(value)
            if name in OURS_NAMES and dbos[key]:
                if key.startswith("fanout"):
                    cell += f" ({min(dbos[key]) / value:.2f}×)"
                else:
                    cell += f" ({value / max(dbos[key]):.2f}×)"
            row.append(cell)
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    out = []
    for index, row in enumerate(table):
        out.append(
            "  ".join(
                [row[0].ljust(widths[0])]
                + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
            )
        )
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    lines_ = [
        "\n".join(out),
        "",
        "ratios (ours): 10-step: ours ÷ the better DBOS variant; fan-out: the faster DBOS "
        "variant's time ÷ ours (above 1: ours is faster)",
    ]
    for mine in (n for n in figures if n in OURS_NAMES):
        for key, label, _ in columns[4:]:
            if others[key]:
                best = min(others[key])
                lines_.append(
                    f"{mine}, {label}: the fastest other contender (task peers included, no "
                    f"join) {best:.2f} s, {best / figures[mine][key]:.2f}× ours"
                )
    lines_ += [
        "per step, 10-step backlog with 1 worker (fan-out for the task peers): statements, "
        "explicit transactions, CPU µs in the worker + in its PostgreSQL backends:",
    ]
    for name, found in figures.items():
        d = found.get("seq10_1_detail") or found["fanout_1_detail"]
        lines_.append(
            f"  {name:<16} {d['statements_per_step']:5.1f} statements  "
            f"{d['transactions_per_step']:4.1f} transactions  "
            f"CPU {d['worker_cpu_us_per_step']:6.0f} + {d['server_cpu_us_per_step']:.0f} µs"
        )
    middles = [(n, f["middle_step"]) for n, f in figures.items() if f.get("middle_step")]
    if middles:
        lines_.append(
            "a middle step against a whole 1-step run (1 worker; backlogs of 10-step runs and of "
            "as many 1-step runs, back to back; medians over the repetitions):"
        )
        for name, found in middles:
            lines_ += render_middle_step(name, found)
            each = figures[name]["middle_step_repetitions"]
            lines_.append(
                f"  {name}: each repetition, middle step ÷ 1-step run, CPU worker + server: "
                + ", ".join(f"{d['cpu_us_vs_run']:.2f}×" for d in each)
            )
    lines_.append("per branch, the fan-out with 1 worker (the same counts):")
    for name, found in figures.items():
        d = found["fanout_1_detail"]
        lines_.append(
            f"  {name:<16} {d['statements_per_step']:5.1f} statements  "
            f"{d['transactions_per_step']:4.1f} transactions  "
            f"CPU {d['worker_cpu_us_per_step']:6.0f} + {d['server_cpu_us_per_step']:.0f} µs"
        )
    return "\n".join(lines_)


# -- sequential: one run of k steps, as the run grows ------------------------------------------
#
# One run of k no-op steps at a time, one worker process, for each k of --seq-steps (10, 100,
# 1,000), ours beside DBOS Transact (and, with --seq-candidate, ours from another tree): the
# worker frozen while the run commits, released, the run's times read from its rows
# (wfbench/sequential.py). Per k: ms per step overall (release → completion) and over each
# tenth of the run, CPU per step of the worker and its PostgreSQL backends, statements per
# step. Targets (issue 26): ours' worker CPU per step at the largest k within 1.3× of the
# smallest; time per step ≥ 2× faster than DBOS at every k.

#: Ours' worker CPU per step at the largest k ÷ at the smallest: at most this.
SEQ_CPU_GROWTH_TARGET = 1.3
#: The faster DBOS variant's time per step ÷ ours: at least this at every k.
SEQ_VS_DBOS_TARGET = 2.0
#: The contenders of the sequential stage (of --contenders), besides --seq-candidate trees.
SEQ_NAMES = ("ours", *DBOS_NAMES)


def seq_input(steps: int, result_bytes: int) -> dict[str, int]:
    """Ours' input of a sequential run: ``steps`` steps, each returning ``result_bytes``
    bytes of JSON (0: nothing, the no-op step)."""
    if result_bytes:
        return {"steps": int(steps), "result_bytes": int(result_bytes)}
    return {"steps": int(steps)}


def measure_seq(
    shape: ShapeContender, workers: Workers, steps: int, timeout: float, result_bytes: int = 0
) -> dict[str, Any]:
    """Freeze the idle worker, start one run of ``steps`` steps (committed on return),
    release the worker, wait for the run's completion. Its times from its rows; CPU of the
    worker and of its PostgreSQL backends over the window (per thread, in nanoseconds, where
    ``/proc`` allows; else in clock ticks); statements and transactions it sent; what the
    run added to the contender's tables (bytes, ``table_bytes``)."""
    load = load_average()
    size_before = shape.table_bytes()
    workers.signal(signal.SIGSTOP)
    frozen = time.perf_counter()
    time.sleep(0.1)  # let the counters' last write land
    counted_before = workers.counted()
    handle = shape.start_seq(steps, result_bytes)
    committed = time.perf_counter()
    time.sleep(max(0.2, HOLD_SECONDS - (committed - frozen)))
    pids = [process.pid for process in workers.processes]
    ticks_before = workers.cpu()
    threads_before = threads_cpu_ns(pids)
    server_before = {pid: thread_cpu_ns(pid) for pid in workers.backend_pids()}
    released = time.time()
    workers.signal(signal.SIGCONT)
    deadline = time.perf_counter() + timeout
    while (finished := shape.seq_finished_at(handle)) is None:
        if time.perf_counter() > deadline:
            workers.check_alive()
            raise BenchError(f"{shape.name}: a {steps}-step run not done within {timeout:g} s")
        time.sleep(POLL_DONE)
    threads_after = threads_cpu_ns(pids)
    ticks_after = workers.cpu()
    server_after = {pid: thread_cpu_ns(pid) for pid in workers.backend_pids()}
    time.sleep(0.15)
    counted_after = workers.counted()
    size_after = shape.table_bytes()
    worker_cpu, exact = cpu_window(threads_before, threads_after)
    if worker_cpu is None or not exact:
        worker_cpu = ticks_after - ticks_before
    server_cpu = 0.0
    for pid, after in server_after.items():
        spent, _ = cpu_window(server_before.get(pid) or {}, after)
        server_cpu += spent or 0.0
    boundaries = shape.seq_boundaries(handle, steps)
    if not released - 0.002 <= boundaries[0] <= boundaries[-1] <= finished + 0.002:
        raise BenchError(f"{shape.name}: the run's times are out of order (clocks?)")
    found = tenths(boundaries)
    seconds = finished - released
    return {
        "steps": steps,
        "result_bytes": result_bytes,
        "table_bytes_per_run": size_after - size_before,
        "run": str(handle),
        "load_average": load,
        "seconds": seconds,
        "ms_per_step": 1e3 * seconds / steps,
        "to_first_step_ms": 1e3 * (boundaries[0] - released),
        **found,
        "worker_cpu_us_per_step": 1e6 * worker_cpu / steps,
        "worker_cpu_exact": exact,
        "worker_cpu_ticks_us_per_step": 1e6 * (ticks_after - ticks_before) / steps,
        "server_cpu_us_per_step": 1e6 * server_cpu / steps,
        "backends": len(server_after),
        "statements_per_step": (counted_after["statements"] - counted_before["statements"]) / steps,
        "transactions_per_step": (counted_after["transactions"] - counted_before["transactions"])
        / steps,
    }


def run_sequential_once(
    shape: ShapeContender, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """Fresh tables and one fresh worker: a warm-up run of 10 steps, then one run of each
    length of ``--seq-steps``, in that order."""
    out: dict[str, Any] = {}
    shape.reset()
    workers = shape.workers(1, workdir, args)
    workers.start()
    try:
        shape.wait_ready(workers)
        handle = shape.start_seq(10)
        wait_until(lambda: shape.seq_finished_at(handle) is not None, workers, 120)
        workers.wait_idle()
        for steps in args.seq_steps:
            out[str(steps)] = measure_seq(shape, workers, steps, 300 + steps, args.seq_result_bytes)
            workers.wait_idle()
        failed = shape.failed()
        if failed:
            raise BenchError(f"{shape.name}: {failed} runs failed")
    finally:
        workers.stop()
    return out


def run_sequential(args: argparse.Namespace, workdir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every chosen contender, ``--seq-repeat`` times, interleaved in a rotating order."""
    host = str(psycopg_conninfo(args.database_url).get("host") or "")
    if host not in ("", "localhost", "127.0.0.1", "::1") and not host.startswith("/"):
        # The release is timed on this machine's clock, the run's end on the server's.
        raise SystemExit("the sequential stage needs the database server on this machine")
    for shape in args.seq_candidates:
        shape.prepare()
    chosen = args.seq_chosen
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in chosen}
    for repetition in range(args.seq_repeat):
        shift = repetition % len(chosen)
        for name in chosen[shift:] + chosen[:shift]:
            found = run_sequential_once(seq_contender(args, name), args, workdir)
            runs[name].append(found)
            parts = [
                f"k={steps} {d['ms_per_step']:5.2f} ms/step "
                f"({d['first_tenth_ms']:.2f} → {d['last_tenth_ms']:.2f}) "
                f"CPU {d['worker_cpu_us_per_step']:,.0f} µs"
                for steps, d in found.items()
            ]
            print(
                f"  [{repetition + 1}/{args.seq_repeat}] {name:<16} " + "  ".join(parts),
                flush=True,
            )
    return runs


def seq_contender(args: argparse.Namespace, name: str) -> ShapeContender:
    for shape in args.seq_candidates:
        if shape.name == name:
            return shape
    return SHAPE_CONTENDERS[name]


def summarise_sequential(
    runs: dict[str, list[dict[str, Any]]], steps: list[int]
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Per contender and k, the repetition with the least time per step (every figure of
    that repetition, and the median of each over the repetitions); ratios for ours and each
    candidate: the faster DBOS variant's time per step ÷ theirs at each k, and their worker
    CPU per step at the largest k ÷ at the smallest."""
    figures: dict[str, dict[str, Any]] = {}
    keys = (
        "ms_per_step",
        "first_tenth_ms",
        "last_tenth_ms",
        "worker_cpu_us_per_step",
        "server_cpu_us_per_step",
        "statements_per_step",
    )
    for name, repetitions in runs.items():
        figures[name] = {}
        for k in steps:
            each = [r[str(k)] for r in repetitions]
            best = dict(min(each, key=lambda d: d["ms_per_step"]))
            best["medians"] = {key: statistics.median(d[key] for d in each) for key in keys}
            best["repetitions"] = len(each)
            figures[name][str(k)] = best
    ratios: dict[str, Any] = {}
    dbos = [n for n in figures if n in DBOS_NAMES]
    for mine in (n for n in figures if n not in DBOS_NAMES):
        found: dict[str, Any] = {}
        for k in steps:
            ours = figures[mine][str(k)]
            if dbos:
                best = min(dbos, key=lambda n, k=k: figures[n][str(k)]["ms_per_step"])
                found[f"{k}_dbos_time_vs_ours"] = (
                    figures[best][str(k)]["ms_per_step"] / ours["ms_per_step"]
                )
                found[f"{k}_best_dbos"] = best
        low, high = figures[mine][str(min(steps))], figures[mine][str(max(steps))]
        found["worker_cpu_growth"] = high["worker_cpu_us_per_step"] / low["worker_cpu_us_per_step"]
        found["worker_cpu_growth_medians"] = (
            high["medians"]["worker_cpu_us_per_step"] / low["medians"]["worker_cpu_us_per_step"]
        )
        ratios[mine] = found
    return figures, ratios


def render_sequential(
    figures: dict[str, dict[str, Any]], ratios: dict[str, Any], steps: list[int]
) -> str:
    header = [
        "contender",
        "k",
        "ms/step",
        "first → last tenth",
        "worker CPU µs/step",
        "server CPU µs/step",
        "statements/step",
        "DBOS ÷ ours",
        "load",
    ]
    table = [header]
    for name, found in figures.items():
        for k in steps:
            d = found[str(k)]
            versus = ratios.get(name, {}).get(f"{k}_dbos_time_vs_ours")
            table.append(
                [
                    name,
                    f"{k:,}",
                    f"{d['ms_per_step']:.2f}",
                    f"{d['first_tenth_ms']:.2f} → {d['last_tenth_ms']:.2f}",
                    f"{d['worker_cpu_us_per_step']:,.0f}"
                    + ("" if d["worker_cpu_exact"] else " (ticks)"),
                    f"{d['server_cpu_us_per_step']:,.0f}",
                    f"{d['statements_per_step']:.2f}",
                    "" if versus is None else f"{versus:.2f}×",
                    f"{d['load_average'][0]:.2f}" if d.get("load_average") else "?",
                ]
            )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    out = []
    for index, row in enumerate(table):
        out.append(
            "  ".join(
                [row[0].ljust(widths[0])]
                + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
            )
        )
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    out += [
        "",
        "ms/step: release of the worker → the run's completion, ÷ k; the tenths from the run's "
        "rows (first step's start → each step's end); the figures of the fastest repetition; "
        "load: the 1-minute load average as that run started; DBOS ÷ ours: the faster DBOS "
        "variant's ms/step ÷ ours (above 1: ours is faster)",
    ]
    low, high = min(steps), max(steps)
    for mine, found in ratios.items():
        verdicts = [
            f"k={k:,} {found[f'{k}_dbos_time_vs_ours']:.2f}×"
            for k in steps
            if f"{k}_dbos_time_vs_ours" in found
        ]
        if verdicts:
            out.append(
                f"{mine}: time per step, DBOS ÷ ours: "
                + ", ".join(verdicts)
                + f" — target ≥ {SEQ_VS_DBOS_TARGET:g}× at every k"
            )
        out.append(
            f"{mine}: worker CPU per step at k={high:,} ÷ k={low:,}: "
            f"{found['worker_cpu_growth']:.2f}× (medians of the repetitions: "
            f"{found['worker_cpu_growth_medians']:.2f}×) — target ≤ {SEQ_CPU_GROWTH_TARGET:g}×"
        )
    return "\n".join(out)


# -- scale: the drain on tables a long-lived deployment has filled -----------------------------
#
# ``--scale N``: the same 1,000-run drain of ours (1 and --workers processes; persistent
# connections and CONN_MAX_AGE = 0) on empty tables and on tables holding N finished runs with
# their steps, attempts and released run leases (``wfbench/scale.py``), in one run, each
# repetition interleaving both; the ratio filled ÷ empty, the HOT share of the updates per
# table, and the plans of the worker's statements on both (auto_explain).

DEFAULT_SCALE_DATABASE_URL = (
    "postgres://postgres@127.0.0.1:5432/django_leases_bench_workflows_scale"
)
SCALE_CONTENDERS = ("ours", "ours" + CMA0)
#: ours ÷ the same drain on empty tables, with the filled tables: the target.
SCALE_TARGET = 0.9
#: Runs in the backlog while the plans are captured, and how many units of work run first so
#: that the functions' plan cache has settled (PL/pgSQL tries 5 custom plans, then generic).
PLAN_BACKLOG = 300
PLAN_WARM_UNITS = 12
PLAN_CAPTURED_UNITS = 2


def database_name(database_url: str) -> str:
    return str(psycopg_conninfo(database_url).get("dbname") or "")


def with_database_name(database_url: str, name: str) -> str:
    """``database_url`` naming database ``name`` instead (same server, user, options)."""
    from urllib.parse import quote, urlsplit, urlunsplit

    parts = urlsplit(database_url)
    return urlunsplit(parts._replace(path="/" + quote(name)))


@contextlib.contextmanager
def harness_on(database_url: str) -> Any:
    """The harness's Django connection on ``database_url``'s database (same server) within."""
    from django.db import connections

    connection = connections["default"]
    previous = connection.settings_dict["NAME"]
    connection.close()
    connection.settings_dict["NAME"] = database_name(database_url)
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["NAME"] = previous


def database_exists(database_url: str) -> bool:
    import psycopg

    admin = psycopg.conninfo.make_conninfo(libpq_conninfo(database_url), dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as connection:
        found = connection.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (database_name(database_url),)
        ).fetchone()
    return found is not None


def prepare_scale_database(args: argparse.Namespace) -> dict[str, Any]:
    """The filled database, reused when it holds ``--scale`` runs filled under the current
    migrations (what later runs added is deleted), else dropped, migrated and filled."""
    from django.core.management import call_command
    from wfbench import scale

    url = args.scale_database_url
    conninfo = libpq_conninfo(url)
    if "bench" not in database_name(url):
        raise SystemExit("the scale database's name must say 'bench'")
    out: dict[str, Any] = {"database": database_name(url), "runs": args.scale}
    if database_exists(url) and not args.scale_refill:
        with harness_on(url):
            call_command("migrate", verbosity=0, interactive=False)
        found = scale.marker(conninfo)
        if (
            found
            and found["runs"] == args.scale
            and found["migrations"] == scale.applied_migrations(conninfo)
        ):
            print(
                f"scale: reusing {out['database']} ({args.scale:,} finished runs, filled "
                f"{found['filled_at']:%Y-%m-%d %H:%M} in {found['fill_seconds']:.0f} s)",
                flush=True,
            )
            out.update(
                reused=True,
                filled_at=found["filled_at"].isoformat(),
                fill_seconds=found["fill_seconds"],
                trim_seconds=scale.trim_to_fill(conninfo, found),
            )
            out["sizes"] = scale.sizes(conninfo)
            return out
    print(f"scale: filling {out['database']} with {args.scale:,} finished runs", flush=True)
    recreate_database(url)
    with harness_on(url):
        call_command("migrate", verbosity=0, interactive=False)
    filled = scale.fill(conninfo, args.scale, lambda line: print(line, flush=True))
    print(
        f"scale: filled in {filled['fill_seconds']:.0f} s, VACUUM (ANALYZE) "
        f"{filled['vacuum_seconds']:.0f} s",
        flush=True,
    )
    out.update(
        reused=False,
        filled_at=filled["filled_at"].isoformat() if filled["filled_at"] else None,
        fill_seconds=filled["fill_seconds"],
        vacuum_seconds=filled["vacuum_seconds"],
    )
    out["sizes"] = scale.sizes(conninfo)
    return out


def scale_drain(
    contender: Contender,
    count: int,
    database_url: str,
    empty: bool,
    args: argparse.Namespace,
    workdir: Path,
) -> dict[str, Any]:
    """One drain of ``--tasks`` runs by ``count`` fresh workers on ``database_url``'s tables
    (emptied first when ``empty``); done counted among the runs created since the warm-up."""
    with harness_on(database_url):
        if empty:
            truncate(contender)
        workers = Workers(contender, count, workdir, database_url)
        workers.start()
        try:
            warm_up(contender, workers, 20 if count == 1 else 4 * count, db_now())
            return measure_drain(contender, workers, args.tasks, db_now())
        finally:
            workers.stop()


def aggregate_plans(plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The captured plans grouped by statement, in order of first appearance: how often it
    ran, its shared buffers (mean, first and last tenth of the executions, max), its mean
    duration, the scans of its first execution and that execution's plan."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for plan in plans:
        groups.setdefault(plan["query"][:400], []).append(plan)
    out = []
    for query, found in groups.items():
        buffers = [p["top_buffers"] for p in found]
        tenth = max(1, len(found) // 10)
        out.append(
            {
                "query": query,
                "executions": len(found),
                "buffers_mean": statistics.fmean(buffers),
                "buffers_first_tenth": statistics.fmean(buffers[:tenth]),
                "buffers_last_tenth": statistics.fmean(buffers[-tenth:]),
                "buffers_max": max(buffers),
                "duration_ms_mean": statistics.fmean(p["duration_ms"] or 0.0 for p in found),
                "scans": found[0]["scans"],
                "plan": found[0]["plan"],
                "last_plan": found[-1]["plan"],
            }
        )
    return out


def capture_worker_plans(database_url: str) -> dict[str, Any]:
    """The plans of ours' worker statements on ``database_url``'s tables, as the functions'
    plan cache runs them (auto_explain, in this process): a few runs drained first so that
    the cache has settled, then a backlog of ``PLAN_BACKLOG`` runs committed and drained with
    the plans captured, then an idle poll; and, with the backlog there, EXPLAIN of a run
    looked up by id while ``running`` (custom and generic plans)."""
    from django.db import connection, transaction
    from wfbench import scale

    from django_leases.workflows.worker import Worker

    ours = CONTENDERS["ours"]
    out: dict[str, Any] = {"backlog": PLAN_BACKLOG}
    with harness_on(database_url):
        worker = Worker(1)
        for _ in range(PLAN_WARM_UNITS):
            ours.enqueue()
        while worker.work_once():
            pass
        with transaction.atomic():
            for _ in range(PLAN_BACKLOG):
                ours.enqueue()
        run_id = scalar(
            f"SELECT id FROM {ours.table} WHERE status = 'running' ORDER BY id DESC LIMIT 1"
        )
        out["probes"] = probe_run_lookup(ours.table, run_id, "")

        def drain() -> None:
            while worker.work_once():
                pass

        out["drain"] = aggregate_plans(scale.capture_plans(drain))
        out["idle_poll"] = aggregate_plans(scale.capture_plans(worker.work_once))
        # The same lookup once ANALYZE has seen running runs (a backlog committed again):
        # the statistics, not the statement, choose the index.
        with transaction.atomic():
            for _ in range(PLAN_BACKLOG):
                ours.enqueue()
        run_id = scalar(
            f"SELECT id FROM {ours.table} WHERE status = 'running' ORDER BY id DESC LIMIT 1"
        )
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {ours.table}")
        out["probes"].update(probe_run_lookup(ours.table, run_id, ", after ANALYZE"))
        while worker.work_once():
            pass
    return out


def probe_run_lookup(table: str, run_id: Any, label: str) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of a run looked up by id while ``running``, as the
    completion and the step's insert do, with a custom and with a generic plan."""
    from django.db import connection
    from wfbench import scale

    probes = {}
    with connection.cursor() as cursor:
        cursor.execute(
            f"PREPARE bench_run_running(uuid) AS SELECT id FROM {table} "
            "WHERE id = $1 AND status = 'running'"
        )
        for mode in ("force_custom_plan", "force_generic_plan"):
            cursor.execute(f"SET plan_cache_mode = {mode}")
            cursor.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE bench_run_running(%s)",
                [run_id],
            )
            plan = cursor.fetchone()[0]
            probes[f"run by id and running, {mode}{label}"] = scale.summarise_plan(
                "plan:" + json.dumps(plan[0] if isinstance(plan, list) else plan)
            )
        cursor.execute("RESET plan_cache_mode")
        cursor.execute("DEALLOCATE bench_run_running")
    return probes


@contextlib.contextmanager
def indexes_dropped(urls: list[str], names: list[str]) -> Any:
    """The indexes ``names`` dropped from the databases ``urls`` within (an experiment: what
    the drain costs without them), created again from their definitions afterwards."""
    import psycopg

    dropped: list[tuple[str, str]] = []
    try:
        for url in urls:
            with psycopg.connect(libpq_conninfo(url), autocommit=True) as connection:
                for name in names:
                    row = connection.execute(
                        "SELECT pg_get_indexdef(to_regclass(%s))", (name,)
                    ).fetchone()
                    if not row or not row[0]:
                        raise SystemExit(f"--scale-drop-index: no index {name!r}")
                    connection.execute(f'DROP INDEX "{name}"')
                    dropped.append((url, row[0]))
        yield [definition for _, definition in dropped]
    finally:
        for url, definition in dropped:
            with psycopg.connect(libpq_conninfo(url), autocommit=True) as connection:
                connection.execute(definition)


def run_scale(args: argparse.Namespace, workdir: Path, filled: dict[str, Any]) -> dict[str, Any]:
    """``--scale-repeat`` repetitions of every (tables, contender, workers) drain, interleaved
    in a rotating order; then the plans on both. With ``--scale-drop-index``, all of it
    without those indexes (put back afterwards)."""
    urls = [args.database_url, args.scale_database_url]
    with indexes_dropped(urls, args.scale_drop_index) as dropped:
        found = run_scale_stage(args, workdir, filled)
    found["dropped_indexes"] = dropped
    return found


def run_scale_stage(
    args: argparse.Namespace, workdir: Path, filled: dict[str, Any]
) -> dict[str, Any]:
    states = {"empty": args.database_url, "filled": args.scale_database_url}
    cases = [
        (state, name, count)
        for name in SCALE_CONTENDERS
        for count in (1, args.workers)
        for state in states
    ]
    runs: dict[str, list[dict[str, Any]]] = {}
    for repetition in range(args.scale_repeat):
        shift = (repetition * 3) % len(cases)
        for state, name, count in cases[shift:] + cases[:shift]:
            found = scale_drain(
                CONTENDERS[name], count, states[state], state == "empty", args, workdir
            )
            runs.setdefault(f"{name}|{state}|{count}", []).append(found)
            print(
                f"  [{repetition + 1}/{args.scale_repeat}] {name:<10} {state:<6} ×{count} "
                f"{found['rate']:6,.0f} runs/s  HOT {render_hot(found['tables'])}",
                flush=True,
            )
    print("  plans (auto_explain) on the filled and the empty tables", flush=True)
    plans = {state: capture_worker_plans(url) for state, url in states.items()}
    return {"filled": filled, "repetitions": runs, "plans": plans}


def summarise_scale(found: dict[str, Any], workers: int) -> dict[str, Any]:
    """Best repetition per (contender, tables, workers); ratio filled ÷ empty; the HOT share
    per table pooled over every repetition's drain."""
    figures: dict[str, Any] = {}
    for key, repetitions in found["repetitions"].items():
        name, state, count = key.split("|")
        best = max(repetitions, key=lambda r: r["rate"])
        pooled: dict[str, dict[str, Any]] = {}
        for repetition in repetitions:
            for table, stats in repetition["tables"].items():
                into = pooled.setdefault(table, {"updates": 0, "hot_updates": 0, "inserts": 0})
                for field in into:
                    into[field] += stats[field]
        for stats in pooled.values():
            stats["hot_share"] = (
                stats["hot_updates"] / stats["updates"] if stats["updates"] else None
            )
        entry = figures.setdefault(name, {})
        entry[f"{state}_{count}"] = best["rate"]
        entry[f"{state}_{count}_detail"] = best
        entry[f"{state}_{count}_hot"] = pooled
    for entry in figures.values():
        for count in (1, workers):
            if f"filled_{count}" in entry and f"empty_{count}" in entry:
                entry[f"ratio_{count}"] = entry[f"filled_{count}"] / entry[f"empty_{count}"]
    return figures


def render_scale(figures: dict[str, Any], workers: int, runs: int) -> str:
    header = [
        "contender",
        "empty ×1 /s",
        f"{runs:,} kept ×1 /s",
        "ratio ×1",
        f"empty ×{workers} /s",
        f"{runs:,} kept ×{workers} /s",
        f"ratio ×{workers}",
    ]
    table = [header]
    for name, entry in figures.items():
        table.append(
            [
                name,
                f"{entry['empty_1']:,.0f}",
                f"{entry['filled_1']:,.0f}",
                f"{entry['ratio_1']:.2f}×",
                f"{entry[f'empty_{workers}']:,.0f}",
                f"{entry[f'filled_{workers}']:,.0f}",
                f"{entry[f'ratio_{workers}']:.2f}×",
            ]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    out = []
    for index, row in enumerate(table):
        out.append(
            "  ".join(
                [row[0].ljust(widths[0])]
                + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
            )
        )
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    out.append(f"ratio: kept ÷ empty, target ≥ {SCALE_TARGET}×")
    out.append("HOT share of the updates per table, every repetition pooled (updates):")
    for name, entry in figures.items():
        for state in ("empty", "filled"):
            for count in (1, workers):
                out.append(
                    f"  {name:<10} {state:<6} ×{count}  {render_hot(entry[f'{state}_{count}_hot'])}"
                )
    return "\n".join(out)


def render_plans(plans: dict[str, Any]) -> str:
    """Per captured statement (filled tables): its scans and buffers, beside the empty's."""
    out = [
        f"plans of the worker's statements (auto_explain; a backlog of {PLAN_BACKLOG} runs "
        "drained, then an idle poll): shared buffers per execution, mean (first tenth → last "
        "tenth), kept tables vs empty"
    ]
    filled, empty = plans["filled"], plans["empty"]
    for part in ("drain", "idle_poll"):
        others = {g["query"]: g for g in empty[part]}
        for group in filled[part]:
            other = others.get(group["query"])
            scans = "; ".join(
                f"{s['scan']} {s['index'] or ''} on {short_table(s['table'] or '')}".replace(
                    "  ", " "
                )
                for s in group["scans"]
            )
            line = (
                f"  [{part}] {group['query'][:80]}\n      ×{group['executions']}: kept "
                f"{group['buffers_mean']:.1f} ({group['buffers_first_tenth']:.1f} → "
                f"{group['buffers_last_tenth']:.1f}) buffers, {group['duration_ms_mean']:.3f} ms"
            )
            if other:
                line += (
                    f"; empty {other['buffers_mean']:.1f} ({other['buffers_first_tenth']:.1f} → "
                    f"{other['buffers_last_tenth']:.1f}), {other['duration_ms_mean']:.3f} ms"
                )
            out.append(line)
            if scans:
                out.append(f"      {scans}")
    for state in ("filled", "empty"):
        for label, plan in plans[state]["probes"].items():
            out.append(f"  [probe, {state}] {label}: " + "; ".join(plan["plan"]))
    return "\n".join(out)


# -- facts, report ------------------------------------------------------------------------------


def server_facts(name: str) -> dict[str, Any]:
    facts: dict[str, Any] = {"database": name}
    for setting in ("server_version", "synchronous_commit", "fsync", "shared_buffers"):
        facts[setting] = scalar(f"SHOW {setting}")
    return facts


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarise(
    runs: dict[str, list[dict[str, Any]]], workers: int
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, float | None]]]:
    """Best throughput per metric, pooled latency percentiles; ratios ours / best peer."""
    throughput = ("end_to_end", "drain_1", f"drain_{workers}")
    figures: dict[str, dict[str, Any]] = {}
    for name, repetitions in runs.items():
        found: dict[str, Any] = {}
        for metric in throughput:
            best = max(repetitions, key=lambda r, m=metric: r[m]["rate"])[metric]
            found[metric] = best["rate"]
            found[f"{metric}_detail"] = best
        latencies = [ms for r in repetitions for ms in r["latency_ms"]]
        found["latency_p50_ms"] = percentile(latencies, 0.5)
        found["latency_p99_ms"] = percentile(latencies, 0.99)
        found["latency_mean_ms"] = statistics.fmean(latencies)
        found["latency_samples"] = len(latencies)
        figures[name] = found
    ratios: dict[str, dict[str, float | None]] = {}
    for variant in (v for v in figures if v in VARIANTS):
        base = CONTENDERS[variant].base
        if base in figures:
            ratios[f"{variant}_vs_{base}"] = {
                metric: figures[variant][metric] / figures[base][metric] for metric in throughput
            }
    every_peer = [p for p in figures if p not in OURS_TASK_NAMES and p not in VARIANTS]
    task_peers = [p for p in every_peer if p in TASK_BACKEND_PEERS]
    for mine, against, peers in (
        ("ours", "best_peer", every_peer),
        ("ours-tasks", "best_peer", every_peer),
        ("ours-tasks", "best_task_backend", task_peers),
    ):
        if mine not in figures or not peers:
            continue
        ours = figures[mine]
        found_ratios: dict[str, float | None] = {}
        ratios[f"{mine}_vs_{against}"] = found_ratios
        for metric in throughput:
            best_peer = max(peers, key=lambda p, m=metric: figures[p][m])
            found_ratios[metric] = ours[metric] / figures[best_peer][metric]
            found_ratios[f"{metric}_best_peer"] = best_peer  # type: ignore[assignment]
        for metric in ("latency_p50_ms", "latency_p99_ms"):
            best_peer = min(peers, key=lambda p, m=metric: figures[p][m])
            # For latency, lower is better: best peer's latency / ours (≥ 1 means ours is faster).
            found_ratios[metric] = figures[best_peer][metric] / ours[metric]
            found_ratios[f"{metric}_best_peer"] = best_peer  # type: ignore[assignment]
    return figures, ratios


def render_table(figures: dict[str, dict[str, Any]], workers: int) -> str:
    columns = [
        ("end_to_end", "e2e items/s", "{:,.0f}"),
        ("drain_1", "drain 1 worker/s", "{:,.0f}"),
        (f"drain_{workers}", f"drain {workers} workers/s", "{:,.0f}"),
        ("latency_p50_ms", "latency p50 ms", "{:,.1f}"),
        ("latency_p99_ms", "latency p99 ms", "{:,.1f}"),
    ]
    peers = [p for p in figures if p not in OURS_TASK_NAMES and p not in VARIANTS]
    best_peer = (
        {
            key: (min if key.startswith("latency") else max)(figures[p][key] for p in peers)
            for key, _, _ in columns
        }
        if peers
        else {}
    )
    header = ["contender"] + [label for _, label, _ in columns]
    lines_ = [header]
    for name, found in figures.items():
        row = [name]
        for key, _, fmt in columns:
            cell = fmt.format(found[key])
            base = CONTENDERS[name].base
            if base in figures:
                # A variant: to its base, persistent connections (above 1: it is faster).
                ratio = (
                    figures[base][key] / found[key]
                    if key.startswith("latency")
                    else found[key] / figures[base][key]
                )
                cell += f" ({ratio:.2f}× {base})"
            elif name in OURS_TASK_NAMES and best_peer:
                ratio = (
                    best_peer[key] / found[key]
                    if key.startswith("latency")
                    else found[key] / best_peer[key]
                )
                cell += f" ({ratio:.2f}×)"
            row.append(cell)
        lines_.append(row)
    widths = [max(len(r[i]) for r in lines_) for i in range(len(header))]
    out = []
    for index, row in enumerate(lines_):
        out.append(
            "  ".join(
                [row[0].ljust(widths[0])]
                + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
            )
        )
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def render_costs(figures: dict[str, dict[str, Any]]) -> str:
    lines_ = [
        "per item, 1-worker drain: statements sent, explicit transactions (commit/rollback), "
        "CPU µs in the worker + in its PostgreSQL backends:",
    ]
    for name, found in figures.items():
        d = found["drain_1_detail"]
        server = d["server_cpu_us_per_item"]
        lines_.append(
            f"  {name:<16} {d['statements_per_item']:5.1f} statements  "
            f"{d['transactions_per_item']:4.1f} transactions  "
            f"CPU {d['worker_cpu_us_per_item']:6.0f} + "
            f"{'?' if server is None else f'{server:.0f}'} µs"
        )
    lines_.append("HOT share of the updates per table during the 1-worker drain (updates):")
    for name, found in figures.items():
        lines_.append(f"  {name:<16} {render_hot(found['drain_1_detail'].get('tables', {}))}")
    return "\n".join(lines_)


def short_table(table: str) -> str:
    return table.removeprefix("django_leases_").removeprefix("workflow") or table


def render_hot(tables: dict[str, dict[str, Any]]) -> str:
    """``table 93 % (2,000)`` for each table with updates."""
    parts = []
    for table, found in tables.items():
        if found["updates"]:
            parts.append(
                f"{short_table(table)} {100 * found['hot_share']:.0f} % ({found['updates']:,})"
            )
    return ", ".join(parts) or "no updates"


# -- profiling ours -----------------------------------------------------------------------------


def profile_ours(args: argparse.Namespace) -> None:
    """Ours' worker loop in this process: statements per run (by kind), and a cProfile."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_leases.workflows.worker import Worker

    ours = CONTENDERS[args.profile_contender]
    truncate(ours)
    worker = Worker(1)

    def drain(items: int) -> None:
        for _ in range(items):
            ours.enqueue()
        while worker.work_once():
            pass

    drain(20)  # warm
    with CaptureQueriesContext(connection) as captured:
        ours.enqueue()
        enqueue_count = len(captured.captured_queries)
        while worker.work_once():
            pass
    print(
        f"\n{ours.name}, one item: {len(captured.captured_queries)} statements "
        f"({enqueue_count} to start it), in order:"
    )
    for query in captured.captured_queries:
        print(f"  {query['time']:>6}s  {query['sql'][:160]}")
    empty = CaptureQueriesContext(connection)
    with empty:
        worker.work_once()
    print(f"an idle poll: {len(empty.captured_queries)} statements")

    # Where a run's wall time goes, unit by unit, against what a bare round trip and a bare
    # thread start + join cost here and now (medians; the machine may be shared).
    def median_us(action: Any, times: int = 300) -> float:
        found = []
        for _ in range(times):
            began = time.perf_counter()
            action()
            found.append(1e6 * (time.perf_counter() - began))
        return statistics.median(found)

    def round_trip() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    def thread_start_join() -> None:
        import threading

        thread = threading.Thread(target=lambda: None)
        thread.start()
        thread.join()

    rt_us = median_us(round_trip)
    thread_us = median_us(thread_start_join)
    units: dict[str, list[tuple[float, int, float]]] = {}
    for _ in range(args.breakdown_runs):
        ours.enqueue()
        while True:
            with CaptureQueriesContext(connection) as unit:
                began = time.perf_counter()
                did = worker.work_once()
                wall = 1e6 * (time.perf_counter() - began)
            if not did:
                break
            # A worker drives the run it takes: pick, step, completion in one unit of work.
            kind = "pick + step + completion"
            in_sql = 1e6 * sum(float(q["time"]) for q in unit.captured_queries)
            units.setdefault(kind, []).append((wall, len(unit.captured_queries), in_sql))
    print(
        f"\nper unit of work, median of {args.breakdown_runs} runs, one at a time "
        f"(a bare Django round trip: {rt_us:.0f} µs; a thread start+join: {thread_us:.0f} µs):"
    )
    total_wall = 0.0
    total_statements = 0
    for kind, found in units.items():
        wall = statistics.median(w for w, _, _ in found)
        statements = int(statistics.median(n for _, n, _ in found))
        in_sql = statistics.median(t for _, _, t in found)
        total_wall += wall
        total_statements += statements
        print(
            f"  {kind:<28} {statements:3d} statements (incl. BEGIN/COMMIT/SAVEPOINT)  "
            f"{wall:7.0f} µs wall: {in_sql:7.0f} µs inside the statements "
            f"(as Django times them), {wall - in_sql:6.0f} µs outside"
        )
    print(
        f"  {'a run, worker side':<28} {total_statements:3d} statements  {total_wall:7.0f} µs wall "
        f"→ at most {1e6 / total_wall:,.0f} runs/s per worker thread"
    )

    for _ in range(args.tasks):
        ours.enqueue()
    profiler = cProfile.Profile()
    cpu = time.process_time()
    start = time.perf_counter()
    profiler.enable()
    done = 0
    while worker.work_once():
        done += 1
    profiler.disable()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    print(
        f"\n{args.tasks} runs drained in-process under cProfile: "
        f"{args.tasks / elapsed:,.0f} runs/s, "
        f"{done} units of work, client CPU {1e6 * cpu / args.tasks:.0f} µs/run (profiler included)"
    )
    if args.profile_dump is not None:
        profiler.dump_stats(args.profile_dump)
    for sort in ("tottime", "cumulative"):
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats(sort).print_stats(args.profile_top)
        print(stream.getvalue())


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark django-leases workflows against django-ox, Procrastinate and "
        "django-tasks-db (no-op work, PostgreSQL, real worker processes).",
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_WORKFLOWS_DATABASE_URL", DEFAULT_DATABASE_URL),
        help="PostgreSQL URL of the bench-only database, dropped and recreated "
        "(default: $BENCH_WORKFLOWS_DATABASE_URL or %(default)s)",
    )
    parser.add_argument("--tasks", type=int, default=1000, help="items per drain")
    parser.add_argument("--e2e-tasks", type=int, default=500, help="items in the end-to-end run")
    parser.add_argument("--workers", type=int, default=4, help="processes in the wide drain")
    parser.add_argument("--latency-samples", type=int, default=30, help="per repetition")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; the best is kept")
    parser.add_argument(
        "--contenders",
        default=",".join(n for n in ALL_CONTENDERS if n not in OPTIONAL_CONTENDERS),
        help="comma-separated subset of: "
        + ", ".join(ALL_CONTENDERS)
        + " (DBOS and ours-c4, ours with 4 threads per process, take part in the shapes "
        "stage only; ours-c4 only when named)",
    )
    parser.add_argument(
        "--only",
        default="tasks,shapes,sequential",
        help="comma-separated stages to run: tasks (the 1-step no-op against the task queues), "
        "shapes (the 10-step workflow and the fan-out, with DBOS), sequential (one run of k "
        "steps for each k of --seq-steps, with DBOS), scale (with --scale N; --scale adds "
        "it); default: tasks,shapes,sequential",
    )
    parser.add_argument(
        "--seq-steps",
        default=",".join(str(k) for k in DEFAULT_STEPS),
        help="the sequential stage's run lengths, comma-separated, each >= 10 (default "
        "%(default)s)",
    )
    parser.add_argument(
        "--seq-repeat",
        type=int,
        default=3,
        help="repetitions of the sequential stage (per k, the fastest is kept; default "
        "%(default)s)",
    )
    parser.add_argument(
        "--seq-candidate",
        action="append",
        default=[],
        type=Path,
        metavar="TREE",
        help="the sequential stage also runs ours with django_leases from this source tree "
        "(e.g. an older commit's `git archive`), as ours@<directory name>, on a database of "
        "its own (--database-url's name + _candidate, _candidate2, …) migrated by that tree; "
        "repeatable",
    )
    parser.add_argument(
        "--seq-result-bytes",
        type=int,
        default=0,
        help="the sequential stage's steps each return about this many bytes of JSON "
        "(wfbench/payloads.py; default 0: no-op steps returning nothing)",
    )
    parser.add_argument(
        "--seq-workflows",
        type=int,
        default=100,
        help="10-step workflows per backlog in the shapes stage",
    )
    parser.add_argument("--fanout", type=int, default=100, help="width of the fan-out")
    parser.add_argument(
        "--shape-repeat",
        type=int,
        default=2,
        help="repetitions of the shapes stage (the best is kept; default %(default)s, so that "
        "both stages fit in about 15 min)",
    )
    parser.add_argument(
        "--dbos-database-url",
        default=os.environ.get("BENCH_DBOS_DATABASE_URL", DEFAULT_DBOS_DATABASE_URL),
        help="PostgreSQL URL of DBOS's own system database (bench-only, dropped and "
        "recreated; same server as --database-url; default: $BENCH_DBOS_DATABASE_URL or "
        "%(default)s)",
    )
    parser.add_argument(
        "--dbos-worker-concurrency",
        type=int,
        default=None,
        help="worker_concurrency of DBOS's queue (default: DBOS's, no per-process limit: a "
        "worker runs every workflow it dequeues at once, in its thread pool)",
    )
    parser.add_argument(
        "--scale",
        type=int,
        default=0,
        help="the scale stage: the drain of ours on empty tables and on tables kept with this "
        "many finished runs (e.g. 1000000; make bench-scale); default 0: off",
    )
    parser.add_argument(
        "--scale-database-url",
        default=os.environ.get("BENCH_SCALE_DATABASE_URL", DEFAULT_SCALE_DATABASE_URL),
        help="PostgreSQL URL of the filled bench-only database, kept between runs (same server "
        "as --database-url; default: $BENCH_SCALE_DATABASE_URL or %(default)s)",
    )
    parser.add_argument(
        "--scale-refill",
        action="store_true",
        help="fill the scale database again even when it holds --scale runs already",
    )
    parser.add_argument(
        "--scale-repeat", type=int, default=3, help="repetitions of the scale stage's drains"
    )
    parser.add_argument(
        "--scale-drop-index",
        action="append",
        default=[],
        metavar="NAME",
        help="an experiment: the scale stage without this index on both databases (dropped "
        "after the fill, created again at the end); repeatable",
    )
    add_settle_argument(parser)
    parser.add_argument("--output", type=Path, default=None, help="JSON file to write")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead of the benchmark: ours' worker loop in-process, statements per run and "
        "a cProfile of --tasks runs",
    )
    parser.add_argument("--profile-top", type=int, default=30)
    parser.add_argument(
        "--profile-dump",
        type=Path,
        default=None,
        help="with --profile: also write the cProfile stats to this file (pstats format)",
    )
    parser.add_argument(
        "--profile-contender",
        choices=OURS_TASK_NAMES,
        default="ours",
        help="with --profile: a workflow run per item (ours) or the @task (ours-tasks)",
    )
    parser.add_argument("--breakdown-runs", type=int, default=50, help="runs timed unit by unit")
    parser.add_argument(
        "--conn-max-age",
        default="none",
        help="CONN_MAX_AGE of every process: seconds, or 'none' (persistent, the default); "
        "0 is Django's default (a connection per unit of work)",
    )
    parser.add_argument(
        "--fault-latency",
        action="store_true",
        help="instead of the benchmark: enqueue-to-visible-completion latency of one worker, "
        "--latency-samples items one at a time, its connections killed every --kill-every s",
    )
    parser.add_argument(
        "--kill-every",
        type=float,
        default=0.0,
        help="with --fault-latency: seconds between two kills of the worker's connections "
        "(0: none)",
    )
    args = parser.parse_args(argv)
    if args.conn_max_age.strip().lower() != "none":
        try:
            float(args.conn_max_age)
        except ValueError:
            parser.error("--conn-max-age must be a number of seconds or 'none'")
    os.environ["BENCH_CONN_MAX_AGE"] = args.conn_max_age
    sizes = (args.tasks, args.e2e_tasks, args.workers, args.repeat, args.latency_samples)
    if min(*sizes, args.seq_workflows, args.fanout, args.shape_repeat, args.seq_repeat) < 1:
        parser.error(
            "--tasks, --e2e-tasks, --workers, --repeat, --latency-samples, --seq-workflows, "
            "--fanout, --shape-repeat, --seq-repeat must be >= 1"
        )
    try:
        args.seq_steps = sorted({int(k) for k in args.seq_steps.split(",") if k.strip()})
    except ValueError:
        parser.error("--seq-steps takes whole numbers, comma-separated")
    if not args.seq_steps or min(args.seq_steps) < 10:
        parser.error("--seq-steps: each run length must be >= 10 (a tenth is one step or more)")
    chosen = [n.strip() for n in args.contenders.split(",") if n.strip()]
    unknown = sorted(set(chosen) - set(ALL_CONTENDERS))
    if unknown:
        parser.error(f"unknown contenders: {', '.join(unknown)}")
    args.only = {n.strip() for n in args.only.split(",") if n.strip()}
    if not args.only or args.only - {"tasks", "shapes", "sequential", "scale"}:
        parser.error("--only takes tasks, shapes, sequential, scale (comma-separated)")
    if args.scale < 0 or args.scale_repeat < 1:
        parser.error("--scale must be >= 0 and --scale-repeat >= 1")
    if "scale" in args.only and not args.scale:
        parser.error("--only scale needs --scale N")
    if args.scale:
        args.only.add("scale")
    args.run_scale = "scale" in args.only
    args.chosen = [n for n in CONTENDERS if n in chosen]
    args.shape_chosen = [n for n in SHAPE_CONTENDERS if n in chosen]
    if "tasks" not in args.only:
        args.chosen = []
    if "shapes" not in args.only:
        args.shape_chosen = []
    args.seq_candidates = []
    args.seq_chosen = []
    if "sequential" in args.only:
        for index, tree in enumerate(args.seq_candidate):
            if not (tree / "django_leases" / "__init__.py").is_file():
                parser.error(f"--seq-candidate {tree}: no django_leases package there")
            suffix = "_candidate" + (str(index + 1) if index else "")
            url = with_database_name(args.database_url, database_name(args.database_url) + suffix)
            args.seq_candidates.append(OursCandidate(tree.resolve(), url))
        args.seq_chosen = [n for n in SEQ_NAMES if n in chosen] + [
            c.name for c in args.seq_candidates
        ]
        if len(set(args.seq_chosen)) != len(args.seq_chosen):
            parser.error("--seq-candidate: two trees of the same directory name")
    if not args.chosen and not args.shape_chosen and not args.seq_chosen and not args.run_scale:
        parser.error("no contender left to run in the chosen stages")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if sys.version_info < (3, 12):
        raise SystemExit(
            "bench/workflows.py needs Python >= 3.12 (django-ox): make bench-workflows"
        )
    name = recreate_database(args.database_url)
    setup_django(args.database_url)
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    if args.profile:
        profile_ours(args)
        return 0
    if args.fault_latency:
        started = dt.datetime.now(dt.UTC)
        machine = machine_facts()
        print(
            f"fault latency: CONN_MAX_AGE={args.conn_max_age}, connections killed every "
            f"{args.kill_every:g} s, load average {machine['load_average_at_start'][0]:.2f}"
        )
        found = run_fault_latency(args)
        machine["load_average_at_end"] = load_average()
        report = {
            "benchmark": "django-leases workflows: latency under killed connections",
            "started_at": started.isoformat(),
            "machine": machine,
            "versions": versions(("django-ox", "procrastinate", "django-tasks-db")),
            "postgresql": server_facts(name),
            "settings": {
                "conn_max_age": args.conn_max_age,
                "kill_every_seconds": args.kill_every,
                "samples": args.latency_samples,
            },
            "units": {"*_ms": "ms from the enqueue call to a completion visible to the harness"},
            "figures": found,
        }
        output = args.output or RESULTS_DIR / f"fault-latency-{started.date().isoformat()}.json"
        output.parent.mkdir(parents=True, exist_ok=True)
        write_report(output, report)
        print(f"wrote {output}")
        return 0

    settle(within=args.settle)
    machine = machine_facts()
    started = dt.datetime.now(dt.UTC)
    database = server_facts(name)
    dbos_database = None
    if any(n in DBOS_NAMES for n in [*args.shape_chosen, *args.seq_chosen]):
        same_server = {
            k: v
            for k, v in psycopg_conninfo(args.dbos_database_url).items()
            if k in ("host", "port")
        } == {k: v for k, v in psycopg_conninfo(args.database_url).items() if k in ("host", "port")}
        if not same_server:
            raise SystemExit("--dbos-database-url must be on the server of --database-url")
        dbos_database = recreate_database(args.dbos_database_url)
        for dbos_name in DBOS_NAMES:
            shape = SHAPE_CONTENDERS[dbos_name]
            assert isinstance(shape, DbosShapes)
            shape.configure(args)
    print(
        f"django-leases workflow benchmark: PostgreSQL {database['server_version']} "
        f"(database {name}"
        + (f"; DBOS's system database {dbos_database}" if dbos_database else "")
        + f"), {machine['cpu_count']} CPUs ({machine['cpu']}), "
        f"Python {machine['python']}, load average "
        + " ".join(f"{x:.2f}" for x in machine["load_average_at_start"])
    )
    print(
        f"every contender: same database server, same Django; CONN_MAX_AGE={args.conn_max_age}, "
        "DEBUG=False (Procrastinate's worker and DBOS keep their own psycopg connections); "
        "workers as real processes with package defaults, one unit at a time each (DBOS: "
        + (
            "its default, every dequeued workflow at once"
            if args.dbos_worker_concurrency is None
            else f"worker_concurrency={args.dbos_worker_concurrency}"
        )
        + ")"
    )
    for contender in args.chosen:
        print(f"  {contender:<16} {CONTENDERS[contender].description}")
    for contender in args.shape_chosen:
        if contender not in args.chosen:
            print(f"  {contender:<16} {SHAPE_CONTENDERS[contender].description}")
    for contender in args.seq_chosen:
        if contender not in args.chosen and contender not in args.shape_chosen:
            print(f"  {contender:<16} {seq_contender(args, contender).description}")
    print()
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in args.chosen}
    shape_runs: dict[str, list[dict[str, Any]]] = {}
    seq_runs: dict[str, list[dict[str, Any]]] = {}
    scale_runs: dict[str, Any] = {}
    stage_seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="wfbench-") as tmp:
        began = time.perf_counter()
        for repetition in range(args.repeat if args.chosen else 0):
            shift = repetition % len(args.chosen)
            for contender_name in args.chosen[shift:] + args.chosen[:shift]:
                found = run_contender(CONTENDERS[contender_name], args, Path(tmp))
                runs[contender_name].append(found)
                wide = found[f"drain_{args.workers}"]
                print(
                    f"  [{repetition + 1}/{args.repeat}] {contender_name:<16} "
                    f"e2e {found['end_to_end']['rate']:6,.0f}/s  "
                    f"drain×1 {found['drain_1']['rate']:6,.0f}/s  "
                    f"drain×{args.workers} {wide['rate']:6,.0f}/s  "
                    f"latency p50 {percentile(found['latency_ms'], 0.5):6.1f} ms "
                    f"p99 {percentile(found['latency_ms'], 0.99):6.1f} ms",
                    flush=True,
                )
        if args.chosen:
            stage_seconds["tasks"] = time.perf_counter() - began
            machine["load_average_after_tasks"] = load_average()
        if args.shape_chosen:
            began = time.perf_counter()
            print(
                f"\nshapes: {args.seq_workflows} 10-step workflows per backlog; a fan-out of "
                f"{args.fanout}; 1 and {args.workers} worker processes",
                flush=True,
            )
            shape_runs = run_shapes(args, Path(tmp))
            stage_seconds["shapes"] = time.perf_counter() - began
            machine["load_average_after_shapes"] = load_average()
        if args.seq_chosen:
            if stage_seconds:  # the stages before leave the load up (DBOS's processes)
                settle(within=args.settle)
            machine["load_average_at_sequential_start"] = load_average()
            began = time.perf_counter()
            print(
                "\nsequential: one run of k no-op steps, k = "
                + ", ".join(f"{k:,}" for k in args.seq_steps)
                + "; 1 worker process",
                flush=True,
            )
            seq_runs = run_sequential(args, Path(tmp))
            stage_seconds["sequential"] = time.perf_counter() - began
            machine["load_average_after_sequential"] = load_average()
        if args.run_scale:
            began = time.perf_counter()
            print(
                f"\nscale: {args.tasks} runs per drain, 1 and {args.workers} workers, on empty "
                f"tables and with {args.scale:,} finished runs kept",
                flush=True,
            )
            filled = prepare_scale_database(args)
            machine["load_average_after_fill"] = load_average()
            scale_runs = run_scale(args, Path(tmp), filled)
            stage_seconds["scale"] = time.perf_counter() - began
    report_figures: dict[str, Any] = {}
    report_ratios: dict[str, Any] = {}
    if args.chosen:
        figures, ratios = summarise(runs, args.workers)
        report_figures, report_ratios = figures, ratios
        print()
        print(render_table(figures, args.workers))
        print()
        print(render_costs(figures))
        for key, label in (
            ("ours_vs_best_peer", "ours / best peer"),
            ("ours-tasks_vs_best_peer", "ours-tasks / best peer"),
            ("ours-tasks_vs_best_task_backend", "ours-tasks / best Django Tasks backend"),
        ):
            verdict = ratios.get(key)
            if verdict:
                print(
                    f"\n{label}: "
                    + "; ".join(
                        f"{metric} {verdict[metric]:.2f}× (vs {verdict[f'{metric}_best_peer']})"
                        for metric in ("end_to_end", "drain_1", f"drain_{args.workers}")
                    )
                    + f" — target ≥ {TARGET}×"
                )
    shape_figures: dict[str, Any] = {}
    shape_ratios: dict[str, Any] = {}
    if shape_runs:
        shape_figures, shape_ratios = summarise_shapes(shape_runs, args.workers)
        print()
        print(render_shapes(shape_figures, args.workers, args.fanout))
        for shape_name in shape_figures:
            reason = SHAPE_CONTENDERS[shape_name].seq_reason
            if reason:
                print(f"  {shape_name}: 10-step n/a: {reason}")
    seq_figures: dict[str, Any] = {}
    seq_ratios: dict[str, Any] = {}
    if seq_runs:
        seq_figures, seq_ratios = summarise_sequential(seq_runs, args.seq_steps)
        print()
        print(render_sequential(seq_figures, seq_ratios, args.seq_steps))
    scale_figures: dict[str, Any] = {}
    if scale_runs:
        scale_figures = summarise_scale(scale_runs, args.workers)
        print()
        print(render_scale(scale_figures, args.workers, args.scale))
        print()
        print(render_plans(scale_runs["plans"]))
    machine["load_average_at_end"] = load_average()
    print(
        "\nload average at start "
        + " ".join(f"{x:.2f}" for x in machine["load_average_at_start"])
        + ", at end "
        + " ".join(f"{x:.2f}" for x in machine["load_average_at_end"])
        + "; "
        + ", ".join(f"{stage} stage {seconds:.0f} s" for stage, seconds in stage_seconds.items())
    )
    report = {
        "benchmark": "django-leases workflows",
        "started_at": started.isoformat(),
        "finished_at": dt.datetime.now(dt.UTC).isoformat(),
        "machine": machine,
        "versions": versions(("django-ox", "procrastinate", "django-tasks-db", "dbos")),
        "postgresql": database,
        "dbos_system_database": dbos_database,
        "stages": sorted(args.only),
        "stage_seconds": stage_seconds,
        "settings": {
            "tasks": args.tasks,
            "e2e_tasks": args.e2e_tasks,
            "workers": args.workers,
            "latency_samples_per_repetition": args.latency_samples,
            "repeat": args.repeat,
            "seq_workflows": args.seq_workflows,
            "seq_steps": SEQ_STEPS,
            "fanout": args.fanout,
            "shape_repeat": args.shape_repeat,
            "sequential_steps": args.seq_steps,
            "sequential_repeat": args.seq_repeat,
            "sequential_result_bytes": args.seq_result_bytes,
            "sequential_candidates": {c.name: str(c.tree) for c in args.seq_candidates},
            "dbos_worker_concurrency": args.dbos_worker_concurrency,
            "scale": args.scale,
            "scale_repeat": args.scale_repeat,
            "scale_drop_index": args.scale_drop_index,
            "scale_contenders": list(SCALE_CONTENDERS) if args.scale else [],
            "hold_seconds": HOLD_SECONDS,
            "best_of": "throughputs and fan-out times: the best repetition; latencies: every "
            "sample pooled",
            "connections": "same database server and Django settings for every contender: "
            f"CONN_MAX_AGE={args.conn_max_age}, DEBUG=False, client-side binding "
            "(Django's default); DBOS: its own SQLAlchemy pool (psycopg 3) on its system "
            "database",
            "contenders": {n: CONTENDERS[n].description for n in args.chosen},
            "idle_wake": {n: CONTENDERS[n].wakes for n in args.chosen},
            "shape_contenders": {
                n: {
                    "description": SHAPE_CONTENDERS[n].description,
                    "fanout": SHAPE_CONTENDERS[n].fanout_how,
                    "seq10_not_applicable": SHAPE_CONTENDERS[n].seq_reason,
                }
                for n in args.shape_chosen
            },
        },
        "units": {
            "end_to_end": "items/s, one worker, enqueued one transaction each meanwhile",
            "drain_1": "items/s, backlog of --tasks, one worker process",
            f"drain_{args.workers}": f"items/s, backlog of --tasks, {args.workers} processes",
            "latency_*_ms": "ms from the enqueue call to a visible completion, idle worker",
            "statements_per_item": "cursor execute/executemany calls by the worker(s) per item",
            "transactions_per_item": "explicit commits/rollbacks by the worker(s) per item",
            "worker_cpu_us_per_item": "CPU µs of the worker processes per item",
            "server_cpu_us_per_item": "CPU µs of the PostgreSQL backends serving the workers",
            "seq10_wf_per_s_N": "10-step workflows/s, backlog of --seq-workflows committed in "
            "one transaction, N worker processes, release → last completion",
            "seq10_steps_per_s_N": "the same ×10",
            "fanout_seconds_N": "s from the release of N idle worker processes to the "
            "completion of one fan-out of --fanout (committed before the release)",
            "*_per_step": "per step (the fan-out: per branch), statements / transactions / "
            "CPU µs of the workers and of their PostgreSQL backends",
            "middle_step": "shapes, ours: (a 10-step run − a 1-step run) ÷ 9, statements, "
            "transactions and CPU µs; *_vs_run: ÷ the 1-step run",
            "sequential.figures.<contender>.<k>": "one run of k steps, 1 worker: ms_per_step "
            "(release → completion ÷ k), tenths_ms (ms per step over each tenth, from the "
            "run's rows), worker / server CPU µs per step (worker_cpu_exact: per-thread "
            "schedstat ns, else clock ticks), statements per step, load_average as the run "
            "started; the fastest repetition, medians of all",
        },
        "figures": report_figures,
        "ratios": report_ratios,
        "target": {"ours_vs_best_peer": TARGET},
        "repetitions": runs,
        "shapes": {
            "figures": shape_figures,
            "ratios": shape_ratios,
            "repetitions": shape_runs,
        },
        "sequential": {
            "targets": {
                "worker_cpu_growth_at_most": SEQ_CPU_GROWTH_TARGET,
                "dbos_time_vs_ours_at_least": SEQ_VS_DBOS_TARGET,
            },
            "figures": seq_figures,
            "ratios": seq_ratios,
            "repetitions": seq_runs,
        }
        if seq_runs
        else None,
        "scale": {
            "runs_kept": args.scale,
            "target_filled_vs_empty": SCALE_TARGET,
            "figures": scale_figures,
            **scale_runs,
        }
        if scale_runs
        else None,
    }
    stamp = started.strftime("%Y-%m-%d-%H%M")
    kind = {
        frozenset({"scale"}): "workflows-scale",
        frozenset({"sequential"}): "workflows-sequential",
    }.get(frozenset(args.only), "workflows")
    output = args.output or RESULTS_DIR / f"{kind}-{stamp}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    write_report(output, report)
    print(f"\nwrote {output}")
    return 0


def psycopg_conninfo(database_url: str) -> dict[str, Any]:
    import psycopg

    return psycopg.conninfo.conninfo_to_dict(libpq_conninfo(database_url))


if __name__ == "__main__":
    sys.exit(main())

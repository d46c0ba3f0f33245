"""What a busy worker spends on renewing its step leases: connections, threads, statements.

``python bench/worker_renewals.py [--tree DIR]`` starts one ``run_workflow_worker
--concurrency N`` process (``tests.chaosapp`` settings: persistent connections) on a fresh
PostgreSQL database, starts N runs of ``chaos.three-steps`` whose steps each work
``--step-seconds`` (longer than the step lease, ``--step-ttl``, so every step lease is renewed
several times), and once all N steps are running samples, for ``--window`` seconds:

* the worker's sessions on the server (``pg_stat_activity`` of the database, less this
  harness's), the most seen at once;
* the worker's threads (``/proc/<pid>/task``), the most seen at once;
* the transactions the server committed for the database per second (``pg_stat_database``),
  which in that window are the renewals plus the main loop's heartbeat and schedule looks.

``--tree DIR`` runs the worker from another source tree (an export of an older commit, say):
``manage.py`` there, its ``django_leases`` first on the path. The bench database
(``--database-url``, whose name must say ``bench``) is dropped and recreated each run. Prints
one JSON line; nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import ROOT, libpq_conninfo, load_average, recreate_database

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/django_leases_bench_renewals"


def _manage(tree: Path, env: dict[str, str], *argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "manage.py", *argv],
        cwd=tree,
        env={**env, "PYTHONPATH": str(tree)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run one worker as the module docstring says; returns the figures."""
    import psycopg

    tree = Path(args.tree).resolve()
    conninfo = libpq_conninfo(args.database_url)
    recreate_database(args.database_url)
    env = {
        **os.environ,
        "DATABASE_URL": args.database_url,
        "DJANGO_SETTINGS_MODULE": "tests.chaosapp.settings",
        "CHAOS_STEP_LEASE_TTL": str(args.step_ttl),
        "CHAOS_STEP_MIN": str(args.step_seconds),
        "CHAOS_STEP_MAX": str(args.step_seconds),
        "CHAOS_POLL_INTERVAL": "0.2",
    }
    if _manage(tree, env, "migrate", "--verbosity", "0").wait() != 0:
        raise SystemExit("migrate failed")
    starter = (
        "import django; django.setup()\n"
        "from django.db import connection\n"
        "from tests.chaosapp.workflows import create_table_sql\n"
        "from django_leases.workflows.engine import start_workflow\n"
        "with connection.cursor() as c: c.execute(create_table_sql(connection))\n"
        f"for n in range({args.concurrency}): start_workflow('chaos.three-steps', {{'n': n}})\n"
    )
    subprocess.run(
        [sys.executable, "-c", starter], cwd=tree, env={**env, "PYTHONPATH": str(tree)}, check=True
    )
    worker = _manage(tree, env, "run_workflow_worker", "--concurrency", str(args.concurrency))
    sessions = threads = 0
    kinds: list[tuple[str, int]] = []
    asked = [0]
    try:
        with psycopg.connect(conninfo, autocommit=True) as harness:

            def one(sql: str) -> Any:
                asked[0] += 1
                row = harness.execute(sql).fetchone()
                return None if row is None else row[0]

            deadline = time.monotonic() + 120
            running = "SELECT count(*) FROM chaos_execution WHERE finished_at IS NULL"
            while (one(running) or 0) < args.concurrency:
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise SystemExit("the steps never all ran at once")
                time.sleep(0.05)
            time.sleep(args.step_ttl)  # every step lease renewed at least once
            commits = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            first, started, asked[0] = one(commits), time.monotonic(), 0
            while time.monotonic() - started < args.window:
                sessions = max(
                    sessions,
                    one(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND pid <> pg_backend_pid()"
                    ),
                )
                threads = max(threads, len(os.listdir(f"/proc/{worker.pid}/task")))
                time.sleep(0.1)
            elapsed = time.monotonic() - started
            last = one(commits)
            # What each session did last (the renewer's: the step leases' UPDATE).
            kinds = harness.execute(
                "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 60), count(*) "
                "FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() GROUP BY 1 ORDER BY 2 DESC"
            ).fetchall()
    finally:
        worker.terminate()
        worker.wait(60)
    return {
        "tree": str(tree),
        "concurrency": args.concurrency,
        "step_ttl": args.step_ttl,
        "worker_sessions_max": sessions,
        "worker_threads_max": threads,
        "sessions_by_last_statement": dict(kinds),
        # Less the harness's own reads (each its own transaction).
        "commits_per_second": round((last - first - asked[0]) / elapsed, 1),
        "load_average": load_average(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--tree", default=str(ROOT), help="source tree to run the worker from")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--step-ttl", type=float, default=3.0, help="step lease, seconds")
    parser.add_argument("--step-seconds", type=float, default=12.0)
    parser.add_argument("--window", type=float, default=5.0, help="sampling, seconds")
    print(json.dumps(measure(parser.parse_args())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

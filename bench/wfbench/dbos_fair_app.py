"""DBOS Transact's side of the fairness benchmark (``bench/fairness.py``): a partitioned queue.

``python bench/wfbench/dbos_fair_app.py`` is a DBOS worker process on its own system database
(``BENCH_DBOS_DATABASE_URL``): it registers the workflow below and one partitioned queue,
``wffair``, with ``partition_concurrency`` = ``BENCH_DBOS_PARTITION_CONCURRENCY`` (at most that
many workflows of one partition key running across every worker, as ``key_concurrency`` is for
ours) and ``polling_interval_sec`` = ``BENCH_DBOS_POLLING_INTERVAL`` (default 0.1 s), launches,
says so, and dequeues until SIGTERM. The harness enqueues with ``DBOSClient``, each item with
its ``queue_partition_key``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from dbos import DBOS, DBOSConfig

APP_NAME = "wffair"
QUEUE = "wffair"
ITEM = "bench-fair-item"


def dbos_url(database_url: str) -> str:
    """A SQLAlchemy URL (psycopg 3 driver) for DBOS from a ``postgres://`` one."""
    return "postgresql+psycopg://" + database_url.split("://", 1)[1]


@DBOS.step(name="bench.fair.noop")
def noop_step() -> None:
    """Does nothing; the cost is the engine's alone."""
    return None


@DBOS.workflow(name=ITEM)
def item_workflow() -> None:
    """One item of work: one no-op step."""
    noop_step()


def main() -> int:
    """Launch DBOS and dequeue until SIGTERM."""
    config: DBOSConfig = {
        "name": APP_NAME,
        "system_database_url": dbos_url(os.environ["BENCH_DBOS_DATABASE_URL"]),
        "application_version": "wffair",
        "log_level": "WARNING",
    }
    DBOS(config=config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    DBOS.launch()
    DBOS.register_queue(
        QUEUE,
        partition_concurrency=int(os.environ.get("BENCH_DBOS_PARTITION_CONCURRENCY", "8")),
        polling_interval_sec=float(os.environ.get("BENCH_DBOS_POLLING_INTERVAL", "0.1")),
    )
    print("dbos worker launched", flush=True)
    stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())

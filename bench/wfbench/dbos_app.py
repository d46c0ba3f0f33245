"""DBOS Transact's side of the workflow shapes, declared with its public API.

``python bench/wfbench/dbos_app.py`` is a DBOS worker process: it configures DBOS on its own
system database (``BENCH_DBOS_DATABASE_URL``), registers the workflows and steps below and one
queue, ``wfbench``, launches, and dequeues until SIGTERM. ``BENCH_DBOS_POLLING_INTERVAL`` sets
the queue's ``polling_interval_sec`` and the fan-out's handle polling (unset: DBOS's defaults,
1 s each); ``BENCH_DBOS_WORKER_CONCURRENCY`` the queue's ``worker_concurrency`` (unset: DBOS's
default, no per-process limit: a worker runs every workflow it dequeues at once, in its thread
pool). The harness enqueues
with ``DBOSClient`` (it runs no workflow itself) and reads completions from
``dbos.workflow_status``.

The shapes, as DBOS's documentation writes them:

* ``bench-seq10``: a workflow calling ten ``@DBOS.step`` no-op steps one after another;
* ``bench-seq``: the same with ``steps`` steps (its argument; the sequential stage);
* ``bench-fanout``: a workflow that enqueues ``width`` no-op step workflows on the queue
  (``queue.enqueue``) and waits for every handle's result.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from dbos import DBOS, DBOSConfig

from wfbench.payloads import sized_result

APP_NAME = "wfbench"
QUEUE = "wfbench"
SEQ10 = "bench-seq10"
SEQ = "bench-seq"
FANOUT = "bench-fanout"
FANOUT_CHILD = "bench-fanout-child"
STEPS = 10


def dbos_url(database_url: str) -> str:
    """A SQLAlchemy URL (psycopg 3 driver) for DBOS from a ``postgres://`` one."""
    rest = database_url.split("://", 1)[1]
    return "postgresql+psycopg://" + rest


@DBOS.step(name="bench.noop")
def noop_step(index: int) -> None:
    """Does nothing; the cost is the engine's alone."""
    return None


@DBOS.workflow(name=SEQ10)
def seq10_workflow() -> int:
    """Ten no-op steps, one after another."""
    for index in range(STEPS):
        noop_step(index)
    return STEPS


@DBOS.step(name="bench.sized")
def sized_step(index: int, size: int) -> Any:
    """Returns about ``size`` bytes of JSON (``wfbench/payloads.py``)."""
    return sized_result(index, size)


@DBOS.workflow(name=SEQ)
def seq_workflow(steps: int, result_bytes: int = 0) -> int:
    """``steps`` no-op steps, one after another (each returning ``result_bytes`` bytes of
    JSON instead, when set: ``--seq-result-bytes``)."""
    for index in range(steps):
        if result_bytes:
            sized_step(index, result_bytes)
        else:
            noop_step(index)
    return steps


@DBOS.workflow(name=FANOUT_CHILD)
def fanout_child(index: int) -> None:
    """One branch of the fan-out: one no-op step."""
    noop_step(index)


@DBOS.workflow(name=FANOUT)
def fanout_workflow(width: int) -> int:
    """Enqueue ``width`` branches on the queue, wait for all of them."""
    queue = DBOS.retrieve_queue(QUEUE)
    handles = [queue.enqueue(fanout_child, index) for index in range(width)]
    for handle in handles:
        handle.get_result(**result_polling())
    return width


def result_polling() -> dict[str, float]:
    """A handle polls for its result every second by default; the variant with a faster queue
    (``BENCH_DBOS_POLLING_INTERVAL``) polls its handles as often."""
    interval = os.environ.get("BENCH_DBOS_POLLING_INTERVAL")
    return {"polling_interval_sec": float(interval)} if interval else {}


def queue_options() -> dict[str, Any]:
    """The queue's settings from the environment (unset: DBOS's defaults)."""
    options: dict[str, Any] = {}
    if os.environ.get("BENCH_DBOS_POLLING_INTERVAL"):
        options["polling_interval_sec"] = float(os.environ["BENCH_DBOS_POLLING_INTERVAL"])
    if os.environ.get("BENCH_DBOS_WORKER_CONCURRENCY"):
        options["worker_concurrency"] = int(os.environ["BENCH_DBOS_WORKER_CONCURRENCY"])
    return options


def main() -> int:
    """Launch DBOS and dequeue until SIGTERM."""
    if os.environ.get("BENCH_COUNT_STATEMENTS"):
        from wfbench.counting import install

        install(os.environ["BENCH_COUNT_STATEMENTS"])
    url = dbos_url(os.environ["BENCH_DBOS_DATABASE_URL"])
    config: DBOSConfig = {
        "name": APP_NAME,
        "system_database_url": url,
        "db_engine_kwargs": {
            "connect_args": {
                "application_name": os.environ.get("BENCH_APPLICATION_NAME", "wfbench-dbos")
            }
        },
        "application_version": "wfbench",
        "log_level": "WARNING",
    }
    DBOS(config=config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    DBOS.launch()
    DBOS.register_queue(QUEUE, **queue_options())  # persisted: needs the launched database
    print("dbos worker launched", flush=True)
    stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())

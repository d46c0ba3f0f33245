"""What the suite's tests share: one place for each helper.

* :func:`tuned_sql` — run a block with the tuned statements on or off
  (``DJANGO_LEASES["TUNED_SQL"]``), so a rule's portable ORM path is proven on PostgreSQL too;
* :func:`unique_key` — a lease key no other test uses;
* :func:`wait_until` — poll a predicate until it holds, or fail after a timeout;
* :func:`lapse_lease` / :func:`lapse_step_lease` — make a lease lapse on the database clock,
  instead of waiting for it;
* :func:`wait_until_blocked` — wait until a PostgreSQL backend is blocked behind another
  (``pg_blocking_pids()``), to order threads without sleeps;
* :func:`race` — start callables on threads released together by a barrier.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, connections
from django.test import override_settings

from django_leases.clock import db_now


@contextmanager
def tuned_sql(enabled: bool) -> Iterator[None]:
    """Run the block with ``DJANGO_LEASES["TUNED_SQL"] = enabled`` (the other keys kept)."""
    merged = {**(getattr(settings, "DJANGO_LEASES", None) or {}), "TUNED_SQL": enabled}
    with override_settings(DJANGO_LEASES=merged):
        yield


def unique_key(prefix: str = "test") -> str:
    """A lease key no other test uses: ``<prefix>:<12 hex digits>``."""
    return f"{prefix}:{uuid.uuid4().hex[:12]}"


def wait_until(
    predicate: Callable[[], Any], timeout: float = 30.0, *, interval: float = 0.02, what: str = ""
) -> Any:
    """Call ``predicate`` every ``interval`` seconds until it returns something true; return
    that. ``AssertionError`` (naming ``what``) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what or predicate!r} did not happen within {timeout:g} s")
        time.sleep(interval)


def lapse_lease(key: str, *, using: str = "default") -> None:
    """Make the lease on ``key`` lapse now, on the database clock (its expiry a second ago)."""
    from django_leases.models import Lease

    Lease.objects.using(using).filter(key=key).update(expires_at=db_now() - timedelta(seconds=1))


def lapse_step_lease(step_id: int, *, using: str = "default") -> None:
    """Make the step lease of step ``step_id`` lapse now, on the database clock."""
    from django_leases.models import WorkflowStep

    WorkflowStep.objects.using(using).filter(pk=step_id).update(
        lease_expires_at=db_now() - timedelta(seconds=1)
    )


def backend_pid() -> int:
    """The PostgreSQL backend pid of the calling thread's connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def wait_until_blocked(pid: int, timeout: float = 30.0) -> list[int]:
    """Wait until PostgreSQL backend ``pid`` is blocked by another backend (a lock wait);
    returns the blocking pids. Read on a connection of its own (this thread's, so call it from
    a thread that is not the blocked one)."""

    def blockers() -> list[int]:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_blocking_pids(%s)", [pid])
            return list(cursor.fetchone()[0])

    return list(wait_until(blockers, timeout, what=f"backend {pid} waiting on a lock"))


def race(calls: Sequence[Callable[[], Any]], *, timeout: float = 60.0) -> list[Any]:
    """Run each of ``calls`` on its own thread, all released at once by a barrier; returns
    their results in order (an exception a call raised is its result). Each thread closes its
    database connections when it ends."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout)
            results[index] = call()
        except BaseException as exc:  # the caller decides what an error means
            results[index] = exc
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=run, args=(i, call), daemon=True) for i, call in enumerate(calls)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        if thread.is_alive():
            raise AssertionError(f"a raced call did not finish within {timeout:g} s")
    return results

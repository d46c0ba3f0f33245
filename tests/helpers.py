"""What the suite's tests share: one place for each helper.

* :func:`tuned_sql` — run a block with the tuned statements on or off
  (``DJANGO_LEASES["TUNED_SQL"]``), so a rule's portable ORM path is proven on PostgreSQL too;
* :func:`unique_key` — a lease key no other test uses;
* :func:`wait_until` — poll a predicate until it holds, or fail after a timeout;
* :func:`lapse_lease` / :func:`lapse_step_lease` — make a lease lapse on the database clock,
  instead of waiting for it;
* :func:`wait_until_blocked` — wait until a PostgreSQL backend is blocked behind another
  (``pg_blocking_pids()``), to order threads without sleeps;
* :func:`race` — start callables on threads released together by a barrier;
* :func:`raw_request` — one HTTP request written byte for byte (repeated headers, any value
  a client library would refuse) to a live server, and its answer.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

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


@dataclass(frozen=True)
class RawAnswer:
    """What a server answered to :func:`raw_request`: status, headers (lower-case names), body."""

    status: int
    headers: dict[str, str]
    body: bytes


def raw_request(
    base_url: str,
    method: str,
    path: str,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes = b"",
    *,
    content_length: str | None = "",
    timeout: float = 30.0,
) -> RawAnswer:
    """Send one HTTP/1.1 request, written exactly as given, on a connection of its own.

    Args:
        base_url: the server, e.g. ``live_server.url``.
        method, path: the request line's method and target (sent as they are).
        headers: ``(name, value)`` pairs in order, a name may repeat; values are sent as
            latin-1, so any character a header can carry (``\x0b``, ``\xa0``) goes through.
        body: the bytes sent after the head (all of them, whatever the declared length).
        content_length: the ``Content-Length`` value to declare; ``""`` (default) declares
            ``len(body)``, ``None`` declares none.
        timeout: seconds for connecting and for each read.

    Returns a :class:`RawAnswer`, the body read by the answer's ``Content-Length``. Raises
    ``AssertionError`` when the server closes without a complete answer. The sending side is
    shut once everything is sent, so a body declared longer than sent ends there. A server
    that answers before reading the whole body may close early: sending stops then, and the
    answer already sent is read.
    """
    address = urlsplit(base_url)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {address.netloc}", "Connection: close"]
    if content_length is not None:
        lines.append(f"Content-Length: {content_length or len(body)}")
    lines.extend(f"{name}: {value}" for name, value in headers)
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    assert address.hostname is not None and address.port is not None
    with socket.create_connection((address.hostname, address.port), timeout=timeout) as sock:
        # A server that answered and closed before taking everything has its answer waiting.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head + body)
        with contextlib.suppress(OSError):
            # Nothing more comes: a server waiting for the rest of a declared body (Django's
            # development server drains it before it closes) sees its end.
            sock.shutdown(socket.SHUT_WR)
        raw = b""
        answer = None
        while answer is None:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            raw += chunk
            answer = _complete_answer(raw, ended=not chunk)
            if not chunk:
                break
    assert answer is not None, f"no complete answer to {method} {path}: {raw[:200]!r}"
    return answer


def _complete_answer(raw: bytes, *, ended: bool) -> RawAnswer | None:
    """``raw`` read as an HTTP answer, or ``None`` while its head or body is incomplete
    (an answer without ``Content-Length`` is complete when the connection has ``ended``)."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return None
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" not in headers:
        return RawAnswer(int(status_line.split(" ", 2)[1]), headers, rest) if ended else None
    length = int(headers["content-length"])
    if len(rest) < length:
        return None
    return RawAnswer(int(status_line.split(" ", 2)[1]), headers, rest[:length])

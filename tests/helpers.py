"""What the suite's tests share: one place for each helper.

* :func:`tuned_sql` — run a block with the tuned statements on or off
  (``DJANGO_LEASES["TUNED_SQL"]``), so a rule's portable ORM path is proven on PostgreSQL too;
* :func:`unique_key` — a lease key no other test uses;
* :func:`wait_until` — poll a predicate until it holds, or fail after a timeout;
* :func:`lapse_lease` / :func:`lapse_step_lease` — make a lease lapse on the database clock,
  instead of waiting for it;
* :func:`wait_until_blocked` — wait until a PostgreSQL backend (or MariaDB / MySQL
  connection) is blocked behind another (``pg_blocking_pids()``, InnoDB's lock waits),
  to order threads without sleeps; :func:`start_blocked` — start a
  call on a thread and return once it waits on a lock the calling thread holds;
* :func:`on_another_thread` — run a call on a thread (and connection) of its own;
* :func:`race` — start callables on threads released together by a barrier;
  :func:`race_in_processes` / :func:`in_processes` — the same with forked processes;
* :func:`terminate_other_backends` — kill every other connection to the test database
  (PostgreSQL), as a failover would;
* :func:`manage` — run ``python manage.py …`` as a child process, to the end;
  :func:`start_process` / :func:`run_at_once` — child processes with their output piped;
* :func:`fake_sources` / :func:`make_orphan` — trigger sources on a fake provider;
  :func:`failed_run` — a workflow run that failed on its step's last attempt.
* :func:`staff_user` / :func:`staff_client` — a staff user with some of django-leases'
  permissions, or a client logged in as one;
* :func:`renewal_threads` — the renewal (and deadline) threads of live holds;
  :func:`take_over` — take an ``ahold_lease``'s key from it;
  :func:`held_renewals` — what still renews a key (the renewers, or its own threads);
  :func:`end_renewers` — end the renewers' threads so the next hold connects afresh;
  :func:`spend_steps_first` — spend a worker's periodic look for due steps on an idle unit;
* :func:`raw_request` — one HTTP request written byte for byte (repeated headers, any value
  a client library would refuse) to a live server, and its answer;
* :class:`Chaos` — worker processes to SIGKILL, SIGSTOP and SIGCONT (the chaos tests);
  :func:`process_stopped` — whether a process is stopped (``/proc``).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection, connections
from django.test import override_settings

from django_leases.clock import db_now

#: The project's root: where ``manage.py`` is.
ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def tuned_sql(enabled: bool) -> Iterator[None]:
    """Run the block with ``DJANGO_LEASES["TUNED_SQL"] = enabled`` (the other keys kept)."""
    merged = {**(getattr(settings, "DJANGO_LEASES", None) or {}), "TUNED_SQL": enabled}
    with override_settings(DJANGO_LEASES=merged):
        yield


@contextmanager
def no_queue_limits() -> Iterator[None]:
    """Run the block with the suite's queues without their limits (the other keys kept): a
    worker that may take a limited queue claims the portable way, so only then does
    PostgreSQL's one-statement claim run."""
    merged = {**(getattr(settings, "DJANGO_LEASES", None) or {})}
    merged["QUEUES"] = {name: {} for name in merged.get("QUEUES") or {}}
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
    """Make the lease on ``key`` lapse now, on the database clock (its expiry a second ago).
    ``AssertionError`` if there is no lease on ``key`` (a lapse that lapses nothing)."""
    from django_leases.models import Lease

    updated = (
        Lease.objects.using(using)
        .filter(key=key)
        .update(expires_at=db_now() - timedelta(seconds=1))
    )
    assert updated == 1, f"no lease on {key!r} to lapse"


def lapse_step_lease(
    step_id: int | None = None,
    *,
    run_id: uuid.UUID | str | None = None,
    step_name: str | None = None,
    using: str = "default",
) -> None:
    """Make a step lease lapse now, on the database clock, as when its worker died: step
    ``step_id``, or the steps of run ``run_id`` (only ``step_name`` if given).
    ``AssertionError`` if no step matches."""
    from django_leases.models import WorkflowStep

    steps = WorkflowStep.objects.using(using)
    if step_id is not None:
        steps = steps.filter(pk=step_id)
    if run_id is not None:
        steps = steps.filter(run_id=run_id)
    if step_name is not None:
        steps = steps.filter(step_name=step_name)
    assert step_id is not None or run_id is not None, "which step? (step_id or run_id)"
    updated = steps.update(lease_expires_at=db_now() - timedelta(seconds=1))
    assert updated, f"no step to lapse (step {step_id}, run {run_id}, {step_name!r})"


def backend_pid() -> int:
    """The server's id of the calling thread's connection: the PostgreSQL backend pid, the
    MariaDB / MySQL ``CONNECTION_ID()``."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SELECT CONNECTION_ID()")
        else:
            cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _blockers(pid: int) -> list[int]:
    with connections["default"].cursor() as cursor:
        if connections["default"].vendor == "mysql":
            # InnoDB's lock waits: the connections whose transactions hold what ``pid`` waits
            # for. MariaDB: information_schema's tables (what the sys schema's slower view
            # reads); MySQL 8 keeps them in performance_schema, read through sys.
            if connections["default"].mysql_is_mariadb:
                cursor.execute(
                    "SELECT b.trx_mysql_thread_id FROM information_schema.INNODB_LOCK_WAITS w "
                    "JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id "
                    "JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id "
                    "WHERE r.trx_mysql_thread_id = %s",
                    [pid],
                )
                found = [int(row[0]) for row in cursor.fetchall()]
                return found or _mariadb_status_blockers(cursor, pid)
            else:
                cursor.execute(
                    "SELECT blocking_pid FROM sys.innodb_lock_waits WHERE waiting_pid = %s", [pid]
                )
            return [int(row[0]) for row in cursor.fetchall()]
        cursor.execute("SELECT pg_blocking_pids(%s)", [pid])
        return list(cursor.fetchone()[0])


def _mariadb_status_blockers(cursor: Any, pid: int) -> list[int]:
    """MariaDB: a locking read that waits while the optimizer reads a row by a unique key
    (state "Statistics") is missing from information_schema.INNODB_LOCK_WAITS, but
    ``SHOW ENGINE INNODB STATUS`` shows it in LOCK WAIT. The status names no holder: the
    candidates are the other transactions holding row locks, none of them waiting."""
    cursor.execute("SHOW ENGINE INNODB STATUS")
    status = str(cursor.fetchone()[2])
    waiting, holders = False, []
    for block in status.split("---TRANSACTION ")[1:]:
        thread = re.search(r"thread id (\d+),", block)
        if thread is None:
            continue
        if int(thread.group(1)) == pid:
            waiting = "LOCK WAIT" in block
        elif "LOCK WAIT" not in block and re.search(r"[1-9]\d* row lock\(s\)", block):
            holders.append(int(thread.group(1)))
    return holders if waiting else []


def wait_until_blocked(
    pid: int,
    timeout: float = 30.0,
    *,
    by: int | None = None,
    unless: Callable[[], bool] | None = None,
) -> list[int]:
    """Wait until PostgreSQL backend ``pid`` is blocked by another backend (a lock wait; by
    backend ``by``, if given); returns the blocking pids, or ``[]`` as soon as ``unless()``
    holds (the waiter finished without waiting). Read on a connection of its own (this
    thread's, so call it from a thread that is not the blocked one)."""

    def seen() -> tuple[list[int]] | None:
        if unless is not None and unless():
            return ([],)
        found = _blockers(pid)
        return (found,) if found and (by is None or by in found) else None

    what = f"backend {pid} waiting on a lock" + (f" held by backend {by}" if by else "")
    return list(wait_until(seen, timeout, what=what)[0])


class Blocked:
    """A call :func:`start_blocked` started on a thread of its own."""

    def __init__(self, thread: threading.Thread, outcome: list[tuple[Any, BaseException | None]]):
        self._thread = thread
        self._outcome = outcome
        #: Whether the call was seen waiting on the starting thread's lock (``False``: it
        #: finished without waiting).
        self.waited = False

    def result(self, timeout: float = 60.0) -> Any:
        """Wait for the call to end; return its value, or raise what it raised."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"the blocked call did not finish within {timeout:g} s")
        value, error = self._outcome[0]
        if error is not None:
            raise error
        return value


def start_blocked(call: Callable[[], Any], timeout: float = 30.0) -> Blocked:
    """Start ``call`` on a thread (with its own connection); return once it waits on a lock
    held by the calling thread's transaction, or once it finished without waiting
    (:attr:`Blocked.waited` tells which). So a test orders two threads without sleeping: what
    the call does cannot happen before the caller commits, and the caller knows it tried.

    PostgreSQL: the call's backend is blocked by this thread's (``pg_blocking_pids()``);
    MariaDB / MySQL: the call's connection waits for an InnoDB lock of this thread's
    transaction (``information_schema.INNODB_LOCK_WAITS``, ``sys.innodb_lock_waits``).
    SQLite, which cannot show a waiting connection: the call has begun a statement while this
    thread holds the write lock (an IMMEDIATE transaction), so a write it makes waits for the
    commit; a test must still check that the call's effect came after the commit.
    """
    # MariaDB / MySQL show lock waits too (sys.innodb_lock_waits): ordered as on PostgreSQL.
    on_postgres = connection.vendor in {"postgresql", "mysql"}
    ours = backend_pid() if on_postgres else None
    began = threading.Event()
    theirs: list[int] = []
    outcome: list[tuple[Any, BaseException | None]] = []

    def run() -> None:
        try:
            if on_postgres:
                theirs.append(backend_pid())
            else:
                connection.ensure_connection()
                connection.connection.set_trace_callback(lambda statement: began.set())
            outcome.append((call(), None))
        except BaseException as exc:  # handed to Blocked.result()
            outcome.append((None, exc))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    blocked = Blocked(thread, outcome)
    thread.start()

    def finished() -> bool:
        return not thread.is_alive()

    if on_postgres:
        wait_until(lambda: theirs or finished(), timeout, what="the call's connection")
        blocked.waited = bool(
            theirs and wait_until_blocked(theirs[0], timeout, by=ours, unless=finished)
        )
    else:
        state = wait_until(
            lambda: "finished" if finished() else began.is_set() and "began",
            timeout,
            what="the call to begin a statement",
        )
        blocked.waited = state == "began"
    return blocked


def closing_connections(call: Callable[..., Any]) -> Callable[..., Any]:
    """``call``, closing the calling thread's database connections once it returns or raises:
    for ORM work handed to a thread pool (``asyncio.to_thread``), whose threads end with the
    event loop and would otherwise leave their connections to the garbage collector."""

    def closing(*args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        finally:
            connections.close_all()

    return closing


async def take_over(held: Any, key: str) -> None:
    """Take an ``ahold_lease``'s key from it: its grant ``held`` released and the key given
    to holder ``other`` (TTL 60 s), each on a worker thread. The hold finds the loss at its
    next renewal."""
    from django_leases.models import Lease

    await asyncio.to_thread(closing_connections(Lease.objects.release), held.lease)
    await asyncio.to_thread(closing_connections(Lease.objects.acquire), key, "other", 60)


def start_thread(call: Callable[[], Any], *, name: str | None = None) -> threading.Thread:
    """Start ``call`` on a daemon thread that closes its own database connections at its end
    (a thread that ends with one open leaves it to the garbage collector, and the server
    session open); returns the thread, for the test to join."""

    def run() -> None:
        try:
            call()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def on_another_thread(call: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Run ``call`` on a thread of its own (its own connection: it sees only committed rows,
    and what it writes is committed) and return its result, or raise what it raised."""
    outcome: list[tuple[Any, BaseException | None]] = []

    def run() -> None:
        try:
            outcome.append((call(), None))
        except BaseException as exc:  # handed back to the caller
            outcome.append((None, exc))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise AssertionError(f"the call did not finish within {timeout:g} s")
    value, error = outcome[0]
    if error is not None:
        raise error
    return value


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


#: Processes are forked: each child starts from the test's settings and database (no Django
#: set-up to repeat) and opens connections of its own.
_fork = multiprocessing.get_context("fork")


def in_processes(
    calls: Sequence[Callable[[], Any]],
    *,
    while_running: Callable[[], Any] | None = None,
    timeout: float = 120.0,
) -> list[tuple[Any, str]]:
    """Run each of ``calls`` in its own forked process (``while_running``, if given, runs here
    meanwhile); returns ``(value, error)`` per call, in order: ``error`` is ``""``, or the
    exception's class and message (with its traceback but for an ``AssertionError`` or
    ``ValueError``, and the store's ``…SupersededError``). Values must pickle.

    This thread's connections are closed first: no connection is shared across the fork. A
    child ends with ``os._exit``, so it never closes what it inherited from other threads.
    """
    connections.close_all()
    results = _fork.Queue()

    def child(index: int) -> None:
        try:
            results.put((index, calls[index](), ""))
        except BaseException as exc:
            detail = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, AssertionError | ValueError) and "Superseded" not in detail:
                detail += "\n" + traceback.format_exc()
            results.put((index, None, detail))
        finally:
            connections.close_all()
            results.close()
            results.join_thread()
            os._exit(0)

    processes = [_fork.Process(target=child, args=(i,), daemon=True) for i in range(len(calls))]
    for process in processes:
        process.start()
    try:
        if while_running is not None:
            while_running()
        outcomes: dict[int, tuple[Any, str]] = {}
        for _ in processes:
            index, value, error = results.get(timeout=timeout)
            outcomes[index] = (value, error)
    finally:
        for process in processes:
            process.join(timeout)
            if process.is_alive():
                process.kill()
    for process in processes:
        assert process.exitcode == 0, f"a process ended with {process.exitcode}"
    return [outcomes[i] for i in range(len(calls))]


def race_in_processes(*calls: Callable[[], Any], timeout: float = 120.0) -> list[tuple[Any, str]]:
    """:func:`in_processes`, the processes released together by a barrier."""
    barrier = _fork.Barrier(len(calls))

    def released(call: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            barrier.wait(timeout)
            return call()

        return run

    return in_processes([released(call) for call in calls], timeout=timeout)


def terminate_other_backends() -> int:
    """Kill every other connection to the test database (PostgreSQL, MariaDB / MySQL), as a
    failover would; returns how many were killed."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT id FROM information_schema.PROCESSLIST "
                "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            )
            killed = 0
            for (pid,) in cursor.fetchall():
                try:
                    cursor.execute(f"KILL CONNECTION {int(pid)}")
                    killed += 1
                except Exception:  # it ended meanwhile
                    pass
            return killed
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def failed_run(workflow: str, step: str, function: str, error: Any = "boom") -> Any:
    """A failed run of ``workflow`` whose step ``step`` (function ``function``) failed with
    ``error`` on its only attempt."""
    from django_leases.models import WorkflowRun, WorkflowStep

    run = WorkflowRun.objects.start(workflow, {})
    WorkflowStep.objects.schedule(run.id, step, function, retries=0)
    claim = WorkflowStep.objects.claim_for_execution(run.id, step, function, 60)
    assert claim is not None
    WorkflowStep.objects.set_error(claim.step_id, error, claim.attempt)
    WorkflowRun.objects.fail(run.id, f"step {step} failed")
    return run


#: The command line of ``python manage.py`` (run in :data:`ROOT`), to put a command after.
#: Python source that configures a project with Django's admin and django-leases (SQLite in
#: memory, no settings module) and runs ``django.setup()``: the start of a fresh
#: interpreter's script (:func:`in_fresh_interpreter`).
ADMIN_PROJECT_SETUP = """\
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=[
        "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
        "django.contrib.sessions", "django.contrib.messages", "django_leases",
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
)
django.setup()
"""


def in_fresh_interpreter(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run Python source ``code`` with ``args`` in a fresh interpreter, without the
    caller's ``DJANGO_SETTINGS_MODULE``; its completed process (output as text)."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env={key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


MANAGE_PY = (sys.executable, "manage.py")


def manage(
    *args: str, env: dict[str, str], stdin: str | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run ``python manage.py *args`` in the project's root with ``env`` (the
    ``subprocess_env`` fixture: this test's database) to the end; its output as text."""
    return subprocess.run(
        [*MANAGE_PY, *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_process(
    argv: Sequence[str], *, env: dict[str, str], stdin: bool = False
) -> subprocess.Popen[str]:
    """Start ``argv`` in the project's root with ``env``, its stdout and stderr (and its
    stdin, when ``stdin``) piped as text.

    The process is reaped at the end of the test (:func:`reap_started_processes`): killed if
    still running, its pipes closed.
    """
    process = subprocess.Popen(
        list(argv),
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _STARTED.append(process)
    return process


#: Processes :func:`start_process` started in the current test.
_STARTED: list[subprocess.Popen[str]] = []


def reap_started_processes() -> None:
    """Kill every process :func:`start_process` started that still runs, wait for it, and
    close its pipes (so no test leaves a process or an open file behind)."""
    while _STARTED:
        process = _STARTED.pop()
        if process.poll() is None:
            process.kill()
        process.wait(timeout=60)
        for pipe in (process.stdin, process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def run_at_once(
    commands: Sequence[Sequence[str]], *, env: dict[str, str], timeout: float = 300.0
) -> list[subprocess.CompletedProcess[str]]:
    """Start every command at once (:func:`start_process`), then wait for them all; their
    outcomes in order."""
    processes = [start_process(argv, env=env) for argv in commands]
    done = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return done


@contextmanager
def fake_sources(*names: str, **options: Any) -> Iterator[Any]:
    """A fake provider ``fake`` installed (``FakeProvider("fake", **options)``, yielded) and
    trigger sources ``names`` declared on it, not synced; the declarations are withdrawn
    at the end."""
    from django_leases.testing.providers import FakeProvider, installed_provider
    from django_leases.triggers import registry
    from django_leases.triggers.registry import webhook_source

    with installed_provider(FakeProvider("fake", **options)) as provider:
        for name in names:
            webhook_source(name, provider="fake", events={})
        try:
            yield provider
        finally:
            for name in names:
                registry.unregister(name)


def make_orphan(name: str) -> None:
    """Turn declared source ``name`` into an orphan: enabled (registered at its provider),
    then its declaration withdrawn and the sources reconciled."""
    from django_leases.triggers import lifecycle, registry

    lifecycle.enable(name)
    registry.unregister(name)
    lifecycle.reconcile()


# -- admin users --------------------------------------------------------------------------------


def staff_user(*codenames: str) -> Any:
    """A new active staff user (a unique username, password ``pw``) holding django-leases'
    permissions ``codenames`` (``"view_lease"``…), read afresh so its permission cache is
    empty."""
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user(f"staff-{uuid.uuid4().hex[:8]}", password="pw", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_leases", codename=codename)
        )
    return User.objects.get(pk=user.pk)


def staff_client(*codenames: str, **client_options: Any) -> Any:
    """A test ``Client`` (built with ``client_options``) logged in as a new
    :func:`staff_user` holding ``codenames``."""
    from django.test import Client

    client = Client(**client_options)
    client.force_login(staff_user(*codenames))
    return client


def drain(worker: Any = None, limit: int = 5000) -> int:
    """Do due work (passes and steps) on this thread with ``worker`` (a ``Worker``; by
    default one with a 60 s step lease) until none is left; returns the units done. Fails
    the test once ``limit`` units were done: the workflow never settles."""
    from django_leases.workflows.worker import Worker

    worker = worker or Worker(step_lease_ttl=60.0)
    done = 0
    while worker.work_once():
        done += 1
        assert done < limit, "the workflow never settles"
    return done


def work_until_idle(worker: Any, units: int = 100) -> int:
    """Units of work with ``worker`` (a ``Worker``) on this thread until none is due (twice
    idle), as the worker's loop takes them: a database error ends its unit and the
    thread's connections are closed (the next unit reconnects). Returns how many units
    raised one; fails the test after ``units`` units: the run never settles."""
    from django.db import DatabaseError, InterfaceError

    from django_leases import db

    errors = idle = 0
    for _ in range(units):
        try:
            idle = 0 if worker.work_once() else idle + 1
            if idle == 2:
                return errors
        except (DatabaseError, InterfaceError):
            errors += 1
            db.close_thread_connections()
    raise AssertionError("the run never settles")


def settle(run_id: Any, rounds: int = 3) -> None:
    """Finish run ``run_id`` after worker processes stopped: drain its due work on this
    thread, and where a write a busy SQLite refused ended a unit of work (a step stays
    claimed, or the run lease held, until its lease lapses, as a dead worker's — the
    release on the way out may be refused too), lapse those on the database clock and drain
    again, at most ``rounds`` times; from the second round on, the run's pass is also made
    due (a pass request whose write was refused with its unit). Leaves the run as it
    settled: the caller asserts. For tests of limits and order under worker processes on a
    busy SQLite, not of liveness (``tests/test_statement_faults.py`` is that)."""
    from django_leases.models import Lease, WorkflowRun, WorkflowStep
    from django_leases.workflows.values import run_lease_key

    drain()
    for again in range(rounds):
        running = WorkflowRun.objects.filter(pk=run_id, status="running")
        if running.values("pk").first() is None:
            return
        steps = WorkflowStep.objects.filter(run_id=run_id, status="running")
        steps.update(lease_expires_at=db_now() - timedelta(seconds=1))
        Lease.objects.filter(key=run_lease_key(run_id), expires_at__gt=db_now()).update(
            expires_at=db_now() - timedelta(seconds=1)
        )
        if again:
            running.update(pass_due_at=db_now())
        drain()


def run_of(run_id: Any) -> Any:
    """The ``WorkflowRun`` with id ``run_id`` (a UUID or its text), read afresh."""
    from django_leases.models import WorkflowRun

    return WorkflowRun.objects.get(pk=run_id)


# -- holds and workers --------------------------------------------------------------------------


def renewal_threads(key: str | None = None) -> list[threading.Thread]:
    """The renewal threads of a lease renewed on threads of its own (``key``: its
    ``lease-renewal:<key>`` thread, as leases had before the renewer: none should be left);
    with no key, every renewal thread of the process: such threads (``lease-renewal:…``,
    ``lease-deadline:…``) and each alias's renewer and watchdog (``lease-renewer:…``,
    ``lease-watchdog:…``)."""
    if key is not None:
        return [t for t in threading.enumerate() if t.name == f"lease-renewal:{key}"]
    names = ("lease-renewal:", "lease-deadline:", "lease-renewer:", "lease-watchdog:")
    return [t for t in threading.enumerate() if t.name.startswith(names)]


def end_renewers(monkeypatch: Any, *more: Any) -> None:
    """End the renewers' threads now (none may hold a lease) and keep them from lingering
    for the rest of the test (``RENEWER_IDLE`` 0): the next hold's renewals then open a new
    connection, as a test that changes the connection settings needs. ``more``: renewers
    a test made itself (``Renewer(...)``), ended too."""
    from django_leases import renewal

    monkeypatch.setattr(renewal, "RENEWER_IDLE", 0.0)
    for found in [*renewal.renewers(), *more]:
        with found.cond:
            found.cond.notify_all()
    wait_until(lambda: not renewal_threads(), 60, what="the renewers' threads to end")


def held_renewals(key: str) -> list[str]:
    """What still renews the lease ``key`` in this process: its registrations with the
    renewers (``renewer:<alias>``) and its own renewal threads (``thread``)."""
    from django_leases.renewal import renewers

    found = [f"renewer:{r.alias}" for r in renewers() for name in r.held() if name == key]
    return found + ["thread" for _ in renewal_threads(key)]


def spend_steps_first(worker: Any, run_ids: Sequence[Any] | None = None) -> None:
    """Spend ``worker``'s look for due steps ahead of new runs (made once per poll interval)
    on an idle unit of work: the passes of ``run_ids`` (default: every run with a pass due)
    are held back for that unit, then due again."""
    from django_leases.models import WorkflowRun

    if run_ids is None:
        due = WorkflowRun.objects.filter(pass_due_at__isnull=False)
        run_ids = list(due.values_list("pk", flat=True))
    WorkflowRun.objects.filter(pk__in=run_ids).update(pass_due_at=None)
    assert worker.work_once() is False
    WorkflowRun.objects.filter(pk__in=run_ids).update(pass_due_at=db_now())


# -- chaos --------------------------------------------------------------------------------------


@dataclass
class Chaos:
    """The worker processes of a chaos test: ``run_workflow_worker --concurrency
    <concurrency>`` started in :data:`ROOT` with ``env``, each logging to
    ``<tmp>/worker-<n>.log``; the SIGKILLs (``kills``: pid and database time) and SIGSTOPs
    (``stops``) a test made, and the workers stopped now (``stopped``: pid → the monotonic
    time to SIGCONT it by)."""

    tmp: Path
    env: dict[str, str]
    concurrency: int = 2
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[IO[bytes]] = field(default_factory=list)
    kills: list[tuple[int, datetime]] = field(default_factory=list)  # (pid, DB time)
    stops: list[int] = field(default_factory=list)
    stopped: dict[int, float] = field(default_factory=dict)  # pid -> monotonic time to CONT
    started: int = 0

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start one more worker process; returns it."""
        self.started += 1
        log = open(self.tmp / f"worker-{self.started}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                *MANAGE_PY,
                "run_workflow_worker",
                "--concurrency",
                str(self.concurrency),
                "--shutdown-grace",
                "10",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def live(self) -> list[subprocess.Popen[bytes]]:
        """The workers not ended (stopped ones included)."""
        return [p for p in self.procs if p.poll() is None]

    def running(self) -> list[subprocess.Popen[bytes]]:
        """The live workers not stopped."""
        return [p for p in self.live() if p.pid not in self.stopped]

    def cont_due(self, now: float | None = None) -> None:
        """SIGCONT the stopped workers whose time has come by ``now`` (monotonic seconds;
        ``None``: every stopped worker)."""
        for pid, until in list(self.stopped.items()):
            if now is None or now >= until:
                os.kill(pid, signal.SIGCONT)
                del self.stopped[pid]

    def call_resuming(self, call: Callable[[], Any], timeout: float = 120.0) -> Any:
        """Run ``call`` (a write that may wait for a row lock) on a thread of its own, and
        resume the stopped workers whose time comes meanwhile: a worker stopped inside a
        transaction holds its row locks until it is resumed, which only this thread does.
        Returns what ``call`` returned, or raises what it raised."""
        outcome: list[tuple[Any, BaseException | None]] = []

        def run() -> None:
            try:
                outcome.append((call(), None))
            except BaseException as exc:  # handed back to the caller
                outcome.append((None, exc))

        thread = start_thread(run, name="chaos-call")
        deadline = time.monotonic() + timeout
        while thread.is_alive():
            assert time.monotonic() < deadline, f"the call did not end within {timeout:g} s"
            self.cont_due(time.monotonic())
            thread.join(0.05)
        value, error = outcome[0]
        if error is not None:
            raise error
        return value

    def check_exits(self) -> None:
        """``AssertionError`` if a worker ended other than by a test's SIGKILL."""
        for proc in self.procs:
            code = proc.poll()
            assert code is None or code == -signal.SIGKILL, (
                f"worker {proc.pid} exited with {code}; see {self.tmp}"
            )

    def shutdown(self) -> None:
        """SIGCONT every stopped worker, SIGTERM every live one and wait for them (60 s,
        then SIGKILL); close the logs."""
        self.cont_due()
        for proc in self.live():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.close()


def process_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state ``T`` in ``/proc/<pid>/stat``; Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def json_nested(levels: int) -> list[Any]:
    """A list nested ``levels`` deep (``[]`` is one level): JSON as deep as a test needs."""
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


PGBOUNCER = "/usr/sbin/pgbouncer"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def running_pgbouncer(pool_mode: str, *, pool_size: int | None = None) -> Iterator[int]:
    """Debian's PgBouncer on a private port in front of the suite's PostgreSQL
    (127.0.0.1:5432), in ``pool_mode`` (``"transaction"`` or ``"session"``) with at most
    ``pool_size`` server connections per pool (``None``: PgBouncer's default); yields its
    port. Without PgBouncer the test is skipped, and fails under ``CI=true``."""
    import pwd
    import shutil
    import tempfile
    import textwrap

    import pytest

    program = shutil.which("pgbouncer") or PGBOUNCER
    if not os.path.exists(program):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("pgbouncer is not installed: the pooler tests must run under CI")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="dl-pgbouncer-"))
    (folder / "users.txt").write_text('"postgres" ""\n')
    size = "" if pool_size is None else f"default_pool_size = {pool_size}\n"
    (folder / "pgbouncer.ini").write_text(
        textwrap.dedent(
            f"""\
            [databases]
            * = host=127.0.0.1 port=5432
            [pgbouncer]
            listen_addr = 127.0.0.1
            listen_port = {port}
            unix_socket_dir =
            auth_type = trust
            auth_file = {folder}/users.txt
            pool_mode = {pool_mode}
            max_client_conn = 200
            ignore_startup_parameters = extra_float_digits,options
            logfile = {folder}/pgbouncer.log
            pidfile = {folder}/pgbouncer.pid
            """
        )
        + size
    )
    user = "postgres" if os.geteuid() == 0 else None
    if user is not None:
        entry = pwd.getpwnam(user)
        for path in (folder, *folder.iterdir()):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    command = [program, *(["-u", user] if user else []), str(folder / "pgbouncer.ini")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def accepting() -> bool:
        if process.poll() is not None:
            output = process.stdout.read().decode() if process.stdout else ""
            raise AssertionError(f"pgbouncer exited with {process.returncode}: {output}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return True

    wait_until(accepting, 30, what="pgbouncer accepting connections")
    try:
        yield port
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()
        shutil.rmtree(folder, ignore_errors=True)


def with_queues(queues: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ``DJANGO_LEASES`` setting with ``queues`` added to (or replacing entries of) its
    ``QUEUES``, for ``override_settings``."""
    configured = dict(getattr(settings, "DJANGO_LEASES", {}) or {})
    configured["QUEUES"] = {**(configured.get("QUEUES") or {}), **queues}
    return configured


@contextmanager
def limited_queues(queues: dict[str, dict[str, Any]], functions: dict[str, str]) -> Iterator[None]:
    """For the block: ``queues`` configured (:func:`with_queues`) and, for each name in
    ``functions``, a step function doing nothing on the queue it maps to."""
    from django_leases.workflows import registry, step_function

    for name, queue in functions.items():
        step_function(name, queue=queue)(lambda data, ctx: None)
    try:
        with override_settings(DJANGO_LEASES=with_queues(queues)):
            yield
    finally:
        for name in functions:
            registry._step_functions.pop(name, None)
            registry._step_options.pop(name, None)


def finish_step(step_name: str) -> None:
    """Record a ``None`` result for the running step ``step_name`` (its current attempt)."""
    from django_leases.models import WorkflowStep

    step = WorkflowStep.objects.get(step_name=step_name)
    assert WorkflowStep.objects.set_result(step.pk, None, step.attempt)


def holds_renewed_together(ttls: Sequence[float], prefix: str = "held") -> list[Any]:
    """Holds (``HeldLease``) of these TTLs (seconds) on new keys starting with ``prefix``,
    each acquired first and registered with the renewer after: their first renewals are due
    together, so they share every tick."""
    from django_leases.leases import HeldLease

    holds = [HeldLease(unique_key(prefix), ttl) for ttl in ttls]
    for held in holds:
        held.acquire(renew=False)
    for held in holds:
        held.start_renewing()
    return holds

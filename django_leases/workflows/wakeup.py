"""Prompt wake-up of idle workflow workers when work becomes due.

PostgreSQL: LISTEN/NOTIFY. The store calls :func:`notify_work_due` inside the transaction
that makes work due now (a run started, a pass requested, a step scheduled, a failed step
due again at once); PostgreSQL delivers the notification when — and only if — that
transaction commits, so a woken worker always finds the work committed. Each worker process
keeps one :class:`WakeupListener`: its own psycopg connection in autocommit mode, outside
Django's connection handling, that ``LISTEN``\\ s on the channel and wakes one idle worker
thread per notification (a thread that finds work wakes the next, so a burst fans out over
all threads). If the listener's connection is killed it reconnects, and wakes every thread
once, as notifications sent while it was away are lost.

Behind a pooler in transaction mode (the alias's ``DISABLE_SERVER_SIDE_CURSORS`` set, as
Django asks for one) or with ``DJANGO_LEASES["WORKER_WAKEUP"] = "poll"`` workers do not
LISTEN and poll instead (:func:`listens`). Elsewhere (SQLite) :func:`notify_work_due` does
nothing and workers poll: an idle thread
looks again every poll interval (``WORKER_POLL_INTERVAL``; see
:class:`~django_leases.workflows.worker.Worker` for the defaults). Polling also stays the
fallback on PostgreSQL, for work that becomes due by the clock rather than by a write — a
step whose lease lapsed, a retry after its retry delay, a pass retried a second later —
and while the listener is disconnected.

The channel is :func:`~django_leases.workflows.channel.channel_name`: two projects on one
server never wake each other's workers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_leases import db
from django_leases.conf import leases_settings
from django_leases.workflows.channel import channel_name, notify_work_due

if TYPE_CHECKING:  # psycopg is imported when a listener connects (PostgreSQL only)
    # deferred: psycopg is loaded only by a PostgreSQL worker that listens
    import psycopg
    from psycopg.rows import TupleRow

logger = logging.getLogger("django_leases.worker")

#: Seconds the listener waits for notifications before it looks at its stop flag again.
LISTEN_TICK = 0.5
#: Seconds between two liveness pings of an idle listener connection (a dead TCP peer
#: raises no error on its own).
PING_INTERVAL = 30.0
#: First and longest pause before the listener reconnects, seconds.
RECONNECT_BACKOFF = 0.1
MAX_RECONNECT_BACKOFF = 5.0
#: Seconds a connection attempt of the listener may take.
CONNECT_TIMEOUT = 10


def listens(using: str) -> bool:
    """Whether workers on database alias ``using`` (``str``) are woken by LISTEN/NOTIFY:
    PostgreSQL, unless the alias is behind a pooler in transaction mode (its
    ``DISABLE_SERVER_SIDE_CURSORS`` is ``True``, as Django asks for one), which delivers a
    notification to whichever client holds the server connection at that moment, or
    ``DJANGO_LEASES["WORKER_WAKEUP"]`` is ``"poll"``, or Django runs on psycopg2 (the
    listener is a psycopg 3 connection)."""
    connection = connections[using]
    if connection.vendor != "postgresql" or leases_settings.WORKER_WAKEUP == "poll":
        return False
    if not db.psycopg3(connection):
        return False
    return not connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")


def wakeup_method(using: str, poll_interval: float) -> str:
    """How idle workers on ``using`` learn of new work, in words (for the worker's first
    line): LISTEN/NOTIFY, or polling every ``poll_interval`` seconds and why."""
    connection = connections[using]
    if listens(using):
        return f"woken by LISTEN/NOTIFY, polling every {poll_interval:g} s for work due later"
    if connection.vendor != "postgresql":
        why = f"{connection.vendor} has no notifications"
    elif leases_settings.WORKER_WAKEUP == "poll":
        why = 'WORKER_WAKEUP is "poll"'
    elif not db.psycopg3(connection):
        why = "psycopg2: LISTEN/NOTIFY needs psycopg 3"
    else:
        why = "DISABLE_SERVER_SIDE_CURSORS: a pooler in transaction mode delivers none"
    return f"polling every {poll_interval:g} s ({why})"


class WakeSignal:
    """Wake-ups for a process's idle worker threads: tokens, one per wake-up asked for.

    :meth:`wait` consumes one token or times out; :meth:`wake` adds tokens (at most
    ``capacity`` are kept, so a burst of notifications while every thread is busy costs at
    most one extra look per thread). A token added while a thread is still looking for work
    is kept, so a notification arriving between "found nothing" and "wait" is never missed.
    :meth:`interrupt` ends every wait for good (the worker is stopping).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._cond = threading.Condition()
        self._tokens = 0
        self._waiting = 0
        self._interrupted = False

    @property
    def waiting(self) -> int:
        """How many threads are waiting now (``int``)."""
        with self._cond:
            return self._waiting

    def wake(self, count: int = 1) -> None:
        """Wake up to ``count`` waiting threads (or the next ones to wait)."""
        with self._cond:
            self._tokens = min(self.capacity, self._tokens + count)
            self._cond.notify(count)

    def wake_if_waiting(self) -> None:
        """Wake one thread if one is waiting (a thread that found work passes it on)."""
        with self._cond:
            if self._waiting > self._tokens:
                self._tokens += 1
                self._cond.notify(1)

    def interrupt(self) -> None:
        """End every current and future wait at once."""
        with self._cond:
            self._interrupted = True
            self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a wake-up; ``True`` if woken (or interrupted),
        ``False`` on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._waiting += 1
            try:
                while not self._tokens and not self._interrupted:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                if self._tokens:
                    self._tokens -= 1
                return True
            finally:
                self._waiting -= 1


class WakeupListener:
    """A thread that LISTENs on :func:`channel_name` and calls ``on_notify`` per notification.

    Args:
        using: database alias (PostgreSQL) whose settings the listener's own connection uses.
        on_notify: called on the listener thread for each notification received.
        on_reconnect: called after every successful (re)connection, once listening: work made
            due while no connection listened would otherwise wait for the next poll.

    Attributes:
        connects: how many times the listener connected and started listening (``int``).
        listening: a :class:`threading.Event` set while a connection is listening.

    The connection is a plain psycopg connection in autocommit mode built from the alias's
    settings (never one of Django's per-thread connections, never pooled). A failure —
    the backend killed, the server restarted — is logged; the listener reconnects with a
    back-off from :data:`RECONNECT_BACKOFF` to :data:`MAX_RECONNECT_BACKOFF` seconds, and
    the workers keep polling meanwhile.
    """

    def __init__(
        self,
        using: str,
        on_notify: Callable[[], None],
        *,
        on_reconnect: Callable[[], None] | None = None,
    ) -> None:
        self.using = using
        self.channel = channel_name(using)
        self.connects = 0
        self.listening = threading.Event()
        self._on_notify = on_notify
        self._on_reconnect = on_reconnect
        self._stop = threading.Event()
        self._params = self._connection_params()
        self._conn: psycopg.Connection[TupleRow] | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._main, name=f"workflow-wakeup:{using}", daemon=True
        )

    def _connection_params(self) -> dict[str, Any]:
        # The options Django was given, as Django passes them (``prepare_threshold=None``
        # among them: behind a pooler in transaction mode a prepared keep-alive would fail).
        params: dict[str, Any] = dict(connections[self.using].get_connection_params())
        params.setdefault("connect_timeout", CONNECT_TIMEOUT)
        params["application_name"] = f"django_leases worker wake-up ({self.using})"
        return params

    def start(self) -> WakeupListener:
        """Start the listener thread; returns ``self``."""
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop listening and close the connection; waits up to ``timeout`` seconds."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def backend_pid(self) -> int | None:
        """The PostgreSQL backend pid of the listening connection, or ``None``."""
        with self._lock:
            conn = self._conn
        if conn is None or conn.closed:
            return None
        try:
            return int(conn.info.backend_pid)
        except Exception:
            return None

    def _connect(self) -> psycopg.Connection[TupleRow]:
        # deferred: psycopg is loaded only by a PostgreSQL worker that listens
        import psycopg
        from psycopg import sql

        conn = psycopg.connect(**self._params, autocommit=True)
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        except BaseException:
            conn.close()
            raise
        return conn

    def _main(self) -> None:
        backoff = RECONNECT_BACKOFF
        while not self._stop.is_set():
            try:
                conn = self._connect()
            except Exception as exc:
                logger.warning(
                    "Workflow wake-up listener could not connect (%s); polling meanwhile, "
                    "reconnecting in %.1f s",
                    exc,
                    backoff,
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_RECONNECT_BACKOFF)
                continue
            with self._lock:
                self._conn = conn
            self.connects += 1
            self.listening.set()
            backoff = RECONNECT_BACKOFF
            logger.debug("Workflow wake-up listener listening on %s", self.channel)
            try:
                if self._on_reconnect is not None:
                    self._on_reconnect()
                self._listen(conn)
            except Exception as exc:
                if not self._stop.is_set():
                    logger.warning(
                        "Workflow wake-up listener lost its connection (%s); polling "
                        "meanwhile, reconnecting",
                        exc,
                    )
            finally:
                self.listening.clear()
                with self._lock:
                    self._conn = None
                try:
                    conn.close()
                except Exception:
                    logger.debug("closing the wake-up connection failed", exc_info=True)
            if not self._stop.is_set():
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_RECONNECT_BACKOFF)

    def _listen(self, conn: psycopg.Connection[TupleRow]) -> None:
        last_ping = time.monotonic()
        while not self._stop.is_set():
            for _notify in conn.notifies(timeout=LISTEN_TICK):
                self._on_notify()
                if self._stop.is_set():
                    return
            if time.monotonic() - last_ping >= PING_INTERVAL:
                conn.execute("SELECT 1")
                last_ping = time.monotonic()


__all__ = [
    "WakeSignal",
    "WakeupListener",
    "channel_name",
    "listens",
    "notify_work_due",
    "wakeup_method",
]

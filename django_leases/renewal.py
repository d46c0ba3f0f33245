"""The TTL/3 renewal loop shared by ``hold_lease`` and workflow step execution.

Behaviour follows the reference ``keepLeaseAlive`` (rules L12–L18):

* a renewal runs every ``max(ttl / 3, RENEWAL_FLOOR)`` seconds, so a failed one still leaves
  two more before the lease runs out; renewals never overlap;
* a renewal that answers ``False`` ("not held") marks the lease **lost** at once;
* a renewal that raises proves nothing: the lease is counted lost only once the *local
  deadline* has passed — the monotonic time at which the last successful renewal (or the
  acquisition) was *sent*, plus the TTL. A briefly unreachable database therefore does not
  cost the lease (L16);
* the deadline is watched by its own timer, so a renewal that *hangs* (a dead TCP peer) still
  marks the lease lost when the deadline passes (L17);
* :meth:`Renewal.stop` waits for a renewal in flight (until the local deadline at most), and
  ``refresh`` never extends a released lease, so a release made after it can never be
  undone by a late renewal.

The renewal thread uses its own database connections (Django's are per thread) and closes
them when it ends; after a failed renewal it closes them too, so the next one reconnects.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django_leases import db
from django_leases.conf import leases_settings
from django_leases.process import TIMERS, Timer

logger = logging.getLogger("django_leases.renewal")

#: How many renewals fit in one lease.
RENEWALS_PER_LEASE = 3

#: Called with each renewal's outcome (``"held"``, ``"lost"``, ``"failed"``), on the renewal
#: thread: the metrics count them. Observers must be quick and must not raise.
observers: list[Callable[[str], None]] = []


def _observed(outcome: str) -> None:
    for observer in observers:
        try:
            observer(outcome)
        except Exception:
            logger.debug("a renewal observer failed", exc_info=True)


def renewal_interval(ttl: float) -> float:
    """Seconds between renewals of a ``ttl``-second lease: ``max(ttl / 3, RENEWAL_FLOOR)``."""
    return max(ttl / RENEWALS_PER_LEASE, float(leases_settings.RENEWAL_FLOOR))


class Renewal:
    """Keeps a lease alive by calling ``renew`` every TTL/3 on a background thread.

    Args:
        name: what the lease is (its key), for logs and thread names.
        ttl: the lease's TTL in seconds (float).
        renew: called on the renewal thread; returns ``True`` while the lease is still held,
            ``False`` once it is not. An exception means "unknown".
        held_since: ``time.monotonic()`` taken just before the acquisition was sent; the
            first local deadline is ``held_since + ttl``. Defaults to now.
        on_lost: called once, on a background thread, when the lease is seen lost.
        lost: the :class:`threading.Event` to set when the lease is lost (default: a new one;
            a holder passes its own, which exists before the renewal does).

        deferred: start the renewal and deadline threads only once the first renewal is
            due (``interval`` seconds after :meth:`start`), from the process's one timer
            thread (:data:`~django_leases.process.TIMERS`). A unit of work that ends before
            then (most workflow passes and steps) starts no thread at all, and :meth:`stop`
            has nothing to wait for. Once started, the threads follow the rules above
            unchanged.

    ``lost`` is a :class:`threading.Event` set when the lease is lost. Call :meth:`start`
    once and :meth:`stop` exactly when done (it is idempotent).
    """

    def __init__(
        self,
        name: str,
        ttl: float,
        renew: Callable[[], bool],
        *,
        held_since: float | None = None,
        on_lost: Callable[[], None] | None = None,
        deferred: bool = False,
        lost: threading.Event | None = None,
    ) -> None:
        self.name = name
        self.ttl = ttl
        self.interval = renewal_interval(ttl)
        self.lost = threading.Event() if lost is None else lost
        self._renew = renew
        self._on_lost = on_lost
        self._deadline = (time.monotonic() if held_since is None else held_since) + ttl
        self._stopped = threading.Event()
        self._cond = threading.Condition()
        self._lost_once = threading.Lock()
        self._lost_reported = False
        # Made when they start: a deferred renewal usually never does, and a Thread object
        # costs more than the rest of this one.
        self._renewer: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._deferred = deferred
        self._threads_lock = threading.Lock()
        self._threads_started = False
        self._first_wait = self.interval
        self._timer: Timer | None = None

    @property
    def deadline(self) -> float:
        """The local deadline (``time.monotonic()`` seconds) the lease is vouched for until."""
        with self._cond:
            return self._deadline

    def start(self) -> Renewal:
        """Start the renewal and deadline threads (deferred: schedule their start for when the
        first renewal is due); returns ``self``."""
        if self._deferred:
            self._timer = TIMERS.at(time.monotonic() + self.interval, self._start_now)
        else:
            self._start_threads(self.interval)
        return self

    def _start_now(self) -> None:
        """The first renewal is due (deferred start, on the timer thread)."""
        try:
            self._start_threads(0.0)
        except Exception:  # e.g. no thread can be started: the deadline still rules
            logger.exception("Could not start the renewal of lease %r", self.name)

    def _start_threads(self, first_wait: float) -> None:
        with self._threads_lock:
            if self._stopped.is_set() or self._threads_started:
                return
            self._threads_started = True
            self._first_wait = first_wait
            self._renewer = threading.Thread(
                target=self._renew_loop, name=f"lease-renewal:{self.name}", daemon=True
            )
            self._watchdog = threading.Thread(
                target=self._watch_deadline, name=f"lease-deadline:{self.name}", daemon=True
            )
            self._renewer.start()
            self._watchdog.start()

    def stop(self) -> None:
        """Stop renewing, waiting for a renewal in flight to finish. Idempotent.

        The wait is bounded by the local deadline: a renewal still hanging when the deadline
        passes (a dead TCP peer) can no longer vouch for the lease, so the lease is marked
        lost and the hung renewal is left to end on its own. It cannot undo a later release:
        ``refresh`` never extends a released lease.
        """
        with self._threads_lock:
            self._stopped.set()
            started = self._threads_started
        if self._timer is not None:
            self._timer.cancel()
        if not started:
            return  # no renewal ever ran or can run now: nothing to wait for
        with self._cond:
            self._cond.notify_all()
        current = threading.current_thread()
        renewer, watchdog = self._renewer, self._watchdog
        while renewer is not None and renewer.is_alive() and renewer is not current:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.mark_lost("a renewal was still hanging when its TTL ran out")
                break
            renewer.join(remaining)
        if watchdog is not None and watchdog.is_alive() and watchdog is not current:
            watchdog.join()

    def mark_lost(self, reason: str) -> None:
        """Record the loss (once) and tell ``on_lost``."""
        with self._lost_once:
            if self._lost_reported:
                return
            self._lost_reported = True
        logger.warning("Lease %r lost: %s", self.name, reason)
        self.lost.set()
        with self._cond:
            self._cond.notify_all()
        if self._on_lost is not None:
            try:
                self._on_lost()
            except Exception:
                logger.exception("on_lost callback of lease %r failed", self.name)

    def _renew_loop(self) -> None:
        try:
            wait = self._first_wait
            while not self.lost.is_set():
                if self._stopped.wait(wait):
                    return
                wait = self.interval
                sent = time.monotonic()
                try:
                    held: bool | None = bool(self._renew())
                except Exception as exc:  # the database may be briefly unreachable
                    held = None
                    logger.warning("Renewal of lease %r failed: %s", self.name, exc)
                    self._close_connections()
                _observed("failed" if held is None else "held" if held else "lost")
                if held:
                    with self._cond:
                        self._deadline = max(self._deadline, sent + self.ttl)
                        self._cond.notify_all()
                elif held is False:
                    self.mark_lost("the database says it is no longer held")
                elif time.monotonic() >= self.deadline:
                    self.mark_lost("renewals kept failing past its TTL")
        finally:
            self._close_connections()

    def _watch_deadline(self) -> None:
        with self._cond:
            while not self._stopped.is_set() and not self.lost.is_set():
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            expired = not self._stopped.is_set() and not self.lost.is_set()
        if expired:
            self.mark_lost("no renewal succeeded within its TTL")

    @staticmethod
    def _close_connections() -> None:
        # Django's connections are per thread: this closes only the renewal thread's own.
        db.close_thread_connections()

"""The TTL/3 renewal loop: one :class:`Renewer` per process and database alias.

Behaviour follows the reference ``keepLeaseAlive`` (rules L12–L18):

* a lease is renewed every ``max(ttl / 3, RENEWAL_FLOOR)`` seconds, and a renewal that proved
  nothing (it raised, or its row was locked) is tried again after half that
  (:func:`retry_interval`), so a failed renewal still leaves at least two more before the
  lease runs out — not one, and a third racing the deadline; a lease's renewals never
  overlap;
* a renewal that answers "not held" marks the lease **lost** at once;
* a renewal that raises proves nothing: the lease is counted lost only once the *local
  deadline* has passed — the monotonic time at which the last successful renewal (or the
  acquisition) was *sent*, plus the TTL. A briefly unreachable database therefore does not
  cost the lease (L16);
* the deadline is watched by a thread of its own, so a renewal that *hangs* (a dead TCP
  peer) still marks the lease lost when the deadline passes (L17);
* stopping a lease's renewals waits for a renewal of it in flight (until the local deadline
  at most), and ``refresh`` never extends a released lease, so a release made after it can
  never be undone by a late renewal.

**One renewer per process and alias** (:func:`renewer`). Every lease ``hold_lease``,
``ahold_lease`` and the ``hold_lease`` command hold, and the workflow worker's run, step and
heartbeat leases, is registered with the renewer of its database alias
(:meth:`Renewer.lease`, then :meth:`Renewed.start`). The renewer's one thread
(``lease-renewer:<alias>``) sleeps until a renewal is due, then renews **every lease
due** — and every one due within the next quarter of its own interval, so leases taken at
about the same time share their ticks from then on — in one tick: one call of each
:data:`BatchRefresh` for all its leases (``Lease.objects.refresh_many`` for leases,
``WorkflowStep.objects.refresh_leases`` for step leases: each one statement that says which
were still held), on the thread's one connection. Its watchdog thread
(``lease-watchdog:<alias>``) marks a lease lost once its local deadline passes. A holder
learns of its own loss only (its ``lost`` event, its ``on_lost``: run on a short-lived thread,
so a slow ``lease_lost`` receiver delays no renewal). Both threads end, and close their
connections, once the renewer has had nothing to renew for :data:`RENEWER_IDLE` seconds.
So a process holding 1,000 leases, or a worker running 16 slow steps, renews them on one
connection and two threads, with one statement per tick and kind of lease, where each lease
used to have a connection and two threads.

A lease without a set-based refresh registers a ``renew`` callable instead (called on the
renewer thread, one call per lease per tick).

The renewal thread uses its own database connection (Django's are per thread) and closes
it when it ends; after a failed renewal it closes it too, so the next one reconnects.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from django.db import connections

from django_leases import db
from django_leases.conf import leases_settings

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("django_leases.renewal")

#: How many renewals fit in one lease.
RENEWALS_PER_LEASE = 3

#: Called with each renewal's outcome (``"held"``, ``"lost"``, ``"failed"``, ``"skipped"``: its
#: row was locked by another transaction), on the renewal thread: the metrics count them.
#: Observers must be quick and must not raise.
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


def retry_interval(ttl: float) -> float:
    """Seconds after a renewal of a ``ttl``-second lease that proved nothing (it raised, or
    the row was locked) before the next try: half of :func:`renewal_interval`, no less than
    ``RENEWAL_FLOOR``."""
    return max(renewal_interval(ttl) / 2, float(leases_settings.RENEWAL_FLOOR))


#: Seconds a renewer with nothing to renew keeps its threads (and their connection) before
#: they end; the next lease registered starts them again.
RENEWER_IDLE = 5.0

#: A tick also renews the leases due within this share of their own interval (early, never
#: late): leases taken at about the same time then share their ticks.
COALESCE = 0.25

#: Seconds past a tick's bound (the shortest TTL in it, after which ``db.bounded`` cuts a
#: statement without an answer) at which the watchdog counts the tick as stuck and starts a
#: new renewal thread.
STUCK_GRACE = 1.0


class Unknown(enum.Enum):
    """The type of :data:`UNKNOWN`."""

    UNKNOWN = "unknown"

    def __bool__(self) -> bool:
        raise TypeError("UNKNOWN is neither held nor lost: compare it with `is UNKNOWN`")


#: A set-based refresh's answer for one lease whose row another transaction held locked:
#: the row was skipped (``SKIP LOCKED``), so nothing is known of that lease this tick. The
#: renewer counts it as a failed renewal of that lease alone (its local deadline rules: lost
#: only if it stays unrenewed past its TTL); the other leases of the statement are renewed.
#: Not truthy nor falsy (``bool(UNKNOWN)`` raises): test it with ``is UNKNOWN``.
UNKNOWN: Final = Unknown.UNKNOWN


class BatchRefresh(Protocol):
    """Refreshes several leases of one kind on database ``alias`` in one statement.

    Called on the renewer thread with ``(item, ttl seconds)`` pairs; returns one entry per
    pair, in order: the item as refreshed (handed to the lease's ``on_renewed``, and
    refreshed next time), ``None`` when that lease is no longer held, or :data:`UNKNOWN`
    when its row was locked by another transaction and skipped (a failed renewal of that
    lease alone: one row lock must not make every lease of the process wait). Raising says
    nothing of any lease (each counts as a renewal that failed). ``Lease.objects.refresh_many`` is
    the leases' (:func:`~django_leases.leases.refresh_leases`); a workflow step lease's is
    one fenced ``UPDATE`` of the steps matching id and attempt
    (:func:`~django_leases.workflows.engine.refresh_step_leases`).
    """

    def __call__(
        self, alias: str, items: Sequence[tuple[Any, float]]
    ) -> Sequence[Any | Unknown | None]:
        """Refresh ``items`` on ``alias``; see the class docstring."""
        ...


class Renewed:
    """One lease kept alive by a :class:`Renewer` (made by :meth:`Renewer.lease`).

    Call :meth:`start` once, and :meth:`stop` exactly when done (idempotent). ``lost`` is a
    :class:`threading.Event` set when the lease is lost; :attr:`deadline` the local deadline.
    """

    def __init__(
        self,
        renewer: Renewer,
        name: str,
        ttl: float,
        *,
        item: Any,
        refresh: BatchRefresh | None,
        renew: Callable[[], bool] | None,
        held_since: float | None,
        on_lost: Callable[[], None] | None,
        on_renewed: Callable[[Any], None] | None,
        lost: threading.Event | None,
    ) -> None:
        self.renewer = renewer
        self.name = name
        self.ttl = ttl
        self.interval = renewal_interval(ttl)
        self.retry_interval = retry_interval(ttl)
        self.item = item
        self.refresh = refresh
        self.renew = renew
        self.lost = threading.Event() if lost is None else lost
        self.on_lost = on_lost
        self.on_renewed = on_renewed
        self._deadline = (time.monotonic() if held_since is None else held_since) + ttl
        #: ``time.monotonic()`` when the next renewal is due (set by :meth:`start`).
        self.due = 0.0
        self.in_flight = False
        self.started = False
        self.stopped = False
        self._lost_once = threading.Lock()
        self._lost_reported = False
        #: Set once ``on_lost`` has been called (for a loss seen), so that :meth:`stop`
        #: returns only after the holder was told, as a joined renewal thread did.
        self._told = threading.Event()
        self._teller: threading.Thread | None = None
        #: The process renewing it (a forked child's copy is not renewed there).
        self._pid = os.getpid()

    @property
    def deadline(self) -> float:
        """The local deadline (``time.monotonic()`` seconds) the lease is vouched for until."""
        with self.renewer.cond:
            return self._deadline

    def start(self) -> Renewed:
        """Register with the renewer: the first renewal is due an interval from now. Returns
        ``self``."""
        self.renewer.register(self)
        return self

    def stop(self) -> None:
        """Stop renewing, waiting for a renewal of this lease in flight to finish.
        Idempotent. The wait is bounded by the local deadline: a renewal still hanging then
        can no longer vouch for the lease, which is marked lost (the hung call is left to end
        on its own; ``refresh`` never extends a released lease). In a child forked since it
        started, nothing: the renewer is the parent's (its locks may have been held at the
        fork)."""
        if os.getpid() != self._pid:
            return
        self.renewer.unregister(self)

    def mark_lost(self, reason: str) -> None:
        """Record the loss (once): set :attr:`lost` and call ``on_lost`` on this thread."""
        if self._report(reason):
            self._tell()

    def _report(self, reason: str) -> bool:
        """Set :attr:`lost` (the first time: log ``reason``); whether this call did."""
        with self._lost_once:
            if self._lost_reported:
                return False
            self._lost_reported = True
        logger.warning("Lease %r lost: %s", self.name, reason)
        self.lost.set()
        return True

    def _tell(self) -> None:
        try:
            if self.on_lost is not None:
                self.on_lost()
        except Exception:
            logger.exception("on_lost callback of lease %r failed", self.name)
        finally:
            self._told.set()

    def _wait_told(self) -> None:
        """Wait until the holder was told of a loss seen by the renewer or the watchdog
        (not from the telling thread itself: an ``on_lost`` that stops the lease)."""
        if self._lost_reported and threading.current_thread() is not self._teller:
            self._told.wait()


class Renewer:
    """Renews the leases of one database alias registered in this process: one renewal
    thread and one watchdog thread, started with the first lease and ending
    :data:`RENEWER_IDLE` seconds after the last one stopped (module docstring). Get it with
    :func:`renewer`.

    Attributes:
        alias: the database alias.
        ticks: how many ticks it has made (``int``); ``calls``: how many batch refreshes and
            ``renew`` callables those ticks made; ``renewals``: how many lease renewals.
    """

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.cond = threading.Condition()
        self._leases: dict[int, Renewed] = {}
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        #: ``time.monotonic()`` past which the tick in flight counts as stuck.
        self._stuck_at: float | None = None
        #: ``time.monotonic()`` until which each thread sleeps (``-inf``: it is awake,
        #: ``inf``: until notified); a new lease due sooner wakes them.
        self._renewer_wakes = -math.inf
        self._watchdog_wakes = -math.inf
        self.ticks = 0
        self.calls = 0
        self.renewals = 0
        #: The renewal thread's connection, once it sent a batch refresh: a forked child
        #: disowns its copy (:func:`_after_fork_in_child`).
        self._connection: BaseDatabaseWrapper | None = None

    # -- registration --------------------------------------------------------------------------

    def lease(
        self,
        name: str,
        ttl: float,
        *,
        item: Any = None,
        refresh: BatchRefresh | None = None,
        renew: Callable[[], bool] | None = None,
        held_since: float | None = None,
        on_lost: Callable[[], None] | None = None,
        on_renewed: Callable[[Any], None] | None = None,
        lost: threading.Event | None = None,
    ) -> Renewed:
        """A lease to keep alive (:class:`Renewed`, not started: call its ``start``).

        Args:
            name: what the lease is (its key), for logs.
            ttl: its TTL, seconds (``float``); renewed every ``max(ttl / 3, RENEWAL_FLOOR)``.
            item: what ``refresh`` renews (a ``Lease``), replaced by each refreshed one.
            refresh: the set-based refresh of ``item`` (:class:`BatchRefresh`); or
            renew: a callable renewing this lease alone (``True`` while held, ``False`` once
                not, raising for "unknown"), called on the renewer thread.
            held_since: ``time.monotonic()`` just before the acquisition was sent; the first
                local deadline is ``held_since + ttl``. Defaults to now.
            on_lost: called once when the lease is seen lost (on a short-lived thread of its
                own when the renewer or the watchdog saw it; on the caller's thread for
                :meth:`Renewed.mark_lost`).
            on_renewed: called on the renewer thread with each refreshed ``item``.
            lost: the :class:`threading.Event` to set when the lease is lost (default: new).

        Raises ``ValueError`` unless exactly one of ``refresh`` and ``renew`` is given.
        """
        if (refresh is None) == (renew is None):
            raise ValueError("Give a lease either refresh (with item) or renew, not both")
        return Renewed(
            self,
            name,
            ttl,
            item=item,
            refresh=refresh,
            renew=renew,
            held_since=held_since,
            on_lost=on_lost,
            on_renewed=on_renewed,
            lost=lost,
        )

    def register(self, lease: Renewed) -> None:
        """Start renewing ``lease`` (:meth:`Renewed.start`); a no-op if started already."""
        with self.cond:
            if lease.started:
                return
            lease.started = True
            if lease.stopped:
                return
            lease.due = time.monotonic() + lease.interval
            self._leases[id(lease)] = lease
            self._start_threads()
            # Wake the threads only when they would sleep past the new lease's moments: a
            # busy worker registers a lease per step, nearly always due after the others.
            if lease.due < self._renewer_wakes or lease._deadline < self._watchdog_wakes:
                self.cond.notify_all()

    def unregister(self, lease: Renewed) -> None:
        """Stop renewing ``lease`` (:meth:`Renewed.stop`)."""
        me = threading.current_thread()
        hanging = False
        with self.cond:
            lease.stopped = True
            self._leases.pop(id(lease), None)
            while lease.in_flight and me is not self._thread:
                remaining = lease._deadline - time.monotonic()
                if remaining <= 0:
                    hanging = True
                    break
                self.cond.wait(remaining)
            if not self._leases:
                self.cond.notify_all()  # the idle countdown starts
        if hanging:
            lease.mark_lost("a renewal was still hanging when its TTL ran out")
        lease._wait_told()

    def held(self) -> list[str]:
        """The names of the leases registered now (for tests and operators)."""
        with self.cond:
            return [lease.name for lease in self._leases.values()]

    def _start_threads(self) -> None:
        # Under self.cond.
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"lease-renewer:{self.alias}", daemon=True
            )
            self._thread.start()
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=self._watch, name=f"lease-watchdog:{self.alias}", daemon=True
            )
            self._watchdog.start()

    # -- the renewal thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self.cond:
                    batch = self._next_batch()
                if batch is None:
                    return
                self._tick(batch)
        finally:
            db.close_thread_connections()

    def _current(self) -> bool:
        """Whether the calling thread is the renewal thread (not one retired while stuck)."""
        return threading.current_thread() is self._thread

    def _next_batch(self) -> list[Renewed] | None:
        """Wait until a renewal is due; the leases to renew now, or ``None`` when the thread
        should end (nothing to renew for :data:`RENEWER_IDLE` seconds). Under ``cond``."""
        idle_since: float | None = None
        while True:
            if not self._current():
                return None  # retired while a tick was stuck: a new thread took over
            now = time.monotonic()
            if not self._leases:
                if idle_since is None:
                    # Nothing to renew: no connection stays open while the thread idles.
                    # (An open SQLite connection must not be carried across a fork: the
                    # child's own connections to that file would fail, "disk I/O error".)
                    db.close_thread_connections()
                idle_since = now if idle_since is None else idle_since
                left = idle_since + RENEWER_IDLE - now
                if left <= 0:
                    self._thread = None
                    self.cond.notify_all()  # the watchdog ends too
                    return None
                self._sleep(left)
                continue
            idle_since = None
            # A lease seen lost is renewed no more (its holder is told; it stops it); one
            # still in the tick of a retired thread is not renewed twice at once.
            active = [
                lease
                for lease in self._leases.values()
                if not lease.lost.is_set() and not lease.in_flight
            ]
            if not active:
                self._sleep(None)  # until a lease is registered or a tick ends
                continue
            soonest = min(lease.due for lease in active)
            if soonest > now:
                self._sleep(soonest - now)
                continue
            batch = [lease for lease in active if lease.due <= now + COALESCE * lease.interval]
            for lease in batch:
                lease.in_flight = True
            self._stuck_at = now + min(lease.ttl for lease in batch) + STUCK_GRACE
            return batch

    def _sleep(self, seconds: float | None) -> None:
        """The renewal thread waits on ``cond`` (``None``: until notified), saying until
        when, so that :meth:`register` wakes it only when a lease is due sooner. Under
        ``cond``."""
        self._renewer_wakes = math.inf if seconds is None else time.monotonic() + seconds
        self.cond.wait(seconds)
        self._renewer_wakes = -math.inf

    def _tick(self, batch: list[Renewed]) -> None:
        """Renew ``batch``: one call per refresh kind, one per ``renew`` callable."""
        sent = time.monotonic()
        outcomes: list[tuple[Renewed, bool | None]] = []
        skipped: list[Renewed] = []
        failed = False
        kinds: dict[int, list[Renewed]] = {}
        for lease in batch:
            if lease.refresh is not None:
                kinds.setdefault(id(lease.refresh), []).append(lease)
        try:
            for leases in kinds.values():
                refresh = leases[0].refresh
                assert refresh is not None
                bound = min(lease.ttl for lease in leases)
                self.calls += 1
                try:
                    # This thread's connection, for a forked child to disown.
                    self._connection = connections[self.alias]
                    with db.bounded(self._connection, bound, f"renewal of {len(leases)} lease(s)"):
                        answers = list(refresh(self.alias, [(x.item, x.ttl) for x in leases]))
                    if len(answers) != len(leases):
                        raise RuntimeError(f"{refresh!r} answered {len(answers)} of {len(leases)}")
                except Exception as exc:  # the database may be briefly unreachable
                    logger.warning(
                        "Renewal of lease(s) %s on %r failed: %s", _names(leases), self.alias, exc
                    )
                    failed = True
                    outcomes.extend((lease, None) for lease in leases)
                    continue
                for lease, answer in zip(leases, answers, strict=True):
                    if answer is UNKNOWN:
                        skipped.append(lease)
                        outcomes.append((lease, None))
                        continue
                    outcomes.append((lease, answer is not None))
                    if answer is not None:
                        lease.item = answer
                        if lease.on_renewed is not None:
                            try:
                                lease.on_renewed(answer)
                            except Exception:
                                logger.exception("on_renewed of lease %r failed", lease.name)
            for lease in batch:
                if lease.renew is None:
                    continue
                self.calls += 1
                try:
                    outcomes.append((lease, bool(lease.renew())))
                except Exception as exc:
                    logger.warning("Renewal of lease %r failed: %s", lease.name, exc)
                    failed = True
                    outcomes.append((lease, None))
        finally:
            if skipped:
                logger.info(
                    "Renewal of lease(s) %s on %r skipped: locked by another transaction",
                    _names(skipped),
                    self.alias,
                )
            if failed:
                db.close_thread_connections()
            answered = {id(lease) for lease, _ in outcomes}
            outcomes.extend((lease, None) for lease in batch if id(lease) not in answered)
            with self.cond:
                if self._current():
                    self._stuck_at = None
                self.ticks += 1
                self.renewals += len(batch)
                for lease, held in outcomes:
                    lease.in_flight = False
                    lease.due = sent + (
                        lease.interval if held is not None else lease.retry_interval
                    )
                    if held:
                        lease._deadline = max(lease._deadline, sent + lease.ttl)
                self.cond.notify_all()
        now = time.monotonic()
        lost: list[Renewed] = []
        locked = {id(lease) for lease in skipped}
        for lease, held in outcomes:
            if held is None:
                _observed("skipped" if id(lease) in locked else "failed")
            else:
                _observed("held" if held else "lost")
            if held is False:
                reason = "the database says it is no longer held"
            elif held is None and now >= lease.deadline:
                reason = "renewals kept failing past its TTL"
            else:
                continue
            if lease._report(reason):
                lost.append(lease)
        _tell_later(lost, self.alias)

    # -- the watchdog thread -------------------------------------------------------------------

    def _watch(self) -> None:
        while True:
            with self.cond:
                if self._thread is None and not self._leases:
                    self._watchdog = None
                    return
                now = time.monotonic()
                if self._stuck_at is not None and now >= self._stuck_at:
                    self._retire(now)
                live = [lease for lease in self._leases.values() if not lease.lost.is_set()]
                expired = [lease for lease in live if lease._deadline <= now]
                if not expired:
                    # Woken by every change: a lease registered or stopped, a tick's new
                    # deadlines, the renewal thread's end.
                    moments = [lease._deadline for lease in live]
                    if self._stuck_at is not None:
                        moments.append(self._stuck_at)
                    soonest = min(moments, default=None)
                    wait = None if soonest is None else max(soonest - now, 0.001)
                    self._watchdog_wakes = math.inf if wait is None else now + wait
                    self.cond.wait(wait)
                    self._watchdog_wakes = -math.inf
                    continue
            lost = [x for x in expired if x._report("no renewal succeeded within its TTL")]
            _tell_later(lost, self.alias)

    def _retire(self, now: float) -> None:
        """The renewal thread's tick has hung past its bound (a connection attempt to a
        silent peer, which no statement timeout reaches): leave it to end on its own and
        start a new renewal thread (a new connection) for the other leases and the new ones.
        The stuck tick's leases are not renewed meanwhile (their deadlines rule). Under
        ``cond``."""
        stuck = self._thread
        logger.warning(
            "The lease renewal thread of %r has been stuck in a tick for over %g s: a new "
            "one takes over",
            self.alias,
            round(now - self._stuck_at + STUCK_GRACE, 1) if self._stuck_at else 0,
        )
        self._thread = None
        self._stuck_at = None
        if stuck is not None:
            stuck.name = f"{stuck.name} (retired)"
        if self._leases:
            self._start_threads()


def _names(leases: Sequence[Renewed], shown: int = 3) -> str:
    """``'a', 'b', 'c' and 7 more`` for a log line."""
    names = ", ".join(repr(lease.name) for lease in leases[:shown])
    return names if len(leases) <= shown else f"{names} and {len(leases) - shown} more"


def _tell_later(lost: list[Renewed], alias: str) -> None:
    """Call the ``on_lost`` of ``lost`` leases on a thread of their own (none if empty)."""
    if not lost:
        return

    def tell() -> None:
        for lease in lost:
            lease._tell()

    teller = threading.Thread(target=tell, name=f"lease-lost:{alias}", daemon=True)
    for lease in lost:
        lease._teller = teller
    teller.start()


_renewers_lock = threading.Lock()
_renewers: dict[str, Renewer] = {}
_renewers_pid = os.getpid()


def renewer(alias: str) -> Renewer:
    """The process's :class:`Renewer` of database ``alias`` (a new one after a fork: threads
    do not survive it)."""
    global _renewers_pid
    with _renewers_lock:
        if _renewers_pid != os.getpid():
            _renewers.clear()
            _renewers_pid = os.getpid()
        found = _renewers.get(alias)
        if found is None:
            found = _renewers[alias] = Renewer(alias)
        return found


def renewers() -> list[Renewer]:
    """This process's renewers, one per alias that has had a lease renewed."""
    with _renewers_lock:
        return list(_renewers.values()) if _renewers_pid == os.getpid() else []


def _after_fork_in_child() -> None:
    """In a forked child: the parent's renewers are not the child's (their threads did not
    survive the fork), nor is their lock, which another thread may have held at the fork.
    Their connections are the parent's sessions: the child's copies are pointed at nothing
    (:func:`db.disown_after_fork`), so that no close of a copy, when the child collects it,
    ends the parent's session (mysqlclient and psycopg2 would send it a goodbye)."""
    global _renewers_lock, _renewers_pid
    for inherited in _renewers.values():
        if inherited._connection is not None:
            db.disown_after_fork(inherited._connection)
    _renewers_lock = threading.Lock()
    _renewers.clear()
    _renewers_pid = os.getpid()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_after_fork_in_child)

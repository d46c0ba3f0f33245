"""``hold_lease`` and ``ahold_lease``: run a body while holding a lease, renewed every TTL/3.

Follows the reference ``holdLease`` (rules L9–L15) plus DESIGN §4's L16–L18::

    from django_leases import hold_lease, LeaseLostError

    with hold_lease("nightly-report", ttl=60) as held:
        for chunk in work():
            held.check()                  # raises LeaseLostError once the lease is gone
            write(chunk, token=held.token)

    @hold_lease("rebuild-index", ttl=30)  # each call holds the lease afresh
    def rebuild() -> None: ...

    with hold_lease("migrate", wait=120):  # wait up to 2 minutes for another holder
        ...

Every holder in the package — ``hold_lease``, ``ahold_lease``, the ``hold_lease`` command
(:mod:`django_leases.holder`), the workflow engine's run lease and the trigger-source
lifecycle — follows one protocol, :class:`HeldLease`: acquire (or adopt a lease granted by a
larger statement), renew every TTL/3, vouch with a final check, release unless it lapsed. The
renewals of every hold of a process on one database alias are made by that alias's one
:class:`~django_leases.renewal.Renewer`: one thread, one connection and one statement per
tick for all the leases due (``Lease.objects.refresh_many``), the workflow engine's run
leases too.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import secrets
import socket
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ContextDecorator, suppress
from datetime import timedelta
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import DatabaseError, InterfaceError, OperationalError, connections, router

from django_leases import db
from django_leases.conf import leases_settings
from django_leases.exceptions import LeaseLostError, LeaseTakenError, MisuseError
from django_leases.renewal import Renewed, Unknown, renewal_interval, renewer
from django_leases.signals import lease_lost
from django_leases.validation import (
    MAX_KEY_LENGTH,
    check_lease_name,
    check_name,
    renewable_ttl_seconds,
    seconds,
)

if TYPE_CHECKING:
    from django_leases.models.lease import Lease, LeaseQuerySet

logger = logging.getLogger("django_leases.leases")

_F = TypeVar("_F", bound=Callable[..., Any])
_R = TypeVar("_R")

#: First pause between two tries for a taken lease, seconds (doubled up to the longest).
WAIT_FIRST_PAUSE = 0.02
#: Longest pause between two tries for a taken lease, seconds (also at most a renewal
#: interval of the lease asked for).
WAIT_MAX_PAUSE = 1.0

#: Shortest time the final check of a hold may take before its connection is cut, seconds
#: (it may otherwise take until the lease's local deadline).
FINAL_CHECK_MIN = 1.0
#: Longest time a release may take before its connection is cut (at most the TTL), seconds.
RELEASE_TIMEOUT = 10.0

#: Clean-up tasks that must outlive the task that started them (asyncio keeps only weak
#: references to tasks).
_background: set[asyncio.Future[Any]] = set()


def _keep(future: asyncio.Future[Any]) -> asyncio.Future[Any]:
    _background.add(future)
    future.add_done_callback(_background.discard)
    return future


def refresh_leases(
    alias: str, items: Sequence[tuple[Lease, float]]
) -> list[Lease | Unknown | None]:
    """The :class:`~django_leases.renewal.BatchRefresh` of holds: ``Lease.objects.refresh_many``
    on ``alias`` for ``(lease, ttl seconds)`` pairs; one refreshed lease, ``None`` (not held)
    or :data:`~django_leases.renewal.UNKNOWN` (its row locked elsewhere) each."""
    # deferred: the lazy public API may be imported before the app registry is ready
    from django_leases.models.lease import Lease

    queryset: LeaseQuerySet = Lease.objects.db_manager(alias)  # type: ignore[assignment]
    return queryset.refresh_many(items)


def new_holder() -> str:
    """A fresh, unique holder name: ``host:pid:random``."""
    return f"{socket.gethostname()[:180]}:{os.getpid()}:{secrets.token_hex(8)}"


#: Characters :func:`holder_for` adds to a given holder name (``":"`` and 16 hex digits).
HOLDER_SUFFIX_LENGTH = 17

#: Longest holder name ``hold_lease`` / ``ahold_lease`` accept, in characters: the column
#: width (255) less :data:`HOLDER_SUFFIX_LENGTH`.
MAX_HOLDER_NAME_LENGTH = MAX_KEY_LENGTH - HOLDER_SUFFIX_LENGTH


def check_holder_name(holder: object) -> str:
    """``holder`` if it is a usable holder name for a hold (a ``str`` of 1 to
    :data:`MAX_HOLDER_NAME_LENGTH` characters, storable); else ``ValueError`` naming it."""
    return check_name(holder, "Lease holder", max_length=MAX_HOLDER_NAME_LENGTH)


def holder_for(name: str | None) -> str:
    """The holder identity of one hold (``str``): ``name:random`` (16 hex digits) for a given
    ``name``, a fresh :func:`new_holder` for ``None``.

    Every hold gets an identity of its own, so two holds given the same name (two cron boxes
    configured ``holder="cron"``) never both hold the key: ``Lease.objects.acquire`` lets the
    live holder re-acquire, and a shared identity would let the second hold in.
    """
    if name is None:
        return new_holder()
    return f"{name}:{secrets.token_hex(8)}"


def _wait_seconds(wait: object) -> float | None:
    """``wait`` (``None``: do not wait; seconds ≥ 0, ``math.inf`` for ever) checked."""
    if wait is None:
        return None
    if isinstance(wait, float) and wait == float("inf"):
        return wait
    return seconds(wait, "wait")


class Backoff:
    """The pauses between tries of a wait for a taken lease: 20 ms doubling up to
    ``min(1 s, TTL/3)``, within ``wait`` seconds (``math.inf``: for ever; ``None``: no wait,
    so no pause at all)."""

    def __init__(self, wait: float | None, ttl: float) -> None:
        limit = _wait_seconds(wait)
        #: Whether there is a wait (``wait`` was not ``None``).
        self.waits = limit is not None
        self._give_up = None if limit is None else time.monotonic() + limit
        self._pause = WAIT_FIRST_PAUSE
        self._longest = min(WAIT_MAX_PAUSE, renewal_interval(ttl))

    def next_pause(self) -> float | None:
        """Seconds to pause before the next try, or ``None``: the wait is over."""
        left = 0.0 if self._give_up is None else self._give_up - time.monotonic()
        if left <= 0:
            return None
        pause = min(self._pause, left)
        self._pause = min(self._pause * 2, self._longest)
        return pause


class _Lost(threading.Event):
    """``held.lost``: set when the lease is seen lost (a renewal, the watchdog, a check).
    Reading it — :meth:`is_set`, :meth:`wait` — first notices a local deadline that passed
    with no renewal vouching for the lease (:meth:`HeldLease._notice_lapse`), as
    :meth:`HeldLease.check` does: a body polling ``held.lost`` after its process was paused
    past the TTL (SIGSTOP, a long GC, a suspended VM) learns at once that it lost the lease,
    before the watchdog thread has run."""

    def __init__(self, held: HeldLease) -> None:
        super().__init__()
        self._held = held

    def is_set(self) -> bool:
        """Whether the lease is lost (a lapse noticed first)."""
        self._held._notice_lapse()
        return super().is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the lease is lost, at most ``timeout`` seconds; whether it is."""
        self._held._notice_lapse()
        return super().wait(timeout)


class HeldLease:
    """One hold of a lease: what a ``hold_lease`` body gets, and the protocol every holder
    follows (acquire or adopt → renew every TTL/3 → final check → release).

    Args:
        key: the lease key (``str``, 1–255 characters).
        ttl: the lease's TTL in seconds (``float``, already checked by the caller).
        holder: the holder identity, used as given (default: a fresh ``host:pid:random``).
            It must be unique to this hold: ``Lease.objects.acquire`` lets the live holder
            re-acquire. ``hold_lease`` passes :func:`holder_for` of the caller's name.
        using: the database alias (default: the router's choice for ``Lease``).
        on_lost: called once, on a background thread, when the lease is seen lost (before
            the ``lease_lost`` signal is sent).
        release_vouches: vouch and release in one statement at the end (the workflow
            engine's run leases), instead of a final check followed by a release.

    The lease is renewed by the alias's :class:`~django_leases.renewal.Renewer`, with every
    other lease the process holds there.

    Attributes:
        key: the lease key; ``holder``: the holder name; ``ttl``: seconds.
        lease: the latest :class:`~django_leases.models.Lease` row (updated by each
            renewal).
        lost: a :class:`threading.Event`, set as soon as the lease is seen lost.
    """

    def __init__(
        self,
        key: str,
        ttl: float,
        *,
        holder: str | None = None,
        using: str | None = None,
        on_lost: Callable[[], None] | None = None,
        release_vouches: bool = False,
    ) -> None:
        self.key = key
        self.ttl = ttl
        self.holder = holder or new_holder()
        self.using = using
        self._lease: Lease | None = None
        #: Set once the lease is lost (see :class:`_Lost`: reading it notices a lapse).
        self.lost: threading.Event = _Lost(self)
        self._on_lost = on_lost
        self._release_vouches = release_vouches
        self._renewal: Renewed | None = None
        self._released_live: bool | None = None
        self._unresponsive = False
        #: The process holding it: a child forked inside the hold holds nothing.
        self._pid = os.getpid()
        #: ``None`` until :meth:`finish` ran; then whether the lease was given back.
        self.released: bool | None = None

    # -- what a body uses -----------------------------------------------------------------------

    @property
    def lease(self) -> Lease:
        """The latest :class:`~django_leases.models.Lease` row (each renewal updates it).
        Raises ``MisuseError`` before the lease is acquired."""
        if self._lease is None:
            raise MisuseError(f"Lease {self.key!r} is not held yet")
        return self._lease

    @property
    def acquired(self) -> bool:
        """Whether the lease was acquired (or adopted)."""
        return self._lease is not None

    @property
    def token(self) -> int:
        """The fencing token (``int``) of the held lease; pass it along with your writes."""
        return self.lease.token

    def check(self) -> None:
        """Raise :class:`LeaseLostError` if the lease is lost; else return ``None``.

        Lost: seen lost by a renewal or the watchdog, or its local deadline (:attr:`deadline`)
        passed with no renewal vouching for it since. A holder paused past its TTL (SIGSTOP,
        a long GC, a suspended VM) thus learns it at its first check after resuming, whichever
        of its threads runs first; the loss is then recorded as the watchdog would
        (:attr:`lost`, ``on_lost``, the ``lease_lost`` signal)."""
        if self.lost.is_set():  # which notices a lapse (_Lost)
            raise LeaseLostError(self.key)

    def _notice_lapse(self) -> None:
        """Count the lease lost if its local deadline passed with no renewal vouching for it
        while it is held here (not yet finished, not in a forked child, which only reads
        what its parent saw): what :meth:`check` and reading :attr:`lost` do first."""
        if (
            not threading.Event.is_set(self.lost)
            and self.released is None
            and os.getpid() == self._pid
            and self._lapsed()
        ):
            self.mark_lost("its local deadline passed with no renewal vouching for it")

    @property
    def deadline(self) -> float:
        """The local deadline (``time.monotonic()``) the lease is vouched for until."""
        if self._renewal is None:
            raise MisuseError(f"Lease {self.key!r} is not held yet")
        return self._renewal.deadline

    # -- the protocol ---------------------------------------------------------------------------

    def _objects(self) -> LeaseQuerySet:
        # deferred: the lazy public API may be imported before the app registry is ready
        from django_leases.models.lease import Lease

        # A manager with the QuerySet's methods (the stubs' plugin makes its class, unnamed here).
        return Lease.objects.db_manager(self.alias)  # type: ignore[return-value]

    @property
    def alias(self) -> str:
        """The database alias the lease lives on."""
        # deferred: the lazy public API may be imported before the app registry is ready
        from django_leases.models.lease import Lease

        return self.using or router.db_for_write(Lease)

    def acquire(
        self,
        *,
        wait: float | None = None,
        stop: Callable[[], bool] | None = None,
        observe: Callable[[str, BaseException | None], None] | None = None,
        renew: bool = True,
    ) -> HeldLease:
        """Acquire the lease and start renewing it (unless ``renew`` is false: then call
        :meth:`start_renewing`); returns ``self``.

        ``wait`` (seconds, ``math.inf`` for ever; ``None``, the default, does not wait): while
        another holder has the key live, try again with a back-off of 20 ms doubling up to
        ``min(1 s, TTL/3)``; a database error while waiting is logged and tried again too.
        ``stop()``, asked after each refusal and again after each back-off pause (just
        before the next try), ends the wait early. ``observe(event, error)`` is told
        ``"taken"`` on each refusal and ``"unreachable"`` (with the error) on each
        database error while waiting.

        Raises:
            LeaseTakenError: another holder has the key (after ``wait`` seconds, or when
                ``stop()`` turned true).
            MisuseError: inside ``transaction.atomic()`` on the lease database (the grant
                would be invisible to others until that transaction commits).
            DatabaseError: without ``wait``, as the acquire statement raised it.
        """
        backoff = Backoff(wait, self.ttl)
        while True:
            if self.try_acquire(waiting=backoff.waits, observe=observe, renew=renew):
                return self
            pause = backoff.next_pause()
            if pause is None or (stop is not None and stop()):
                raise LeaseTakenError(self.key)
            time.sleep(pause)
            if stop is not None and stop():
                # Stopped during the pause (a cancelled waiter): do not try once more, or a
                # key given up meanwhile would be taken for a caller that has gone.
                raise LeaseTakenError(self.key)

    def try_acquire(
        self,
        *,
        waiting: bool = False,
        observe: Callable[[str, BaseException | None], None] | None = None,
        renew: bool = True,
    ) -> bool:
        """One try of :meth:`acquire`: whether the lease was granted (then it is held, and
        renewed unless ``renew`` is false). ``waiting``: a database error is logged, told to
        ``observe`` and answered ``False`` (the caller tries again), not raised.

        Raises:
            MisuseError: as :meth:`acquire`.
            DatabaseError: not ``waiting``, as the acquire statement raised it.
        """
        alias = self.alias
        if not db.outside_transactions(connections[alias]):
            # The grant would stay invisible to everyone else until the outer transaction
            # commits, and the renewal thread (its own connection) would wait on the row lock.
            raise MisuseError(
                f"hold_lease({self.key!r}) cannot run inside transaction.atomic() (or with "
                f"autocommit off) on database {alias!r}: a lease must be committed to "
                "protect anything. "
                "Take the lease outside the transaction (in tests, use TransactionTestCase "
                "or django_db(transaction=True))."
            )
        sent = time.monotonic()
        try:
            lease = self._objects().acquire(self.key, self.holder, self.ttl)
        except db.DATABASE_FAULTS as exc:  # psycopg2: a closed connection's InterfaceError
            if not waiting:
                raise
            logger.warning("Could not reach the database to acquire %r: %s", self.key, exc)
            if observe is not None:
                observe("unreachable", exc)
            db.close_thread_connections()
            return False
        if lease is None:
            if observe is not None:
                observe("taken", None)
            return False
        self.adopt(lease, sent, renew=renew)
        return True

    def adopt(self, lease: Lease, sent: float, *, renew: bool = True) -> HeldLease:
        """Hold ``lease``, granted to this key and holder by a statement that may have done more
        than acquire it (``sent``: ``time.monotonic()`` just before that statement was sent,
        where the local deadline starts); renew it from here on. Returns ``self``."""
        self._lease = lease
        self._renewal = renewer(self.alias).lease(
            self.key,
            self.ttl,
            item=lease,
            refresh=refresh_leases,
            held_since=sent,
            on_lost=self._lost,
            on_renewed=self._renewed,
            lost=self.lost,
        )
        if renew:
            self._renewal.start()
        return self

    def _renewed(self, lease: Lease) -> None:
        self._lease = lease

    def start_renewing(self) -> None:
        """Start the renewals of a lease acquired with ``renew=False`` (a holder that must start
        a child process before any thread exists)."""
        if self._renewal is None:
            raise MisuseError(f"Lease {self.key!r} is not held yet")
        self._renewal.start()

    def released_elsewhere(self, live: bool) -> None:
        """The lease was released by a statement that did more than release it, and was
        ``live`` up to that moment: :meth:`finish` only stops renewing, and vouches from
        ``live`` instead of a final check."""
        self._released_live = live

    def mark_lost(self, reason: str) -> None:
        """Count the lease lost (once): set :attr:`lost`, tell ``on_lost``, log ``reason``."""
        if self._renewal is not None:
            self._renewal.mark_lost(reason)
        else:
            self.lost.set()

    def _renew(self) -> bool:
        with db.bounded(connections[self.alias], self.ttl, f"renewal of {self.key!r}"):
            refreshed = self._objects().refresh(self.lease, self.ttl)
        if refreshed is None:
            return False
        self._lease = refreshed
        return True

    def _lost(self) -> None:
        # deferred: the lazy public API may be imported before the app registry is ready
        from django_leases.models.lease import Lease

        # Tell the body first: a failing signal receiver must not keep it from being told.
        if self._on_lost is not None:
            self._on_lost()
        lease_lost.send_robust(sender=Lease, key=self.key, lease=self._lease)

    def finish(self, *, vouch: bool) -> None:
        """Stop renewing; with ``vouch``, check once more that the lease is still held and
        raise :class:`LeaseLostError` if that cannot be confirmed; release (a release that
        fails is logged, never raised: the lease then lapses after its TTL). A lease whose
        local deadline has passed and that was seen lost is not released: it has lapsed, and
        the database, which most likely stopped answering, is not asked (a holder of a lost
        lease exits at once).
        None of it waits on a database that stopped answering for longer than the local
        deadline and :data:`RELEASE_TIMEOUT`: its connection is cut (``db.bounded``)."""
        if self.released is not None or self._renewal is None:
            return
        if os.getpid() != self._pid:
            # A child forked inside the hold, leaving the block: the lease is its parent's,
            # who renews it and gives it back; the child neither stops that nor releases it.
            self.released = False
            return
        self.released = False
        released = self._released_live is not None
        try:
            self._renewal.stop()
            if released and vouch:
                if not self._released_live:
                    self.mark_lost("it had lapsed when it was released")
                    raise LeaseLostError(self.key)
            elif vouch:
                # The last renewal can be a third of a TTL old: check once more before vouching.
                held, released = self._final_check()
                if not held:
                    self.mark_lost("the final check could not vouch for it")
                    raise LeaseLostError(self.key)
        finally:
            if released:
                self.released = True
            elif self.lost.is_set() and self._lapsed():
                # Nothing to give back, and no wait on a database that may have stopped
                # answering (which is how most leases get here). A final check that renewed
                # the lease, however late its answer came, left it live: that one is released.
                self.released = False
            else:
                self.released = self._release()

    def _lapsed(self) -> bool:
        """Whether the local deadline has passed: no renewal vouched for the lease within its
        TTL, so it has lapsed on the database clock too (its expiry there is at most the
        statement's latency later). Read without the renewer's lock (a float, written whole):
        ``check()`` calls it on every call, also in a child forked while another thread held
        that lock."""
        return self._renewal is not None and time.monotonic() >= self._renewal._deadline

    def _final_check(self) -> tuple[bool, bool]:
        """Whether the lease was still held, and whether that check also released it. A
        check that failed on its connection (the server closed the caller's idle
        connection, or killed it) before the local deadline is made once more on a fresh
        one, as the release is: a dead connection is not a lost lease."""
        if self.lost.is_set():
            return False, False
        for tries_left in (1, 0):
            # No later than the local deadline (a second at least): past it a database that
            # stopped answering has its connection cut, and cannot vouch.
            limit = max(FINAL_CHECK_MIN, self.deadline - time.monotonic())
            with db.bounded(connections[self.alias], limit, f"lease {self.key!r}") as bound:
                try:
                    if self._release_vouches:  # the check and the release in one statement
                        held = self._release_held()
                        if held is not None:
                            return held, True
                    return self._renew(), False
                except (OperationalError, InterfaceError) as exc:
                    if not tries_left or bound.cut or self._lapsed():
                        logger.warning("Final check of lease %r failed", self.key, exc_info=True)
                        self._unresponsive = bound.cut
                        return False, False
                    logger.info(
                        "Final check of lease %r failed on its connection (%s); trying again "
                        "on a fresh one",
                        self.key,
                        exc,
                    )
                except Exception:
                    logger.warning("Final check of lease %r failed", self.key, exc_info=True)
                    self._unresponsive = bound.cut
                    return False, False
            # Closed once the bound is disarmed: its timer never shuts a socket reused since.
            connections[self.alias].close()
        return False, False  # pragma: no cover - the loop always returns

    def _release_held(self) -> bool | None:
        return self._objects().release_held(self.lease)

    def _release(self) -> bool:
        """Release; ``False`` when that failed (logged: the lease then lapses after its TTL).
        A release whose connection failed is tried once more on a fresh connection: a killed
        connection must not cost the key its TTL."""
        limit = max(FINAL_CHECK_MIN, min(self.ttl, RELEASE_TIMEOUT))
        # A database that did not answer the final check gets one try, which fails at once
        # on the cut connection: a new connection to it could wait for minutes.
        for tries_left in (0,) if self._unresponsive else (1, 0):
            bound: db.Bound | None = None
            try:
                with db.bounded(
                    connections[self.alias], limit, f"release of {self.key!r}"
                ) as bound:
                    self._objects().release(self.lease)
                return True
            # psycopg2 answers a statement on a connection it already saw die (the final
            # check's) with InterfaceError, which is not a DatabaseError; psycopg 3 with an
            # OperationalError. Either way: a fresh connection, once.
            except (DatabaseError, InterfaceError) as exc:
                if not tries_left or (bound is not None and bound.cut):
                    logger.warning("Releasing lease %r failed: %s", self.key, exc)
                    return False
                logger.info("Releasing lease %r failed (%s); trying again", self.key, exc)
                connections[self.alias].close()
            except Exception:
                logger.warning("Releasing lease %r failed", self.key, exc_info=True)
                return False
        return False  # pragma: no cover - the loop always returns


#: The handle's former name.
LeaseHandle = HeldLease


class _Entry:
    """One try of an ``ahold_lease`` acquisition, which can be abandoned while in flight.

    :meth:`run` tries once on a worker thread; :meth:`abandon` (called on the event loop when
    the task is cancelled) makes sure whatever it acquired is given back, by ``run`` itself
    if it has not finished yet, else by a short-lived thread. No event-loop task is involved,
    so this holds even if the loop shuts down first.
    """

    def __init__(self, held: HeldLease, waiting: bool) -> None:
        self.held = held
        self.waiting = waiting
        self._lock = threading.Lock()
        self._granted = False
        self._abandoned = False

    def run(self) -> bool:
        granted = self.held.try_acquire(waiting=self.waiting)
        with self._lock:
            self._granted = granted
            abandoned = self._abandoned
        if abandoned and granted:
            _give_back(self.held, "a cancelled acquire")
        return granted

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            granted = self._granted
        if granted:
            _give_back_on_a_thread(self.held, "a cancelled acquire")


def _give_back(held: HeldLease, after: str, *, close: bool = False) -> None:
    """Stop renewing ``held`` and release it, on this thread; a failure is logged (the lease
    then lapses after its TTL). ``after``: what left it without its holder, for the log."""
    try:
        held.finish(vouch=False)
    except Exception:
        logger.warning("Giving back lease %r after %s failed", held.key, after, exc_info=True)
    finally:
        if close:
            connections.close_all()


def _give_back_on_a_thread(held: HeldLease, after: str) -> None:
    """:func:`_give_back` on a short-lived thread of its own, which closes its connections:
    for a holder that can neither wait for the release nor run it on an event loop."""
    threading.Thread(
        target=_give_back, args=(held, after), kwargs={"close": True}, daemon=True
    ).start()


def _can_await_closing(frame: FrameType | None) -> bool:
    """Whether the body running ``async with`` in ``frame``, being closed (GeneratorExit),
    may still await: an async generator closed by ``aclose()`` on a running loop may; a
    coroutine closed by ``close()`` (or collected) may not, whatever loop runs on the thread
    — awaiting there makes Python raise "coroutine ignored GeneratorExit"."""
    if frame is None or not frame.f_code.co_flags & inspect.CO_ASYNC_GENERATOR:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _HoldArguments:
    """``hold_lease`` / ``ahold_lease``'s arguments, checked (``ValueError``) and kept."""

    def __init__(
        self,
        key: str,
        ttl: float | timedelta | None = None,
        *,
        holder: str | None = None,
        using: str | None = None,
        wait: float | None = None,
    ) -> None:
        self.key = check_lease_name(key, "key")
        self.ttl = renewable_ttl_seconds(leases_settings.DEFAULT_TTL if ttl is None else ttl)
        self.holder = None if holder is None else check_holder_name(holder)
        self.using = using
        self.wait = _wait_seconds(wait)
        self._held: HeldLease | None = None

    def _held_lease(self, on_lost: Callable[[], None] | None = None) -> HeldLease:
        # Each hold its own identity: two holds given one name must not both hold the key.
        return HeldLease(
            self.key, self.ttl, holder=holder_for(self.holder), using=self.using, on_lost=on_lost
        )


class hold_lease(_HoldArguments, ContextDecorator):
    """Hold ``key`` for the duration of a ``with`` block or a decorated call.

    Args:
        key: the lease key (``str``, 1–255 characters).
        ttl: how long a crashed holder keeps the key from everyone else: a ``timedelta`` or
            seconds (> 0). Defaults to ``DJANGO_LEASES["DEFAULT_TTL"]`` (30 s). The lease is
            renewed every ``ttl / 3``.
        holder: a name for the holder (``str``, 1–238 characters), e.g. ``"cron"``. Each hold
            stores it as ``<holder>:<16 hex digits>`` (``held.holder``), an identity of its
            own: two holds given the same name exclude each other like any two holders.
            Defaults to a fresh ``host:pid:random``.
        using: the database alias; defaults to the router's choice for ``Lease``.
        wait: seconds to wait for another holder to give the key up (``math.inf``: for
            ever); ``None``, the default, does not wait.

    ``with hold_lease(...) as held`` gives a :class:`HeldLease`.

    Raises:
        ValueError: bad key, holder (longer than 238 characters included), TTL or wait
            (nothing written).
        LeaseTakenError: another holder — another hold given the same name included — has
            the key live (at once, or after ``wait``).
        LeaseLostError: the lease was lost while the body ran, or the final check after a
            normally finished body could not confirm it was still held. The body is *not*
            interrupted (threads cannot be); poll ``held.check()`` or ``held.lost``.
        MisuseError: called inside ``transaction.atomic()`` on the lease database (the
            grant would be invisible to others until that transaction commits).

    An exception from the body propagates unchanged. The lease is always released.

    As a decorator it wraps plain functions only; decorating an ``async def`` raises
    ``TypeError`` (the lease would be released before the coroutine ran): use
    :class:`ahold_lease` there. So does a generator function (sync or async): calling it
    only makes the generator; hold the lease inside its body instead.
    """

    def _recreate_cm(self) -> hold_lease:
        # Each decorated call holds the lease afresh.
        return hold_lease(self.key, self.ttl, holder=self.holder, using=self.using, wait=self.wait)

    def __call__(self, func: _F) -> _F:
        if inspect.iscoroutinefunction(func):
            raise TypeError(
                f"hold_lease cannot decorate the coroutine function {func.__qualname__}: "
                "the lease would be released before it ran; use ahold_lease"
            )
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                f"hold_lease cannot decorate the generator function {func.__qualname__}: "
                "calling it only makes the generator, so the lease would be released before "
                "its body ran; hold the lease inside it (with hold_lease(...): ...)"
            )
        return super().__call__(func)

    def __enter__(self) -> HeldLease:
        if self._held is not None:
            raise MisuseError("hold_lease(...) is not reentrant; create a new one")
        held = self._held_lease()
        held.acquire(wait=self.wait)
        self._held = held
        return held

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        held, self._held = self._held, None
        assert held is not None
        held.finish(vouch=exc_type is None)


class ahold_lease(_HoldArguments):
    """The asyncio form of :class:`hold_lease`: ``async with ahold_lease(key, ttl) as held``.

    Same arguments, errors and handle. On loss the body's task is **cancelled** and the
    cancellation turns into :class:`LeaseLostError` at the ``async with`` (as
    ``asyncio.timeout`` turns its cancellation into ``TimeoutError``). Database calls run
    through ``sync_to_async``; renewals run on their own thread.

    Also a decorator for ``async def`` functions (each call holds the lease afresh);
    decorating a plain function raises ``TypeError``. A task cancelled while the lease is
    being acquired (or waited for) still gives the lease back once the acquisition has
    finished.
    """

    # The hold's task and loop, and where its exit stands (each ``async with`` sets them anew).
    # The task only weakly: the renewer keeps this object (its ``on_lost``), and a task kept
    # through it could never be collected, nor its coroutine closed (see ``_closed``).
    _task_ref: weakref.ref[asyncio.Task[object]] | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _cancelled = False
    _cancelling = 0
    _exiting = False
    #: Entered, from the start of the acquisition to the end of the exit.
    _busy = False

    def __call__(self, func: Callable[..., Awaitable[_R]]) -> Callable[..., Awaitable[_R]]:
        if inspect.isasyncgenfunction(func):
            raise TypeError(
                f"ahold_lease cannot decorate the async generator function {func.__qualname__}: "
                "calling it only makes the generator, so the lease would be released before "
                "its body ran; hold the lease inside it (async with ahold_lease(...): ...)"
            )
        if not inspect.iscoroutinefunction(func):
            raise TypeError(
                f"ahold_lease decorates coroutine functions; {func.__qualname__} is not one "
                "(use hold_lease)"
            )

        @functools.wraps(func)
        async def held_call(*args: Any, **kwargs: Any) -> _R:
            async with ahold_lease(
                self.key, self.ttl, holder=self.holder, using=self.using, wait=self.wait
            ):
                return await func(*args, **kwargs)

        return held_call

    def _task(self) -> asyncio.Task[object] | None:
        """The hold's task, while it exists."""
        return None if self._task_ref is None else self._task_ref()

    def _cancel_body(self) -> None:  # runs on the event loop
        task = self._task()
        if self._exiting or task is None or task.done():
            return
        self._cancelled = True
        task.cancel(msg=f"lease {self.key!r} lost")

    def _lost_from_thread(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # the task can never run again: there is no body left to stop
        with suppress(RuntimeError):  # the loop closed since
            loop.call_soon_threadsafe(self._cancel_body)

    async def __aenter__(self) -> HeldLease:
        if self._busy:  # entered already, or still acquiring for another task
            raise MisuseError("ahold_lease(...) is not reentrant; create a new one")
        self._busy = True
        try:
            held = await self._acquire()
        except BaseException:
            self._busy = False
            raise
        self._held = held
        return held

    async def _acquire(self) -> HeldLease:
        """Acquire, one try at a time on a worker thread; a wait's pauses are spent on the
        event loop, so the context's one sync thread (``thread_sensitive``) stays free for
        the others — the holder's own release among them."""
        task = asyncio.current_task()
        self._task_ref = None if task is None else weakref.ref(task)
        # The cancel requests pending on entry: only ours, beyond them, becomes the loss.
        self._cancelling = 0 if task is None else task.cancelling()
        self._loop = asyncio.get_running_loop()
        self._cancelled = self._exiting = False
        held = self._held_lease(on_lost=self._lost_from_thread)
        backoff = Backoff(self.wait, self.ttl)
        while True:
            entry = _Entry(held, backoff.waits)
            trying = _keep(asyncio.ensure_future(sync_to_async(entry.run)()))
            try:
                granted = await asyncio.shield(trying)
            except asyncio.CancelledError:
                # The try goes on in its thread; whatever it gets is given back (else its
                # renewal thread would keep the lease alive for a task that is gone).
                entry.abandon()
                raise
            if granted:
                return held
            pause = backoff.next_pause()
            if pause is None:
                raise LeaseTakenError(self.key)
            await asyncio.sleep(pause)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc_type is GeneratorExit and not _can_await_closing(sys._getframe(1)):
                self._closed()
                return
            await self._exit(exc_type, exc)
        finally:
            self._busy = False

    def _closed(self) -> None:
        """The body's coroutine is being closed (``close()``, or collected: after its loop
        closed, or on a thread where another loop runs). Nothing may be awaited here, so the
        lease is given back on a thread of its own rather than renewed for a holder that is
        gone. (An async generator closed by ``aclose()`` on its loop exits as any body does:
        its release is awaited.)"""
        held, self._held = self._held, None
        assert held is not None
        self._exiting = True
        _give_back_on_a_thread(held, "its holder's coroutine was closed")

    async def _exit(self, exc_type: type[BaseException] | None, exc: BaseException | None) -> None:
        self._exiting = True
        held, self._held = self._held, None
        assert held is not None
        ours = self._cancelled and exc_type is asyncio.CancelledError
        # Shielded: a cancellation cannot cut the final check and release short.
        finishing = _keep(asyncio.ensure_future(sync_to_async(held.finish)(vouch=exc_type is None)))
        while not finishing.done():
            try:
                await asyncio.shield(finishing)
            except asyncio.CancelledError:
                if not self._cancelled:
                    raise
                # Our cancellation arrived just after the body finished: still a loss.
                ours = True
            except Exception:
                break
        if self._cancelled:
            # Undo our own cancel() whatever the body did with it, as asyncio.timeout does;
            # and as it does, leave a cancellation from outside that came meanwhile (a
            # shutdown, a TaskGroup sibling's failure) to go on as one: the task stays
            # cancelled rather than told of the loss, which it might handle and go on from.
            task = self._task()
            assert task is not None  # the one running this
            if task.uncancel() > self._cancelling:
                if exc_type is asyncio.CancelledError:
                    return  # the body's CancelledError goes on
                raise asyncio.CancelledError
        if ours:
            raise LeaseLostError(self.key) from exc
        finishing.result()


__all__ = [
    "HOLDER_SUFFIX_LENGTH",
    "MAX_HOLDER_NAME_LENGTH",
    "HeldLease",
    "LeaseHandle",
    "ahold_lease",
    "check_holder_name",
    "hold_lease",
    "holder_for",
    "new_holder",
    "refresh_leases",
]

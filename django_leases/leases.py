"""``hold_lease`` and ``ahold_lease``: run a body while holding a lease, renewed every TTL/3.

Follows the reference ``holdLease`` (rules L9–L15) plus DESIGN §4's L16–L18::

    from django_leases import hold_lease, LeaseLostError

    with hold_lease("nightly-report", ttl=60) as held:
        for chunk in work():
            held.check()                  # raises LeaseLostError once the lease is gone
            write(chunk, token=held.token)

    @hold_lease("rebuild-index", ttl=30)  # each call holds the lease afresh
    def rebuild() -> None: ...
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import ContextDecorator
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async

from django_leases.conf import leases_settings
from django_leases.exceptions import LeaseLostError, LeaseTakenError
from django_leases.renewal import Renewal
from django_leases.signals import lease_lost
from django_leases.validation import check_name, renewable_ttl_seconds

if TYPE_CHECKING:
    from django_leases.models import Lease, LeaseQuerySet

logger = logging.getLogger("django_leases.leases")

_F = TypeVar("_F", bound=Callable[..., Any])
_R = TypeVar("_R")

#: Clean-up tasks that must outlive the task that started them (asyncio keeps only weak
#: references to tasks).
_background: set[asyncio.Future[Any]] = set()


def _keep(future: asyncio.Future[Any]) -> asyncio.Future[Any]:
    _background.add(future)
    future.add_done_callback(_background.discard)
    return future


def new_holder() -> str:
    """A fresh, unique holder name: ``host:pid:random``."""
    return f"{socket.gethostname()[:180]}:{os.getpid()}:{secrets.token_hex(8)}"


class LeaseHandle:
    """What the body of ``hold_lease`` gets.

    Attributes:
        key: the lease key (``str``).
        lease: the latest :class:`~django_leases.models.Lease` row (updated by each renewal).
        lost: a :class:`threading.Event`, set as soon as the lease is seen lost.
    """

    def __init__(self, lease: Lease, renewal: Renewal) -> None:
        self.key: str = lease.key
        self.lease = lease
        self._renewal = renewal

    @property
    def lost(self) -> threading.Event:
        return self._renewal.lost

    @property
    def token(self) -> int:
        """The fencing token (``int``) of the held lease; pass it along with your writes."""
        return self.lease.token

    def check(self) -> None:
        """Raise :class:`LeaseLostError` if the lease has been seen lost; else return ``None``."""
        if self.lost.is_set():
            raise LeaseLostError(self.key)


class _Holding:
    """One acquisition: acquire, renew in the background, final check, release."""

    def __init__(
        self,
        key: str,
        ttl: float,
        holder: str,
        using: str | None,
        on_lost: object = None,
        *,
        deferred_renewal: bool = False,
    ) -> None:
        self.key = key
        self.ttl = ttl
        self.holder = holder
        self.using = using
        self.handle: LeaseHandle | None = None
        self._on_lost = on_lost
        self._deferred_renewal = deferred_renewal
        self._released_live: bool | None = None

    def _objects(self) -> LeaseQuerySet:
        from django_leases.models import Lease

        manager = Lease.objects
        return manager.db_manager(self.using) if self.using else manager  # type: ignore[return-value]

    def enter(self) -> LeaseHandle:
        from django.db import connections, router

        from django_leases.models import Lease

        alias = self.using or router.db_for_write(Lease)
        if connections[alias].in_atomic_block:
            # The grant would stay invisible to everyone else until the outer transaction
            # commits, and the renewal thread (its own connection) would wait on the row lock.
            raise RuntimeError(
                f"hold_lease({self.key!r}) cannot run inside transaction.atomic() on "
                f"database {alias!r}: a lease must be committed to protect anything. "
                "Take the lease outside the transaction (in tests, use TransactionTestCase "
                "or django_db(transaction=True))."
            )
        sent = time.monotonic()
        lease = self._objects().acquire(self.key, self.holder, self.ttl)
        if lease is None:
            raise LeaseTakenError(self.key)
        return self.adopt(lease, sent)

    def adopt(self, lease: Lease, sent: float) -> LeaseHandle:
        """Hold ``lease``, granted to this holding's key and holder by a statement that did
        more than acquire it (``sent``: ``time.monotonic()`` just before that statement was
        sent): renew it from here on as :meth:`enter` would have."""
        renewal = Renewal(
            self.key,
            self.ttl,
            self._renew,
            held_since=sent,
            on_lost=self._lost,
            deferred=self._deferred_renewal,
        )
        self.handle = LeaseHandle(lease, renewal)
        renewal.start()
        return self.handle

    def released_elsewhere(self, live: bool) -> None:
        """The lease was released by a statement that did more than release it, and was
        ``live`` up to that moment: :meth:`exit` only stops renewing, and vouches from
        ``live`` instead of a final check."""
        self._released_live = live

    def _renew(self) -> bool:
        assert self.handle is not None
        refreshed = self._objects().refresh(self.handle.lease, self.ttl)
        if refreshed is None:
            return False
        self.handle.lease = refreshed
        return True

    def _lost(self) -> None:
        assert self.handle is not None
        from django_leases.models import Lease

        # Tell the body first: a failing signal receiver must not keep it from being told.
        if callable(self._on_lost):
            self._on_lost()
        lease_lost.send_robust(sender=Lease, key=self.key, lease=self.handle.lease)

    def exit(self, body_failed: bool) -> None:
        """Stop renewing; unless the body failed, vouch with one last refresh; always release."""
        handle = self.handle
        assert handle is not None
        released = self._released_live is not None
        try:
            handle._renewal.stop()
            if released and not body_failed:
                if not self._released_live:
                    handle._renewal.mark_lost("it had lapsed when it was released")
                    raise LeaseLostError(self.key)
            elif not body_failed:
                # The last renewal can be a third of a TTL old: check once more before vouching.
                try:
                    held: bool | None = None
                    if handle.lost.is_set():
                        held = False
                    elif self._deferred_renewal:
                        # The check and the release in one statement where the database can.
                        held = self._objects().release_held(handle.lease)
                        released = held is not None
                    if held is None:
                        held = self._renew()
                except Exception:
                    logger.warning("Final check of lease %r failed", self.key, exc_info=True)
                    held = False
                if not held:
                    handle._renewal.mark_lost("the final check could not vouch for it")
                    raise LeaseLostError(self.key)
        finally:
            if not released:
                try:
                    self._objects().release(handle.lease)
                except Exception:
                    logger.warning("Releasing lease %r failed", self.key, exc_info=True)


class _Entry:
    """An acquisition for ``ahold_lease`` that can be abandoned while it is in flight.

    :meth:`run` acquires on a worker thread; :meth:`abandon` (called on the event loop when
    the task is cancelled) makes sure whatever it acquired is given back, by ``run`` itself
    if it has not finished yet, else by a short-lived thread. No event-loop task is involved,
    so this holds even if the loop shuts down first.
    """

    def __init__(self, holding: _Holding) -> None:
        self.holding = holding
        self._lock = threading.Lock()
        self._entered = False
        self._abandoned = False

    def run(self) -> LeaseHandle:
        handle = self.holding.enter()
        with self._lock:
            self._entered = True
            abandoned = self._abandoned
        if abandoned:
            self._give_back()
        return handle

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            entered = self._entered
        if entered:
            threading.Thread(target=self._give_back, kwargs={"close": True}, daemon=True).start()

    def _give_back(self, close: bool = False) -> None:
        try:
            self.holding.exit(body_failed=True)
        except Exception:
            logger.warning(
                "Giving back lease %r after a cancelled acquire failed", self.holding.key
            )
        finally:
            if close:
                from django.db import connections

                connections.close_all()


class hold_lease(ContextDecorator):
    """Hold ``key`` for the duration of a ``with`` block or a decorated call.

    Args:
        key: the lease key (``str``, 1–255 characters).
        ttl: how long a crashed holder keeps the key from everyone else: a ``timedelta`` or
            seconds (> 0). Defaults to ``DJANGO_LEASES["DEFAULT_TTL"]`` (30 s). The lease is
            renewed every ``ttl / 3``.
        holder: the holder name; defaults to a fresh ``host:pid:random``.
        using: the database alias; defaults to the router's choice for ``Lease``.

    ``with hold_lease(...) as held`` gives a :class:`LeaseHandle`.

    Raises:
        ValueError: bad key, holder or TTL (nothing written).
        LeaseTakenError: another holder has the key live (raised at once; never waits).
        LeaseLostError: the lease was lost while the body ran, or the final check after a
            normally finished body could not confirm it was still held. The body is *not*
            interrupted (threads cannot be); poll ``held.check()`` or ``held.lost``.
        RuntimeError: called inside ``transaction.atomic()`` on the lease database (the
            grant would be invisible to others until that transaction commits).

    An exception from the body propagates unchanged. The lease is always released.

    As a decorator it wraps plain functions only; decorating an ``async def`` raises
    ``TypeError`` (the lease would be released before the coroutine ran): use
    :class:`ahold_lease` there.
    """

    def __init__(
        self,
        key: str,
        ttl: float | timedelta | None = None,
        *,
        holder: str | None = None,
        using: str | None = None,
    ) -> None:
        self.key = check_name(key, "key")
        self.ttl = renewable_ttl_seconds(leases_settings.DEFAULT_TTL if ttl is None else ttl)
        self.holder = None if holder is None else check_name(holder, "holder")
        self.using = using
        self._holding: _Holding | None = None

    #: Start the renewal threads only once a first renewal is due (see ``Renewal``).
    _deferred_renewal = False

    def _recreate_cm(self) -> hold_lease:
        # Each decorated call holds the lease afresh.
        return hold_lease(self.key, self.ttl, holder=self.holder, using=self.using)

    def __call__(self, func: _F) -> _F:
        if inspect.iscoroutinefunction(func):
            raise TypeError(
                f"hold_lease cannot decorate the coroutine function {func.__qualname__}: "
                "the lease would be released before it ran; use ahold_lease"
            )
        return super().__call__(func)

    def __enter__(self) -> LeaseHandle:
        if self._holding is not None:
            raise RuntimeError("hold_lease(...) is not reentrant; create a new one")
        self._holding = _Holding(
            self.key,
            self.ttl,
            self.holder or new_holder(),
            self.using,
            deferred_renewal=self._deferred_renewal,
        )
        try:
            return self._holding.enter()
        except BaseException:
            self._holding = None
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        holding, self._holding = self._holding, None
        assert holding is not None
        holding.exit(body_failed=exc_type is not None)


class _deferred_hold_lease(hold_lease):
    """:class:`hold_lease` whose renewal threads start only once a first renewal is due
    (``Renewal(deferred=True)``): for a hot path that holds many short leases, such as the
    workflow worker driving runs, where most holds end before their first renewal.

    ``adopt``: a lease on ``key`` already granted by a statement that did more than acquire
    it (the worker's pick of a run), with ``sent`` the ``time.monotonic()`` taken just before
    that statement; it is held from there instead of acquired. :meth:`released_elsewhere`
    tells the hold that a statement doing more than release it gave the lease back.
    """

    _deferred_renewal = True

    def __init__(
        self,
        key: str,
        ttl: float | timedelta | None = None,
        *,
        using: str | None = None,
        adopt: Lease | None = None,
        sent: float = 0.0,
    ) -> None:
        super().__init__(key, ttl, holder=None if adopt is None else adopt.holder, using=using)
        self._adopt = adopt
        self._sent = sent

    def __enter__(self) -> LeaseHandle:
        if self._adopt is None:
            return super().__enter__()
        assert self.holder is not None
        self._holding = _Holding(self.key, self.ttl, self.holder, self.using, deferred_renewal=True)
        return self._holding.adopt(self._adopt, self._sent)

    def released_elsewhere(self, live: bool) -> None:
        """See :meth:`_Holding.released_elsewhere`."""
        assert self._holding is not None
        self._holding.released_elsewhere(live)


class ahold_lease:
    """The asyncio form of :class:`hold_lease`: ``async with ahold_lease(key, ttl) as held``.

    Same arguments, errors and handle. On loss the body's task is **cancelled** and the
    cancellation turns into :class:`LeaseLostError` at the ``async with`` (as
    ``asyncio.timeout`` turns its cancellation into ``TimeoutError``). Database calls run
    through ``sync_to_async``; renewals run on their own thread.

    Also a decorator for ``async def`` functions (each call holds the lease afresh);
    decorating a plain function raises ``TypeError``. A task cancelled while the lease is
    being acquired still gives the lease back once the acquisition has finished.
    """

    def __init__(
        self,
        key: str,
        ttl: float | timedelta | None = None,
        *,
        holder: str | None = None,
        using: str | None = None,
    ) -> None:
        self.key = check_name(key, "key")
        self.ttl = renewable_ttl_seconds(leases_settings.DEFAULT_TTL if ttl is None else ttl)
        self.holder = None if holder is None else check_name(holder, "holder")
        self.using = using
        self._holding: _Holding | None = None
        self._task: asyncio.Task[object] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cancelled = False
        self._exiting = False

    def __call__(self, func: Callable[..., Awaitable[_R]]) -> Callable[..., Awaitable[_R]]:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(
                f"ahold_lease decorates coroutine functions; {func.__qualname__} is not one "
                "(use hold_lease)"
            )

        @functools.wraps(func)
        async def held_call(*args: Any, **kwargs: Any) -> _R:
            async with ahold_lease(self.key, self.ttl, holder=self.holder, using=self.using):
                return await func(*args, **kwargs)

        return held_call

    def _cancel_body(self) -> None:  # runs on the event loop
        if self._exiting or self._task is None or self._task.done():
            return
        self._cancelled = True
        self._task.cancel(msg=f"lease {self.key!r} lost")

    def _lost_from_thread(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._cancel_body)

    async def __aenter__(self) -> LeaseHandle:
        if self._holding is not None:
            raise RuntimeError("ahold_lease(...) is not reentrant; create a new one")
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._cancelled = self._exiting = False
        holding = _Holding(
            self.key,
            self.ttl,
            self.holder or new_holder(),
            self.using,
            on_lost=self._lost_from_thread,
        )
        entry = _Entry(holding)
        entering = _keep(asyncio.ensure_future(sync_to_async(entry.run)()))
        try:
            handle = await asyncio.shield(entering)
        except asyncio.CancelledError:
            # The acquisition goes on in its thread; whatever it gets is given back (else
            # its renewal thread would keep the lease alive for a task that is gone).
            entry.abandon()
            raise
        self._holding = holding
        return handle

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exiting = True
        holding, self._holding = self._holding, None
        assert holding is not None
        ours = self._cancelled and exc_type is asyncio.CancelledError
        # Shielded: a cancellation cannot cut the final check and release short.
        finishing = _keep(
            asyncio.ensure_future(sync_to_async(holding.exit)(body_failed=exc_type is not None))
        )
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
            # Undo our own cancel() whatever the body did with it, as asyncio.timeout does.
            assert self._task is not None
            self._task.uncancel()
        if ours:
            raise LeaseLostError(self.key) from exc
        finishing.result()

"""A conformance suite for leases: rules L1–L18, runnable against your own database.

L1–L8 pin ``Lease.objects`` (acquire / refresh / release / current; the ``test_l0*_async_*``
tests pin the same rules on their coroutine forms ``aacquire`` / ``arefresh`` / ``arelease``
/ ``acurrent``), L9–L15 pin
``hold_lease`` / ``ahold_lease``, and L16–L18 pin how they behave while the database is
unreachable. Each test's docstring names its rule.

Use it by mixing :class:`LeaseConformanceTests` into a ``TransactionTestCase`` (real commits
are needed: several rules are checked with threads that use their own connections)::

    # yourproject/tests/test_lease_conformance.py
    from django.test import TransactionTestCase

    from django_leases.testing import LeaseConformanceTests


    class LeaseConformance(LeaseConformanceTests, TransactionTestCase):
        # The alias your database router sends ``Lease`` to (``"default"`` by default).
        lease_database = "default"
        databases = {"default"}

It runs under ``manage.py test`` and under pytest-django alike, on PostgreSQL and on a
file-backed SQLite database (WAL, ``"transaction_mode": "IMMEDIATE"``; not ``:memory:``,
which threads cannot share). The tokens it pins (a new key's first grant is 1) are those of a
database that never failed over: on a PostgreSQL server promoted from a standby (a timeline
above 1) every token carries the timeline's epoch, and a new key starts at
``(timeline - 1) × 10**12 + 1`` (``docs/operations/replication.md``). It takes about a
minute: leases that must lapse get a TTL of ``short_ttl`` (1 s) and the tests wait two to
three times that; nothing is timed.

**Simulated outages (L16–L18).** :class:`SimulatedOutage` replaces
``LeaseQuerySet.refresh`` and ``LeaseQuerySet.refresh_many`` — the renew paths of the
process's renewer and of the final check of ``hold_lease`` — for the length of a ``with``
block. While the outage is on, each refresh (a renewer's tick: one statement for all its
leases) fails with ``django.db.OperationalError`` before anything reaches the database,
exactly as a dropped connection would; in ``"hang"`` mode it first blocks, as a call to a
silent TCP peer does, until the outage ends. ``acquire`` and ``release`` are left alone so a
test can still set up and tear down its leases.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar
from unittest import mock

from asgiref.sync import async_to_sync, sync_to_async
from django.db import DEFAULT_DB_ALIAS, OperationalError, connections

from django_leases.exceptions import LeaseLostError, LeaseTakenError
from django_leases.leases import ahold_lease, hold_lease
from django_leases.models import Lease, LeaseQuerySet
from django_leases.renewal import Unknown
from django_leases.testing.base import ConformanceSuite

if TYPE_CHECKING:
    from datetime import timedelta

    from django_leases.models import Lease, LeaseQuerySet


class SimulatedOutage:
    """Makes ``Lease.objects.refresh`` (and ``refresh_many``) fail as if the database were
    unreachable.

    Args:
        mode: ``"raise"`` — a failing refresh raises ``django.db.OperationalError`` at once;
            ``"hang"`` — it blocks until :meth:`end` (or the ``with`` block ends), then raises.

    Use as a context manager; the patch is removed and hung calls are let go on exit::

        with SimulatedOutage() as outage:
            outage.begin(renewals=1)   # the next refresh fails, later ones succeed
            ...
            outage.begin()             # every refresh fails until outage.end()

    ``failed`` and ``succeeded`` count refreshes (``int``) since the block began: a
    ``refresh_many`` call (one statement, whatever the number of leases) counts once.
    """

    def __init__(self, mode: str = "raise") -> None:
        if mode not in ("raise", "hang"):
            raise ValueError(f"SimulatedOutage mode must be 'raise' or 'hang', not {mode!r}")
        self.mode = mode
        self.failed = 0
        self.succeeded = 0
        self._lock = threading.Lock()
        self._failures_left: float = 0
        self._over = threading.Event()
        self._over.set()
        self._patches: list[Any] = []

    def begin(self, renewals: int | None = None) -> None:
        """Fail the next ``renewals`` refreshes (``int``), or all of them until :meth:`end`."""
        with self._lock:
            self._failures_left = math.inf if renewals is None else renewals
            self._over.clear()

    def end(self) -> None:
        """End the outage: refreshes reach the database again and hung ones raise."""
        with self._lock:
            self._failures_left = 0
            self._over.set()

    def __enter__(self) -> SimulatedOutage:

        real_refresh = LeaseQuerySet.refresh
        real_refresh_many = LeaseQuerySet.refresh_many

        def refresh(queryset: LeaseQuerySet, lease: Lease, ttl: float | timedelta) -> Lease | None:
            self._fail_or_pass()
            result = real_refresh(queryset, lease, ttl)
            self._passed()
            return result

        def refresh_many(
            queryset: LeaseQuerySet, held: Sequence[tuple[Lease, float | timedelta]]
        ) -> list[Lease | Unknown | None]:
            self._fail_or_pass()
            results = real_refresh_many(queryset, held)
            self._passed()
            return results

        self._patches = [
            mock.patch.object(LeaseQuerySet, "refresh", refresh),
            mock.patch.object(LeaseQuerySet, "refresh_many", refresh_many),
        ]
        for patch in self._patches:
            patch.start()
        return self

    def _fail_or_pass(self) -> None:
        with self._lock:
            failing = self._failures_left > 0
            if failing:
                self._failures_left -= 1
                self.failed += 1
        if failing:
            if self.mode == "hang":
                self._over.wait()
            raise OperationalError("simulated outage: the database is unreachable")

    def _passed(self) -> None:
        with self._lock:
            self.succeeded += 1

    def __exit__(self, *exc_info: object) -> None:
        self.end()
        for patch in self._patches:
            patch.stop()


def _awaited(call: Callable[[], Awaitable[Any]]) -> Any:
    """Await ``call()`` from sync code (``async_to_sync``) and return its result."""

    async def awaiting() -> Any:
        return await call()

    return async_to_sync(awaiting)()


class LeaseConformanceTests(ConformanceSuite):
    """Rules L1–L18 as ``test_*`` methods; mix into ``django.test.TransactionTestCase``.

    Class attributes you may override:
        lease_database: the database alias ``Lease`` lives on (``str``).
        short_ttl: TTL in seconds of the leases a test lets lapse (``float``, default 1.0).
        long_ttl: TTL in seconds of leases that must not lapse during a test (``float``).
    """

    lease_database: ClassVar[str] = DEFAULT_DB_ALIAS
    short_ttl: ClassVar[float] = 1.0
    long_ttl: ClassVar[float] = 3600.0

    # -- helpers ---------------------------------------------------------------------------

    @property
    def leases(self) -> LeaseQuerySet:
        """``Lease.objects`` on :attr:`lease_database`."""
        # A manager with the QuerySet's methods (the stubs' plugin makes its class, unnamed here).
        return Lease.objects.db_manager(self.lease_database)  # type: ignore[return-value]

    def new_key(self) -> str:
        """A key no other test uses."""
        return f"conformance:{self._testMethodName}:{uuid.uuid4().hex[:12]}"

    def hold(self, key: str, ttl: float, **kwargs: Any) -> hold_lease:
        """``hold_lease(key, ttl, **kwargs)`` (``ttl`` in seconds) on :attr:`lease_database`."""
        return hold_lease(key, ttl, using=self.lease_database, **kwargs)

    def ahold(self, key: str, ttl: float, **kwargs: Any) -> ahold_lease:
        """``ahold_lease(key, ttl, **kwargs)`` (``ttl`` in seconds) on :attr:`lease_database`."""
        return ahold_lease(key, ttl, using=self.lease_database, **kwargs)

    def lapse(self) -> None:
        """Wait until a ``short_ttl`` lease taken before the call has lapsed (2× its TTL)."""
        time.sleep(2 * self.short_ttl)

    def holder_of(self, key: str) -> str | None:
        """The holder (``str``) of the live lease on ``key``, or ``None`` when none is live."""
        lease = self.leases.current(key)
        return None if lease is None else lease.holder

    def run_in_thread(self, target: Callable[[], Any], timeout: float) -> Any:
        """Run ``target`` on a thread with its own connection; return its result or raise.

        Fails the test if the thread is still running after ``timeout`` seconds (a hang).
        """
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["result"] = target()
            except BaseException as exc:
                outcome["error"] = exc
            finally:
                connections.close_all()

        thread = threading.Thread(target=run, name=f"conformance:{self._testMethodName}")
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            self.fail(f"still running after {timeout:g} s: it hangs")
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("result")

    @contextmanager
    def outage(self, mode: str = "raise") -> Iterator[SimulatedOutage]:
        """A :class:`SimulatedOutage`; on exit, waits for renewal threads it left hanging."""
        with SimulatedOutage(mode) as outage:
            yield outage
        for thread in threading.enumerate():
            if thread.name.startswith("lease-renewal:conformance:"):
                thread.join(10 * self.short_ttl)

    # -- L1–L8: Lease.objects ------------------------------------------------------------------

    def test_l01_one_holder_at_a_time(self) -> None:
        """L1: a new key goes to its first holder with token 1; a second holder is refused."""
        key = self.new_key()
        first = self.leases.acquire(key, "a", self.long_ttl)
        assert first is not None
        self.assertEqual((first.holder, first.token), ("a", 1))
        self.assertIsNone(self.leases.acquire(key, "b", self.long_ttl))
        self.assertEqual(self.holder_of(key), "a")

    def test_l02_keys_are_independent(self) -> None:
        """L2: holding one key does not keep another holder from a different key."""
        one, two = self.new_key(), self.new_key()
        self.assertIsNotNone(self.leases.acquire(one, "a", self.long_ttl))
        other = self.leases.acquire(two, "b", self.long_ttl)
        assert other is not None
        self.assertEqual(other.holder, "b")
        self.assertEqual(self.holder_of(one), "a")

    def test_l03_holder_reacquires_under_same_token(self) -> None:
        """L3: the live holder acquiring again keeps its token and gets a later expiry."""
        key = self.new_key()
        first = self.leases.acquire(key, "a", self.short_ttl)
        again = self.leases.acquire(key, "a", self.long_ttl)
        assert first is not None and again is not None
        self.assertEqual(again.token, first.token)
        self.assertGreater(again.expires_at, first.expires_at)

    def test_l04_lapsed_lease_passes_with_next_token(self) -> None:
        """L4: once lapsed, the key passes to another holder with token + 1, and the old
        lease can no longer be refreshed."""
        key, old = self._lapsed_lease()
        new = self.leases.acquire(key, "b", self.long_ttl)
        assert new is not None
        self.assertEqual((new.holder, new.token), ("b", old.token + 1))
        self.assertIsNone(self.leases.refresh(old, self.long_ttl))
        self.assertEqual(self.holder_of(key), "b")

    def test_l04_lapsed_lease_passes_to_its_old_holder_with_next_token(self) -> None:
        """L4: a lapsed lease taken again by its own old holder is a takeover: token + 1."""
        key, old = self._lapsed_lease()
        self.assertIsNone(self.leases.current(key))
        again = self.leases.acquire(key, "a", self.long_ttl)
        assert again is not None
        self.assertEqual(again.token, old.token + 1)

    def test_l05_release_frees_key_and_token_keeps_rising(self) -> None:
        """L5: a released key is free at once, and its next holder gets token + 1."""
        key = self.new_key()
        first = self.leases.acquire(key, "a", self.long_ttl)
        assert first is not None
        self.leases.release(first)
        self.assertIsNone(self.leases.current(key))
        self.assertIsNone(self.leases.refresh(first, self.long_ttl))
        second = self.leases.acquire(key, "b", self.long_ttl)
        assert second is not None
        self.assertEqual(second.token, first.token + 1)
        self.leases.release(second)
        third = self.leases.acquire(key, "a", self.long_ttl)
        assert third is not None
        self.assertEqual(third.token, second.token + 1)

    def _lapsed_lease(self) -> tuple[str, Lease]:
        """A new key acquired by holder ``a`` for :attr:`short_ttl`, then lapsed
        (:meth:`lapse`): the key and the lease as granted."""
        key = self.new_key()
        lease = self.leases.acquire(key, "a", self.short_ttl)
        assert lease is not None
        self.lapse()
        return key, lease

    def _stale_release_after_takeover(self, taker: str) -> tuple[Lease, Lease]:
        """Holder ``a``'s lease lapses and ``taker`` takes the key; then the stale lease is
        released and refreshed (the refresh must answer ``None``). Returns the taker's lease
        as granted and the key's current lease after all that (``None`` fails the test)."""
        key, stale = self._lapsed_lease()
        current = self.leases.acquire(key, taker, self.long_ttl)
        assert current is not None
        self.leases.release(stale)
        self.assertIsNone(self.leases.refresh(stale, self.long_ttl))
        held = self.leases.current(key)
        assert held is not None
        return current, held

    def test_l06_stale_lease_cannot_refresh_or_release_new_holder(self) -> None:
        """L6: after a takeover, the old lease's refresh and release leave the new holder be."""
        current, now_held = self._stale_release_after_takeover("b")
        self.assertEqual((now_held.holder, now_held.token), ("b", current.token))
        self.assertEqual(now_held.expires_at, current.expires_at)

    def test_l06_same_holder_stale_token_cannot_release(self) -> None:
        """L6: the token fences a holder from its own earlier lease on the key."""
        current, held = self._stale_release_after_takeover("a")
        self.assertEqual(held.token, current.token)

    def test_l07_refresh_extends_live_lease(self) -> None:
        """L7: refreshing a live lease keeps its token and keeps others out past the old TTL."""
        key = self.new_key()
        lease = self.leases.acquire(key, "a", self.short_ttl)
        assert lease is not None
        refreshed = self.leases.refresh(lease, self.long_ttl)
        assert refreshed is not None
        self.assertEqual(refreshed.token, lease.token)
        self.assertGreater(refreshed.expires_at, lease.expires_at)
        self.lapse()
        self.assertIsNone(self.leases.acquire(key, "b", self.long_ttl))
        self.assertEqual(self.holder_of(key), "a")

    def test_l07_lapsed_lease_cannot_be_refreshed_even_if_untaken(self) -> None:
        """L7: a lease that lapsed on the database clock cannot be refreshed, taken or not."""
        key, lease = self._lapsed_lease()
        self.assertIsNone(self.leases.refresh(lease, self.long_ttl))
        self.assertIsNone(self.leases.current(key))

    # -- L1–L7 again, on the coroutine forms (aacquire, arefresh, arelease, acurrent) -----------

    def test_l01_async_one_holder_at_a_time(self) -> None:
        """L1 (async forms): ``aacquire`` grants a new key to its first holder with token 1
        and refuses a second holder; ``acurrent`` names the first."""
        key = self.new_key()

        async def scenario() -> tuple[Lease | None, Lease | None, Lease | None]:
            first = await self.leases.aacquire(key, "a", self.long_ttl)
            second = await self.leases.aacquire(key, "b", self.long_ttl)
            return first, second, await self.leases.acurrent(key)

        first, second, current = async_to_sync(scenario)()
        assert first is not None and current is not None
        self.assertEqual((first.holder, first.token), ("a", 1))
        self.assertIsNone(second)
        self.assertEqual((current.holder, current.token), ("a", 1))

    def test_l03_async_holder_reacquires_and_refreshes_under_same_token(self) -> None:
        """L3, L7 (async forms): the live holder's ``aacquire`` and ``arefresh`` keep its
        token and move its expiry later."""
        key = self.new_key()

        async def scenario() -> tuple[Lease | None, Lease | None, Lease | None]:
            first = await self.leases.aacquire(key, "a", self.short_ttl)
            assert first is not None
            again = await self.leases.aacquire(key, "a", self.short_ttl * 2)
            assert again is not None
            return first, again, await self.leases.arefresh(again, self.long_ttl)

        first, again, refreshed = async_to_sync(scenario)()
        assert first is not None and again is not None and refreshed is not None
        self.assertEqual({again.token, refreshed.token}, {first.token})
        self.assertGreater(again.expires_at, first.expires_at)
        self.assertGreater(refreshed.expires_at, again.expires_at)

    def test_l05_async_release_frees_key_and_token_keeps_rising(self) -> None:
        """L5 (async forms): ``arelease`` frees the key at once (``True``), ``acurrent`` is
        ``None`` then, the released lease cannot be refreshed, and the next holder gets
        token + 1."""
        key = self.new_key()

        async def scenario() -> tuple[Any, ...]:
            first = await self.leases.aacquire(key, "a", self.long_ttl)
            assert first is not None
            released = await self.leases.arelease(first)
            return (
                first,
                released,
                await self.leases.acurrent(key),
                await self.leases.arefresh(first, self.long_ttl),
                await self.leases.aacquire(key, "b", self.long_ttl),
            )

        first, released, current, refreshed, second = async_to_sync(scenario)()
        self.assertIs(released, True)
        self.assertIsNone(current)
        self.assertIsNone(refreshed)
        self.assertEqual(second.token, first.token + 1)

    def test_l06_async_stale_lease_cannot_refresh_or_release_new_holder(self) -> None:
        """L4, L6, L7 (async forms): once a lease lapsed (on the database clock) and passed
        on with token + 1, the stale lease's ``arefresh`` is ``None`` and its ``arelease``
        a no-op (``False``): the new holder keeps the key, token and expiry."""
        key = self.new_key()
        stale = _awaited(lambda: self.leases.aacquire(key, "a", self.short_ttl))
        assert stale is not None
        self.lapse()

        async def scenario() -> tuple[Any, ...]:
            current = await self.leases.aacquire(key, "b", self.long_ttl)
            return (
                current,
                await self.leases.arelease(stale),
                await self.leases.arefresh(stale, self.long_ttl),
                await self.leases.acurrent(key),
            )

        current, released, refreshed, held = async_to_sync(scenario)()
        self.assertEqual((current.holder, current.token), ("b", stale.token + 1))
        self.assertIs(released, False)
        self.assertIsNone(refreshed)
        self.assertEqual((held.holder, held.token), ("b", current.token))
        self.assertEqual(held.expires_at, current.expires_at)

    def test_l07_async_forms_refuse_bad_input_like_the_sync_ones(self) -> None:
        """The coroutine forms raise what the sync ones raise (``ValueError``), with nothing
        written."""
        key = self.new_key()
        for call in (
            lambda: self.leases.aacquire("", "a", self.long_ttl),
            lambda: self.leases.aacquire(key, "a", 0),
            lambda: self.leases.acurrent("x" * 256),
            lambda: self.leases.arefresh("not a lease", self.long_ttl),  # type: ignore[arg-type]
            lambda: self.leases.arelease("not a lease"),  # type: ignore[arg-type]
        ):
            with self.subTest(call=call), self.assertRaises(ValueError):
                _awaited(call)
        self.assertFalse(self.leases.filter(key=key).exists())

    def test_l08_concurrent_acquires_admit_exactly_one(self) -> None:
        """L8: many holders acquiring one free key at the same moment: exactly one wins."""
        contenders = 8
        for round_number in range(3):
            key = self.new_key()
            barrier = threading.Barrier(contenders)
            results: list[Lease | None] = [None] * contenders

            def contend(
                index: int,
                key: str = key,
                barrier: threading.Barrier = barrier,
                results: list[Lease | None] = results,
            ) -> None:
                try:
                    barrier.wait()
                    results[index] = self.leases.acquire(key, f"h{index}", self.long_ttl)
                finally:
                    connections.close_all()

            threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            winners = [lease for lease in results if lease is not None]
            self.assertEqual(len(winners), 1, f"round {round_number}: {winners}")
            self.assertEqual(winners[0].token, 1)
            self.assertEqual(self.holder_of(key), winners[0].holder)

    # -- L9–L15: hold_lease / ahold_lease ----------------------------------------------------

    def test_l09_hold_lease_hands_body_its_lease_and_frees_key(self) -> None:
        """L9: the body gets the held lease; afterwards the key is free."""
        key = self.new_key()
        with self.hold(key, self.long_ttl) as held:
            self.assertEqual(held.key, key)
            self.assertEqual(held.lease.key, key)
            current = self.leases.current(key)
            assert current is not None
            self.assertEqual((current.holder, current.token), (held.lease.holder, held.token))
        self.assertIsNone(self.leases.current(key))

    def test_l09_hold_lease_as_decorator_returns_body_result(self) -> None:
        """L9: as a decorator, each call holds the lease and returns the body's result."""
        key = self.new_key()
        seen: list[str | None] = []

        @self.hold(key, self.long_ttl)
        def body() -> int:
            seen.append(self.holder_of(key))
            return 42

        self.assertEqual(body(), 42)
        self.assertEqual(body(), 42)
        self.assertEqual(len(seen), 2)
        self.assertTrue(all(seen))
        self.assertIsNone(self.leases.current(key))

    def test_l09_ahold_lease_hands_body_its_lease_and_frees_key(self) -> None:
        """L9 (asyncio): the body gets the held lease; afterwards the key is free."""
        key = self.new_key()

        async def scenario() -> str | None:
            async with self.ahold(key, self.long_ttl) as held:
                self.assertEqual(held.lease.key, key)
                return await sync_to_async(self.holder_of)(key)

        self.assertIsNotNone(async_to_sync(scenario)())
        self.assertIsNone(self.leases.current(key))

    def test_l10_hold_lease_refuses_taken_key(self) -> None:
        """L10: a key held live by another holder: LeaseTakenError at once, body not run."""
        key = self.new_key()
        self.leases.acquire(key, "other", self.long_ttl)
        ran: list[bool] = []
        with self.assertRaises(LeaseTakenError) as caught, self.hold(key, self.long_ttl):
            ran.append(True)
        self.assertEqual(caught.exception.key, key)
        self.assertEqual(ran, [])
        self.assertEqual(self.holder_of(key), "other")

    def test_l10_ahold_lease_refuses_taken_key(self) -> None:
        """L10 (asyncio): a key held live by another holder: LeaseTakenError, body not run."""
        key = self.new_key()
        self.leases.acquire(key, "other", self.long_ttl)
        ran: list[bool] = []

        async def scenario() -> None:
            async with self.ahold(key, self.long_ttl):
                ran.append(True)

        with self.assertRaises(LeaseTakenError):
            async_to_sync(scenario)()
        self.assertEqual(ran, [])

    def test_l11_hold_lease_frees_key_when_body_raises(self) -> None:
        """L11: the body's own exception comes out unchanged and the key is freed."""
        key = self.new_key()
        boom = RuntimeError("boom")
        with self.assertRaises(RuntimeError) as caught, self.hold(key, self.long_ttl):
            raise boom
        self.assertIs(caught.exception, boom)
        self.assertIsNone(self.leases.current(key))

    def test_l11_body_exception_wins_over_a_lost_lease(self) -> None:
        """L11: a body that raises after its lease was lost still raises its own exception."""
        key = self.new_key()
        boom = KeyError("boom")
        with self.assertRaises(KeyError) as caught, self.hold(key, self.long_ttl) as held:
            self.leases.release(held.lease)
            self.leases.acquire(key, "other", self.long_ttl)
            raise boom
        self.assertIs(caught.exception, boom)
        self.assertEqual(self.holder_of(key), "other")

    def test_l11_ahold_lease_frees_key_when_body_raises(self) -> None:
        """L11 (asyncio): the body's own exception comes out unchanged and the key is freed."""
        key = self.new_key()
        boom = RuntimeError("boom")

        async def scenario() -> None:
            async with self.ahold(key, self.long_ttl):
                raise boom

        with self.assertRaises(RuntimeError) as caught:
            async_to_sync(scenario)()
        self.assertIs(caught.exception, boom)
        self.assertIsNone(self.leases.current(key))

    def test_l12_refuses_to_vouch_for_body_that_outlived_its_lease(self) -> None:
        """L12: a body still running after its lease passed on ends in LeaseLostError."""
        key = self.new_key()
        with self.assertRaises(LeaseLostError) as caught, self.hold(key, self.short_ttl) as held:
            self.leases.release(held.lease)
            self.assertIsNotNone(self.leases.acquire(key, "other", self.long_ttl))
            self.lapse()
        self.assertEqual(caught.exception.key, key)
        self.assertEqual(self.holder_of(key), "other")

    def test_l13_notices_loss_after_its_last_renewal(self) -> None:
        """L13: a loss no renewal saw (the body ended first) is caught by the final check."""
        key = self.new_key()
        with self.assertRaises(LeaseLostError), self.hold(key, self.long_ttl) as held:
            self.leases.release(held.lease)
            self.assertIsNotNone(self.leases.acquire(key, "other", self.long_ttl))
        self.assertEqual(self.holder_of(key), "other")

    def test_l13_ahold_lease_notices_loss_after_its_last_renewal(self) -> None:
        """L13 (asyncio): a loss no renewal saw is caught by the final check."""
        key = self.new_key()

        async def scenario() -> None:
            async with self.ahold(key, self.long_ttl) as held:
                await sync_to_async(self.leases.release)(held.lease)
                await sync_to_async(self.leases.acquire)(key, "other", self.long_ttl)

        with self.assertRaises(LeaseLostError):
            async_to_sync(scenario)()
        self.assertEqual(self.holder_of(key), "other")

    def test_l14_tells_body_once_lost(self) -> None:
        """L14: once the lease is lost, ``held.lost`` is set and ``held.check()`` raises."""
        key = self.new_key()
        told: list[bool] = []
        with self.assertRaises(LeaseLostError), self.hold(key, self.short_ttl) as held:
            held.check()
            self.leases.release(held.lease)
            self.assertIsNotNone(self.leases.acquire(key, "other", self.long_ttl))
            told.append(held.lost.wait(3 * self.short_ttl))
            held.check()
            told.append(False)  # check() did not raise
        self.assertEqual(told, [True], "the body was never told its lease was gone")
        self.assertEqual(self.holder_of(key), "other")

    def test_l14_ahold_lease_cancels_body_once_lost(self) -> None:
        """L14 (asyncio): the body is cancelled on loss, and that ends in LeaseLostError."""
        key = self.new_key()
        finished: list[bool] = []

        async def scenario() -> None:
            async with self.ahold(key, self.short_ttl) as held:
                await sync_to_async(self.leases.release)(held.lease)
                await sync_to_async(self.leases.acquire)(key, "other", self.long_ttl)
                await asyncio.sleep(5 * self.short_ttl)
                finished.append(True)

        with self.assertRaises(LeaseLostError):
            async_to_sync(scenario)()
        self.assertEqual(finished, [], "the body ran on after its lease was lost")
        self.assertEqual(self.holder_of(key), "other")

    def test_l15_keeps_lease_alive_past_its_ttl(self) -> None:
        """L15: a body that runs longer than the TTL still holds the lease throughout."""
        key = self.new_key()
        with self.hold(key, self.short_ttl) as held:
            time.sleep(2.5 * self.short_ttl)
            self.assertFalse(held.lost.is_set())
            self.assertEqual(self.holder_of(key), held.lease.holder)
            self.assertIsNone(self.leases.acquire(key, "other", self.long_ttl))
        self.assertIsNone(self.leases.current(key))

    def test_l15_ahold_lease_keeps_lease_alive_past_its_ttl(self) -> None:
        """L15 (asyncio): a body that runs longer than the TTL still holds the lease."""
        key = self.new_key()

        async def scenario() -> None:
            async with self.ahold(key, self.short_ttl) as held:
                await asyncio.sleep(2.5 * self.short_ttl)
                self.assertFalse(held.lost.is_set())
                holder = await sync_to_async(self.holder_of)(key)
                self.assertEqual(holder, held.lease.holder)

        async_to_sync(scenario)()
        self.assertIsNone(self.leases.current(key))

    # -- L16–L18: an unreachable database -------------------------------------------------

    def test_l16_brief_outage_does_not_cost_the_lease(self) -> None:
        """L16: renewals that fail for less than the TTL, then succeed, keep the lease.

        TTL 3 × ``short_ttl``: one renewal (a third of the TTL) fails, the next succeed.
        """
        key = self.new_key()
        ttl = 3 * self.short_ttl
        with self.outage() as outage, self.hold(key, ttl) as held:
            outage.begin(renewals=1)
            deadline = time.monotonic() + 5 * ttl
            while outage.succeeded < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertEqual(outage.failed, 1)
            self.assertGreaterEqual(outage.succeeded, 2)
            self.assertFalse(held.lost.is_set(), "a brief outage cost the lease")
            self.assertEqual(self.holder_of(key), held.lease.holder)
        self.assertIsNone(self.leases.current(key))

    def test_l17_outage_past_the_ttl_aborts_the_body(self) -> None:
        """L17: renewals failing past the TTL mark the lease lost; the body ends in
        LeaseLostError."""
        key = self.new_key()
        with (
            self.outage() as outage,
            self.assertRaises(LeaseLostError),
            self.hold(key, self.short_ttl) as held,
        ):
            outage.begin()
            self.assertTrue(held.lost.wait(3 * self.short_ttl), "the outage went unnoticed")
            held.check()

    def test_l17_hung_renewal_still_aborts_the_body(self) -> None:
        """L17: a renewal that hangs (a silent TCP peer) still marks the lease lost within
        the TTL, and leaving the block does not wait for the hung call."""
        key = self.new_key()
        told: list[bool] = []

        def scenario() -> None:
            with self.hold(key, self.short_ttl) as held:
                outage.begin()
                told.append(held.lost.wait(3 * self.short_ttl))

        with self.outage("hang") as outage, self.assertRaises(LeaseLostError):
            self.run_in_thread(scenario, timeout=10 * self.short_ttl)
        self.assertEqual(told, [True], "the hung renewal went unnoticed")

    def test_l17_ahold_lease_cancels_body_on_outage(self) -> None:
        """L17 (asyncio): an outage past the TTL (renewals hanging) cancels the body and
        ends in LeaseLostError."""
        key = self.new_key()
        finished: list[bool] = []

        async def scenario() -> None:
            async with self.ahold(key, self.short_ttl):
                outage.begin()
                await asyncio.sleep(10 * self.short_ttl)
                finished.append(True)

        with self.outage("hang") as outage, self.assertRaises(LeaseLostError):
            self.run_in_thread(async_to_sync(scenario), timeout=10 * self.short_ttl)
        self.assertEqual(finished, [], "the body ran on through the outage")

    def test_l18_outage_at_the_final_check_cannot_vouch(self) -> None:
        """L18: when the final check cannot reach the database, the body is not vouched for
        (LeaseLostError); the key is still released. A check that failed on its connection
        is made once more on a fresh one before the hold gives up: two failed checks."""
        key = self.new_key()
        with (
            self.outage() as outage,
            self.assertRaises(LeaseLostError),
            self.hold(key, self.long_ttl),
        ):
            outage.begin()
        self.assertEqual(outage.failed, 2)
        self.assertIsNone(self.leases.current(key))

    def test_l18_ahold_lease_outage_at_the_final_check_cannot_vouch(self) -> None:
        """L18 (asyncio): an unreachable database at the final check: LeaseLostError."""
        key = self.new_key()

        async def scenario() -> None:
            async with self.ahold(key, self.long_ttl):
                outage.begin()

        with self.outage() as outage, self.assertRaises(LeaseLostError):
            async_to_sync(scenario)()
        self.assertIsNone(self.leases.current(key))


__all__ = ["LeaseConformanceTests", "SimulatedOutage"]

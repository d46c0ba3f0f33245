"""``Lease.objects.fenced(lease)``: writes that cannot interleave with a takeover.

Writes inside the block commit with the holder/token/liveness check or not at all; a block
on a lease that is no longer held raises ``LeaseLostError`` and writes nothing; a takeover
attempted while a block runs waits until the block commits (PostgreSQL: the row lock;
SQLite: the IMMEDIATE transaction's write lock).

The takeover test orders its threads without sleeping: the takeover is started while the
block holds its lock, and the block goes on only once the takeover is seen waiting on it
(:func:`tests.helpers.start_blocked`). A fence broken on purpose (it neither locks nor checks,
or it checks but does not lock) makes the same test fail: see
``test_the_takeover_test_fails_when_the_fence_is_broken`` (PostgreSQL, where a lock wait can
be seen, so the broken fence is caught every time rather than in most interleavings; MariaDB
too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now

from django_leases import LeaseLostError
from django_leases.models import Lease, LeaseQuerySet
from tests.helpers import lapse_lease, on_another_thread, start_blocked, unique_key

pytestmark = pytest.mark.django_db(transaction=True)


def _exists(key: str) -> bool:
    """Whether a lease on ``key`` is committed (read on a thread of its own)."""
    return bool(on_another_thread(lambda: Lease.objects.filter(key=key).exists()))


def test_writes_inside_fenced_commit() -> None:
    lease = Lease.objects.acquire(unique_key("fenced"), "a", 60)
    assert lease is not None
    marker = unique_key("fenced")
    with Lease.objects.fenced(lease) as row:
        assert (row.key, row.holder, row.token) == (lease.key, "a", lease.token)
        Lease.objects.acquire(marker, "written-under-the-fence", 60)
    assert _exists(marker)


def test_body_error_rolls_the_writes_back() -> None:
    lease = Lease.objects.acquire(unique_key("fenced"), "a", 60)
    assert lease is not None
    marker = unique_key("fenced")
    with pytest.raises(RuntimeError, match="boom"), Lease.objects.fenced(lease):
        Lease.objects.acquire(marker, "x", 60)
        raise RuntimeError("boom")
    assert not _exists(marker)


def _lapsed(key: str) -> Lease:
    lease = Lease.objects.acquire(key, "a", 60)
    assert lease is not None
    lapse_lease(key)
    return lease


def _released(key: str) -> Lease:
    lease = Lease.objects.acquire(key, "a", 60)
    assert lease is not None
    Lease.objects.release(lease)
    return lease


def _taken_over(key: str) -> Lease:
    lease = _released(key)
    assert Lease.objects.acquire(key, "b", 60) is not None
    return lease


def _stale_token_same_holder(key: str) -> Lease:
    lease = _released(key)
    assert Lease.objects.acquire(key, "a", 60) is not None  # same holder, token + 1
    return lease


@pytest.mark.parametrize("lose", [_lapsed, _released, _taken_over, _stale_token_same_holder])
def test_fenced_on_a_lost_lease_raises_and_writes_nothing(lose: Callable[[str], Lease]) -> None:
    key = unique_key("fenced")
    lease = lose(key)
    before = list(Lease.objects.order_by("key").values_list())
    ran = []
    with pytest.raises(LeaseLostError) as caught, Lease.objects.fenced(lease):
        ran.append(True)
        Lease.objects.acquire(unique_key("fenced"), "x", 60)
    assert caught.value.key == key
    assert ran == []
    assert list(Lease.objects.order_by("key").values_list()) == before


def _takeover_waits_for_the_block() -> None:
    """The block starts while the lease is live; a takeover is attempted from another thread
    and seen waiting on the block's lock; the block then runs on past the lease's expiry (it
    lapses on the database clock) and writes; only after its commit does the takeover go on,
    and it wins with token + 1. ``AssertionError`` if the takeover did not wait."""
    key, marker = unique_key("fenced"), unique_key("fenced")
    lease = Lease.objects.acquire(key, "a", 60)
    assert lease is not None
    # The block's write updates a row that exists already: on InnoDB, inserting a new lease
    # row could fall into the index gap that the waiting takeover's duplicate-key check
    # asks to lock, and deadlock (docs/operations/backends.md).
    written = Lease.objects.acquire(marker, "written-under-the-fence", 60)
    assert written is not None
    committed = [False]

    def take_over() -> tuple[Lease | None, bool]:
        return Lease.objects.acquire(key, "b", 60), committed[0]

    with Lease.objects.fenced(lease):
        takeover = start_blocked(take_over)
        assert takeover.waited, "the takeover did not wait for the fenced block"
        lapse_lease(key)  # in the block's own transaction: the block outlives the lease
        assert Lease.objects.release(written)
        committed[0] = True  # set just before the commit: nothing else happens in between
    taken, after_the_commit = takeover.result()
    assert after_the_commit, "the takeover did not wait for the fenced block"
    assert taken is not None and (taken.holder, taken.token) == ("b", lease.token + 1)
    assert on_another_thread(lambda: Lease.objects.current(marker)) is None  # the write landed
    with pytest.raises(LeaseLostError), Lease.objects.fenced(lease):
        pass


def test_takeover_waits_for_a_fenced_block_to_commit(sql_path: str) -> None:
    _takeover_waits_for_the_block()


@contextmanager
def _unlocked(manager: LeaseQuerySet, lease: Lease) -> Iterator[Lease]:
    """A broken fence: no transaction, no lock, no check — the block runs in autocommit."""
    yield manager.model._default_manager.get(key=lease.key)


@contextmanager
def _checked_but_unlocked(manager: LeaseQuerySet, lease: Lease) -> Iterator[Lease]:
    """A broken fence: the transaction and the check, but no ``select_for_update()``."""
    with transaction.atomic():
        row = manager.model._default_manager.filter(
            key=lease.key,
            holder=lease.holder,
            token=lease.token,
            released_at__isnull=True,
            expires_at__gt=Now(),
        ).first()
        if row is None:
            raise LeaseLostError(lease.key)
        yield row


@pytest.mark.skipif(
    connection.vendor == "sqlite", reason="needs PostgreSQL or MariaDB, where a lock wait is seen"
)
@pytest.mark.parametrize("broken", [_unlocked, _checked_but_unlocked])
def test_the_takeover_test_fails_when_the_fence_is_broken(
    sql_path: str, broken: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The takeover test can fail: with the fence's lock gone, the takeover does not wait
    for the block (``pg_blocking_pids()``, or ``sys.innodb_lock_waits`` on MariaDB, never
    names the block's connection), and the test says so."""
    monkeypatch.setattr(LeaseQuerySet, "fenced", broken)
    with pytest.raises(AssertionError, match="the takeover did not wait for the fenced block"):
        _takeover_waits_for_the_block()

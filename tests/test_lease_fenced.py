"""``Lease.objects.fenced(lease)``: writes that cannot interleave with a takeover.

Writes inside the block commit with the holder/token/liveness check or not at all; a block
on a lease that is no longer held raises ``LeaseLostError`` and writes nothing; a takeover
attempted while a block runs waits until the block commits (PostgreSQL: the row lock;
SQLite: the IMMEDIATE transaction's write lock).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connections

from django_leases import LeaseLostError
from django_leases.models import Lease
from tests.helpers import tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)

TTL = 1.0
LAPSE = 2.0 * TTL


@pytest.fixture(params=["sql", "orm"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """The takeover runs on the single-statement SQL path, then on the ORM fallback."""
    if request.param == "orm":
        with tuned_sql(False):
            yield "orm"
    else:
        yield "sql"


def _key() -> str:
    return f"fenced:{uuid.uuid4().hex[:12]}"


def _on_other_connection(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on a thread with its own connection (so it sees only committed rows)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    return box["value"]


def _exists(key: str) -> bool:
    return Lease.objects.filter(key=key).exists()


def test_writes_inside_fenced_commit() -> None:
    lease = Lease.objects.acquire(_key(), "a", 60)
    assert lease is not None
    marker = _key()
    with Lease.objects.fenced(lease) as row:
        assert (row.key, row.holder, row.token) == (lease.key, "a", lease.token)
        Lease.objects.acquire(marker, "written-under-the-fence", 60)
    assert _on_other_connection(lambda: _exists(marker))


def test_body_error_rolls_the_writes_back() -> None:
    lease = Lease.objects.acquire(_key(), "a", 60)
    assert lease is not None
    marker = _key()
    with pytest.raises(RuntimeError, match="boom"), Lease.objects.fenced(lease):
        Lease.objects.acquire(marker, "x", 60)
        raise RuntimeError("boom")
    assert not _on_other_connection(lambda: _exists(marker))


def _lapsed(key: str) -> Lease:
    lease = Lease.objects.acquire(key, "a", TTL)
    assert lease is not None
    time.sleep(LAPSE)
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
    key = _key()
    lease = lose(key)
    before = list(Lease.objects.order_by("key").values_list())
    ran = []
    with pytest.raises(LeaseLostError) as caught, Lease.objects.fenced(lease):
        ran.append(True)
        Lease.objects.acquire(_key(), "x", 60)
    assert caught.value.key == key
    assert ran == []
    assert list(Lease.objects.order_by("key").values_list()) == before


def test_takeover_waits_for_a_fenced_block_to_commit(path: str) -> None:
    """The block starts while the lease is live and runs on past its expiry; a takeover
    attempted then must wait for the block's commit, and only then win (token + 1)."""
    key, marker = _key(), _key()
    lease = Lease.objects.acquire(key, "a", TTL)
    assert lease is not None
    attempting = threading.Event()
    block_finished = threading.Event()
    seen: dict[str, Any] = {}

    def take_over() -> None:
        try:
            attempting.set()
            seen["lease"] = Lease.objects.acquire(key, "b", 60)
            seen["block_finished_first"] = block_finished.is_set()
        finally:
            connections.close_all()

    taker = threading.Thread(target=take_over)
    with Lease.objects.fenced(lease):
        time.sleep(LAPSE)  # lapsed on the database clock, but the block still runs
        taker.start()
        assert attempting.wait(10)
        time.sleep(0.5)  # the takeover is now waiting (or, if unfenced, already done)
        Lease.objects.acquire(marker, "written-under-the-fence", 60)
        block_finished.set()
    taker.join(30)
    assert not taker.is_alive()
    assert seen["block_finished_first"], "the takeover did not wait for the fenced block"
    taken = seen["lease"]
    assert taken is not None and (taken.holder, taken.token) == ("b", lease.token + 1)
    assert _exists(marker)
    with pytest.raises(LeaseLostError), Lease.objects.fenced(lease):
        pass

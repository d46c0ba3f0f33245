"""The lease signals: ``lease_acquired``, ``lease_released`` and ``lease_lost``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from django_leases import LeaseLostError, hold_lease
from django_leases.models import Lease
from django_leases.signals import lease_acquired, lease_lost, lease_released
from tests.helpers import unique_key

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every lease signal sent during the test, as ``(name, kwargs)``."""
    log: list[tuple[str, dict[str, Any]]] = []
    lock = threading.Lock()
    receivers = {}
    for name, signal in (
        ("acquired", lease_acquired),
        ("released", lease_released),
        ("lost", lease_lost),
    ):

        def receiver(sender: Any, name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            with lock:
                log.append((name, {"sender": sender, **kwargs}))

        receivers[name] = receiver
        signal.connect(receiver, weak=False)
    yield log
    lease_acquired.disconnect(receivers["acquired"])
    lease_released.disconnect(receivers["released"])
    lease_lost.disconnect(receivers["lost"])


def test_acquire_and_release_send_their_signals(sent: list[tuple[str, dict[str, Any]]]) -> None:
    key = unique_key("signals")
    lease = Lease.objects.acquire(key, "a", 60)
    assert lease is not None
    assert Lease.objects.acquire(key, "b", 60) is None  # refused: no signal
    Lease.objects.release(lease)
    Lease.objects.release(lease)  # already released: a no-op, no signal
    assert [name for name, _ in sent] == ["acquired", "released"]
    for _, kwargs in sent:
        assert kwargs["sender"] is Lease
        assert (kwargs["lease"].key, kwargs["lease"].token) == (key, lease.token)


def test_stale_release_sends_nothing(sent: list[tuple[str, dict[str, Any]]]) -> None:
    key = unique_key("signals")
    stale = Lease.objects.acquire(key, "a", 60)
    assert stale is not None
    Lease.objects.release(stale)
    Lease.objects.acquire(key, "b", 60)
    sent.clear()
    Lease.objects.release(stale)
    assert sent == []


def test_hold_lease_sends_acquired_then_released(sent: list[tuple[str, dict[str, Any]]]) -> None:
    key = unique_key("signals")
    with hold_lease(key, 60) as held:
        pass
    assert [name for name, _ in sent] == ["acquired", "released"]
    assert sent[0][1]["lease"].holder == held.lease.holder


def test_hold_lease_sends_lost_once(sent: list[tuple[str, dict[str, Any]]]) -> None:
    """Seen by the renewal thread (short TTL) and again by the final check: sent once."""
    key = unique_key("signals")
    with pytest.raises(LeaseLostError), hold_lease(key, 1.0) as held:
        Lease.objects.release(held.lease)
        Lease.objects.acquire(key, "other", 60)
        assert held.lost.wait(60), "the renewal thread did not see the loss"
    lost = [kwargs for name, kwargs in sent if name == "lost"]
    assert len(lost) == 1
    assert lost[0]["sender"] is Lease
    assert lost[0]["key"] == key
    assert lost[0]["lease"].token == held.token


def test_final_check_loss_sends_lost(sent: list[tuple[str, dict[str, Any]]]) -> None:
    key = unique_key("signals")
    with pytest.raises(LeaseLostError), hold_lease(key, 60) as held:
        Lease.objects.release(held.lease)
        Lease.objects.acquire(key, "other", 60)
    assert [kwargs["key"] for name, kwargs in sent if name == "lost"] == [key]


def test_a_failing_receiver_never_breaks_the_lease_operation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Receivers run via send_robust: their errors are logged, and the lease operation
    (and the body's loss notice) goes on as if they had not failed."""

    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("broken receiver")

    for signal in (lease_acquired, lease_released, lease_lost):
        signal.connect(broken, weak=False)
    try:
        key = unique_key("signals")
        lease = Lease.objects.acquire(key, "a", 60)
        assert lease is not None  # granted, not turned into an error
        Lease.objects.release(lease)
        assert Lease.objects.current(key) is None
        with pytest.raises(LeaseLostError), hold_lease(key, 1.0) as held:
            Lease.objects.release(held.lease)
            Lease.objects.acquire(key, "other", 60)
            assert held.lost.wait(60), "the body was not told"
    finally:
        for signal in (lease_acquired, lease_released, lease_lost):
            signal.disconnect(broken)
    assert any("broken receiver" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)

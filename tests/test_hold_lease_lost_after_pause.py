"""``held.lost`` after a pause past the TTL.

The docs offer ``held.lost`` beside ``held.check()`` ("poll held.check() or held.lost"; the
leader-election example loops ``while not held.lost.is_set()``). ``check()`` reads the local
deadline, so a holder paused past its TTL (SIGSTOP, a long GC, a suspended VM) learns at once
that it lost the lease. ``lost`` was set only by the watchdog thread: a body that resumed
first read it unset and worked on beside the next holder. Reading ``lost`` now notices the
passed deadline as ``check()`` does, with the same record (the ``lease_lost`` signal, once).
The pause is made by moving the local deadline into the past, as a pause would leave it,
before the watchdog (asleep until the deadline it knew) has run.
"""

from __future__ import annotations

import time

import pytest

from django_leases import LeaseLostError, hold_lease
from django_leases.signals import lease_lost
from tests.helpers import end_renewers, unique_key

pytestmark = pytest.mark.django_db(transaction=True)


def _paused_past_its_ttl(held: object) -> None:
    renewal = held._renewal  # type: ignore[attr-defined]
    with renewal.renewer.cond:
        renewal._deadline = time.monotonic() - 1


@pytest.mark.parametrize("read", ["is_set", "wait"])
def test_a_body_reading_lost_after_a_pause_learns_it_lost_the_lease(
    read: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    signalled: list[str] = []

    def receiver(sender: object, key: str, **kwargs: object) -> None:
        signalled.append(key)

    lease_lost.connect(receiver)
    key = unique_key("lost-after-pause")
    try:
        with (
            pytest.raises(LeaseLostError),
            hold_lease(key, 30) as held,
        ):
            assert not held.lost.is_set()
            _paused_past_its_ttl(held)
            seen = held.lost.is_set() if read == "is_set" else held.lost.wait(0)
            assert seen, "the resumed body read held.lost unset past its local deadline"
            assert held.lost.is_set()
    finally:
        lease_lost.disconnect(receiver)
        end_renewers(monkeypatch)
    assert signalled == [key], signalled


def test_reading_lost_after_the_hold_ended_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    key = unique_key("lost-after-end")
    try:
        with hold_lease(key, 30) as held:
            pass
        _paused_past_its_ttl(held)
        assert not held.lost.is_set(), "a finished hold was counted lost"
    finally:
        end_renewers(monkeypatch)

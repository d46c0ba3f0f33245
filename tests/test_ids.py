"""Time-ordered run ids (``django_leases.ids.uuid7``): layout, order and the run default."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from django_leases import ids
from django_leases.models import WorkflowRun
from tests.helpers import in_processes


def _millis(value: uuid.UUID) -> int:
    return value.int >> 80


def test_layout_is_rfc_9562_version_7() -> None:
    before = time.time_ns() // 1_000_000
    value = ids._fallback_uuid7()
    after = time.time_ns() // 1_000_000
    assert value.version == 7
    assert value.variant == uuid.RFC_4122
    assert before <= _millis(value) <= after + 1


def test_ids_of_one_process_strictly_increase() -> None:
    made = [ids._fallback_uuid7() for _ in range(20_000)]
    assert made == sorted(made)
    assert len(set(made)) == len(made)


def test_a_burst_in_one_millisecond_borrows_the_next_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # The clock stands still: the 12-bit counter runs out and the millisecond field moves on,
    # so order and uniqueness hold; the borrowed time is at most a few milliseconds ahead.
    frozen = (time.time_ns() // 1_000_000 + 10_000) * 1_000_000
    monkeypatch.setattr(ids.time, "time_ns", lambda: frozen)
    made = [ids._fallback_uuid7() for _ in range(10_000)]
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    assert _millis(made[0]) == frozen // 1_000_000
    assert _millis(made[-1]) - _millis(made[0]) <= 4


def test_a_clock_stepping_back_keeps_the_order(monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time_ns() + 50_000 * 1_000_000
    monkeypatch.setattr(ids.time, "time_ns", lambda: now)
    first = ids._fallback_uuid7()
    monkeypatch.setattr(ids.time, "time_ns", lambda: now - 5_000 * 1_000_000)
    assert ids._fallback_uuid7() > first


def test_the_native_generator_is_used_where_python_has_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    marker = uuid.UUID(int=(7 << 76) | (0b10 << 62))
    monkeypatch.setattr(ids, "_native", lambda: marker)
    assert ids.uuid7() is marker
    monkeypatch.setattr(ids, "_native", None)
    assert ids.uuid7().version == 7


@pytest.mark.django_db
def test_runs_get_time_ordered_ids() -> None:
    runs = [WorkflowRun.objects.start("ids-demo", {"n": n}) for n in range(5)]
    assert all(run.id.version == 7 for run in runs)
    stored = list(WorkflowRun.objects.order_by("id").values_list("input", flat=True))
    assert stored == [{"n": n} for n in range(5)]


def test_a_child_forked_while_a_thread_holds_the_lock_still_makes_ids() -> None:
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with ids._lock:
            held.set()
            release.wait(60)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(60)
    try:
        outcomes = in_processes([lambda: ids._fallback_uuid7().version], timeout=30)
    finally:
        release.set()
        thread.join()
    assert outcomes == [(7, "")]

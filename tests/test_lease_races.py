"""Races on one key: 16 threads and 4 processes acquiring at once, with real commits.

Two tests:

* **rounds** — every contender waits at a barrier, then all acquire the key at once. Exactly
  one wins each round. Before the next round the winner gives the key up: it releases it, or
  (every ``LAPSE_EVERY``-th round) lapses it on the database clock, so every round is a
  takeover and the tokens must run 1, 2, 3, … with no gap and no repeat.
* **free-for-all** — every contender acquires in a loop with a 50 ms TTL and nobody releases,
  so takeovers happen exactly at lapse time, under contention, until the key has been
  granted ``_grants()`` times. (The 50 ms TTL is the subject here: nothing waits for it and
  nothing is timed.)

In both, every grant is recorded with the database's own timestamps (``renewed_at`` is the
database time of the grant, ``expires_at`` and ``released_at`` its end), and the checker
verifies, in token order, that each grant began no earlier than the previous one ended on the
database clock: no two contenders ever held the key live at the same moment.

The processes are forked (:func:`tests.helpers.in_processes`: no connection crosses the fork)
and the threads run here meanwhile (:func:`tests.helpers.race`).
"""

from __future__ import annotations

import itertools
import multiprocessing
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import pytest

from django_leases.models import Lease
from tests.helpers import in_processes, lapse_lease, race, unique_key, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

THREADS = 16
PROCESSES = 4
PARTIES = THREADS + PROCESSES
TTL = 60.0
LAPSE_EVERY = 25
HAMMER_TTL = 0.05
BARRIER_TIMEOUT = 120.0
#: Barriers and events the threads here and the forked processes share.
FORK = multiprocessing.get_context("fork")

Grant = dict[str, Any]


def _rounds(vendor: str) -> int:
    return 200 if vendor in ("postgresql", "mysql") else 30


def _grants(vendor: str) -> int:
    return 60 if vendor in ("postgresql", "mysql") else 40


def _plan(rounds: int) -> list[tuple[int, bool]]:
    """``(round, lapse)`` for each round; a lapse round's winner lapses its lease."""
    every = LAPSE_EVERY if rounds >= 100 else 10
    return [(number, number % every == every - 1) for number in range(rounds)]


def _grant(lease: Any, contender: str, round_number: int | None) -> Grant:
    return {
        "round": round_number,
        "contender": contender,
        "holder": lease.holder,
        "token": lease.token,
        "start": lease.renewed_at,
        "end": lease.expires_at,
    }


def contend_in_rounds(
    contender: str, key: str, plan: list[tuple[int, bool]], barrier: Any
) -> tuple[int, list[Grant]]:
    """One contender's part in the rounds test; returns (attempts made, grants won)."""
    attempts, grants = 0, []
    for round_number, lapse in plan:
        barrier.wait(BARRIER_TIMEOUT)
        lease = Lease.objects.acquire(key, f"{contender}:r{round_number}", TTL)
        attempts += 1
        barrier.wait(BARRIER_TIMEOUT)  # every contender has tried this round
        if lease is None:
            continue
        grant = _grant(lease, contender, round_number)
        if lapse:
            lapse_lease(key)
        else:
            Lease.objects.release(lease)
        # The next round cannot start before this contender reaches the barrier, so the row
        # still belongs to this grant: its end is the lapsed expiry, or the release.
        row = Lease.objects.get(key=key)
        assert row.token == lease.token, (row.token, lease.token)
        assert lapse or row.released_at is not None
        grant["end"] = row.expires_at if lapse else row.released_at
        grants.append(grant)
    return attempts, grants


def contend_free_for_all(
    contender: str, key: str, start: Any, stop: Any
) -> tuple[int, list[Grant]]:
    """Acquire ``key`` in a loop until ``stop`` is set; every attempt is a fresh holder."""
    attempts, grants = 0, []
    start.wait(BARRIER_TIMEOUT)
    while not stop.is_set():
        lease = Lease.objects.acquire(key, f"{contender}:{attempts}", HAMMER_TTL)
        attempts += 1
        if lease is not None:
            grants.append(_grant(lease, contender, None))
        time.sleep(0.002)
    return attempts, grants


def _run_contenders(
    contend: Callable[[str], tuple[int, list[Grant]]],
    barrier: Any,
    meanwhile: Sequence[Callable[[], Any]] = (),
) -> list[tuple[int, list[Grant]]]:
    """Run ``contend(name)`` in PROCESSES forked processes and on THREADS threads here (with
    the ``meanwhile`` calls on threads of their own); collect what each contender returned.
    A contender that fails breaks ``barrier``, so the others stop waiting at once."""

    def contender(name: str) -> Callable[[], tuple[int, list[Grant]]]:
        def run() -> tuple[int, list[Grant]]:
            try:
                return contend(name)
            except BaseException:
                barrier.abort()
                raise

        return run

    threads: list[Any] = []
    processes = in_processes(
        [contender(f"p{index}") for index in range(PROCESSES)],
        while_running=lambda: threads.extend(
            race(
                [*(contender(f"t{index}") for index in range(THREADS)), *meanwhile],
                timeout=BARRIER_TIMEOUT * 2,
            )
        ),
        timeout=BARRIER_TIMEOUT * 2,
    )
    errors = [f"process {index}: {error}" for index, (_, error) in enumerate(processes) if error]
    errors += [
        "".join(traceback.format_exception(outcome))
        for outcome in threads
        if isinstance(outcome, BaseException)
    ]
    assert not errors, "\n".join(errors)
    collected = [value for value, _ in processes] + threads[:THREADS]
    assert len(collected) == PARTIES
    return collected


def _check_no_overlap(grants: list[Grant]) -> None:
    """Tokens unique and gap-free; each grant starts no earlier than the previous ended."""
    ordered = sorted(grants, key=lambda grant: grant["token"])
    tokens = [grant["token"] for grant in ordered]
    assert tokens == list(range(1, len(ordered) + 1)), f"tokens not 1..n: {tokens}"
    for previous, following in itertools.pairwise(ordered):
        previous_end: datetime = previous["end"]
        following_start: datetime = following["start"]
        assert following_start >= previous_end, (
            f"two live holders: token {following['token']} ({following['holder']}) granted "
            f"at {following_start} before token {previous['token']} ({previous['holder']}) "
            f"ended at {previous_end}"
        )


def test_one_winner_per_round_and_tokens_rise_by_one(vendor: str) -> None:
    rounds = _rounds(vendor)
    plan = _plan(rounds)
    key = unique_key("race:rounds")
    barrier = FORK.Barrier(PARTIES)
    outcomes = _run_contenders(lambda name: contend_in_rounds(name, key, plan, barrier), barrier)

    attempts = sum(made for made, _ in outcomes)
    assert attempts == PARTIES * rounds, "some contender skipped a round"
    grants = [grant for _, won in outcomes for grant in won]
    by_round: dict[int, list[Grant]] = {}
    for grant in grants:
        by_round.setdefault(grant["round"], []).append(grant)
    for number in range(rounds):
        winners = by_round.get(number, [])
        assert len(winners) == 1, f"round {number} had {len(winners)} winners: {winners}"
        assert winners[0]["token"] == number + 1, f"round {number}: {winners[0]}"
    _check_no_overlap(grants)
    row = Lease.objects.get(key=key)
    assert row.token == rounds


def test_no_two_live_holders_in_a_free_for_all(vendor: str) -> None:
    key = unique_key("race:free")
    wanted = _grants(vendor)
    start = FORK.Barrier(PARTIES + 1)
    stop = FORK.Event()

    def stop_once_granted_enough() -> None:
        try:
            start.wait(BARRIER_TIMEOUT)
            wait_until(
                lambda: Lease.objects.filter(key=key, token__gte=wanted).exists(),
                BARRIER_TIMEOUT,
                what=f"{wanted} grants of the key",
            )
        finally:
            stop.set()

    outcomes = _run_contenders(
        lambda name: contend_free_for_all(name, key, start, stop),
        start,
        meanwhile=[stop_once_granted_enough],
    )
    grants = [grant for _, won in outcomes for grant in won]
    assert len(grants) >= wanted, f"too few takeovers to mean anything: {len(grants)}"
    _check_no_overlap(grants)
    row = Lease.objects.get(key=key)
    assert row.token == len(grants), "a grant was not reported by its contender"

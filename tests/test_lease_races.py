"""Races on one key: 16 threads and 4 processes acquiring at once, with real commits.

Two tests:

* **rounds** — every contender waits at a barrier, then all acquire the key at once. Exactly
  one wins each round. Before the next round the winner gives the key up: it releases it, or
  (every ``LAPSE_EVERY``-th round) lets it lapse, so every round is a takeover and the tokens
  must run 1, 2, 3, … with no gap and no repeat.
* **free-for-all** — every contender acquires in a loop with a 50 ms TTL and nobody releases,
  so takeovers happen exactly at lapse time, under contention.

In both, every grant is recorded with the database's own timestamps (``renewed_at`` is the
database time of the grant, ``expires_at`` and ``released_at`` its end), and the checker
verifies, in token order, that each grant began no earlier than the previous one ended on the
database clock: no two contenders ever held the key live at the same moment.

Processes are started with the ``spawn`` method (never fork with open connections) and set
Django up against this test's database.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from django.db import connections

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

THREADS = 16
PROCESSES = 4
PARTIES = THREADS + PROCESSES
LONG_TTL = 60.0
LAPSE_TTL = 1.0
LAPSE_MARGIN = 0.3
LAPSE_EVERY = 25
HAMMER_TTL = 0.05
BARRIER_TIMEOUT = 120.0

Grant = dict[str, Any]


def _rounds(vendor: str) -> int:
    return 200 if vendor == "postgresql" else 30


def _plan(rounds: int) -> list[tuple[int, float, bool]]:
    """``(round, ttl, lapse)`` for each round; a lapse round's winner lets its lease lapse."""
    every = LAPSE_EVERY if rounds >= 100 else 10
    plan = []
    for number in range(rounds):
        lapse = number % every == every - 1
        plan.append((number, LAPSE_TTL if lapse else LONG_TTL, lapse))
    return plan


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
    contender: str, key: str, plan: list[tuple[int, float, bool]], barrier: Any
) -> tuple[int, list[Grant]]:
    """One contender's part in the rounds test; returns (attempts made, grants won)."""
    from django_leases.models import Lease

    attempts, grants = 0, []
    for round_number, ttl, lapse in plan:
        barrier.wait(BARRIER_TIMEOUT)
        lease = Lease.objects.acquire(key, f"{contender}:r{round_number}", ttl)
        attempts += 1
        barrier.wait(BARRIER_TIMEOUT)  # every contender has tried this round
        if lease is None:
            continue
        grant = _grant(lease, contender, round_number)
        if lapse:
            time.sleep(ttl + LAPSE_MARGIN)
        else:
            Lease.objects.release(lease)
            # The next round cannot start before this contender reaches the barrier, so
            # the row still belongs to this grant.
            row = Lease.objects.get(key=key)
            assert row.token == lease.token, (row.token, lease.token)
            assert row.released_at is not None
            grant["end"] = row.released_at
        grants.append(grant)
    return attempts, grants


def contend_free_for_all(
    contender: str, key: str, start: Any, stop: Any
) -> tuple[int, list[Grant]]:
    """Acquire ``key`` in a loop until ``stop`` is set; every attempt is a fresh holder."""
    from django_leases.models import Lease

    attempts, grants = 0, []
    start.wait(BARRIER_TIMEOUT)
    while not stop.is_set():
        lease = Lease.objects.acquire(key, f"{contender}:{attempts}", HAMMER_TTL)
        attempts += 1
        if lease is not None:
            grants.append(_grant(lease, contender, None))
        time.sleep(0.002)
    return attempts, grants


def _process_main(
    database_url: str, target: str, args: tuple[Any, ...], results: Any, index: int
) -> None:
    """Entry point of a spawned contender process: set Django up, contend, report."""
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    try:
        import django

        django.setup()
        from django.db import connections as process_connections

        try:
            results.put(("ok", index, globals()[target](*args)))
        finally:
            process_connections.close_all()
    except BaseException:
        results.put(("error", index, traceback.format_exc()))
        for arg in args:
            if hasattr(arg, "abort"):
                arg.abort()  # a broken barrier ends the others' waits at once


def _run_contenders(
    database_url: str,
    target: str,
    thread_args: Callable[[str], tuple[Any, ...]],
    context: Any,
    during: Callable[[], None] | None = None,
) -> list[tuple[int, list[Grant]]]:
    """Run THREADS contender threads here and PROCESSES contender processes; collect."""
    results = context.Queue()
    processes = [
        context.Process(
            target=_process_main,
            args=(database_url, target, thread_args(f"p{index}"), results, index),
            name=f"race-contender-p{index}",
        )
        for index in range(PROCESSES)
    ]
    for process in processes:
        process.start()

    outcomes: list[tuple[int, list[Grant]] | None] = [None] * THREADS
    errors: list[str] = []

    def run_thread(index: int) -> None:
        args = thread_args(f"t{index}")
        try:
            outcomes[index] = globals()[target](*args)
        except BaseException:
            errors.append(traceback.format_exc())
            for arg in args:
                if hasattr(arg, "abort"):
                    arg.abort()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run_thread, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    if during is not None:
        during()
    for thread in threads:
        thread.join()
    collected: list[tuple[int, list[Grant]]] = [o for o in outcomes if o is not None]
    for _ in processes:
        status, index, payload = results.get(timeout=BARRIER_TIMEOUT * 2)
        if status == "ok":
            collected.append(payload)
        else:
            errors.append(f"process {index}:\n{payload}")
    for process in processes:
        process.join(30)
    assert not errors, "\n".join(errors)
    assert all(process.exitcode == 0 for process in processes)
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


@pytest.fixture
def database_url(subprocess_env: dict[str, str]) -> str:
    return subprocess_env["DATABASE_URL"]


def test_one_winner_per_round_and_tokens_rise_by_one(database_url: str, vendor: str) -> None:
    from django_leases.models import Lease

    rounds = _rounds(vendor)
    plan = _plan(rounds)
    key = f"race:rounds:{uuid.uuid4().hex[:8]}"
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PARTIES)
    outcomes = _run_contenders(
        database_url,
        "contend_in_rounds",
        lambda name: (name, key, plan, barrier),
        context,
    )

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


def test_no_two_live_holders_in_a_free_for_all(database_url: str, vendor: str) -> None:
    from django_leases.models import Lease

    key = f"race:free:{uuid.uuid4().hex[:8]}"
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(PARTIES + 1)
    stop = context.Event()

    def let_them_run() -> None:
        start.wait(BARRIER_TIMEOUT)
        time.sleep(3.0 if vendor == "postgresql" else 2.0)
        stop.set()

    outcomes = _run_contenders(
        database_url,
        "contend_free_for_all",
        lambda name: (name, key, start, stop),
        context,
        during=let_them_run,
    )
    grants = [grant for _, won in outcomes for grant in won]
    assert len(grants) >= 5, f"too few takeovers to mean anything: {len(grants)}"
    _check_no_overlap(grants)
    row = Lease.objects.get(key=key)
    assert row.token == len(grants), "a grant was not reported by its contender"

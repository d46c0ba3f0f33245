"""Keyed queues at scale, on every backend and both SQL paths: per-key limits behind many
full keys, thousands of keys, look-alike and long keys, limits changed while steps run,
racing claimers, and per-key rows pruned as keys come and go (docs/howto/fairness.md)."""

from __future__ import annotations

import unicodedata
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from django_leases.models import (
    WorkflowQueueKey,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
)
from django_leases.workflows import (
    start_workflow,
)
from tests.helpers import finish_step, limited_queues, race, tuned_sql, with_queues

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0
QUEUES: dict[str, dict[str, Any]] = {
    "bk-keyed": {"key_concurrency": 1},
    "bk-keyed2": {"key_concurrency": 2},
    "bk-rated": {"key_rate": "2/h"},
    "bk-both": {"concurrency": 5, "key_concurrency": 2, "key_rate": "3/h"},
}
FUNCTIONS = {
    "tests.bk.keyed": "bk-keyed",
    "tests.bk.keyed2": "bk-keyed2",
    "tests.bk.rated": "bk-rated",
    "tests.bk.both": "bk-both",
}


@pytest.fixture(autouse=True)
def _queues() -> Iterator[None]:
    with limited_queues(QUEUES, FUNCTIONS):
        yield


def _queue(key: str, names: list[str], function: str = "tests.bk.keyed") -> uuid.UUID:
    run_id = start_workflow("tests.idle", {}, queue_key=key)
    for name in names:
        WorkflowStep.objects.schedule(
            run_id, name, function, {}, queue=FUNCTIONS[function], queue_key=key
        )
    return run_id


def _running_per_key(queue: str) -> Counter[str]:
    return Counter(
        WorkflowStep.objects.holding_slots().filter(queue=queue).values_list("queue_key", flat=True)
    )


# -- keyed queues --------------------------------------------------------------------------------


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
def test_a_cold_key_is_claimed_behind_more_than_twenty_keys_at_their_limit(sql_path: str) -> None:
    """fairness.md: "A key at its key_concurrency or out of its key_rate is passed over (only
    that key: the others are still claimed)". With 3,000 tenants, more than 20 hot keys at
    their limit is ordinary; a cold key whose turn comes after theirs must still be claimed."""
    with tuned_sql(sql_path == "tuned"):
        hot = [f"hot-{i:02d}" for i in range(25)]
        for key in hot:
            _queue(key, [f"{key}-a", f"{key}-b"])
        for _ in hot:  # each hot key gets its one slot (never-claimed keys first)
            claim = WorkflowStep.objects.claim_due(LEASE, queues=["bk-keyed"])
            assert claim is not None and claim.step_name.endswith("-a")
        # Now every hot key is at its key_concurrency (1) with a step waiting. A cold key is
        # claimed (after them: its turn is later than theirs), finishes, and queues again.
        _queue("cold", ["cold-1"])
        claim = WorkflowStep.objects.claim_due(LEASE, queues=["bk-keyed"])
        assert claim is not None and claim.step_name == "cold-1"
        finish_step("cold-1")
        cold_run = WorkflowStep.objects.get(step_name="cold-1").run_id
        WorkflowStep.objects.schedule(
            cold_run, "cold-2", "tests.bk.keyed", {}, queue="bk-keyed", queue_key="cold"
        )
        claim = WorkflowStep.objects.claim_due(LEASE, queues=["bk-keyed"])
        assert claim is not None, (
            "the cold key's due step was not claimed: the claim gave up after passing over "
            "the hot keys at their limit"
        )
        assert claim.step_name == "cold-2"


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
def test_a_cold_key_is_claimed_by_a_worker_of_every_queue_behind_many_full_keys(
    sql_path: str,
) -> None:
    """The same for a worker of every queue (no --queue): the default worker."""
    with tuned_sql(sql_path == "tuned"):
        hot = [f"hot-{i:02d}" for i in range(25)]
        for key in hot:
            _queue(key, [f"{key}-a", f"{key}-b"])
        for _ in hot:
            assert WorkflowStep.objects.claim_due(LEASE) is not None
        _queue("cold", ["cold-1"])
        assert WorkflowStep.objects.claim_due(LEASE).step_name == "cold-1"
        finish_step("cold-1")
        cold_run = WorkflowStep.objects.get(step_name="cold-1").run_id
        WorkflowStep.objects.schedule(
            cold_run, "cold-2", "tests.bk.keyed", {}, queue="bk-keyed", queue_key="cold"
        )
        claim = WorkflowStep.objects.claim_due(LEASE)
        assert claim is not None and claim.step_name == "cold-2"


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
def test_a_cold_key_is_claimed_behind_more_than_twenty_keys_out_of_their_key_rate(
    sql_path: str,
) -> None:
    """The same with key_rate ("2/h"): keys out of their rate are passed over, only them."""
    with tuned_sql(sql_path == "tuned"):
        hot = [f"hot-{i:02d}" for i in range(22)]
        for key in hot:
            _queue(key, [f"{key}-a", f"{key}-b", f"{key}-c"], "tests.bk.rated")
        claimed = 0
        while (claim := WorkflowStep.objects.claim_due(LEASE, queues=["bk-rated"])) is not None:
            finish_step(claim.step_name)
            claimed += 1
            if claimed == 2 * len(hot):
                break
        assert claimed == 2 * len(hot)
        # Every hot key is out of its key_rate, with a step waiting. A cold key is claimed
        # once after them (1 of its 2 starts), finishes, and queues again.
        cold_run = _queue("cold", ["cold-1"], "tests.bk.rated")
        claim = WorkflowStep.objects.claim_due(LEASE, queues=["bk-rated"])
        assert claim is not None and claim.step_name == "cold-1"
        finish_step("cold-1")
        WorkflowStep.objects.schedule(
            cold_run, "cold-2", "tests.bk.rated", {}, queue="bk-rated", queue_key="cold"
        )
        claim = WorkflowStep.objects.claim_due(LEASE, queues=["bk-rated"])
        assert claim is not None and claim.step_name == "cold-2"


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
def test_keys_differing_in_case_spaces_or_normalisation_are_distinct_keys(sql_path: str) -> None:
    """A key is any str of 1-255 characters; "a", "A" and "a " are three keys on every backend
    (tests/settings.py, backends.md), and so are NFC and NFD forms."""
    nfc = unicodedata.normalize("NFC", "café")
    nfd = unicodedata.normalize("NFD", "café")
    keys = ["tenant", "Tenant", "tenant ", "TENANT", nfc, nfd, "ß", "ss"]
    with tuned_sql(sql_path == "tuned"):
        for index, key in enumerate(keys):
            _queue(key, [f"s{index}"])
        names = set()
        while (claim := WorkflowStep.objects.claim_due(LEASE, queues=["bk-keyed"])) is not None:
            names.add(claim.step_name)
        assert names == {f"s{i}" for i in range(len(keys))}
        rows = sorted(
            WorkflowQueueKey.objects.filter(queue="bk-keyed").values_list("key", flat=True)
        )
        assert sorted(rows) == sorted(keys)


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
def test_a_key_of_255_four_byte_characters_is_claimed_counted_and_pruned(sql_path: str) -> None:
    long_key = "\U0001f600" * 255
    other = "\U0001f600" * 254 + "\U0001f601"
    with tuned_sql(sql_path == "tuned"):
        _queue(long_key, ["l1", "l2"])
        _queue(other, ["o1"])
        got = []
        while (claim := WorkflowStep.objects.claim_due(LEASE, queues=["bk-keyed"])) is not None:
            got.append(claim.step_name)
        assert sorted(got) == ["l1", "o1"]
        finish_step("l1")
        finish_step("o1")
        claim = WorkflowStep.objects.claim_due(LEASE, queues=["bk-keyed"])
        assert claim is not None and claim.step_name == "l2"
        finish_step("l2")
        assert set(WorkflowQueueKey.objects.values_list("key", flat=True)) == {long_key, other}
        assert WorkflowQueueKey.objects.prune_idle() == 2
        assert not WorkflowQueueKey.objects.exists()


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
def test_lowering_key_concurrency_while_steps_run_admits_nothing_until_below(
    sql_path: str,
) -> None:
    with tuned_sql(sql_path == "tuned"):
        _queue("k", ["k1", "k2", "k3", "k4"], "tests.bk.keyed2")
        assert WorkflowStep.objects.claim_due(LEASE, queues=["bk-keyed2"]) is not None
        assert WorkflowStep.objects.claim_due(LEASE, queues=["bk-keyed2"]) is not None
        assert WorkflowStep.objects.claim_due(LEASE, queues=["bk-keyed2"]) is None
        with override_settings(
            DJANGO_LEASES=with_queues({**QUEUES, "bk-keyed2": {"key_concurrency": 1}})
        ):
            finish_step(WorkflowStep.objects.filter(status="running").first().step_name)
            # one still runs: at the new limit of 1
            assert WorkflowStep.objects.claim_due(LEASE, queues=["bk-keyed2"]) is None
            assert _running_per_key("bk-keyed2") == {"k": 1}


def _claim_until_none(queue: str, *, rounds: int = 60) -> list[str]:
    got = []
    for _ in range(rounds):
        claim = WorkflowStep.objects.claim_due(LEASE, queues=[queue])
        if claim is None:
            break
        got.append(claim.step_name)
    return got


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
def test_key_limits_hold_when_threads_race_claims(sql_path: str, vendor: str) -> None:
    """bk-both: concurrency 5, key_concurrency 2, key_rate 3/h; 3 hot keys of 8 steps and
    6 cold keys of 1. Racing claimers never exceed any limit, and every key is served."""
    hot = ["h0", "h1", "h2"]
    cold = [f"c{i}" for i in range(6)]
    with tuned_sql(sql_path == "tuned"):
        for key in hot:
            _queue(key, [f"{key}-{n}" for n in range(8)], "tests.bk.both")
        for key in cold:
            _queue(key, [f"{key}-0"], "tests.bk.both")
        threads = 4 if vendor != "sqlite" else 3
        results = race([lambda: _claim_until_none("bk-both") for _ in range(threads)])
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors
        running = _running_per_key("bk-both")
        assert sum(running.values()) <= 5, running
        assert all(n <= 2 for n in running.values()), running
        # Finish all running ones and race again, until nothing is left to claim.
        for _ in range(20):
            for step in WorkflowStep.objects.filter(queue="bk-both", status="running"):
                assert WorkflowStep.objects.set_result(step.pk, None, step.attempt)
            results = race([lambda: _claim_until_none("bk-both") for _ in range(threads)])
            assert not [r for r in results if isinstance(r, BaseException)]
            running = _running_per_key("bk-both")
            assert sum(running.values()) <= 5, running
            assert all(n <= 2 for n in running.values()), running
            if not running:
                break
        started = Counter(
            WorkflowStepAttempt.objects.filter(step__queue="bk-both").values_list(
                "step__queue_key", flat=True
            )
        )
        # key_rate 3/h: each hot key started exactly 3 (the rest wait for the window), each
        # cold key its one step.
        assert {k: started[k] for k in hot} == {k: 3 for k in hot}, started
        assert {k: started[k] for k in cold} == {k: 1 for k in cold}, started


def test_prune_keeps_per_key_rows_bounded_as_keys_come_and_go() -> None:
    """Keys that come and go: after their work is done, retention deletes their rows."""
    for wave in range(3):
        keys = [f"w{wave}-{i}" for i in range(40)]
        for key in keys:
            _queue(key, [f"{key}-s"])
        names = _claim_until_none("bk-keyed", rounds=100)
        assert len(names) == 40
        for name in names:
            finish_step(name)
        assert WorkflowQueueKey.objects.count() == 40
        WorkflowRun.objects.filter(status="running").update(status="succeeded")
        assert WorkflowQueueKey.objects.prune_idle(batch_size=7) == 40
        assert WorkflowQueueKey.objects.count() == 0


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
def test_3000_keys_a_hot_key_and_a_cold_one_the_claim_stays_bounded(sql_path: str) -> None:
    """3,000 tenants with one due step each, a hot key with 200: every claim is a few
    statements and the hot key gets one turn per round of the other keys."""
    from django.test.utils import CaptureQueriesContext

    run_id = start_workflow("tests.idle", {}, queue_key="hot")
    rows = []
    base = WorkflowStep.objects.get_queryset().model
    for i in range(200):
        WorkflowStep.objects.schedule(
            run_id, f"hot-{i}", "tests.bk.keyed2", {}, queue="bk-keyed2", queue_key="hot"
        )
    template = WorkflowStep.objects.get(step_name="hot-0")
    for i in range(3000):
        rows.append(
            base(
                **{
                    f.attname: getattr(template, f.attname)
                    for f in base._meta.concrete_fields
                    if f.attname not in ("id", "step_name", "queue_key")
                },
                step_name=f"t-{i}",
                queue_key=f"tenant-{i:04d}",
            )
        )
    base.objects.bulk_create(rows, batch_size=500)
    with tuned_sql(sql_path == "tuned"):
        got = []
        with CaptureQueriesContext(connection) as queries:
            for _ in range(10):
                claim = WorkflowStep.objects.claim_due(LEASE, queues=["bk-keyed2"])
                assert claim is not None
                got.append(claim.step_name)
        assert got[0] == "hot-0"
        assert all(name.startswith("t-") for name in got[1:]), got
        assert len(queries) <= 10 * 20, len(queries)

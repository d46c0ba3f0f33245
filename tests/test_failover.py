"""A primary SIGKILLed and its streaming standby promoted, under holders that take leases and
make fenced writes through a libpq multi-host URL: what ``docs/operations/replication.md``
promises for an asynchronous and a synchronous standby (issue 25, item 4).

PostgreSQL only (the PostgreSQL pass of ``make test``): private clusters on ports 5441-5449
in a temporary directory, made with the server programs of the test server's major version
(``tests/pgcluster.py``; as root they run as ``postgres``). Without server programs the tests
are skipped on a developer's machine and fail under ``CI=true``. The scenario is
``tests/failover.py``; about 20 s for the three runs on an idle 2-core machine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

# The clusters are driven through psycopg 3 (tests/pgcluster.py): on the psycopg2 pass this
# module is skipped whole, as its psycopg3_only mark says (hence the imports below it).
# ruff: noqa: E402
psycopg = pytest.importorskip("psycopg", reason="the test clusters are driven by psycopg 3")

from django.db import connection, connections

from django_leases import health
from django_leases.checks import check_replication
from django_leases.models import Lease
from django_leases.models.lease import EPOCH_SPAN, token_epoch
from tests.failover import Outcome, run_failover
from tests.helpers import tuned_sql
from tests.pgcluster import Clusters, server_bindir

pytestmark = [pytest.mark.postgres_only, pytest.mark.psycopg3_only, pytest.mark.slow]

#: Keys the "before" phase grants once and releases, on each SQL path, for the "after"
#: phase to take over on the promoted server.
OLD_KEYS = {"tuned": "failover:old-tuned", "portable": "failover:old-portable"}


@pytest.fixture(scope="module")
def clusters(django_db_blocker: Any) -> Iterator[Clusters]:
    """Private clusters for the module's runs (one ``initdb``). The tests use no test
    database: the holders' aliases are made by the scenario (Django's test cases would
    refuse them), so database access is unblocked for the module's tests."""
    settings = connection.settings_dict
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    with psycopg.connect(
        host=settings["HOST"] or "127.0.0.1",
        port=settings["PORT"] or 5432,
        user=settings["USER"] or "postgres",
        password=settings["PASSWORD"] or None,
        dbname="postgres",
    ) as server:
        major = int(server.info.server_version) // 10000
    bindir = server_bindir(major)
    if bindir is None:
        message = "no PostgreSQL server programs (initdb, pg_basebackup, postgres) here"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message}: the failover tests must run (CI=true)")
        pytest.skip(message)
    with django_db_blocker.unblock(), Clusters(bindir) as made:
        yield made


def _observe(phase: str, alias: str) -> dict[str, Any]:
    """Before the failover: what the checks say, and a lease on each path's old key granted
    and released (token 1) and replayed on the standby. After it: the tokens both SQL paths
    grant on the promoted server, and what the checks say there."""
    leases = Lease.objects.db_manager(alias)
    seen: dict[str, Any] = {"finding": health.check_replication(alias)}
    state_warning = seen["finding"].message if seen["finding"].status == "warning" else None
    seen["w032"] = [m.id for m in check_replication(alias, state_warning)]
    if phase == "before":
        for path, key in OLD_KEYS.items():
            with tuned_sql(path == "tuned"):
                lease = leases.acquire(key, f"before-{path}", 60)
                assert lease is not None and lease.token == 1
                assert leases.release(lease)
        with connections[alias].cursor() as cursor:  # wait until the standby replayed them
            cursor.execute("SELECT pg_current_wal_lsn()")
            written = cursor.fetchone()[0]
            deadline = time.monotonic() + 60
            while True:
                cursor.execute(
                    "SELECT bool_and(replay_lsn >= %s::pg_lsn) FROM pg_stat_replication",
                    [written],
                )
                if cursor.fetchone()[0] or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        return seen
    for path in OLD_KEYS:
        with tuned_sql(path == "tuned"):
            taken = leases.acquire(OLD_KEYS[path], f"after-{path}", 60)
            new = leases.acquire(f"failover:new-{path}", f"after-{path}", 60)
            again = leases.acquire(f"failover:new-{path}", f"after-{path}", 60)
            assert taken is not None and new is not None and again is not None
            seen[path] = {"takeover": taken.token, "new": new.token, "kept": again.token}
    connections[alias].close()
    return seen


def _assert_epochs(outcome: Outcome) -> None:
    """Tokens of the first timeline before the cut, of the second after the promotion: every
    key's first grant on the fresh cluster is 1, and the promoted server's grants start
    above every earlier token."""
    before, after = outcome.before_cut(), outcome.after_promotion()
    assert before and after
    assert {token_epoch(g.token) for g in before} == {0}
    assert {token_epoch(g.token) for g in after} == {1}
    first: dict[str, int] = {}
    for grant in sorted(outcome.grants, key=lambda g: g.answered):
        first.setdefault(grant.key, grant.token)
    assert set(first.values()) == {1}, first
    highest_before = max(g.token for g in outcome.grants if g.answered < outcome.killed_at)
    assert min(g.token for g in after) > highest_before
    seen = outcome.observed["after"]
    floor = (outcome.timeline - 1) * EPOCH_SPAN
    for path in OLD_KEYS:
        # A key last granted (token 1) before the promotion, taken over after it; a key new
        # on the promoted server; its live holder acquiring it again keeps the token.
        assert seen[path] == {"takeover": floor + 1, "new": floor + 1, "kept": floor + 1}, path
    assert seen["finding"].status == "ok"
    assert seen["finding"].message == "no standby is connected"


def _assert_step_epochs(outcome: Outcome) -> None:
    """Steps claimed before the failover fence with bare attempt numbers (epoch 0); steps
    claimed on the promoted server with tokens of its epoch, above every earlier one."""
    before = [e for e in outcome.executions if e.claimed < outcome.killed_at]
    after = [e for e in outcome.executions if e.claimed >= outcome.promoted_at]
    assert before and after
    assert {token_epoch(e.token) for e in before} == {0}
    assert {token_epoch(e.token) for e in after} == {outcome.timeline - 1}
    assert all(e.token == e.attempt for e in before)
    assert min(e.token for e in after) > max(e.token for e in before)


def test_an_asynchronous_promotion_loses_writes_but_issues_no_token_twice(
    clusters: Clusters,
) -> None:
    outcome = run_failover(clusters, synchronous=False, name="_async", observe=_observe)
    figures = outcome.figures()
    # The failover is what the test says: the promoted server lacks commits the holders saw
    # succeed (the replication's RPO, which no lease can undo).
    assert outcome.timeline == 2
    assert outcome.acknowledged_writes_lost > 0, figures
    # What the epoch promises.
    assert outcome.tokens_issued_twice == 0, figures
    assert outcome.tokens_below_an_earlier_grant == 0, figures
    assert outcome.store_writes_under_a_shared_token == 0, figures
    _assert_epochs(outcome)
    # Steps: claims the promoted server never received are granted again, so an attempt
    # runs twice (the RPO again); but its fence token never names two executions, and every
    # token of the promoted server's claims is above every token before it.
    assert outcome.steps_run_twice > 0, figures
    assert outcome.step_results_lost > 0, figures
    assert outcome.step_tokens_issued_twice == 0, figures
    _assert_step_epochs(outcome)
    # And the checks said so before it happened.
    before = outcome.observed["before"]
    assert outcome.warning is not None and "replicate asynchronously" in outcome.warning
    assert before["finding"].status == "warning"
    assert before["finding"].details["asynchronous"] == 1
    assert before["w032"] == ["django_leases.W032"]


def test_without_epochs_the_same_failover_issues_tokens_twice(clusters: Clusters) -> None:
    """The test above can fail: the previous release's acquire (no epoch) in the same
    failover grants tokens the lost commits had granted already, to other holders."""
    outcome = run_failover(clusters, synchronous=False, epoch=False, name="_noepoch")
    figures = outcome.figures()
    assert outcome.acknowledged_writes_lost > 0, figures
    assert outcome.tokens_issued_twice > 0, figures
    assert outcome.tokens_below_an_earlier_grant > 0, figures
    # A step attempt claimed again runs under the same bare attempt number as its first
    # execution: the external store takes both executions' writes under one token.
    assert outcome.steps_run_twice > 0, figures
    assert outcome.step_tokens_issued_twice == outcome.steps_run_twice, figures


def test_a_synchronous_promotion_loses_nothing(clusters: Clusters) -> None:
    outcome = run_failover(clusters, synchronous=True, commit="on", name="_sync", observe=_observe)
    figures = outcome.figures()
    assert outcome.timeline == 2
    # Commits were waiting for the standby when the primary died: none of them was
    # acknowledged, and every one that was is on the promoted server.
    assert outcome.waiting_at_kill >= 1, figures
    assert outcome.acknowledged_writes_lost == 0, figures
    assert outcome.tokens_issued_twice == 0, figures
    assert outcome.tokens_below_an_earlier_grant == 0, figures
    assert outcome.store_writes_under_a_shared_token == 0, figures
    _assert_epochs(outcome)
    assert outcome.steps_run_twice == 0, figures
    assert outcome.step_results_lost == 0, figures
    assert outcome.step_tokens_issued_twice == 0, figures
    _assert_step_epochs(outcome)
    assert outcome.warning is None
    before = outcome.observed["before"]
    assert before["finding"].status == "ok"
    assert before["finding"].message == "1 standby(s), each synchronous"
    assert before["w032"] == []

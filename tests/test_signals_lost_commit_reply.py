"""A run lease granted by a pick whose commit reply was lost is announced as it is given back.

Rule (``signals.py``, ``announce()``): receivers hear of the grants and releases that
happened, each once; a (key, token) announced released was announced acquired. The
portable pick of a run's pass (SQLite, MariaDB, and PostgreSQL without tuned SQL) takes the
run lease inside its transaction. When the commit lands but its reply is lost, the pick
raises and ``put_back_passes`` releases the lease it may hold — the grant happened (there is
a row to release). Its ``lease_acquired`` was dropped with the failed commit's
``on_commit``, so it is sent as the grant is given back, before its ``lease_released``:
counters (``metrics``) never see more releases than grants.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper

from django_leases.models import Lease, WorkflowRun
from django_leases.signals import lease_acquired, lease_released
from django_leases.workflows.values import RUN_LEASE_PREFIX
from tests.helpers import tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def heard() -> Iterator[dict[str, list[tuple[str, int]]]]:
    log: dict[str, list[tuple[str, int]]] = {"acquired": [], "released": []}

    def acquired(sender: Any, lease: Lease, **kwargs: Any) -> None:
        if lease.key.startswith(RUN_LEASE_PREFIX):
            log["acquired"].append((lease.key, lease.token))

    def released(sender: Any, lease: Lease, **kwargs: Any) -> None:
        if lease.key.startswith(RUN_LEASE_PREFIX):
            log["released"].append((lease.key, lease.token))

    lease_acquired.connect(acquired, weak=False)
    lease_released.connect(released, weak=False)
    yield log
    lease_acquired.disconnect(acquired)
    lease_released.disconnect(released)


def test_a_pick_whose_commit_reply_was_lost_announces_the_grant_it_gives_back(
    monkeypatch: pytest.MonkeyPatch, heard: dict[str, list[tuple[str, int]]]
) -> None:
    run = WorkflowRun.objects.start("lost-commit.pick", {})
    real_commit = BaseDatabaseWrapper._commit  # type: ignore[attr-defined]
    armed = [True]

    def reply_lost(self: BaseDatabaseWrapper) -> None:
        real_commit(self)  # the commit lands...
        if armed and self.alias == "default":
            armed.clear()
            raise DatabaseError("the commit's reply was lost (test)")  # ...its reply does not

    with tuned_sql(False):
        monkeypatch.setattr(BaseDatabaseWrapper, "_commit", reply_lost)
        with pytest.raises(DatabaseError):
            WorkflowRun.objects.claim_due_pass(60, lease_holder="lost-reply-pick")
        monkeypatch.undo()
    key = f"{RUN_LEASE_PREFIX}{run.id}"
    row = Lease.objects.with_state().get(key=key)
    assert row.released_at is not None, "put_back_passes gave the landed grant back"
    assert heard["released"] == [(key, row.token)]
    assert heard["acquired"] == heard["released"], (
        "a release was announced for a grant never announced acquired"
    )

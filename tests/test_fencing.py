"""Fenced writes to the application's own rows (:mod:`django_leases.fencing`): a stale lease
holder's and a superseded step attempt's ``UPDATE`` is refused at the user's table, and the
trigger refuses an older fence from raw SQL."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction

from django_leases.exceptions import FenceRefusedError
from django_leases.fencing import Fence, lease_fence, step_fence, trigger_sql
from django_leases.models import Lease, WorkflowRun, WorkflowStep
from tests.helpers import lapse_lease, lapse_step_lease, unique_key
from tests.workapp.models import Account, GuardedAccount

pytestmark = pytest.mark.django_db


def _balance(model: type[Account] | type[GuardedAccount], name: str) -> tuple[int, str, int]:
    row = model.objects.get(name=name)
    return row.balance, row.fenced_by, row.fence


def test_a_stale_lease_holder_is_refused_at_the_users_table() -> None:
    key = unique_key("fence")
    Account.objects.create(name="a")
    old = Lease.objects.acquire(key, "one", 60)
    assert old is not None
    assert Account.objects.filter(name="a").fenced_update(old, balance=10) == 1
    lapse_lease(key)
    new = Lease.objects.acquire(key, "two", 60)
    assert new is not None and new.token == old.token + 1
    # The old holder's lease is no longer live: refused, whoever wrote last.
    assert Account.objects.filter(name="a").fenced_update(old, balance=99) == 0
    assert _balance(Account, "a") == (10, key, old.token)
    assert Account.objects.filter(name="a").fenced_update(new, balance=20) == 1
    assert _balance(Account, "a") == (20, key, new.token)
    with pytest.raises(FenceRefusedError) as refused:
        Account.objects.filter(name="a").fenced_update(old, strict=True, balance=99)
    assert (refused.value.key, refused.value.token) == (key, old.token)
    assert _balance(Account, "a") == (20, key, new.token)


def test_the_stored_fence_refuses_an_older_token_without_the_liveness_check() -> None:
    """What covers the instant between a takeover and the stale holder's statement (or rows
    on another database than the lease): the fence stored on the row never goes back."""
    Account.objects.create(name="b")
    assert Account.objects.filter(name="b").fenced_update(Fence("k", 5), balance=5) == 1
    assert Account.objects.filter(name="b").fenced_update(Fence("k", 4), balance=4) == 0
    assert Account.objects.filter(name="b").fenced_update(Fence("k", 5), balance=6) == 1
    # Another key takes the row over without comparison.
    assert Account.objects.filter(name="b").fenced_update(Fence("other", 1), balance=7) == 1
    assert _balance(Account, "b") == (7, "other", 1)


def test_a_superseded_attempt_is_refused_at_the_users_table() -> None:
    run = WorkflowRun.objects.start("tests.tx.one", {})
    WorkflowStep.objects.schedule(run.id, "only", "tests.tx.append")
    first = WorkflowStep.objects.claim_for_execution(run.id, "only", "tests.tx.append", 60)
    assert first is not None
    Account.objects.create(name="c")
    stale = step_fence(first.step_id, first.attempt)
    assert Account.objects.filter(name="c").fenced_update(stale, balance=1) == 1
    lapse_step_lease(first.step_id)
    second = WorkflowStep.objects.claim_for_execution(run.id, "only", "tests.tx.append", 60)
    assert second is not None and second.attempt == 2
    # Attempt 1 is no longer the step's running attempt: refused, before attempt 2 wrote.
    assert Account.objects.filter(name="c").fenced_update(stale, balance=99) == 0
    current = step_fence(second.step_id, second.attempt)
    assert Account.objects.filter(name="c").fenced_update(current, balance=2) == 1
    assert _balance(Account, "c") == (2, f"workflow-step:{first.step_id}", 2)
    # And once the attempt finished, its fence no longer writes either.
    WorkflowStep.objects.set_result(second.step_id, {}, second.attempt)
    assert Account.objects.filter(name="c").fenced_update(current, balance=3) == 0


def test_the_step_context_carries_its_fence() -> None:
    from django_leases.workflows.engine import StepContext

    run = WorkflowRun.objects.start("tests.tx.one", {})
    WorkflowStep.objects.schedule(run.id, "only", "tests.tx.append")
    claim = WorkflowStep.objects.claim_for_execution(run.id, "only", "tests.tx.append", 60)
    assert claim is not None
    import threading

    ctx = StepContext(claim, threading.Event())
    assert ctx.fence == Fence(f"workflow-step:{claim.step_id}", claim.attempt)
    Account.objects.create(name="d")
    assert Account.objects.filter(name="d").fenced_update(ctx.fence, balance=4) == 1


def test_bad_fences_are_refused_with_nothing_written() -> None:
    Account.objects.create(name="e")
    with pytest.raises(ValueError):
        Account.objects.filter(name="e").fenced_update("token", balance=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fence"):
        Account.objects.filter(name="e").fenced_update(Fence("k", 1), fence=9)
    with pytest.raises(ValueError):
        lease_fence(Lease(key="never-saved", holder="h"))
    with pytest.raises(ValueError):
        step_fence(1, 0)
    for key, token in [
        ("k", 0),
        ("k", -5),
        ("k", True),
        ("k", 2**63),
        ("k", 1.0),
        (5, 1),
        (None, 1),
        ("", 1),
        ("k" * 256, 1),
        ("k\x00", 1),
    ]:
        with pytest.raises(ValueError, match="fence"):
            Account.objects.filter(name="e").fenced_update(Fence(key, token), balance=1)  # type: ignore[arg-type]
    assert _balance(Account, "e") == (0, "", 0)
    assert Fence("k" * 255, 2**63 - 1).token == 2**63 - 1


def test_the_trigger_refuses_an_older_fence_from_raw_sql() -> None:
    GuardedAccount.objects.create(name="f")
    Account.objects.create(name="f")
    for model in (GuardedAccount, Account):
        assert model.objects.filter(name="f").fenced_update(Fence("k", 7), balance=7) == 1
    quote = connection.ops.quote_name
    stale = "UPDATE {} SET balance = 1, fence = 6 WHERE name = 'f' AND fenced_by = 'k'"
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(stale.format(quote(GuardedAccount._meta.db_table)))
    assert _balance(GuardedAccount, "f") == (7, "k", 7)
    # Newer or equal fences, and other keys, pass the trigger.
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(GuardedAccount._meta.db_table)} SET balance = 8, fence = 8 "
            "WHERE name = 'f'"
        )
        cursor.execute(
            f"UPDATE {quote(GuardedAccount._meta.db_table)} SET balance = 9, fence = 1, "
            "fenced_by = 'other' WHERE name = 'f'"
        )
    assert _balance(GuardedAccount, "f") == (9, "other", 1)
    # Without the trigger, raw SQL can move the fence back (the contrast).
    with connection.cursor() as cursor:
        cursor.execute(stale.format(quote(Account._meta.db_table)))
    assert _balance(Account, "f") == (1, "k", 6)


def test_trigger_sql_is_empty_for_other_databases() -> None:
    assert trigger_sql("oracle", "t", str) == ([], [])
    create, drop = trigger_sql("postgresql", "t", lambda name: f'"{name}"')
    assert len(create) == 2 and len(drop) == 2


def test_long_table_names_alike_at_the_start_get_triggers_of_their_own() -> None:
    quote = connection.ops.quote_name
    first, second = "app_" + "x" * 60 + "_one", "app_" + "x" * 60 + "_two"
    names = {trigger_sql("postgresql", table, str)[1][0].split()[4] for table in (first, second)}
    assert len(names) == 2 and all(len(name) <= 63 for name in names)
    # A name of up to 40 characters is kept as it was (triggers created earlier still match).
    assert trigger_sql("sqlite", "app_config", quote)[1] == [
        f"DROP TRIGGER IF EXISTS {quote('app_config_older_fence')}"
    ]

"""Fenced writes at their edges: a filter through a relation racing a newer write, a model
whose fence columns are a multi-table parent's (refused), the trigger across a later
migration of its table (SQLite rebuilds it), a stale write waiting behind a newer one,
tokens at the top of the column, and the trigger against ``update()``, raw SQL and upserts."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, models, transaction

from django_leases.fencing import Fence, restore_fence_triggers, step_fence
from django_leases.models import Lease
from tests.helpers import (
    lapse_lease,
    on_another_thread,
    start_blocked,
    unique_key,
)
from tests.workapp.models import (
    Account,
    Customer,
    FencedChild,
    FencedParent,
    GuardedAccount,
    Order,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_stale_fence_through_a_join_filter_never_moves_the_fence_back() -> None:
    """The newer holder (token 2) writes the row in an open transaction; the older one
    (token 1) sends its fenced_update with a filter through a relation (``customer__name``)
    meanwhile, and waits for the row. Once the newer one commits, the stored fence (2)
    refuses the older token: 0 rows, the row as the newer holder left it."""
    eu = Customer.objects.create(name="eu")
    order = Order.objects.create(customer=eu)
    with transaction.atomic():
        assert Order.objects.filter(pk=order.pk).fenced_update(Fence("k", 2), status="new") == 1
        stale = start_blocked(
            lambda: Order.objects.filter(customer__name="eu").fenced_update(
                Fence("k", 1), status="stale"
            )
        )
    written = stale.result()
    assert stale.waited, "the older write did not wait for the newer one: proves nothing"
    row = Order.objects.get(pk=order.pk)
    assert (written, row.status, row.fenced_by, row.fence) == (0, "new", "k", 2)
    # The filter through the relation still chooses the rows.
    assert Order.objects.filter(customer__name="us").fenced_update(Fence("k", 3)) == 0
    assert Order.objects.filter(customer__name="eu").fenced_update(Fence("k", 3)) == 1


def test_a_multi_table_child_whose_fence_is_its_parent_s_is_refused() -> None:
    """Django writes a multi-table child in one statement per table, after selecting the
    rows: no check in one statement could fence both, and a newer write or a takeover could
    land between them. ``fenced_update`` refuses it (nothing written), and a parent's write
    through the child's manager as well; the parent's own manager writes its table."""
    child = FencedChild.objects.create(status="s", note="")
    for values in ({"note": "stale"}, {"status": "stale"}, {}):
        with pytest.raises(ValueError, match="writes one table"):
            FencedChild.objects.filter(pk=child.pk).fenced_update(Fence("k", 1), **values)
    row = FencedChild.objects.get(pk=child.pk)
    assert (row.note, row.status, row.fenced_by, row.fence) == ("", "s", "", 0)
    assert FencedParent.objects.filter(pk=child.pk).fenced_update(Fence("k", 1), status="p") == 1
    assert FencedChild.objects.get(pk=child.pk).fence == 1


def test_the_fence_trigger_is_restored_after_a_later_migration_rebuilds_its_table() -> None:
    """SQLite drops a table's triggers when a migration rebuilds the table (a column
    widened, here): after ``migrate`` (``post_migrate``), the trigger of every applied
    ``FenceTrigger`` that lost it is created again, and raw SQL moving the fence back is
    refused as before. Other databases keep it through ``ALTER TABLE``."""
    GuardedAccount.objects.create(name="g")
    assert GuardedAccount.objects.filter(name="g").fenced_update(Fence("k", 5), balance=5) == 1
    table = connection.ops.quote_name(GuardedAccount._meta.db_table)
    stale = f"UPDATE {table} SET balance = 1, fence = 1 WHERE name = 'g'"
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(stale)
    old = GuardedAccount._meta.get_field("name")
    wide = models.CharField(max_length=120, unique=True)
    wide.set_attributes_from_name("name")
    wide.model = GuardedAccount
    try:
        with connection.schema_editor() as editor:
            editor.alter_field(GuardedAccount, old, wide)
        restored = restore_fence_triggers(connection.alias)
        assert restored == (
            [GuardedAccount._meta.db_table] if connection.vendor == "sqlite" else []
        )
        with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(stale)
        assert restore_fence_triggers(connection.alias) == [], "restored once"
    finally:
        with connection.schema_editor() as editor:
            editor.alter_field(GuardedAccount, wide, old)
        restore_fence_triggers(connection.alias)
    row = GuardedAccount.objects.get(name="g")
    assert (row.balance, row.fence) == (5, 5)


def test_a_stale_fence_waiting_behind_a_newer_write_is_refused() -> None:
    """The plain (one table) form of the race above."""
    Account.objects.create(name="race")
    with transaction.atomic():
        assert Account.objects.filter(name="race").fenced_update(Fence("k", 2), balance=2) == 1
        stale = start_blocked(
            lambda: Account.objects.filter(name="race").fenced_update(Fence("k", 1), balance=1)
        )
    assert stale.result() == 0
    row = Account.objects.get(name="race")
    assert (row.balance, row.fenced_by, row.fence) == (2, "k", 2)


def test_a_stale_lease_waiting_behind_the_new_holder_is_refused() -> None:
    key = unique_key("b6")
    Account.objects.create(name="lease-race")
    old = Lease.objects.acquire(key, "old", 60)
    assert old is not None
    assert Account.objects.filter(name="lease-race").fenced_update(old, balance=1) == 1
    lapse_lease(key)
    new = Lease.objects.acquire(key, "new", 60)
    assert new is not None
    with transaction.atomic():
        assert Account.objects.filter(name="lease-race").fenced_update(new, balance=2) == 1
        stale = start_blocked(
            lambda: Account.objects.filter(name="lease-race").fenced_update(old, balance=99)
        )
    assert stale.result() == 0
    row = Account.objects.get(name="lease-race")
    assert (row.balance, row.fence) == (2, new.token)


def test_fence_tokens_at_the_top_of_the_column() -> None:
    top = 2**63 - 1
    for model in (Account, GuardedAccount):
        model.objects.create(name="top")
        assert model.objects.filter(name="top").fenced_update(Fence("k", top), balance=1) == 1
        assert model.objects.filter(name="top").fenced_update(Fence("k", top - 1), balance=2) == 0
        assert model.objects.filter(name="top").fenced_update(Fence("k", top), balance=3) == 1
        row = model.objects.get(name="top")
        assert (row.balance, row.fence) == (3, top)
    quote = connection.ops.quote_name
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(GuardedAccount._meta.db_table)} SET fence = 1 WHERE name = 'top'"
        )
    with pytest.raises(ValueError):
        step_fence(1, 1, floor=top)


def test_the_trigger_refuses_a_stale_raw_write_that_also_sets_other_columns() -> None:
    GuardedAccount.objects.create(name="g")
    assert GuardedAccount.objects.filter(name="g").fenced_update(Fence("k", 5), balance=5) == 1
    quote = connection.ops.quote_name
    table = quote(GuardedAccount._meta.db_table)
    # QuerySet.update() moving the fence back, and a raw UPDATE from another thread.
    with pytest.raises(IntegrityError), transaction.atomic():
        GuardedAccount.objects.filter(name="g").update(fence=4, balance=4)

    def raw() -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {table} SET balance = 3, fence = fence - 1 WHERE name = 'g'")

    with pytest.raises(IntegrityError):
        on_another_thread(raw)
    row = GuardedAccount.objects.get(name="g")
    assert (row.balance, row.fence) == (5, 5)


def test_the_trigger_refuses_an_upsert_moving_the_fence_back() -> None:
    """bulk_create(update_conflicts=True): INSERT ... ON CONFLICT / ON DUPLICATE KEY UPDATE
    moving the fence back under the same key is an UPDATE too."""
    GuardedAccount.objects.create(name="u")
    assert GuardedAccount.objects.filter(name="u").fenced_update(Fence("k", 5), balance=5) == 1
    with pytest.raises(IntegrityError), transaction.atomic():
        GuardedAccount.objects.bulk_create(
            [GuardedAccount(name="u", balance=1, fenced_by="k", fence=1)],
            update_conflicts=True,
            unique_fields=None if connection.vendor == "mysql" else ["name"],
            update_fields=["balance", "fenced_by", "fence"],
        )
    row = GuardedAccount.objects.get(name="u")
    assert (row.balance, row.fence) == (5, 5)

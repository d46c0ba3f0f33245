"""``Lease.objects.refresh_many``: :meth:`refresh`'s rule for many held leases in one
statement (what the process's renewer sends once per tick), on every backend and SQL path."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_leases.models import Lease
from tests.helpers import lapse_lease, unique_key


@pytest.mark.django_db(transaction=True)
def test_refresh_many_refreshes_what_is_held_and_nothing_else(sql_path: str) -> None:
    keys = {name: unique_key(f"many-{name}") for name in ("a", "b", "lapsed", "gone", "stale")}
    leases = {name: Lease.objects.acquire(key, name, 60) for name, key in keys.items()}
    assert all(leases.values())
    lapse_lease(keys["lapsed"])
    assert Lease.objects.release(leases["gone"])  # released: must not come back
    stale = leases["stale"]
    assert Lease.objects.release(stale)
    taken = Lease.objects.acquire(keys["stale"], "stale", 60)  # same holder, next token
    assert taken is not None and taken.token == stale.token + 1
    before = {row.key: row for row in Lease.objects.filter(key__in=keys.values())}

    answers = Lease.objects.refresh_many(
        [
            (leases["a"], 600),
            (leases["lapsed"], 600),
            (leases["b"], timedelta(seconds=5)),
            (leases["gone"], 600),
            (stale, 600),
        ]
    )
    a, lapsed, b, gone, old = answers
    assert lapsed is None and gone is None and old is None
    assert a is not None and b is not None
    rows = {row.key: row for row in Lease.objects.filter(key__in=keys.values())}
    for name, answer, ttl in (("a", a, 600), ("b", b, 5)):
        row = rows[keys[name]]
        # Same grant, expiry moved to the database's now + its own TTL, as refresh() does.
        assert (answer.pk, answer.key, answer.holder, answer.token) == (
            row.pk,
            row.key,
            row.holder,
            row.token,
        )
        assert (answer.expires_at, answer.renewed_at) == (row.expires_at, row.renewed_at)
        assert row.expires_at - row.renewed_at == timedelta(seconds=ttl)
        assert row.renewed_at > before[keys[name]].renewed_at
    for name in ("lapsed", "gone", "stale"):  # untouched
        assert rows[keys[name]].expires_at == before[keys[name]].expires_at
        assert rows[keys[name]].renewed_at == before[keys[name]].renewed_at
    assert rows[keys["gone"]].released_at is not None
    assert Lease.objects.refresh_many([]) == []


@pytest.mark.django_db(transaction=True)
def test_refresh_many_refuses_bad_input_before_sending_anything() -> None:
    lease = Lease.objects.acquire(unique_key("many-bad"), "a", 60)
    assert lease is not None
    with pytest.raises(ValueError, match="Expected a Lease"):
        Lease.objects.refresh_many([(lease, 60), ("not a lease", 60)])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        Lease.objects.refresh_many([(lease, 0)])
    row = Lease.objects.get(pk=lease.pk)
    assert row.renewed_at == lease.renewed_at


@pytest.mark.django_db(transaction=True)
def test_refresh_many_takes_more_leases_than_one_chunk(sql_path: str) -> None:
    count = 1100  # over the 500 of a MariaDB / portable statement
    base = unique_key("many-chunks")
    now = timezone.now()
    Lease.objects.bulk_create(
        Lease(
            key=f"{base}:{n}",
            holder="h",
            token=1,
            expires_at=now + timedelta(hours=1),
            renewed_at=now - timedelta(hours=1),
        )
        for n in range(count)
    )
    leases = list(Lease.objects.filter(key__startswith=base).order_by("pk"))
    answers = Lease.objects.refresh_many([(lease, 120) for lease in leases])
    assert len(answers) == count and all(answer is not None for answer in answers)
    stale = Lease.objects.filter(key__startswith=base, renewed_at__lt=now - timedelta(minutes=1))
    assert not stale.exists()


@pytest.mark.django_db(transaction=True)
def test_refresh_many_answers_for_a_lease_built_by_hand_as_refresh_does(sql_path: str) -> None:
    """``refresh``, ``release`` and ``holding`` take a ``Lease`` built from its key, holder
    and token; ``refresh_many`` renews one too, and must say so: it matches the rows it
    renewed back to the leases asked by grant (key, holder, token), never by row id, which a
    lease built by hand lacks. (It answered ``None``, "no longer held", for a lease it had
    just renewed, on every path but PostgreSQL's tuned one.)"""
    key = unique_key("many-by-hand")
    held = Lease.objects.acquire(key, "holder-a", 60)
    assert held is not None
    by_hand = Lease(key=key, holder="holder-a", token=held.token)
    stale = Lease(key=key, holder="holder-a", token=held.token - 1 if held.token > 1 else 99)
    before = Lease.objects.get(key=key).expires_at
    answer, refused = Lease.objects.refresh_many([(by_hand, 600), (stale, 600)])
    assert Lease.objects.get(key=key).expires_at > before, "the row was not renewed"
    assert isinstance(answer, Lease), f"renewed on {sql_path}, but answered {answer!r}"
    assert (answer.key, answer.holder, answer.token) == (key, "holder-a", held.token)
    assert refused is None

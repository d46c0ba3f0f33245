"""Bad input to every lease entry point: a clear ``ValueError`` and nothing written.

Unicode keys and holders (emoji, CJK, combining marks, exactly 255 characters) are good
input and must come back exactly as given, never normalised or truncated.
"""

from __future__ import annotations

import math
import unicodedata
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from django_leases import ahold_lease, hold_lease
from django_leases.conf import leases_settings
from django_leases.models import Lease
from django_leases.validation import TTL_CEILING
from tests.helpers import unique_key

# No threads here beyond renewal threads that never fire (60 s TTLs), so each test can run
# in a rolled-back transaction.
pytestmark = pytest.mark.django_db

BAD_NAMES: list[tuple[Any, str]] = [
    ("", "empty"),
    (123, "must be a str"),
    (None, "must be a str"),
    (b"bytes", "must be a str"),
    (["a"], "must be a str"),
    ("k" * 256, "256 characters long; the limit is 255"),
    ("🔒" * 256, "256 characters long; the limit is 255"),
    ("a\x00b", "NUL"),
    ("half a pair \ud800", "lone surrogate"),
]
BAD_NAME_IDS = ["empty", "int", "none", "bytes", "list", "256", "256-emoji", "nul", "surrogate"]

BAD_TTLS: list[tuple[Any, str]] = [
    (0, "greater than 0"),
    (0.0, "greater than 0"),
    (-1, "greater than 0"),
    (-0.5, "greater than 0"),
    (timedelta(0), "greater than 0"),
    (timedelta(seconds=-5), "greater than 0"),
    (0.0001, "at least 0.001"),
    ("5", "timedelta or a number"),
    (None, "timedelta or a number"),
    ([5], "timedelta or a number"),
    (True, "timedelta or a number"),
    (False, "timedelta or a number"),
    (math.nan, "finite"),
    (math.inf, "finite"),
    (-math.inf, "finite"),
    (Decimal("NaN"), "finite"),
    (Decimal("sNaN"), "finite"),
    (Decimal("-Infinity"), "finite"),
    (10**400, "finite"),
    (366 * 24 * 3600 + 1, "longer than the limit"),
    (timedelta(days=10_000), "longer than the limit"),
]
BAD_TTL_IDS = [
    "zero",
    "zero-float",
    "negative",
    "negative-float",
    "zero-timedelta",
    "negative-timedelta",
    "below-1ms",
    "str",
    "none",
    "list",
    "true",
    "false",
    "nan",
    "inf",
    "-inf",
    "decimal-nan",
    "decimal-signalling-nan",
    "decimal-minus-infinity",
    "huge-int",
    "over-max",
    "timedelta-over-max",
]


def _snapshot() -> list[tuple[Any, ...]]:
    return list(Lease.objects.order_by("key").values_list("key", "holder", "token", "expires_at"))


@pytest.fixture
def unchanged() -> Any:
    """Asserts the lease table is exactly as before the test's bad call."""
    Lease.objects.acquire("bad-input:bystander", "someone", 3600)
    before = _snapshot()
    yield
    assert _snapshot() == before, "bad input wrote to the lease table"


# -- keys and holders -----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "message"), BAD_NAMES, ids=BAD_NAME_IDS)
def test_acquire_refuses_bad_key(unchanged: None, name: Any, message: str) -> None:
    with pytest.raises(ValueError, match="Lease key") as caught:
        Lease.objects.acquire(name, "holder", 60)
    assert message in str(caught.value)


@pytest.mark.parametrize(("name", "message"), BAD_NAMES, ids=BAD_NAME_IDS)
def test_acquire_refuses_bad_holder(unchanged: None, name: Any, message: str) -> None:
    with pytest.raises(ValueError, match="Lease holder") as caught:
        Lease.objects.acquire(unique_key("bad-input"), name, 60)
    assert message in str(caught.value)


@pytest.mark.parametrize(("name", "message"), BAD_NAMES, ids=BAD_NAME_IDS)
def test_current_refuses_bad_key(unchanged: None, name: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Lease.objects.current(name)


@pytest.mark.parametrize(("name", "message"), BAD_NAMES, ids=BAD_NAME_IDS)
def test_force_release_refuses_bad_key(unchanged: None, name: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Lease.objects.force_release(name)


@pytest.mark.parametrize(("name", "message"), BAD_NAMES, ids=BAD_NAME_IDS)
def test_hold_lease_refuses_bad_key_and_holder(unchanged: None, name: Any, message: str) -> None:
    ran = []
    with pytest.raises(ValueError, match="Lease key"), hold_lease(name, 60):
        ran.append(True)
    if name is not None:  # holder=None asks for a fresh holder name
        with (
            pytest.raises(ValueError, match="Lease holder"),
            hold_lease(unique_key("bad-input"), 60, holder=name),
        ):
            ran.append(True)
    assert ran == []


@pytest.mark.parametrize(("name", "message"), BAD_NAMES, ids=BAD_NAME_IDS)
def test_ahold_lease_refuses_bad_key_and_holder(unchanged: None, name: Any, message: str) -> None:
    ran = []

    async def scenario(**kwargs: Any) -> None:
        async with ahold_lease(**kwargs):
            ran.append(True)

    with pytest.raises(ValueError, match=message):
        async_to_sync(scenario)(key=name, ttl=60)
    if name is not None:  # holder=None asks for a fresh holder name
        # A hold's holder name leaves room for its own suffix (limit 238, not 255).
        with pytest.raises(ValueError, match="Lease holder"):
            async_to_sync(scenario)(key=unique_key("bad-input"), ttl=60, holder=name)
    assert ran == []


# -- TTLs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("ttl", "message"), BAD_TTLS, ids=BAD_TTL_IDS)
def test_acquire_refuses_bad_ttl(unchanged: None, ttl: Any, message: str) -> None:
    with pytest.raises(ValueError, match="Lease ttl") as caught:
        Lease.objects.acquire(unique_key("bad-input"), "holder", ttl)
    assert message in str(caught.value)


@pytest.mark.parametrize(("ttl", "message"), BAD_TTLS, ids=BAD_TTL_IDS)
def test_refresh_refuses_bad_ttl(ttl: Any, message: str) -> None:
    lease = Lease.objects.acquire(unique_key("bad-input"), "holder", 3600)
    assert lease is not None
    before = _snapshot()
    with pytest.raises(ValueError, match=message):
        Lease.objects.refresh(lease, ttl)
    assert _snapshot() == before


# ttl=None is not bad for hold_lease / ahold_lease: it means DJANGO_LEASES["DEFAULT_TTL"].
BAD_HOLD_TTLS = [case for case in zip(BAD_TTLS, BAD_TTL_IDS, strict=True) if case[0][0] is not None]


@pytest.mark.parametrize(
    ("ttl", "message"), [c[0] for c in BAD_HOLD_TTLS], ids=[c[1] for c in BAD_HOLD_TTLS]
)
def test_hold_lease_refuses_bad_ttl(unchanged: None, ttl: Any, message: str) -> None:
    ran = []
    with pytest.raises(ValueError, match=message), hold_lease(unique_key("bad-input"), ttl):
        ran.append(True)
    assert ran == []


@pytest.mark.parametrize(
    ("ttl", "message"), [c[0] for c in BAD_HOLD_TTLS], ids=[c[1] for c in BAD_HOLD_TTLS]
)
def test_ahold_lease_refuses_bad_ttl(unchanged: None, ttl: Any, message: str) -> None:
    ran = []

    async def scenario() -> None:
        async with ahold_lease(unique_key("bad-input"), ttl):
            ran.append(True)

    with pytest.raises(ValueError, match=message):
        async_to_sync(scenario)()
    assert ran == []


def test_max_ttl_follows_the_setting(settings: Any, unchanged: None) -> None:
    settings.DJANGO_LEASES = {**getattr(settings, "DJANGO_LEASES", {}), "MAX_TTL": 10}
    assert leases_settings.MAX_TTL == 10
    with pytest.raises(ValueError, match=r"longer than the limit of 10\.0 s"):
        Lease.objects.acquire(unique_key("bad-input"), "holder", 11)


def test_no_max_ttl_lifts_the_ceiling(settings: Any, unchanged: None) -> None:
    """A TTL whose expiry the database could not store is refused whatever ``MAX_TTL``
    says (check E016 reports such a ``MAX_TTL``)."""
    settings.DJANGO_LEASES = {**getattr(settings, "DJANGO_LEASES", {}), "MAX_TTL": 1e12}
    with pytest.raises(ValueError, match=r"Lease ttl .*longer than the limit of 3162240000\.0 s"):
        Lease.objects.acquire(unique_key("bad-input"), "holder", 5e11)
    with pytest.raises(ValueError, match="longer than the limit"):
        hold_lease(unique_key("bad-input"), TTL_CEILING + 1)


def test_the_longest_ttl_allowed_is_stored(settings: Any) -> None:
    """The ceiling itself is a TTL the database stores and reads back."""
    settings.DJANGO_LEASES = {**getattr(settings, "DJANGO_LEASES", {}), "MAX_TTL": TTL_CEILING}
    key = unique_key("longest")
    lease = Lease.objects.acquire(key, "holder", TTL_CEILING)
    assert lease is not None
    stored = Lease.objects.get(key=key)
    assert (stored.expires_at - stored.acquired_at).total_seconds() == pytest.approx(TTL_CEILING)
    assert Lease.objects.refresh(lease, TTL_CEILING) is not None
    assert Lease.objects.current(key) is not None


@pytest.mark.parametrize("ttl", [1, 2.5, Decimal("2.5"), timedelta(seconds=3), 366 * 24 * 3600])
def test_good_ttls_are_accepted(ttl: Any) -> None:
    # A fresh key is always granted, and the refresh is of a 60 s lease: a stall between the
    # two calls cannot make a 1 s TTL lapse in between and the refresh fail.
    assert Lease.objects.acquire(unique_key("bad-input"), "holder", ttl) is not None
    lease = Lease.objects.acquire(unique_key("bad-input"), "holder", 60)
    assert lease is not None
    assert Lease.objects.refresh(lease, ttl) is not None


# -- not a lease ----------------------------------------------------------------------------


@pytest.mark.parametrize("thing", [None, "lease", {"key": "k", "holder": "h", "token": 1}])
def test_lease_methods_refuse_what_is_not_a_lease(unchanged: None, thing: Any) -> None:
    with pytest.raises(ValueError, match="Expected a Lease"):
        Lease.objects.refresh(thing, 60)
    with pytest.raises(ValueError, match="Expected a Lease"):
        Lease.objects.release(thing)
    with pytest.raises(ValueError, match="Expected a Lease"), Lease.objects.fenced(thing):
        pass


@pytest.mark.parametrize(
    ("fields", "what"),
    [
        ({"token": "1"}, "Lease token"),
        ({"token": 2**63}, "Lease token"),
        ({"token": 1.0}, "Lease token"),
        ({"token": True}, "Lease token"),
        ({"token": 0}, "Lease token"),
        ({"key": "k\x00"}, "Lease key"),
        ({"holder": "h\ud800"}, "Lease holder"),
        ({"key": "k" * 256}, "Lease key"),
    ],
)
def test_a_lease_built_by_hand_that_no_row_could_hold_is_refused(
    fields: dict[str, Any], what: str
) -> None:
    """A ``Lease`` made by hand (not returned by ``acquire``) whose key, holder or token no
    lease row could hold is a ``ValueError`` naming the field, never a driver's error (a
    token past 64 bits, a NUL) nor a lease refreshed or released through a token of another
    type that the database would cast."""
    key = unique_key("by-hand")
    held = Lease.objects.acquire(key, "holder", 60)
    assert held is not None
    forged = Lease(**{"key": key, "holder": "holder", "token": held.token, **fields})
    before = _snapshot()
    with pytest.raises(ValueError, match=what):
        Lease.objects.refresh(forged, 60)
    with pytest.raises(ValueError, match=what):
        Lease.objects.release(forged)
    with pytest.raises(ValueError, match=what), Lease.objects.fenced(forged):
        pass
    assert _snapshot() == before  # still held, untouched


# -- unicode round-trips --------------------------------------------------------------------

UNICODE_NAMES = [
    "🔒 nightly-report 🌙",
    "夜間レポート:鍵",
    "e\u0301cole",  # decomposed: must not be normalised to "école"
    "\u00e9cole",  # composed
    "k" * 255,
    "🔒" * 255,
    "e\u0301" * 127 + "e",  # 255 code points of combining sequences
    "ℌ𝔢𝔩𝔩𝔬 — Ω≈ç√∫ «»",
]


@pytest.mark.django_db(transaction=True)  # hold_lease needs a committed lease
@pytest.mark.parametrize("name", UNICODE_NAMES, ids=range(len(UNICODE_NAMES)))
def test_unicode_keys_and_holders_round_trip_exactly(name: str) -> None:
    assert len(name) <= 255
    lease = Lease.objects.acquire(name, name, 60)
    assert lease is not None and lease.key == name and lease.holder == name
    current = Lease.objects.current(name)
    assert current is not None and (current.key, current.holder) == (name, name)
    stored = Lease.objects.get(pk=lease.pk)
    assert (stored.key, stored.holder) == (name, name)
    refreshed = Lease.objects.refresh(lease, 60)
    assert refreshed is not None and refreshed.key == name
    Lease.objects.release(lease)
    with hold_lease(name, 60) as held:
        assert held.key == name
        current = Lease.objects.current(name)
        assert current is not None and current.key == name
    assert Lease.objects.get(key=name).token == 2


def test_composed_and_decomposed_keys_are_different_keys() -> None:
    composed, decomposed = "\u00e9cole", "e\u0301cole"
    assert unicodedata.normalize("NFC", decomposed) == composed
    first = Lease.objects.acquire(composed, "a", 60)
    second = Lease.objects.acquire(decomposed, "b", 60)
    assert first is not None and second is not None
    assert first.token == second.token == 1
    assert Lease.objects.filter(key__in=[composed, decomposed]).count() == 2


@pytest.mark.parametrize("ttl", [0.001, 0.01, 0.149])
def test_renewed_leases_refuse_a_ttl_shorter_than_three_renewals(
    unchanged: None, ttl: float
) -> None:
    """Renewals run at most every RENEWAL_FLOOR seconds: a shorter lease could never be kept."""
    with pytest.raises(ValueError, match="three renewals"):
        hold_lease(unique_key("bad-input"), ttl)
    with pytest.raises(ValueError, match="three renewals"):
        ahold_lease(unique_key("bad-input"), ttl)

"""Retry backoff: a step's retry delay grows by ``retry_backoff`` per attempt up to
``retry_delay_max`` (``min(retry_delay × retry_backoff^(n − 1), retry_delay_max or one
day)`` after attempt n fails). The rule itself, its overflow guard and the checks of its
arguments, as functions.
"""

from __future__ import annotations

import math
from datetime import timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from django_leases.models.workflow import retry_delay_after
from django_leases.validation import MAX_RETRY_DELAY, check_backoff

# -- the rule -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backoff", "cap", "delays"),
    [
        (1.0, None, [10, 10, 10, 10]),  # the default: constant, as before backoffs
        (2.0, 30.0, [10, 20, 30, 30]),
        (3.0, None, [10, 30, 90, 270]),
        (2.0, 5.0, [5, 5, 5, 5]),  # a cap below retry_delay caps the first delay too
        (2.0, 0.0, [0, 0, 0, 0]),  # a cap of 0 s: every retry at once
        (1.5, None, [10, 15, 22.5, 33.75]),
    ],
)
def test_the_delay_after_each_attempt(
    backoff: float, cap: float | None, delays: list[float]
) -> None:
    got = [retry_delay_after(attempt, 10.0, backoff, cap) for attempt in (1, 2, 3, 4)]
    assert got == delays


def test_without_a_cap_of_its_own_the_delay_stops_at_one_day() -> None:
    assert retry_delay_after(14, 10.0, 2.0) == 10 * 2**13  # 81,920 s
    assert retry_delay_after(15, 10.0, 2.0) == MAX_RETRY_DELAY
    assert retry_delay_after(2, 50_000.0, 2.0, None) == MAX_RETRY_DELAY


def test_no_delay_stays_no_delay_whatever_the_backoff() -> None:
    assert retry_delay_after(1, 0.0, 1e308, None) == 0.0
    assert retry_delay_after(1001, 0.0, 2.0, 30.0) == 0.0


@pytest.mark.parametrize(
    ("attempt", "retry_delay", "backoff"),
    [
        (1001, 10.0, 2.0),  # 2 ** 1000 is a float, 10 × it is not below the cap
        (1001, 10.0, 1e308),  # 1e308 ** 1000 overflows a float
        (3, 10.0, 1e200),
        (1001, 5e-324, 1e308),  # a subnormal delay does not save it
        (2, 86_400.0, 1.0000001),
    ],
)
def test_a_huge_growth_is_capped_without_overflowing(
    attempt: int, retry_delay: float, backoff: float
) -> None:
    assert retry_delay_after(attempt, retry_delay, backoff, None) == MAX_RETRY_DELAY
    assert retry_delay_after(attempt, retry_delay, backoff, 300.0) == 300.0


def test_a_subnormal_delay_grown_past_a_float_is_computed_in_logarithms() -> None:
    # 1e156 ** 2 overflows a float, yet 5e-324 × 1e312 is far below the cap.
    delay = retry_delay_after(3, 5e-324, 1e156, None)
    assert 0 < delay < 1e-10
    assert math.isclose(math.log(delay), math.log(5e-324) + 2 * math.log(1e156))


@pytest.mark.parametrize(
    ("backoff", "cap"), [(math.nan, None), (0.5, None), (math.inf, None), (2.0, -1.0)]
)
def test_stored_values_the_checks_refuse_read_as_no_growth_and_no_cap(
    backoff: float, cap: float | None
) -> None:
    """A row edited by hand does not stop the retry being recorded."""
    expected = 20.0 if backoff == 2.0 else 10.0
    assert retry_delay_after(2, 10.0, backoff, cap) == expected


# -- the checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backoff", "cap", "expected"),
    [
        (1, None, (1.0, None)),
        (2, 300, (2.0, 300.0)),
        (Decimal("1.5"), 0, (1.5, 0.0)),
        (Fraction(5, 2), 86_400, (2.5, 86_400.0)),
        (1e308, 0.001, (1e308, 0.001)),
    ],
)
def test_check_backoff_accepts_factors_from_one_and_caps_from_zero_to_a_day(
    backoff: Any, cap: Any, expected: tuple[float, float | None]
) -> None:
    got = check_backoff(backoff, cap)
    assert got == expected
    assert type(got[0]) is float and (got[1] is None or type(got[1]) is float)


#: Bad ``retry_backoff`` / ``retry_delay_max`` arguments, and the argument each names.
BAD = [
    ({"retry_backoff": 0.99}, "retry_backoff"),
    ({"retry_backoff": 0}, "retry_backoff"),
    ({"retry_backoff": -2}, "retry_backoff"),
    ({"retry_backoff": math.nan}, "retry_backoff"),
    ({"retry_backoff": math.inf}, "retry_backoff"),
    ({"retry_backoff": -math.inf}, "retry_backoff"),
    ({"retry_backoff": Decimal("NaN")}, "retry_backoff"),
    ({"retry_backoff": Decimal("sNaN")}, "retry_backoff"),
    ({"retry_backoff": 10**400}, "retry_backoff"),
    ({"retry_backoff": True}, "retry_backoff"),
    ({"retry_backoff": "2"}, "retry_backoff"),
    ({"retry_backoff": None}, "retry_backoff"),
    ({"retry_delay_max": -1}, "retry_delay_max"),
    ({"retry_delay_max": -0.001}, "retry_delay_max"),
    ({"retry_delay_max": math.nan}, "retry_delay_max"),
    ({"retry_delay_max": math.inf}, "retry_delay_max"),
    ({"retry_delay_max": 86_401}, "retry_delay_max"),
    ({"retry_delay_max": 10**400}, "retry_delay_max"),
    ({"retry_delay_max": True}, "retry_delay_max"),
    ({"retry_delay_max": "300"}, "retry_delay_max"),
    ({"retry_delay_max": timedelta(seconds=30)}, "retry_delay_max"),
]


@pytest.mark.parametrize(("kwargs", "named"), BAD)
def test_check_backoff_refuses_with_the_argument_named(kwargs: dict[str, Any], named: str) -> None:
    args = {"retry_backoff": 2.0, "retry_delay_max": None, **kwargs}
    with pytest.raises(ValueError, match=named):
        check_backoff(args["retry_backoff"], args["retry_delay_max"])

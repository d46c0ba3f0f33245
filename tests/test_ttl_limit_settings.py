"""Limits that refuse the default lease TTLs: ``DJANGO_LEASES = {"MAX_TTL": 10}`` (below the
default ``DEFAULT_TTL`` and ``STEP_LEASE_TTL`` of 30 s) or ``{"RENEWAL_FLOOR": 20}`` (a renewed
lease then needs 60 s) makes every default hold and every worker fail. Check E016 judges the
defaults left in place against the limits set, and the worker refuses to start with a
one-line error naming the setting, not a traceback from its first unit of work."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import checks
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_leases import hold_lease


def _e016(configured: dict[str, Any]) -> list[str]:
    with override_settings(DJANGO_LEASES=configured):
        found = checks.run_checks(tags=["django_leases"])
    return [str(m.msg) for m in found if m.id == "django_leases.E016"]


def test_a_max_ttl_below_the_defaults_is_e016_for_both_ttls() -> None:
    with (
        override_settings(DJANGO_LEASES={"MAX_TTL": 10}),
        pytest.raises(ValueError),
        hold_lease("ttl-limits:default"),
    ):
        pass  # what the check is there to say at start-up
    errors = _e016({"MAX_TTL": 10})
    assert len(errors) == 2, errors
    assert any("'DEFAULT_TTL'" in e and "'MAX_TTL'] = 10" in e for e in errors), errors
    assert any("'STEP_LEASE_TTL'" in e for e in errors), errors


def test_a_renewal_floor_above_the_default_ttl_is_e016_for_default_ttl() -> None:
    errors = _e016({"RENEWAL_FLOOR": 20})
    assert len(errors) == 1 and "'DEFAULT_TTL'" in errors[0], errors
    assert "'RENEWAL_FLOOR'] = 20" in errors[0], errors


@pytest.mark.parametrize(
    "configured",
    [
        {"MAX_TTL": 60},
        {"MAX_TTL": 10, "DEFAULT_TTL": 5, "STEP_LEASE_TTL": 5},
        {"RENEWAL_FLOOR": 1},
        {},
    ],
)
def test_limits_that_admit_the_ttls_in_force_say_nothing(configured: dict[str, Any]) -> None:
    assert _e016(configured) == []


def test_a_ttl_set_and_refused_is_reported_once_and_the_default_beside_it_too() -> None:
    errors = _e016({"MAX_TTL": 10, "DEFAULT_TTL": 20})
    assert len(errors) == 2, errors
    assert sum("'DEFAULT_TTL'" in e for e in errors) == 1, errors
    assert sum("'STEP_LEASE_TTL'" in e for e in errors) == 1, errors


def test_a_limit_itself_refused_is_reported_alone() -> None:
    errors = _e016({"MAX_TTL": "ten"})
    assert len(errors) == 1 and "'MAX_TTL'" in errors[0], errors


@pytest.mark.django_db(transaction=True)
def test_the_worker_refuses_ttls_the_limits_refuse_with_a_command_error() -> None:
    with override_settings(DJANGO_LEASES={"MAX_TTL": 10}), pytest.raises(CommandError) as raised:
        call_command("run_workflow_worker", "--once", skip_checks=True)
    assert "STEP_LEASE_TTL" in str(raised.value) and "DEFAULT_TTL" in str(raised.value)

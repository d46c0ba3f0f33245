"""``manage.py reconcile_trigger_sources``: syncs the declarations and prints the rows."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_leases.models import TriggerSource
from django_leases.triggers.registry import StartWorkflow, TriggerDeclaration

pytestmark = pytest.mark.django_db


def _run(*args: str) -> str:
    out = StringIO()
    call_command("reconcile_trigger_sources", *args, stdout=out)
    return out.getvalue()


def test_reconcile_syncs_the_declarations_and_lists_them() -> None:
    old = TriggerDeclaration(name="removed", provider="github", events={"push": StartWorkflow("w")})
    TriggerSource.objects.sync([old])
    TriggerSource.objects.set_enabled("removed", True)

    output = _run("--base-url", "https://ci.example.com/", "--label-prefix", "ci")

    lines = output.splitlines()
    assert len(lines) == 2
    assert lines[0].split()[:4] == ["github-pushes", "github", "declared", "disabled"]
    assert "base_url=https://ci.example.com" in lines[0]
    assert lines[1].split()[:4] == ["removed", "github", "orphan", "enabled"]
    row = TriggerSource.objects.get(name="github-pushes")
    assert (row.base_url, row.label_prefix, row.enabled) == ("https://ci.example.com", "ci", False)
    assert TriggerSource.objects.get(name="removed").declared is False


def test_reconcile_without_address_keeps_the_known_one() -> None:
    _run("--base-url", "https://kept.example.com")
    _run()
    assert TriggerSource.objects.get(name="github-pushes").base_url == "https://kept.example.com"


def test_a_bad_base_url_is_a_command_error_and_writes_nothing() -> None:
    with pytest.raises(CommandError, match="not an http"):
        _run("--base-url", "nowhere")
    assert not TriggerSource.objects.exists()

"""The trigger-source store beyond the conformance suite (``test_triggers_conformance``):
real declarations, and syncs racing from several processes."""

from __future__ import annotations

import sys
import textwrap

import pytest

from django_leases.models import TriggerEvent, TriggerSource
from django_leases.triggers.registry import StartWorkflow, TriggerDeclaration
from tests.helpers import MANAGE_PY, run_at_once


def _declared(name: str, **config: str) -> TriggerDeclaration:
    return TriggerDeclaration(
        name=name,
        provider="github",
        config=config or {"repository": f"o/{name}"},
        events={"push": StartWorkflow("wf")},
    )


def _row(name: str) -> TriggerSource:
    return TriggerSource.objects.get(name=name)


@pytest.mark.django_db
def test_sync_takes_registry_declarations() -> None:
    rows = TriggerSource.objects.sync([_declared("b"), _declared("a", repository="x/y")])
    assert [(row.name, row.provider, row.kind) for row in rows] == [
        ("a", "github", "webhook"),
        ("b", "github", "webhook"),
    ]
    assert _row("a").config == {"repository": "x/y"}


@pytest.mark.django_db
def test_forget_keeps_the_deliveries_already_recorded() -> None:
    TriggerSource.objects.sync([_declared("gone")])
    TriggerEvent.objects.create(
        source=_row("gone"), source_name="gone", delivery_id="d1", event="push", payload={}
    )
    TriggerSource.objects.sync([])
    TriggerSource.objects.forget("gone")
    event = TriggerEvent.objects.get()
    assert (event.source_id, event.source_name) == (None, "gone")


# Each child syncs its own view of the code: every child declares the shared names, and
# child i also a name only it knows (new code rolling out process by process).
_SYNC_CHILD = textwrap.dedent(
    """
    import sys
    import django
    django.setup()
    from django_leases.models import TriggerSource
    from django_leases.testing.triggers import Declared
    index = int(sys.argv[1])
    shared = [Declared(f"shared-{n}") for n in range(8)]
    for _ in range(int(sys.argv[2])):
        TriggerSource.objects.sync(
            shared + [Declared(f"only-{index}")], base_url=f"https://p{index}.example.com"
        )
    print("synced")
    """
)


@pytest.mark.slow
def test_concurrent_syncs_from_processes_leave_one_row_per_name(
    subprocess_env: dict[str, str],
) -> None:
    children = 4
    syncs = [[sys.executable, "-c", _SYNC_CHILD, str(i), "10"] for i in range(children)]
    for child in run_at_once(syncs, env=subprocess_env):
        assert child.returncode == 0, child.stderr
        assert child.stdout.strip() == "synced"
    names = list(TriggerSource.objects.order_by("name").values_list("name", flat=True))
    # Exactly one row per name, nothing lost: the "only-i" rows stay (declared or orphaned).
    assert names == sorted(
        [f"only-{i}" for i in range(children)] + [f"shared-{n}" for n in range(8)]
    )
    assert set(TriggerSource.objects.filter(declared=True).values_list("name", flat=True)) >= {
        f"shared-{n}" for n in range(8)
    }
    assert not TriggerSource.objects.filter(enabled=True).exists()
    assert {row.base_url for row in TriggerSource.objects.all()} <= {
        f"https://p{i}.example.com" for i in range(children)
    }


@pytest.mark.slow
def test_concurrent_reconcile_commands_in_processes(subprocess_env: dict[str, str]) -> None:
    reconciles = [
        [*MANAGE_PY, "reconcile_trigger_sources", "--base-url", f"https://p{i}.example.com"]
        for i in range(4)
    ]
    for child in run_at_once(reconciles, env=subprocess_env, timeout=120):
        assert child.returncode == 0, child.stderr
        assert "github-pushes" in child.stdout
    from django_leases.triggers.registry import declarations

    names = list(TriggerSource.objects.order_by("name").values_list("name", flat=True))
    assert names == [declaration.name for declaration in declarations()]
    assert {row.base_url for row in TriggerSource.objects.all()} <= {
        f"https://p{i}.example.com" for i in range(4)
    }

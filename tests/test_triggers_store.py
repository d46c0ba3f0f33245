"""The trigger-source store (reference ``TriggerSourceStore`` semantics), both backends."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connection

from django_leases.models import TriggerSource
from django_leases.triggers.errors import UnknownTriggerSourceError
from django_leases.triggers.registry import StartWorkflow, TriggerDeclaration

ROOT = Path(__file__).resolve().parent.parent


def _declared(name: str, **config: str) -> TriggerDeclaration:
    return TriggerDeclaration(
        name=name,
        provider="github",
        config=config or {"repository": f"o/{name}"},
        events={"push": StartWorkflow("wf")},
    )


def _row(name: str) -> TriggerSource:
    return TriggerSource.objects.get(name=name)


pytestmark = pytest.mark.django_db


def test_sync_creates_declared_rows_disabled() -> None:
    rows = TriggerSource.objects.sync([_declared("b"), _declared("a")])
    assert [row.name for row in rows] == ["a", "b"]
    for row in rows:
        assert row.declared is True
        assert row.enabled is False
        assert row.kind == "webhook"
        assert row.provider == "github"
        assert row.status is None and row.state is None and row.detail is None
        assert row.base_url is None and row.label_prefix is None
    assert _row("a").config == {"repository": "o/a"}


def test_a_source_left_out_becomes_an_orphan_and_is_never_deleted() -> None:
    TriggerSource.objects.sync([_declared("a"), _declared("b")])
    TriggerSource.objects.set_enabled("b", True)
    TriggerSource.objects.record("b", status="registered", detail="ok", state={"hook_id": 7})

    rows = TriggerSource.objects.sync([_declared("a")])

    assert {row.name: row.declared for row in rows} == {"a": True, "b": False}
    orphan = _row("b")
    assert orphan.declared is False
    # The orphan keeps what it had: the switch, the provider status and its state.
    assert orphan.enabled is True
    assert orphan.status == "registered"
    assert orphan.state == {"hook_id": 7}
    assert list(TriggerSource.objects.orphaned().values_list("name", flat=True)) == ["b"]
    assert list(TriggerSource.objects.declared().values_list("name", flat=True)) == ["a"]


def test_an_orphan_declared_again_is_declared_again() -> None:
    TriggerSource.objects.sync([_declared("a")])
    TriggerSource.objects.sync([])
    assert _row("a").declared is False
    TriggerSource.objects.sync([_declared("a")])
    assert _row("a").declared is True
    assert TriggerSource.objects.count() == 1


def test_sync_never_touches_enabled_status_or_state() -> None:
    TriggerSource.objects.sync([_declared("a")])
    TriggerSource.objects.set_enabled("a", True)
    TriggerSource.objects.record("a", status="failed", detail="boom", state={"id": 1})
    TriggerSource.objects.sync([_declared("a", repository="o/moved")])
    row = _row("a")
    assert (row.enabled, row.status, row.detail, row.state) == (True, "failed", "boom", {"id": 1})
    # …but the declaration's own fields follow the code.
    assert row.config == {"repository": "o/moved"}


def test_sync_keeps_a_known_address_when_none_is_given() -> None:
    TriggerSource.objects.sync(
        [_declared("a")], base_url="https://app.example.com/", label_prefix="prod"
    )
    assert (_row("a").base_url, _row("a").label_prefix) == ("https://app.example.com", "prod")

    TriggerSource.objects.sync([_declared("a"), _declared("b")])

    assert (_row("a").base_url, _row("a").label_prefix) == ("https://app.example.com", "prod")
    assert (_row("b").base_url, _row("b").label_prefix) == (None, None)

    TriggerSource.objects.sync([_declared("a"), _declared("b")], base_url="http://127.0.0.1:8000")
    assert _row("a").base_url == "http://127.0.0.1:8000"
    assert _row("b").base_url == "http://127.0.0.1:8000"
    assert _row("a").label_prefix == "prod"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_url": "not a url"}, "not an http"),
        ({"base_url": "ftp://example.com"}, "not an http"),
        ({"base_url": 5}, "must be a str"),
        ({"base_url": "https://example.com/" + "x" * 500}, "longer"),
        ({"label_prefix": "x" * 201}, "longer"),
        ({"label_prefix": "bad\nprefix"}, "control"),
    ],
)
def test_a_bad_address_writes_nothing(kwargs: dict, message: str) -> None:
    TriggerSource.objects.sync([_declared("a")], base_url="https://kept.example.com")
    with pytest.raises(ValueError, match=message):
        TriggerSource.objects.sync([_declared("a"), _declared("b")], **kwargs)
    assert list(TriggerSource.objects.values_list("name", "base_url")) == [
        ("a", "https://kept.example.com")
    ]


def test_two_declarations_with_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="same name"):
        TriggerSource.objects.sync([_declared("a"), _declared("a")])
    assert TriggerSource.objects.count() == 0


def test_set_enabled() -> None:
    TriggerSource.objects.sync([_declared("a")])
    assert TriggerSource.objects.set_enabled("a", True) is True
    assert _row("a").enabled is True
    assert TriggerSource.objects.set_enabled("a", True) is False
    assert TriggerSource.objects.set_enabled("a", False) is True
    assert _row("a").enabled is False
    with pytest.raises(UnknownTriggerSourceError, match="'nope'") as info:
        TriggerSource.objects.set_enabled("nope", True)
    assert info.value.name == "nope"
    with pytest.raises(ValueError, match="bool"):
        TriggerSource.objects.set_enabled("a", 1)  # type: ignore[arg-type]
    assert TriggerSource.objects.count() == 1


def test_record_replaces_state_only_when_given_and_always_overwrites_detail() -> None:
    TriggerSource.objects.sync([_declared("a")])
    TriggerSource.objects.record("a", status="registered", detail="hook 7", state={"hook": 7})
    TriggerSource.objects.record("a", status="failed", detail="timeout")
    row = _row("a")
    assert (row.status, row.detail, row.state) == ("failed", "timeout", {"hook": 7})
    TriggerSource.objects.record("a", status=None, state=None)
    row = _row("a")
    assert (row.status, row.detail, row.state) == (None, None, None)
    with pytest.raises(UnknownTriggerSourceError):
        TriggerSource.objects.record("nope", status="x")


def test_receivable_needs_declared_and_enabled() -> None:
    TriggerSource.objects.sync([_declared("a"), _declared("b")])
    assert TriggerSource.objects.receivable("a") is None
    TriggerSource.objects.set_enabled("a", True)
    TriggerSource.objects.set_enabled("b", True)
    assert TriggerSource.objects.receivable("a") == _row("a")
    TriggerSource.objects.sync([_declared("a")])
    assert TriggerSource.objects.receivable("b") is None
    assert TriggerSource.objects.receivable("missing") is None


@pytest.mark.django_db(transaction=True)
def test_concurrent_syncs_leave_one_row_per_name() -> None:
    threads_count = 8
    rounds = 5 if connection.vendor == "sqlite" else 20
    everything = [_declared(f"s{i}") for i in range(6)]
    for round_number in range(rounds):
        barrier = threading.Barrier(threads_count)
        errors: list[BaseException] = []

        def sync(index: int, barrier: threading.Barrier, errors: list[BaseException]) -> None:
            from django.db import connection as own

            try:
                barrier.wait()
                # Half the threads run "old code" (without the last declaration).
                declared = everything if index % 2 else everything[:-1]
                TriggerSource.objects.sync(declared, base_url=f"https://h{index}.example.com")
            except BaseException as exc:
                errors.append(exc)
            finally:
                own.close()

        threads = [
            threading.Thread(target=sync, args=(i, barrier, errors)) for i in range(threads_count)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == [], f"round {round_number}: {errors!r}"
        names = list(TriggerSource.objects.order_by("name").values_list("name", flat=True))
        assert names == [f"s{i}" for i in range(6)]
        # Every row but the contested one stays declared, whoever synced last.
        assert set(TriggerSource.objects.filter(declared=True).values_list("name", flat=True)) >= {
            f"s{i}" for i in range(5)
        }
        assert not TriggerSource.objects.filter(enabled=True).exists()


@pytest.mark.slow
def test_concurrent_reconcile_commands_in_processes(subprocess_env: dict[str, str]) -> None:
    command = [sys.executable, "manage.py", "reconcile_trigger_sources"]
    processes = [
        subprocess.Popen(
            [*command, "--base-url", f"https://p{i}.example.com"],
            cwd=ROOT,
            env=subprocess_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    outputs = [process.communicate(timeout=120) for process in processes]
    for process, (stdout, stderr) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, stderr
        assert "github-pushes" in stdout
    assert list(TriggerSource.objects.values_list("name", flat=True)) == ["github-pushes"]
    assert _row("github-pushes").base_url in {f"https://p{i}.example.com" for i in range(4)}

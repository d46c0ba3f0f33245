"""A conformance suite for the trigger-source store: rules T1–T13, against your own database.

The rules are those of the reference ``TriggerSourceStore`` (DESIGN §6), as kept by the
QuerySet methods of ``TriggerSource.objects``: ``sync``, ``record``, ``set_enabled``,
``forget``, ``remove``, ``named`` and ``receivable``. Each test's docstring names its rule.

Mix :class:`TriggerSourceStoreConformanceTests` into a ``TransactionTestCase`` (the race
rules use threads with their own connections, so real commits are needed)::

    # yourproject/tests/test_trigger_store_conformance.py
    from django.test import TransactionTestCase

    from django_leases.testing.triggers import TriggerSourceStoreConformanceTests


    class TriggerStoreConformance(TriggerSourceStoreConformanceTests, TransactionTestCase):
        # The alias your database router sends ``TriggerSource`` to.
        trigger_database = "default"
        databases = {"default"}

It runs on PostgreSQL and on a file-backed SQLite database (``"transaction_mode":
"IMMEDIATE"``), under ``manage.py test`` or pytest-django, in a few seconds. It declares
nothing in your registry and calls no provider: it drives the store with plain
declarations (:class:`Declared`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any, ClassVar

from django.db import DEFAULT_DB_ALIAS, connections

from django_leases.exceptions import SourceStillDeclared, UnknownTriggerSourceError
from django_leases.frozen import frozen
from django_leases.models import TriggerSource, TriggerSourceDefaults
from django_leases.testing.base import ConformanceSuite

if TYPE_CHECKING:
    from django_leases.models.trigger import TriggerSource, TriggerSourceQuerySet


@frozen
class Declared:
    """A plain declaration for ``sync`` (what a ``TriggerDeclaration`` offers it)."""

    name: str
    provider: str = "github"
    kind: str = "webhook"
    config: dict[str, Any] = field(default_factory=dict)


def _race(count: int, body: Callable[[int], None], aliases: Sequence[str]) -> list[BaseException]:
    """Run ``body(i)`` on ``count`` threads released together; returns what they raised."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=60)
            body(index)
        except BaseException as exc:
            errors.append(exc)
        finally:
            for alias in aliases:
                connections[alias].close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if any(thread.is_alive() for thread in threads):
        errors.append(RuntimeError("a racing thread did not finish within 120 s"))
    return errors


class TriggerSourceStoreConformanceTests(ConformanceSuite):
    """Rules T1–T13 of the trigger-source store. Mix into a ``TransactionTestCase``."""

    #: The database alias ``TriggerSource`` lives on.
    trigger_database: ClassVar[str] = DEFAULT_DB_ALIAS

    #: Threads per race, and rounds of the sync race.
    race_threads: ClassVar[int] = 6
    race_rounds: ClassVar[int] = 5

    # -- helpers ---------------------------------------------------------------------------

    @property
    def sources(self) -> TriggerSourceQuerySet:
        """``TriggerSource.objects`` on :attr:`trigger_database`."""
        return TriggerSource.objects.using(self.trigger_database)

    def row(self, name: str) -> TriggerSource:
        """The ``TriggerSource`` row named ``name``; raises ``TriggerSource.DoesNotExist``."""
        return self.sources.get(name=name)

    def names(self, **filters: Any) -> list[str]:
        """Names (``list[str]``, sorted) of the rows matching ``filters`` (``filter()``
        keywords)."""
        return list(self.sources.filter(**filters).order_by("name").values_list("name", flat=True))

    # -- sync ------------------------------------------------------------------------------

    def test_t1_sync_creates_declared_rows_off(self) -> None:
        """T1: sync creates one row per declaration: declared, off, with no status, state,
        detail or address; it returns every row sorted by name."""
        rows = self.sources.sync([Declared("b", config={"repository": "o/b"}), Declared("a")])
        self.assertEqual([row.name for row in rows], ["a", "b"])
        for row in rows:
            self.assertIs(row.declared, True)
            self.assertIs(row.enabled, False)
            self.assertEqual(row.kind, "webhook")
            self.assertEqual(row.provider, "github")
            self.assertEqual((row.status, row.state, row.detail), (None, None, None))
            self.assertEqual((row.base_url, row.label_prefix), (None, None))
        self.assertEqual(self.row("b").config, {"repository": "o/b"})

    def test_t2_a_source_left_out_becomes_an_orphan_and_keeps_everything(self) -> None:
        """T2: a row whose declaration is gone becomes an orphan (declared=False); it is not
        deleted and keeps its switch, status, state and detail."""
        self.sources.sync([Declared("a"), Declared("b")])
        self.sources.set_enabled("b", True)
        self.sources.record("b", status="registered", detail="hook 7", state={"hook_id": 7})
        rows = self.sources.sync([Declared("a")])
        self.assertEqual({row.name: row.declared for row in rows}, {"a": True, "b": False})
        orphan = self.row("b")
        self.assertEqual(
            (orphan.enabled, orphan.status, orphan.detail, orphan.state),
            (True, "registered", "hook 7", {"hook_id": 7}),
        )
        self.assertEqual(list(self.sources.orphaned().values_list("name", flat=True)), ["b"])
        self.assertEqual(list(self.sources.declared().values_list("name", flat=True)), ["a"])

    def test_t3_an_orphan_declared_again_is_declared_again(self) -> None:
        """T3: declaring an orphan's name again makes the same row declared again."""
        self.sources.sync([Declared("a")])
        pk = self.row("a").pk
        self.sources.sync([])
        self.assertIs(self.row("a").declared, False)
        self.sources.sync([Declared("a")])
        self.assertIs(self.row("a").declared, True)
        self.assertEqual(self.row("a").pk, pk)
        self.assertEqual(self.sources.count(), 1)

    def test_t4_sync_never_touches_enabled_status_or_state(self) -> None:
        """T4: sync leaves enabled, status, state and detail alone; the declaration's own
        fields (provider, kind, config) follow the code. When the provider changes, the
        registration recorded at the former one is kept as ``state["previous"]`` (provider,
        config and state), for the lifecycle to tear down there."""
        self.sources.sync([Declared("a", config={"repository": "o/a"})])
        self.sources.set_enabled("a", True)
        self.sources.record("a", status="failed", detail="boom", state={"id": 1})
        self.sources.sync([Declared("a", config={"repository": "o/moved"})])
        row = self.row("a")
        self.assertEqual(
            (row.enabled, row.status, row.detail, row.state), (True, "failed", "boom", {"id": 1})
        )
        self.assertEqual((row.provider, row.config), ("github", {"repository": "o/moved"}))
        self.sources.sync([Declared("a", provider="stripe", config={"repository": "o/x"})])
        row = self.row("a")
        former = {"provider": "github", "config": {"repository": "o/moved"}, "state": {"id": 1}}
        self.assertEqual(
            (row.enabled, row.status, row.detail, row.state),
            (True, "failed", "boom", {"previous": former}),
        )
        self.assertEqual((row.provider, row.config), ("stripe", {"repository": "o/x"}))

    def test_t5_sync_keeps_a_known_address_when_none_is_given(self) -> None:
        """T5: a sync without base_url / label_prefix keeps each row's known ones, and a new
        row gets the last ones a sync was given, kept project-wide (the reference store gives
        it none, so a source declared in a later deploy could not be enabled); a sync with
        them sets them on every declared row (trailing / dropped)."""
        self.sources.sync([Declared("a")], base_url="https://app.example.com/", label_prefix="p")
        self.sources.sync([Declared("a"), Declared("b")])
        self.assertEqual(
            (self.row("a").base_url, self.row("a").label_prefix), ("https://app.example.com", "p")
        )
        self.assertEqual(
            (self.row("b").base_url, self.row("b").label_prefix), ("https://app.example.com", "p")
        )
        self.sources.sync([Declared("a"), Declared("b")], base_url="http://127.0.0.1:8000")
        self.assertEqual(self.row("a").base_url, "http://127.0.0.1:8000")
        self.assertEqual(self.row("b").base_url, "http://127.0.0.1:8000")
        self.assertEqual(self.row("a").label_prefix, "p")

    def test_t6_bad_input_to_sync_writes_nothing(self) -> None:
        """T6: a bad address or label prefix, a duplicate or unusable name: ValueError and
        nothing written."""
        self.sources.sync([Declared("a")], base_url="https://kept.example.com")
        bad: list[tuple[dict[str, Any], list[Declared]]] = [
            ({"base_url": "not a url"}, [Declared("a"), Declared("b")]),
            ({"base_url": "ftp://example.com"}, [Declared("a"), Declared("b")]),
            ({"base_url": 5}, [Declared("a"), Declared("b")]),
            ({"label_prefix": "x" * 201}, [Declared("a"), Declared("b")]),
            ({"label_prefix": "bad\nprefix"}, [Declared("a"), Declared("b")]),
            ({}, [Declared("b"), Declared("b")]),
            ({}, [Declared("b"), Declared("")]),
        ]
        for kwargs, declared in bad:
            with self.assertRaises(ValueError):
                self.sources.sync(declared, **kwargs)
        self.assertEqual(
            list(self.sources.values_list("name", "base_url", "declared")),
            [("a", "https://kept.example.com", True)],
        )

        known = TriggerSourceDefaults.objects.using(self.trigger_database).known()
        self.assertEqual(known.base_url if known else None, "https://kept.example.com")

    # -- record / set_enabled --------------------------------------------------------------

    def test_t7_record_replaces_state_only_when_given_and_always_overwrites_detail(self) -> None:
        """T7: record stores status as given, always overwrites detail (None clears it), and
        replaces state only when one is given."""
        self.sources.sync([Declared("a")])
        self.sources.record("a", status="registered", detail="hook 7", state={"hook": 7})
        self.sources.record("a", status="failed", detail="timeout")
        row = self.row("a")
        self.assertEqual((row.status, row.detail, row.state), ("failed", "timeout", {"hook": 7}))
        self.sources.record("a", status="off", state=None)
        row = self.row("a")
        self.assertEqual((row.status, row.detail, row.state), ("off", None, None))

    def test_t8_record_refuses_bad_input_and_unknown_names(self) -> None:
        """T8: record of an unknown name raises UnknownTriggerSourceError; an unknown status,
        a non-str detail or a non-object state raises ValueError; nothing is written."""
        self.sources.sync([Declared("a")])
        self.sources.record("a", status="manual", detail="by hand", state={"k": "v"})
        with self.assertRaises(UnknownTriggerSourceError):
            self.sources.record("nope", status="off")
        for kwargs in (
            {"status": "great"},
            {"status": "off", "detail": 5},
            {"status": "off", "state": [1, 2]},
            {"status": "off", "state": {"when": object()}},
        ):
            with self.assertRaises(ValueError):
                self.sources.record("a", **kwargs)
        row = self.row("a")
        self.assertEqual((row.status, row.detail, row.state), ("manual", "by hand", {"k": "v"}))
        self.assertFalse(self.sources.filter(name="nope").exists())

    def test_t9_set_enabled_flips_the_switch_only(self) -> None:
        """T9: set_enabled flips the switch and says whether it changed; it touches nothing
        else; unknown name → UnknownTriggerSourceError; a non-bool → ValueError."""
        self.sources.sync([Declared("a")])
        self.sources.record("a", status="failed", detail="d", state={"s": 1})
        self.assertIs(self.sources.set_enabled("a", True), True)
        self.assertIs(self.sources.set_enabled("a", True), False)
        row = self.row("a")
        self.assertEqual(
            (row.enabled, row.status, row.detail, row.state), (True, "failed", "d", {"s": 1})
        )
        self.assertIs(self.sources.set_enabled("a", False), True)
        self.assertIs(self.row("a").enabled, False)
        with self.assertRaises(UnknownTriggerSourceError) as caught:
            self.sources.set_enabled("nope", True)
        self.assertEqual(caught.exception.name, "nope")
        with self.assertRaises(ValueError):
            self.sources.set_enabled("a", 1)  # type: ignore[arg-type]
        self.assertEqual(self.names(), ["a"])

    # -- forget / remove / reading ---------------------------------------------------------

    def test_t10_forget_deletes_only_an_orphan(self) -> None:
        """T10: forget deletes an orphan's row; a declared source raises
        SourceStillDeclared and stays; an unknown name raises UnknownTriggerSourceError."""
        self.sources.sync([Declared("kept"), Declared("gone")])
        self.sources.sync([Declared("kept")])
        with self.assertRaises(SourceStillDeclared):
            self.sources.forget("kept")
        self.sources.forget("gone")
        self.assertEqual(self.names(), ["kept"])
        with self.assertRaises(UnknownTriggerSourceError):
            self.sources.forget("gone")

    def test_t11_remove_deletes_any_row_and_named_finds_one(self) -> None:
        """T11: remove deletes a row, declared or not (the reference deleteTriggerSource);
        named returns a row or raises UnknownTriggerSourceError; a removed declared source
        comes back, off, at the next sync."""
        self.sources.sync([Declared("a")])
        self.sources.set_enabled("a", True)
        self.assertEqual(self.sources.named("a").name, "a")
        self.sources.remove("a")
        with self.assertRaises(UnknownTriggerSourceError):
            self.sources.named("a")
        with self.assertRaises(UnknownTriggerSourceError):
            self.sources.remove("a")
        self.sources.sync([Declared("a")])
        self.assertIs(self.row("a").enabled, False)

    def test_t12_receivable_needs_declared_and_enabled(self) -> None:
        """T12: only a declared, enabled row is receivable."""
        self.sources.sync([Declared("a"), Declared("b"), Declared("c")])
        self.sources.set_enabled("a", True)
        self.sources.set_enabled("b", True)
        self.sources.sync([Declared("a"), Declared("c")])  # b → orphan
        self.assertEqual(self.sources.receivable("a"), self.row("a"))
        self.assertIsNone(self.sources.receivable("b"))
        self.assertIsNone(self.sources.receivable("c"))
        self.assertIsNone(self.sources.receivable("missing"))

    # -- races -----------------------------------------------------------------------------

    def test_t13_concurrent_syncs_and_writes_lose_nothing(self) -> None:
        """T13: syncs racing each other (some with an older set of declarations) leave
        exactly one row per name and never flip a switch; a switch flipped and a record
        written while syncs race are both kept."""
        everything = [Declared(f"s{i}") for i in range(6)]
        for round_number in range(self.race_rounds):

            def sync(index: int) -> None:
                declared = everything if index % 2 else everything[:-1]
                self.sources.sync(declared, base_url=f"https://h{index}.example.com")

            errors = _race(self.race_threads, sync, [self.trigger_database])
            self.assertEqual(errors, [], f"round {round_number}")
            self.assertEqual(self.names(), [f"s{i}" for i in range(6)])
            self.assertGreaterEqual(set(self.names(declared=True)), {f"s{i}" for i in range(5)})
            self.assertEqual(self.names(enabled=True), [])

        def mixed(index: int) -> None:
            if index == 0:
                self.sources.set_enabled("s0", True)
            elif index == 1:
                self.sources.record("s1", status="registered", detail="d", state={"id": 1})
            else:
                self.sources.sync(everything)

        errors = _race(self.race_threads, mixed, [self.trigger_database])
        self.assertEqual(errors, [])
        self.assertIs(self.row("s0").enabled, True)
        s1 = self.row("s1")
        self.assertEqual((s1.status, s1.detail, s1.state), ("registered", "d", {"id": 1}))
        self.assertEqual(self.sources.count(), 6)

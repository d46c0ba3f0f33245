"""The duplicate-execution check of :func:`~django_leases.testing.drive`
(``duplicate_steps=True``): every step function runs twice, as it would when an attempt is
superseded after its writes (its worker paused past the step lease, say) and the next
attempt runs it again, and the steps whose second run changed the database are named.

A step is idempotent here when the database after both runs is the database after one: its
second run, on the same data and context, leaves every table of the project (django-leases'
own aside) as its first run left it. The first run's result is discarded, as a superseded
attempt's is; the second run's is the step's. A transactional step's first run is rolled
back, as a superseded transactional attempt's is (what it would have committed is compared
with what the second run commits), so a transactional step passes unless it writes
differently each time. What is compared: the rows of every managed model on the drive's
database, column by column, as a multiset, auto-generated primary keys left out (a row
inserted again is a row more, whatever its id) — so a step that stamps ``timezone.now()``
into a row on each run is reported too.
"""

from __future__ import annotations

import contextlib
import copy
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.db import models, transaction

from django_leases.workflows import engine
from django_leases.workflows.registry import step_declaration


@dataclass(frozen=True)
class DuplicateStep:
    """A step whose second run changed the database.

    Attributes:
        run_id: the run (``uuid.UUID``); step_name, function_name: ``str``.
        changes: per model label (``"app.Model"``), what the second run did to its rows
            (``"2 rows added, 1 removed"``).
    """

    run_id: Any
    step_name: str
    function_name: str
    changes: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        what = "; ".join(f"{label}: {change}" for label, change in sorted(self.changes.items()))
        return f"step {self.step_name!r} ({self.function_name}) of run {self.run_id}: {what}"


class _Rollback(Exception):
    """Rolls back a transactional step's first run."""


def _tables(alias: str) -> dict[str, models.QuerySet[Any]]:
    found = {}
    for model in apps.get_models():
        meta = model._meta
        if meta.app_label == "django_leases" or not meta.managed or meta.proxy:
            continue
        columns = [
            f.attname
            for f in meta.concrete_fields
            if not (f.primary_key and isinstance(f, models.AutoField | models.BigAutoField))
        ]
        found[meta.label] = model._base_manager.using(alias).values_list(*columns)
    return found


def _snapshot(alias: str) -> dict[str, Counter[str]]:
    """Every row of every project table on ``alias`` (django-leases' own aside), counted."""
    return {label: Counter(map(repr, rows)) for label, rows in _tables(alias).items()}


def _diff(before: dict[str, Counter[str]], after: dict[str, Counter[str]]) -> dict[str, str]:
    changes = {}
    for label in sorted(set(before) | set(after)):
        old, new = before.get(label, Counter()), after.get(label, Counter())
        added, removed = (new - old).total(), (old - new).total()
        if added or removed:
            changes[label] = f"{added} rows added, {removed} removed"
    return changes


def twice(
    func: Callable[..., Any], alias: str, found: list[DuplicateStep]
) -> Callable[[Any, Any], Any]:
    """``func`` run twice per call: first as a superseded attempt would (its result
    discarded, its exception ignored; rolled back for a transactional step), then for real.
    A second run that changed the database adds a :class:`DuplicateStep` to ``found``."""

    def doubled(data: Any, ctx: Any) -> Any:
        once: dict[str, Counter[str]] | None = None
        with contextlib.suppress(Exception):
            if step_declaration(ctx.function_name).transactional:
                with contextlib.suppress(_Rollback), transaction.atomic(using=alias):
                    func(copy.deepcopy(data), ctx)
                    once = _snapshot(alias)  # what the attempt would have committed
                    raise _Rollback
            else:
                func(copy.deepcopy(data), ctx)
        if once is None:
            once = _snapshot(alias)
        try:
            return func(data, ctx)
        finally:
            changes = _diff(once, _snapshot(alias))
            if changes:
                found.append(DuplicateStep(ctx.run_id, ctx.step_name, ctx.function_name, changes))

    return doubled


@contextlib.contextmanager
def duplicated_steps(alias: str) -> Iterator[list[DuplicateStep]]:
    """Within the block, every step function the engine looks up (on this process) runs
    :func:`twice`; yields the list the non-idempotent steps are added to."""
    found: list[DuplicateStep] = []
    lookup = engine.get_step_function

    def doubling(name: str) -> Callable[..., Any] | None:
        func = lookup(name)
        return None if func is None else twice(func, alias, found)

    engine.get_step_function = doubling
    try:
        yield found
    finally:
        engine.get_step_function = lookup


__all__ = ["DuplicateStep", "duplicated_steps", "twice"]

"""Fenced writes to the application's own rows: a lease holder's or a step attempt's
``UPDATE`` that a stale holder cannot make, even outside ``Lease.objects.fenced()``.

A model that inherits :class:`FencedModel` stores, on each row, who last wrote it
(``fenced_by``: a lease key, or ``workflow-step:<id>`` for a workflow step) and with which
fence (``fence``: the lease's fencing token, or the step attempt's: see :func:`step_fence`).
Its ``objects.fenced_update(fence, **values)`` is one guarded ``UPDATE``::

    UPDATE … SET …, fenced_by = :key, fence = :token
     WHERE <the QuerySet's filter>
       AND (fenced_by <> :key OR fence <= :token)       -- never back to an older fence
       AND EXISTS (<the lease / step attempt, still held>)  -- same database only

so a write is refused (0 rows) when its holder is no longer the live holder of its lease, or
no longer its step's running attempt, **or** a newer holder of the same key already wrote the
row (which covers the instant between a takeover and the stale holder's statement). ::

    from django_leases.fencing import FencedModel, lease_fence

    class Config(FencedModel):
        name = models.CharField(max_length=100, unique=True)
        value = models.JSONField(default=dict)

    with hold_lease("config-writer") as held:
        Config.objects.filter(name="site").fenced_update(held.lease, value=new)

    @step_function("shop.ship")
    def ship(data, ctx):
        Order.objects.filter(pk=data["order"]).fenced_update(ctx.fence, status="shipped")

The fence orders the writers of **one** key (one lease key, one step): a row written under
another key is taken over without comparison. Creating the rows is the application's (with
``fence=0``, the default, any holder's first write lands).

:class:`FenceTrigger` (a migration operation) adds a trigger that refuses, from any SQL —
raw statements and other programs included — an ``UPDATE`` that moves a row's fence
backwards under the same key (PostgreSQL, MariaDB / MySQL, SQLite).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.exceptions import FieldDoesNotExist
from django.db import connections, models, router
from django.db.migrations.operations.base import Operation
from django.db.models import Exists, Q
from django.utils.translation import gettext_lazy as _

from django_leases.exceptions import FenceRefusedError
from django_leases.models import Lease, WorkflowStep
from django_leases.validation import check_attempt, check_name, check_token

if TYPE_CHECKING:
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor
    from django.db.migrations.state import ProjectState

_M = TypeVar("_M", bound=models.Model)

#: Longest ``fenced_by``: a lease key's (``Lease.key``).
MAX_FENCE_KEY = 255


@dataclass(frozen=True)
class Fence:
    """Who writes, for :meth:`FencedQuerySet.fenced_update`.

    Attributes:
        key: the lease key, or ``workflow-step:<step id>``.
        token: the lease's fencing token, or the step attempt's (its attempt number above
            the epoch floor of its claim: see :func:`step_fence`), an ``int`` ≥ 1.
        holding: the row (lease or step) that exists while the holder still holds it, for
            an ``EXISTS`` in the same statement (``None``: only the stored fence decides).
        using: the database ``holding`` is read from.
    """

    key: str
    token: int
    holding: models.QuerySet[Any] | None = field(default=None, compare=False, repr=False)
    using: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        """Refuse a key that is not a storable name of at most :data:`MAX_FENCE_KEY`
        characters, and a token that is not an ``int`` from 1 to 2**63 - 1 (the ``fence``
        column), with ``ValueError``: nothing is written with a bad fence."""
        check_name(self.key, "A fence key", max_length=MAX_FENCE_KEY)
        check_token(self.token, "A fence token")


def lease_fence(lease: Lease) -> Fence:
    """The :class:`Fence` of a held ``lease`` (``hold_lease(...).lease``, or what
    ``Lease.objects.acquire`` returned): its key and token; live while the lease row still
    has that holder and token, unreleased and unlapsed on the database clock.

    Raises ``ValueError`` when ``lease`` is not a saved :class:`Lease`."""
    if not isinstance(lease, Lease) or lease._state.db is None:
        raise ValueError(f"A fence needs a Lease from the database, not {lease!r}")
    alias = lease._state.db
    return Fence(lease.key, lease.token, Lease.objects.db_manager(alias).holding(lease), alias)


def step_fence(
    step_id: int, attempt: int, *, using: str | None = None, floor: int | None = None
) -> Fence:
    """The :class:`Fence` of ``attempt`` of workflow step ``step_id`` (what ``ctx.fence`` is
    in a step function): key ``workflow-step:<step_id>``, token ``floor + attempt``; live
    while that attempt is the step's running one (the attempt fence) under the claim that
    ran it. ``using``: the step's database (default: the router's choice). ``floor``: the
    epoch floor of the server that granted the attempt's claim (``Claim.fence_floor``; 0 on
    a database that never failed over), so that an attempt claimed again after an
    asynchronous promotion lost its first claim fences above every token of the old
    timeline, and the first claim's worker is no longer live
    (``docs/operations/replication.md``). ``None``: token ``attempt``, and liveness judged
    on the attempt alone.

    Raises ``ValueError`` for a bad step id, attempt or floor."""
    if isinstance(step_id, bool) or not isinstance(step_id, int):
        raise ValueError(f"A step id must be an int, not {step_id!r}")
    check_attempt(attempt)
    if floor is not None and (isinstance(floor, bool) or not isinstance(floor, int) or floor < 0):
        raise ValueError(f"An epoch floor must be an int >= 0, not {floor!r}")
    alias = using or router.db_for_write(WorkflowStep)
    holding = WorkflowStep.objects.db_manager(alias).attempt_running(step_id, attempt, floor)
    return Fence(f"workflow-step:{step_id}", (floor or 0) + attempt, holding, alias)


def as_fence(fence: Fence | Lease) -> Fence:
    """``fence`` as a :class:`Fence` (a :class:`Lease` through :func:`lease_fence`)."""
    if isinstance(fence, Fence):
        return fence
    if isinstance(fence, Lease):
        return lease_fence(fence)
    raise ValueError(f"Expected a Fence or a Lease, not {fence!r}")


class FencedQuerySet(models.QuerySet[_M]):
    """The QuerySet of a :class:`FencedModel`: :meth:`fenced_update`."""

    def fenced_update(self, fence: Fence | Lease, /, *, strict: bool = False, **values: Any) -> int:
        """``UPDATE`` this QuerySet's rows with ``values``, fenced to ``fence`` (a
        :class:`Fence` — ``ctx.fence`` in a step function — or a held :class:`Lease`), in one
        statement: only rows whose stored fence is not newer under the same key, and only
        while the holder still holds (where its lease or step lives on the same database as
        these rows). The rows written store the fence (``fenced_by``, ``fence``).

        Args:
            fence: who writes.
            strict: raise :class:`FenceRefusedError` when no row was written.
            values: the columns to set, as for ``QuerySet.update()``.

        Returns:
            The number of rows written (``int``; 0: refused, or no row matched).

        Raises:
            FenceRefusedError: with ``strict``, no row was written (nothing was).
            ValueError: ``fence`` is neither a Fence nor a saved Lease, or ``values`` set
                ``fence`` or ``fenced_by`` themselves (nothing written).
        """
        fenced = as_fence(fence)
        if "fence" in values or "fenced_by" in values:
            raise ValueError("fenced_update() sets fence and fenced_by itself")
        self._check_one_table(values)
        alias = self._db or router.db_for_write(self.model)  # type: ignore[attr-defined]
        rows: models.QuerySet[_M] = self.using(alias)
        if rows.query.count_active_tables() > 1:
            # A filter through a relation: Django would move the whole WHERE, fence check
            # included, into "pk IN (SELECT … JOIN …)", which PostgreSQL does not evaluate
            # again on the row version a wait let through. The rows are chosen by that
            # subquery; the fence and the holder are checked on the row itself.
            rows = self.model._base_manager.using(alias).filter(pk__in=rows.values("pk"))
        rows = rows.filter(~Q(fenced_by=fenced.key) | Q(fence__lte=fenced.token))
        if fenced.holding is not None and fenced.using == alias:
            rows = rows.filter(Exists(fenced.holding.values("pk")))
        written = rows.update(fenced_by=fenced.key, fence=fenced.token, **values)
        if strict and not written:
            raise FenceRefusedError(fenced.key, fenced.token)
        return written

    def _check_one_table(self, values: dict[str, Any]) -> None:
        """``ValueError`` unless the fence columns and every column in ``values`` are on the
        model's own table: Django writes a multi-table-inheritance parent's columns in a
        statement of their own, after selecting the rows, and no check in one statement
        could then fence both."""
        meta = self.model._meta
        concrete = meta.concrete_model
        own = set(concrete._meta.local_concrete_fields) if concrete is not None else set()
        for name in ("fenced_by", "fence", *values):
            try:
                field = meta.get_field(name)
            except FieldDoesNotExist:
                continue  # Django's update() names it
            if field not in own:
                owner = field.model._meta.label if field.model is not None else "another model"
                raise ValueError(
                    f"fenced_update() writes one table: {meta.label}.{name} is a column of "
                    f"{owner}'s table (multi-table inheritance). Write through {owner}'s "
                    "manager, or keep the fenced columns on this model's own table"
                )


class FencedModel(models.Model):
    """An abstract model whose rows are written with fenced updates
    (:meth:`FencedQuerySet.fenced_update`): inherit it, migrate, and write through
    ``objects.filter(...).fenced_update(fence, **values)``.

    Fields: ``fenced_by`` (the key of the last fenced write, ``""`` for none) and ``fence``
    (its token or attempt, 0 for none).
    """

    fenced_by = models.CharField(
        _("fenced by"),
        max_length=MAX_FENCE_KEY,
        blank=True,
        default="",
        help_text=_("The lease key or workflow step of the last fenced write."),
    )
    fence = models.BigIntegerField(
        _("fence"), default=0, help_text=_("The fencing token or attempt of the last fenced write.")
    )

    objects = FencedQuerySet.as_manager()

    class Meta:
        abstract = True


# -- the trigger --------------------------------------------------------------------------------


def _trigger_name(table: str) -> str:
    """The trigger's (and on PostgreSQL its function's) name for ``table``: the table's
    name, and past 40 characters its first 31 and a digest of the whole, so that two long
    names alike at the start get triggers of their own (within the 63 characters of a
    PostgreSQL name)."""
    if len(table) > 40:
        table = f"{table[:31]}_{hashlib.sha256(table.encode()).hexdigest()[:8]}"
    return f"{table}_older_fence"


def trigger_sql(vendor: str, table: str, quote: Any) -> tuple[list[str], list[str]]:
    """The statements that create and drop the trigger refusing an older fence on
    ``table`` for database ``vendor`` (``"postgresql"``, ``"mysql"``, ``"sqlite"``);
    ``quote`` quotes a name. ``([], [])`` for another vendor."""
    name = _trigger_name(table)
    t, n = quote(table), quote(name)
    if vendor == "postgresql":
        return [
            f"CREATE OR REPLACE FUNCTION {n}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN IF NEW.fenced_by = OLD.fenced_by AND NEW.fence < OLD.fence THEN "
            "RAISE EXCEPTION 'fenced write refused: fence % is older than % for %', "
            "NEW.fence, OLD.fence, OLD.fenced_by USING ERRCODE = 'check_violation'; "
            "END IF; RETURN NEW; END $$",
            f"CREATE TRIGGER {n} BEFORE UPDATE OF fence, fenced_by ON {t} "
            f"FOR EACH ROW EXECUTE FUNCTION {n}()",
        ], [f"DROP TRIGGER IF EXISTS {n} ON {t}", f"DROP FUNCTION IF EXISTS {n}()"]
    if vendor == "mysql":
        return [
            f"CREATE TRIGGER {n} BEFORE UPDATE ON {t} FOR EACH ROW BEGIN "
            "IF NEW.fenced_by = OLD.fenced_by AND NEW.fence < OLD.fence THEN "
            "SIGNAL SQLSTATE '23000' SET MESSAGE_TEXT = 'fenced write refused: older fence', "
            # 4025 (a CHECK constraint failed): Django raises IntegrityError for it.
            "MYSQL_ERRNO = 4025; "
            "END IF; END"
        ], [f"DROP TRIGGER IF EXISTS {n}"]
    if vendor == "sqlite":
        return [
            f"CREATE TRIGGER {n} BEFORE UPDATE OF fence, fenced_by ON {t} FOR EACH ROW "
            "WHEN NEW.fenced_by = OLD.fenced_by AND NEW.fence < OLD.fence "
            "BEGIN SELECT RAISE(ABORT, 'fenced write refused: older fence'); END"
        ], [f"DROP TRIGGER IF EXISTS {n}"]
    return [], []


def restore_fence_triggers(using: str) -> list[str]:
    """Create again, on SQLite database ``using`` (an alias), the trigger of every applied
    :class:`FenceTrigger` whose table lost it, and return those tables' names. SQLite drops a
    table's triggers when a migration rebuilds the table, which most changes of a column do;
    ``migrate`` calls this when it is done (``post_migrate``). Nothing on other databases,
    which keep a table's triggers through ``ALTER TABLE``."""
    connection = connections[using]
    if connection.vendor != "sqlite":
        return []
    # deferred: the migration machinery, loaded only after a migrate on SQLite
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connection, ignore_no_migrations=True)
    # Squashed migrations' replaced names are recorded as applied, not nodes of the graph.
    applied = [key for key in loader.applied_migrations if key in loader.graph.nodes]
    state = loader.project_state(applied)
    restored = []
    for key in applied:
        migration = loader.graph.nodes[key]
        for operation in getattr(migration, "operations", ()):
            if not isinstance(operation, FenceTrigger):
                continue
            try:
                model = state.apps.get_model(key[0], operation.model_name)
            except LookupError:
                continue  # deleted by a later migration
            table = model._meta.db_table
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = %s",
                    [_trigger_name(table)],
                )
                if (
                    cursor.fetchone() is not None
                    or table not in connection.introspection.table_names(cursor)
                ):
                    continue
                for statement in trigger_sql("sqlite", table, connection.ops.quote_name)[0]:
                    cursor.execute(statement)
            restored.append(table)
    return restored


class FenceTrigger(Operation):
    """A migration operation: a trigger on ``model_name``'s table (a :class:`FencedModel`)
    that refuses any ``UPDATE`` moving a row's ``fence`` backwards under the same
    ``fenced_by`` — raw SQL and other programs included — with an ``IntegrityError``
    (PostgreSQL: ``check_violation``; SQLite: an abort; MariaDB / MySQL: a ``SIGNAL`` with
    the error number of a failed ``CHECK`` constraint, 4025). Reversible. A trigger created
    by an earlier version on MariaDB / MySQL raised an ``OperationalError`` (1644): migrate
    the operation back and forth to get the new one. Put it after the model's
    ``CreateModel``::

        operations = [
            migrations.CreateModel("Config", ...),
            FenceTrigger("Config"),
        ]
    """

    reversible = True
    reduces_to_sql = True

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        """Nothing: a trigger is not part of the model state."""

    def _run(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, state: ProjectState, i: int
    ) -> None:
        model = state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        connection = schema_editor.connection
        statements = trigger_sql(
            connection.vendor, model._meta.db_table, connection.ops.quote_name
        )[i]
        for statement in statements:
            schema_editor.execute(statement, params=None)

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        """Create the trigger."""
        self._run(app_label, schema_editor, to_state, 0)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        """Drop the trigger."""
        self._run(app_label, schema_editor, from_state, 1)

    def describe(self) -> str:
        """What the operation does, for ``migrate``'s output."""
        return f"Refuse older fences on {self.model_name}"

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        """How a migration file spells it."""
        return ("django_leases.fencing.FenceTrigger", [self.model_name], {})


__all__ = [
    "Fence",
    "FenceTrigger",
    "FencedModel",
    "FencedQuerySet",
    "as_fence",
    "lease_fence",
    "restore_fence_triggers",
    "step_fence",
    "trigger_sql",
]

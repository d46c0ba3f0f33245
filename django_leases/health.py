"""Health of a django-leases installation: what ``manage.py leases_check`` reports.

Six checks, each judged on the **database clock** where time matters:

``database``
    Every alias django-leases writes to (the router's ``db_for_write`` for each of its models)
    answers a ``SELECT 1``.
``migrations``
    No migration is unapplied on that alias, for django-leases or any other installed app
    (the plan ``migrate`` would run), and on the workflow tables' alias the workers could
    start: on PostgreSQL the hot-path functions a migration installed are still there
    (:func:`functions_missing`, the rule the worker applies; the message says
    how to repair).
``workers``
    The workflow worker processes alive now: each holds a heartbeat lease
    (``workflow-worker:<host>:<pid>:<id>``, renewed every TTL/3 like any hold, lapsing after its TTL
    when the process dies) and records its threads and units in flight (``WorkflowWorker``).
    It is a problem when work has been **due for longer than** ``overdue_after`` seconds (a
    pass due, or a waiting step available) and nobody took it: no worker is running, or too
    few for the load. Also reported: steps running under a live step lease, live run leases
    and the time since the latest step claim.
``lapsed_steps``
    Steps still ``running`` whose step lease lapsed more than ``overdue_after`` seconds ago:
    their worker died and no other worker has reclaimed them (a worker would run them again
    as attempt + 1). Lapsed for less than that is normal: they wait for the next claim.
``stuck_runs``
    ``running`` runs that nothing will move: no pass due, no waiting step with attempts left,
    no running step, no live run lease, and no change for ``stuck_after`` seconds. They need
    an operator (resume, cancel or retry a step in the admin).
``replication``
    A **warning** (it does not change the exit status) when the database has standbys
    (replicas) its commits do not wait for: promoting one loses acknowledged lease grants
    and fenced writes (:func:`django_leases.db.replication`; system check ``W032`` says the
    same). ``ok`` when every connected standby is synchronous, or none is connected.

:func:`run_checks` returns a :class:`HealthReport`; its :attr:`~HealthReport.exit_code`
is what the command exits with (:data:`EXIT_OK`, :data:`EXIT_PROBLEMS`,
:data:`EXIT_UNREACHABLE`).
"""

from __future__ import annotations

import importlib
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db import DatabaseError, connections, router, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder
from django.db.models import Exists, F, Max, OuterRef, Q
from django.db.models.functions import Coalesce, Greatest
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse

from django_leases import clock, db
from django_leases.clock import DbNow
from django_leases.exceptions import WorkflowFunctionsMissing
from django_leases.frozen import frozen
from django_leases.models.lease import LEASE_FUNCTIONS_MIGRATION, lease_functions
from django_leases.models.worker import WorkflowWorker
from django_leases.models.workflow import FUNCTIONS_MIGRATION, functions
from django_leases.validation import seconds
from django_leases.workflows.values import attempts_left_q

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models import Model
    from django.db.models.expressions import Combinable

#: Exit status: every check passed.
EXIT_OK = 0
#: Exit status: at least one check found a problem (unapplied migrations, overdue work,
#: lapsed steps nobody reclaimed, stuck runs).
EXIT_PROBLEMS = 3
#: Exit status: a database django-leases writes to could not be reached (takes precedence).
EXIT_UNREACHABLE = 4

#: Default seconds due work may wait before it counts as overdue.
DEFAULT_OVERDUE_AFTER = 60.0
#: Default seconds a running run may sit unmoving before it counts as stuck.
DEFAULT_STUCK_AFTER = 300.0
#: The longest of either threshold, seconds (a year): what the database clock can subtract.
MAX_THRESHOLD = 366 * 24 * 3600.0

#: Key prefix of the lease an orchestration pass holds (see ``workflows.engine.run_lease_key``).
RUN_LEASE_PREFIX = "workflow-run:"

OK = "ok"
PROBLEM = "problem"
UNREACHABLE = "unreachable"
SKIPPED = "skipped"
#: Worth an operator's attention, but not a problem: the exit status stays as it is.
WARNING = "warning"

#: Most items listed in a finding's details (the count is always exact).
MAX_LISTED = 20


@dataclass
class Finding:
    """The outcome of one check on one database alias.

    ``status`` is ``"ok"``, ``"problem"``, ``"unreachable"`` (the database), ``"warning"``
    (worth a look; the exit status stays) or ``"skipped"`` (the check could not run, e.g. its
    database is unreachable); ``details`` is JSON.
    """

    check: str
    alias: str
    status: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class HealthReport:
    """All findings of one :func:`run_checks` call, in the order they ran."""

    findings: list[Finding]

    @property
    def exit_code(self) -> int:
        """:data:`EXIT_UNREACHABLE` if a database is unreachable, else :data:`EXIT_PROBLEMS`
        if any check found a problem, else :data:`EXIT_OK`."""
        statuses = {finding.status for finding in self.findings}
        if UNREACHABLE in statuses:
            return EXIT_UNREACHABLE
        if PROBLEM in statuses:
            return EXIT_PROBLEMS
        return EXIT_OK

    @property
    def healthy(self) -> bool:
        """``True`` when :attr:`exit_code` is :data:`EXIT_OK`."""
        return self.exit_code == EXIT_OK

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data: ``healthy``, ``exit_code`` and ``checks``."""
        return {
            "healthy": self.healthy,
            "exit_code": self.exit_code,
            "checks": [asdict(finding) for finding in self.findings],
        }


def _models() -> dict[str, type[Model]]:
    return {model.__name__: model for model in apps.get_app_config("django_leases").get_models()}


def write_aliases() -> list[str]:
    """The database aliases django-leases writes to: ``router.db_for_write`` of each of its
    models, sorted."""
    return sorted({router.db_for_write(model) for model in _models().values()})


def holds_tables(alias: str) -> bool:
    """Whether the database routers let django-leases' tables be on ``alias`` (a database
    alias): ``allow_migrate`` for one of its models at least. ``migrate`` records the
    migrations of a database the routers keep it off, though no table is created there, so
    the migration record alone cannot tell."""
    return any(router.allow_migrate_model(alias, model) for model in _models().values())


# -- database ---------------------------------------------------------------------------------


def check_database(alias: str) -> Finding:
    """Connect to ``alias`` and run ``SELECT 1``; an unknown alias counts as unreachable."""
    if alias not in connections.settings:
        return Finding("database", alias, UNREACHABLE, f"no database alias {alias!r} is configured")
    connection = connections[alias]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any driver error means "not reachable" to an operator
        return Finding(
            "database",
            alias,
            UNREACHABLE,
            f"cannot reach the database: {type(exc).__name__}: {exc}".strip(),
            {"vendor": connection.vendor},
        )
    return Finding(
        "database", alias, OK, f"reachable ({connection.vendor})", {"vendor": connection.vendor}
    )


# -- migrations -------------------------------------------------------------------------------


def check_migrations(alias: str) -> Finding:
    """List the migrations ``migrate --database alias`` would apply (every installed app)."""
    executor = MigrationExecutor(connections[alias])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    pending = [
        f"{migration.app_label}.{migration.name}" for migration, backwards in plan if not backwards
    ]
    if not pending:
        return Finding("migrations", alias, OK, "all migrations applied")
    ours = [name for name in pending if name.startswith("django_leases.")]
    what = f"{len(pending)} unapplied migration{'s' if len(pending) != 1 else ''}"
    if ours:
        what += f" ({len(ours)} of django_leases)"
    return Finding(
        "migrations",
        alias,
        PROBLEM,
        f"{what}: run `manage.py migrate --database {alias}`",
        {"unapplied": pending},
    )


def _tables_exist(alias: str) -> bool:
    executor = MigrationExecutor(connections[alias])
    return ("django_leases", "0001_initial") in executor.loader.applied_migrations


#: alias -> (``time.monotonic()`` of the reading, the migrations finding, tables exist).
_migrations_seen: dict[str, tuple[float, Finding, bool]] = {}


def _migrations(alias: str, max_age: float) -> tuple[Finding, bool]:
    """The migrations finding and whether django_leases' tables exist on ``alias``, read
    afresh, or (``max_age`` > 0) as read within the last ``max_age`` seconds by this process:
    loading the migration graph is the costly part of the checks."""
    now = time.monotonic()
    seen = _migrations_seen.get(alias)
    if max_age > 0 and seen is not None and now - seen[0] < max_age:
        return seen[1], seen[2]
    finding = _guarded("migrations", alias, lambda: check_migrations(alias))
    exist = _tables_exist(alias)
    _migrations_seen[alias] = (now, finding, exist)
    return finding, exist


def check_functions(alias: str) -> Finding:
    """The migrations finding of an alias whose migrations are all applied: a problem when
    workflow workers would refuse to start there for want of their PostgreSQL functions
    (dropped since ``migrate`` installed them), the message saying how to repair."""
    missing = functions_missing(connections[alias])
    if missing is None:
        return Finding("migrations", alias, OK, "all migrations applied")
    return Finding("migrations", alias, PROBLEM, str(missing))


# -- readiness: the functions the tuned path calls ------------------------------------------


@frozen
class _Family:
    """One set of PostgreSQL functions the tuned path calls: what they are for (``kind``),
    the migration that froze them (``migration``, its dict ``attribute`` of ``CREATE``
    statements by name) and the names the running code calls (``names``)."""

    kind: str
    migration: str
    attribute: str
    names: tuple[str, ...]

    def statements(self) -> dict[str, str]:
        """The ``CREATE`` statements its migration froze, by function name."""
        module = importlib.import_module(f"django_leases.migrations.{self.migration}")
        statements: dict[str, str] = getattr(module, self.attribute)
        return statements


def _families(connection: BaseDatabaseWrapper) -> tuple[_Family, ...]:
    """The workflow functions and the lease functions, as the running code calls them."""
    return (
        _Family(
            "workflow",
            FUNCTIONS_MIGRATION,
            "FUNCTIONS",
            tuple(function.name for function in functions(connection).values()),
        ),
        _Family("lease", LEASE_FUNCTIONS_MIGRATION, "LEASE_FUNCTIONS", tuple(lease_functions())),
    )


def _missing_by_family(connection: BaseDatabaseWrapper) -> list[tuple[_Family, list[str]]]:
    """Each family with the names of its functions ``connection``'s database lacks (looked
    up through its ``search_path``, as the calls are), those lacking none left out; ``[]``
    elsewhere than on PostgreSQL."""
    if connection.vendor != "postgresql":
        return []
    families = _families(connection)
    names = [name for family in families for name in family.names]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name FROM unnest(%s::text[]) AS name WHERE to_regproc(name) IS NULL",
            [names],
        )
        gone = {name for (name,) in cursor.fetchall()}
    found = [(family, [name for name in family.names if name in gone]) for family in families]
    return [(family, missing) for family, missing in found if missing]


def missing_functions(connection: BaseDatabaseWrapper) -> list[str]:
    """Names of the functions the current code calls — the workflow functions
    (:func:`~django_leases.models.workflow.functions`) and the lease functions
    (:func:`~django_leases.models.lease.lease_functions`) — that ``connection``'s database
    lacks; ``[]`` elsewhere than on PostgreSQL."""
    return [name for _family, missing in _missing_by_family(connection) for name in missing]


def functions_missing(connection: BaseDatabaseWrapper) -> WorkflowFunctionsMissing | None:
    """Whether workers on ``connection``'s database would refuse to start for want of the
    functions the running code calls on the tuned path (PostgreSQL only: the workflow
    functions and the lease functions), and how to repair it: the one readiness rule of the
    worker, ``leases_check`` and the health view.

    Args:
        connection: the database's connection.

    Returns:
        ``None`` when workers can start (or the portable path is used); else the error to
        raise or report, whose message says how to repair. When a function's migration
        (:data:`FUNCTIONS_MIGRATION`, or the lease functions' ``LEASE_FUNCTIONS_MIGRATION``)
        is unapplied that is ``migrate``. When it is applied and the functions were dropped
        since, ``migrate`` would not run it again: the repair is
        ``manage.py leases_check --install-functions``, which runs the statements those
        migrations froze (:func:`install_functions`). When the running code's functions are
        not those they install, this version lacks the migration.

    Raises:
        DatabaseError: the database could not be read.
    """
    if not db.tuned(connection, "postgresql"):
        return None
    lacking = _missing_by_family(connection)
    if not lacking:
        return None
    alias = connection.alias
    what = " and ".join(
        f"the {family.kind} functions {', '.join(missing)}" for family, missing in lacking
    )
    applied = MigrationRecorder(connection).applied_migrations()
    if any(("django_leases", family.migration) not in applied for family, _ in lacking):
        return WorkflowFunctionsMissing(alias, what)
    if any(not set(missing) <= set(family.statements()) for family, missing in lacking):
        return WorkflowFunctionsMissing(
            alias,
            what,
            "this version of django-leases lacks the migration that installs them; "
            "install a version that has it",
        )
    migrations = " and ".join(family.migration for family, _ in lacking)
    return WorkflowFunctionsMissing(
        alias,
        what,
        f"they were dropped after migration {migrations} installed them, and "
        "'migrate' does not run an applied migration again. Run "
        f"'manage.py leases_check --install-functions --database {alias}' (it creates the "
        f"functions as migration {migrations} froze them, and changes nothing else)",
    )


def install_functions(connection: BaseDatabaseWrapper) -> list[str]:
    """Create the functions the running code calls that ``connection``'s database lacks, as
    their migrations froze them (:data:`FUNCTIONS_MIGRATION` for the workflow functions, the
    lease functions' ``LEASE_FUNCTIONS_MIGRATION``; ``CREATE OR REPLACE FUNCTION``, in one
    transaction): the repair :func:`functions_missing` gives for functions dropped after
    their migration ran. Nothing else is changed; a no-op elsewhere than on PostgreSQL.

    Returns the names created (``list[str]``; empty when none was missing).

    Raises:
        WorkflowFunctionsMissing: a missing function is not one its migration holds (this
            version lacks the migration that installs it; nothing created).
        DatabaseError: the database refused a statement (nothing created).
    """
    statements: dict[str, str] = {}
    for family, missing in _missing_by_family(connection):
        frozen = family.statements()
        unknown = [name for name in missing if name not in frozen]
        if unknown:
            raise WorkflowFunctionsMissing(
                connection.alias,
                f"the {family.kind} functions {', '.join(unknown)}",
                "this version of django-leases lacks the migration that installs them; "
                "install a version that has it",
            )
        statements.update((name, frozen[name]) for name in missing)
    if statements:
        with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
            for statement in statements.values():
                cursor.execute(statement)
    return list(statements)


# -- replication ------------------------------------------------------------------------------


def check_replication(alias: str) -> Finding:
    """Whether ``alias`` has standbys its commits do not wait for (a warning), from
    :func:`django_leases.db.replication`."""
    state = db.replication(connections[alias])
    if state is None:
        return Finding("replication", alias, OK, "no replication state to read on this database")
    details: dict[str, Any] = {
        "standbys": state.standbys,
        "asynchronous": state.asynchronous,
        "names": list(state.names),
        "known": state.known,
    }
    warning = state.warning()
    if warning is not None:
        return Finding("replication", alias, WARNING, warning, details)
    if not state.standbys:
        message = "no standby is connected"
    elif not state.known:
        message = f"{state.standbys} standby(s) connected; {state.why}"
    else:
        message = f"{state.standbys} standby(s), each synchronous"
    return Finding("replication", alias, OK, message, details)


# -- workers, lapsed steps, stuck runs --------------------------------------------------------


def _ago(seconds: float) -> Combinable:
    """An ORM expression for *database now - seconds*."""
    return clock.db_now_plus(-seconds)


def _waiting_q() -> Q:
    """Steps waiting to run: pending / scheduled, or failed with attempts left."""
    return Q(status__in=["pending", "scheduled"]) | (Q(status="failed") & attempts_left_q())


def _listed(values: Iterable[Any]) -> list[str]:
    return [str(value) for value in list(values)[:MAX_LISTED]]


def check_workers(alias: str, overdue_after: float) -> Finding:
    """Evidence of live workers on ``alias``, and work due for over ``overdue_after`` seconds.

    A problem when a running run's pass, or a waiting step, has been due for longer than
    ``overdue_after`` seconds. Lapsed running steps are :func:`check_lapsed_steps`'s.
    """
    models = _models()
    run_model, step_model, attempt_model, lease_model = (
        models["WorkflowRun"],
        models["WorkflowStep"],
        models["WorkflowStepAttempt"],
        models["Lease"],
    )
    runs = run_model._default_manager.using(alias)
    steps = step_model._default_manager.using(alias)
    leases = lease_model._default_manager.using(alias)
    live_leases = leases.filter(expires_at__gt=DbNow(), released_at__isnull=True)

    overdue_passes = runs.filter(status="running", pass_due_at__lte=_ago(overdue_after))
    overdue_steps = steps.filter(
        _waiting_q(), run__status="running", available_at__lte=_ago(overdue_after)
    )

    alive = list(WorkflowWorker.objects.db_manager(alias).live().order_by("host", "pid"))
    latest = attempt_model._default_manager.using(alias).aggregate(
        latest=Max("started_at"), db_now=Max(DbNow())
    )
    details: dict[str, Any] = {
        "steps_running_under_live_lease": steps.filter(
            status="running", lease_expires_at__gt=DbNow()
        ).count(),
        "live_run_leases": live_leases.filter(key__startswith=RUN_LEASE_PREFIX).count(),
        "live_workers": len(alive),
        "workers": [
            f"{w.host}:{w.pid} ({w.concurrency} thread(s), {w.in_flight} in flight)"
            for w in alive[:MAX_LISTED]
        ],
        "seconds_since_last_claim": _seconds_between(latest["latest"], latest["db_now"]),
        "overdue_passes": overdue_passes.count(),
        "overdue_steps": overdue_steps.count(),
        "overdue_after_seconds": overdue_after,
    }
    overdue = details["overdue_passes"] + details["overdue_steps"]
    busy = details["steps_running_under_live_lease"] + details["live_run_leases"]
    if overdue:
        details["overdue_runs"] = _listed(
            runs.filter(
                Q(pk__in=overdue_passes.values("pk")) | Q(pk__in=overdue_steps.values("run_id"))
            )
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        return Finding(
            "workers",
            alias,
            PROBLEM,
            f"{overdue} piece{'s' if overdue != 1 else ''} of work due for over "
            f"{overdue_after:g} s and not picked up: "
            + (
                f"too few workers ({len(alive)} alive, {busy} busy now)"
                if alive
                else "no workflow worker is running"
            ),
            details,
        )
    if alive:
        message = f"{len(alive)} worker(s) alive; no overdue work"
    else:
        message = "no workflow worker is running; no work is overdue"
    return Finding("workers", alias, OK, message, details)


def _seconds_between(earlier: datetime | None, later: datetime | None) -> float | None:
    if earlier is None or later is None:
        return None
    return round(max(0.0, (later - earlier).total_seconds()), 3)


def check_lapsed_steps(alias: str, overdue_after: float) -> Finding:
    """Running steps whose step lease lapsed over ``overdue_after`` seconds ago (a problem),
    and those lapsed more recently (awaiting a worker's claim, fine)."""
    step_model = _models()["WorkflowStep"]
    lapsed = step_model._default_manager.using(alias).filter(
        Q(lease_expires_at__lte=DbNow()) | Q(lease_expires_at__isnull=True),
        status="running",
        run__status="running",
    )
    long_lapsed = lapsed.filter(
        Q(lease_expires_at__lte=_ago(overdue_after)) | Q(lease_expires_at__isnull=True)
    )
    details: dict[str, Any] = {
        "lapsed": lapsed.count(),
        "lapsed_over_threshold": long_lapsed.count(),
        "overdue_after_seconds": overdue_after,
    }
    if details["lapsed_over_threshold"]:
        details["steps"] = _listed(
            f"{run_id}/{name} (attempt {attempt})"
            for run_id, name, attempt in long_lapsed.order_by("lease_expires_at").values_list(
                "run_id", "step_name", "attempt"
            )[:MAX_LISTED]
        )
        count = details["lapsed_over_threshold"]
        return Finding(
            "lapsed_steps",
            alias,
            PROBLEM,
            f"{count} running step{'s' if count != 1 else ''} lapsed over {overdue_after:g} s "
            "ago and not reclaimed: their worker died and no worker took them over",
            details,
        )
    message = "no running step with a lapsed lease"
    if details["lapsed"]:
        message = f"{details['lapsed']} lapsed step(s) awaiting a worker's claim"
    return Finding("lapsed_steps", alias, OK, message, details)


def check_stuck_runs(alias: str, stuck_after: float) -> Finding:
    """``running`` runs with nothing due, nothing running, no live run lease and no change
    for ``stuck_after`` seconds."""
    models = _models()
    run_model, step_model, lease_model = (
        models["WorkflowRun"],
        models["WorkflowStep"],
        models["Lease"],
    )
    steps = step_model._default_manager.using(alias)
    candidates = (
        run_model._default_manager.using(alias)
        .filter(status="running", pass_due_at__isnull=True)
        .annotate(
            waiting=Exists(steps.filter(_waiting_q(), run=OuterRef("pk"))),
            running_step=Exists(steps.filter(run=OuterRef("pk"), status="running")),
            last_change=Greatest(
                F("updated_at"), Coalesce(Max("steps__updated_at"), F("updated_at"))
            ),
        )
        .filter(waiting=False, running_step=False, last_change__lte=_ago(stuck_after))
        .order_by("last_change")
    )
    candidate_ids: list[uuid.UUID] = list(candidates.values_list("pk", flat=True))
    if candidate_ids:
        keys = {f"{RUN_LEASE_PREFIX}{run_id}": run_id for run_id in candidate_ids}
        held = set(
            lease_model._default_manager.using(alias)
            .filter(key__in=list(keys), expires_at__gt=DbNow(), released_at__isnull=True)
            .values_list("key", flat=True)
        )
        candidate_ids = [run_id for key, run_id in keys.items() if key not in held]
    details: dict[str, Any] = {"stuck": len(candidate_ids), "stuck_after_seconds": stuck_after}
    if not candidate_ids:
        return Finding("stuck_runs", alias, OK, "no stuck run", details)
    details["runs"] = _listed(candidate_ids)
    count = len(candidate_ids)
    return Finding(
        "stuck_runs",
        alias,
        PROBLEM,
        f"{count} running run{'s' if count != 1 else ''} with nothing due or running for over "
        f"{stuck_after:g} s: resume, cancel or retry a step in the admin",
        details,
    )


# -- all together -----------------------------------------------------------------------------


def run_checks(
    aliases: Sequence[str] | None = None,
    *,
    overdue_after: float | Decimal | timedelta = DEFAULT_OVERDUE_AFTER,
    stuck_after: float | Decimal | timedelta = DEFAULT_STUCK_AFTER,
    migrations_max_age: float = 0.0,
) -> HealthReport:
    """Run every check and return the report.

    Args:
        aliases: database aliases to check (default: :func:`write_aliases`). Workflow checks
            run on each alias that holds the workflow tables' writes, or on every alias given.
        overdue_after: how long due work may wait before it is a problem: seconds (> 0,
            ``int``, ``float`` or ``Decimal``) or a ``timedelta``.
        stuck_after: how long a running run may sit unmoving before it is stuck, as
            ``overdue_after``.
        migrations_max_age: seconds a migrations reading of this process may be reused
            (0, the default: read afresh); the health view uses it to stay cheap.

    Raises ``ValueError`` (naming it) for a threshold the one seconds validator
    (:func:`django_leases.validation.seconds`) refuses: not positive, NaN, infinite, a
    ``bool`` or a string. Database errors are
    findings, never exceptions.
    """
    overdue_after = seconds(
        overdue_after, "overdue_after", above_minimum=True, maximum=MAX_THRESHOLD
    )
    stuck_after = seconds(stuck_after, "stuck_after", above_minimum=True, maximum=MAX_THRESHOLD)
    explicit = aliases is not None
    targets = list(dict.fromkeys(aliases if aliases is not None else write_aliases()))
    workflow_alias = router.db_for_write(_models()["WorkflowRun"])
    findings: list[Finding] = []
    for alias in targets:
        database = check_database(alias)
        findings.append(database)
        if database.status != OK:
            for name in ("migrations", "replication", "workers", "lapsed_steps", "stuck_runs"):
                findings.append(Finding(name, alias, SKIPPED, "skipped: database unreachable"))
            continue
        migrations, tables_exist = _migrations(alias, migrations_max_age)
        if migrations.status == OK and tables_exist and (explicit or alias == workflow_alias):
            migrations = _guarded("migrations", alias, lambda a=alias: check_functions(a))
        findings.append(migrations)
        findings.append(_guarded("replication", alias, lambda a=alias: check_replication(a)))
        if not explicit and alias != workflow_alias:
            continue
        if not tables_exist:
            for name in ("workers", "lapsed_steps", "stuck_runs"):
                findings.append(
                    Finding(name, alias, SKIPPED, "skipped: django_leases is not migrated here")
                )
            continue
        findings.append(_guarded("workers", alias, lambda a=alias: check_workers(a, overdue_after)))
        findings.append(
            _guarded("lapsed_steps", alias, lambda a=alias: check_lapsed_steps(a, overdue_after))
        )
        findings.append(
            _guarded("stuck_runs", alias, lambda a=alias: check_stuck_runs(a, stuck_after))
        )
    return HealthReport(findings)


def check_liveness(aliases: Sequence[str] | None = None) -> HealthReport:
    """The cheap part of :func:`run_checks`: whether each database django-leases writes to
    (``aliases``; default :func:`write_aliases`) answers a ``SELECT 1`` — one query per
    alias, whatever the tables hold. The report has only ``database`` findings."""
    targets = list(dict.fromkeys(aliases if aliases is not None else write_aliases()))
    return HealthReport([check_database(alias) for alias in targets])


def _guarded(name: str, alias: str, check: Callable[..., Finding]) -> Finding:
    """Run ``check()`` in a savepoint; a database error becomes a ``problem`` finding."""
    try:
        with transaction.atomic(using=alias):
            result: Finding = check()
            return result
    except DatabaseError as exc:
        return Finding(name, alias, PROBLEM, f"the check failed: {type(exc).__name__}: {exc}")


def format_text(report: HealthReport) -> str:
    """The report as lines for a terminal: a summary line, then one line per finding."""
    problems = sum(f.status in (PROBLEM, UNREACHABLE) for f in report.findings)
    warnings = sum(f.status == WARNING for f in report.findings)
    head = (
        "django-leases: healthy"
        if report.healthy
        else (f"django-leases: {problems} problem{'s' if problems != 1 else ''}")
    )
    if warnings:
        head += f" ({warnings} warning{'s' if warnings != 1 else ''})"
    width = max((len(f"{f.check} [{f.alias}]") for f in report.findings), default=0)
    lines = [head]
    for finding in report.findings:
        label = f"{finding.check} [{finding.alias}]".ljust(width)
        lines.append(f"  {finding.status.upper():<11} {label}  {finding.message}")
        if finding.status == PROBLEM:
            for key in ("unapplied", "overdue_runs", "steps", "runs"):
                for item in finding.details.get(key, []):
                    lines.append(f"  {'':<11} {'':<{width}}    - {item}")
    return "\n".join(lines)


__all__ = [
    "DEFAULT_OVERDUE_AFTER",
    "DEFAULT_STUCK_AFTER",
    "EXIT_OK",
    "EXIT_PROBLEMS",
    "EXIT_UNREACHABLE",
    "Finding",
    "HealthReport",
    "check_database",
    "check_lapsed_steps",
    "check_liveness",
    "check_migrations",
    "check_replication",
    "check_stuck_runs",
    "check_workers",
    "format_text",
    "run_checks",
    "write_aliases",
]


# -- the HTTP view --------------------------------------------------------------------------------

#: Seconds the health view reuses a process's reading of the migrations.
VIEW_MIGRATIONS_MAX_AGE = 60.0


def _is_staff(request: HttpRequest) -> bool:
    """Whether the request is an active staff user's or superuser's; ``False`` when the
    session or the user cannot be read (their database is down: the probe must still answer
    its JSON)."""
    user = getattr(request, "user", None)
    try:
        return bool(user is not None and user.is_active and (user.is_staff or user.is_superuser))
    except DatabaseError:
        return False


def health_view(request: HttpRequest) -> HttpResponse:
    """``GET health/`` (``include("django_leases.urls")``): JSON with ``healthy``,
    ``exit_code``, ``scope`` and ``checks``, status 200 when healthy and 503 otherwise.

    What is checked depends on who asks:

    * anyone (a load balancer, an uptime probe): **liveness** only (``"scope":
      "liveness"``) — each database django-leases writes to answers a ``SELECT 1``
      (:func:`check_liveness`), one query per database however many runs there are, so
      the probe cannot load the database; each check's status, no details;
    * an active staff user or superuser: the **full** checks ``leases_check`` runs
      (``"scope": "full"``, :func:`run_checks`: migrations, workers, lapsed steps, stuck
      runs, replication) with their details (counts, run ids, workers). The migrations are
      read at most once a minute per process (:data:`VIEW_MIGRATIONS_MAX_AGE`).

    A user whose session or row cannot be read (the database is down) counts as anonymous,
    so the answer is still JSON."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    if _is_staff(request):
        report = run_checks(migrations_max_age=VIEW_MIGRATIONS_MAX_AGE)
        body = {**report.as_dict(), "scope": "full"}
    else:
        report = check_liveness()
        body = {**report.as_dict(), "scope": "liveness"}
        body["checks"] = [
            {"check": c["check"], "alias": c["alias"], "status": c["status"]}
            for c in body["checks"]
        ]
    return JsonResponse(body, status=200 if report.healthy else 503)

"""Cron schedules of workflows: their declarations and the tick arithmetic (DESIGN §5b).

A schedule starts one run of a workflow per **tick** of a cron expression, in a time zone,
with a JSON input. It is declared in code or in settings::

    @workflow("reports.nightly", schedule="0 3 * * *", timezone="Europe/Paris")
    def nightly(run, input): ...

    DJANGO_LEASES = {"SCHEDULES": {
        "nightly": {"workflow": "reports.nightly", "cron": "0 3 * * *",
                    "timezone": "Europe/Paris", "input": {"full": True},
                    "catch_up": "latest"},
    }}

A decorator's schedule is named after its workflow. Cron expressions are read by
`cronsim <https://pypi.org/project/cronsim/>`_ (the five classic fields, or six with the
seconds **first**: ``*/10 * * * * *``; ``L``, ``LW``, ``MON#2``, names of days and months):
it evaluates them as Debian's cron does, daylight-saving changes included — a tick that falls
into the hour skipped in spring runs at the change, one in the hour repeated in autumn runs
once (hourly and more frequent expressions run at each real hour). Ticks are kept as UTC
instants, and each one is a run's idempotency key (:func:`run_key`).

This module holds no model and imports none: the store's rules (``WorkflowSchedule.objects``
in :mod:`django_leases.models.schedule`) and the registry both use it.

Overlap (``overlap``): what a tick does while the run the schedule started last is still
**live** (running or suspended). ``"skip"`` (the default) starts nothing for it and records it
as skipped (its time and the reason, on the schedule's row); ``"buffer_one"`` keeps it waiting
and starts it once that run has finished (at most one tick waits: another tick while one waits
is skipped); ``"cancel_other"`` cancels the live run (and its live children) and starts the
tick's; ``"allow"`` starts it whatever runs. A run that ended (completed, failed, cancelled)
is not live.

A schedule may start a Django ``@task`` instead of a workflow: a ``SCHEDULES`` entry with
``"task": "dotted.path"`` (and ``"args"``, ``"kwargs"``, JSON) enqueues that task through
its ``TaskBackend`` (:class:`django_leases.tasks.TaskBackend`) once per tick, the tick key
being the task run's idempotency key.

Catch-up (``catch_up``): a tick fired more than :data:`MISSED_AFTER` seconds after its time
was **missed** (no worker ran then). ``"latest"`` (the default) starts one run for the latest
tick that is due, however many were missed; ``"none"`` starts none for missed ticks and waits
for the next one.

One schedule is built in: ``DJANGO_LEASES["PRUNE"]`` (:func:`prune_from_settings`) declares
:data:`PRUNE_SCHEDULE`, whose ticks start the built-in workflow :data:`PRUNE_WORKFLOW`
(:mod:`django_leases.workflows.retention`): a ``WorkflowRun.objects.prune`` per tick.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from django_leases.conf import DEFAULT_QUEUE, MAX_QUEUE_LENGTH
from django_leases.frozen import frozen
from django_leases.validation import TTL_CEILING, check_json, check_name, seconds
from django_leases.workflows.values import TASK_WORKFLOW

__all__ = [
    "CATCH_UP_POLICIES",
    "MAX_BACKFILL_TICKS",
    "MAX_CRON_LENGTH",
    "MAX_PRUNE_BATCH_SIZE",
    "MAX_SCHEDULE_NAME_LENGTH",
    "MISSED_AFTER",
    "OVERLAP_POLICIES",
    "PRUNE_DEFAULTS",
    "PRUNE_FUNCTION",
    "PRUNE_KEYS",
    "PRUNE_SCHEDULE",
    "PRUNE_STEP",
    "PRUNE_WORKFLOW",
    "RUN_KEY_PREFIX",
    "ScheduleDeclaration",
    "check_catch_up",
    "check_cron",
    "check_overlap",
    "check_timezone",
    "declaration",
    "from_settings",
    "latest_tick",
    "next_tick",
    "prune_from_settings",
    "run_key",
    "ticks_between",
]

#: The catch-up policies: what happens to ticks no worker fired on time.
CATCH_UP_POLICIES = ("latest", "none")
#: The overlap policies: what a tick does while the schedule's previous run is live.
OVERLAP_POLICIES = ("skip", "buffer_one", "cancel_other", "allow")
#: Most ticks one backfill starts (a longer window is refused: split it).
MAX_BACKFILL_TICKS = 10_000
#: Seconds after its time past which an unfired tick counts as missed (workers look for due
#: ticks about once a second, so a running worker fires a tick well within this).
MISSED_AFTER = 10.0
#: Prefix of the idempotency key of a scheduled run (``schedule:<name>:<tick>``).
RUN_KEY_PREFIX = "schedule:"
#: Longest schedule name: the run key (prefix, name, ``:``, a 25-character UTC instant) must
#: fit the 255 characters of a run key.
MAX_SCHEDULE_NAME_LENGTH = 200
#: The longest cron expression a schedule stores (``WorkflowSchedule.cron``), characters.
MAX_CRON_LENGTH = 200

#: How far ahead a cron expression must match at least once (cronsim looks 50 years ahead).
_HORIZON_YEARS = 50


@frozen
class ScheduleDeclaration:
    """One schedule as declared in code or settings (validated: see :func:`declaration`).

    Attributes:
        name: the schedule's name (a decorator's: its workflow's name).
        workflow: the workflow each tick starts.
        cron: the cron expression (5 fields, or 6 with seconds first).
        timezone: the IANA time zone the expression is read in (``"UTC"`` by default).
        input: the JSON input of every run it starts.
        catch_up: ``"latest"`` or ``"none"`` (see the module docstring).
        origin: where it was declared (``"@workflow"`` or ``"settings"``), for messages.
        overlap: one of :data:`OVERLAP_POLICIES` (see the module docstring).
        task: the dotted path of the Django ``@task`` each tick enqueues (``""``: a
            workflow schedule); ``workflow`` is then the tasks' built-in workflow.
    """

    name: str
    workflow: str
    cron: str
    timezone: str = "UTC"
    input: Any = field(default_factory=dict)
    catch_up: str = "latest"
    origin: str = "settings"
    overlap: str = "skip"
    task: str = ""

    def zone(self) -> ZoneInfo:
        """The schedule's time zone (``zoneinfo.ZoneInfo``)."""
        return ZoneInfo(self.timezone)


def check_cron(cron: object) -> str:
    """``cron`` if it is a cron expression of at most :data:`MAX_CRON_LENGTH` characters
    that cronsim reads and that matches at least once in the next 50 years; raises
    ``ValueError`` saying what is wrong."""
    if not isinstance(cron, str) or not cron.strip():
        raise ValueError(f"a cron expression must be a non-empty str, not {cron!r}")
    if len(cron) > MAX_CRON_LENGTH:
        raise ValueError(
            f"a cron expression is at most {MAX_CRON_LENGTH} characters, not {len(cron)} "
            f"({cron[:40]!r}…)"
        )
    start = datetime(2000, 1, 1, tzinfo=UTC)
    try:
        ticks = CronSim(cron, start)
    except CronSimError as exc:
        raise ValueError(f"{cron!r} is not a cron expression: {exc}") from None
    try:
        next(ticks)
    except StopIteration:
        raise ValueError(
            f"the cron expression {cron!r} never matches (not once in {_HORIZON_YEARS} years)"
        ) from None
    return cron


def check_timezone(name: object) -> str:
    """``name`` if it names an IANA time zone (``"Europe/Paris"``, ``"UTC"``); raises
    ``ValueError`` otherwise."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a time zone must be a non-empty str, not {name!r}")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (an IANA name: 'Europe/Paris')") from None
    return name


def check_catch_up(policy: object) -> str:
    """``policy`` if it is one of :data:`CATCH_UP_POLICIES`; raises ``ValueError``."""
    if policy not in CATCH_UP_POLICIES:
        raise ValueError(f'catch_up must be "latest" or "none", not {policy!r}')
    return str(policy)


def check_overlap(policy: object) -> str:
    """``policy`` if it is one of :data:`OVERLAP_POLICIES`; raises ``ValueError``."""
    if policy not in OVERLAP_POLICIES:
        raise ValueError(
            f"overlap must be one of {', '.join(map(repr, OVERLAP_POLICIES))}, not {policy!r}"
        )
    return str(policy)


def declaration(
    name: object,
    workflow: object,
    cron: object,
    *,
    timezone: object = "UTC",
    input: object = None,
    catch_up: object = "latest",
    origin: str = "settings",
    overlap: object = "skip",
    task: object = None,
    args: object = None,
    kwargs: object = None,
) -> ScheduleDeclaration:
    """A validated :class:`ScheduleDeclaration`.

    Args:
        name: the schedule's name (``str``, 1–200 characters, printable).
        workflow: the workflow's name (``str``; whether it is registered is not checked here).
        cron: a cron expression (:func:`check_cron`).
        timezone: an IANA time zone name (:func:`check_timezone`).
        input: the runs' JSON input (``None``: ``{}``), storable as every run's is
            (:func:`~django_leases.validation.check_json`).
        catch_up: ``"latest"`` or ``"none"``.
        origin: where it was declared, for messages.
        overlap: one of :data:`OVERLAP_POLICIES` (default ``"skip"``).
        task: the dotted path of a Django ``@task`` (``str``) each tick enqueues instead of
            starting ``workflow`` (which must then be ``None``); ``args`` (a list) and
            ``kwargs`` (a dict of ``str`` keys), JSON, are its arguments (stored as the
            runs' input ``{"args": ..., "kwargs": ...}``). Whether the path names a task is
            checked later (system check ``E026``), once the apps are loaded.

    Raises ``ValueError`` naming the schedule and what is wrong.
    """
    try:
        if not isinstance(name, str) or not name or len(name) > MAX_SCHEDULE_NAME_LENGTH:
            raise ValueError(
                f"a schedule name must be a str of 1 to {MAX_SCHEDULE_NAME_LENGTH} characters"
            )
        if not name.isprintable():
            raise ValueError("a schedule name must not hold control characters")
        value = {} if input is None else input
        path = ""
        if task is not None:
            if workflow is not None:
                raise ValueError("give a 'workflow' or a 'task', not both")
            if not isinstance(task, str) or not task.strip() or len(task) > 255:
                raise ValueError(f"the task must be a dotted path (a str), not {task!r}")
            if input is not None:
                raise ValueError("a task schedule takes 'args' and 'kwargs', not 'input'")
            arguments = [] if args is None else args
            named = {} if kwargs is None else kwargs
            if not isinstance(arguments, list | tuple):
                raise ValueError(f"args must be a list, not {type(arguments).__name__}")
            if not isinstance(named, Mapping) or not all(isinstance(k, str) for k in named):
                raise ValueError("kwargs must be a dict with str keys")
            path, workflow = task, TASK_WORKFLOW
            value = {"args": list(arguments), "kwargs": dict(named)}
        elif args is not None or kwargs is not None:
            raise ValueError("'args' and 'kwargs' go with a 'task'")
        if not isinstance(workflow, str) or not workflow:
            raise ValueError(f"the workflow must be a workflow's name, not {workflow!r}")
        # As every tick's start will check it (on the schedule's database, which may lower
        # the nesting limit: WorkflowScheduleQuerySet.sync).
        check_json(value, "the input")
        return ScheduleDeclaration(
            name=name,
            workflow=workflow,
            cron=check_cron(cron),
            timezone=check_timezone(timezone),
            input=value,
            catch_up=check_catch_up(catch_up),
            origin=origin,
            overlap=check_overlap(overlap),
            task=path,
        )
    except ValueError as exc:
        raise ValueError(f"Schedule {name!r} ({origin}): {exc}") from None


#: The keys a ``DJANGO_LEASES["SCHEDULES"]`` entry may have.
SETTINGS_KEYS = frozenset(
    {"workflow", "task", "args", "kwargs", "cron", "timezone", "input", "catch_up", "overlap"}
)


def from_settings(configured: object) -> tuple[list[ScheduleDeclaration], list[str]]:
    """The schedules of ``DJANGO_LEASES["SCHEDULES"]`` (``configured``: name → entry dict)
    and the problems found: ``(declarations, problems)``, one message per entry that is not
    usable (that entry is left out). A ``configured`` that is not a dict declares nothing
    (check ``E016`` reports it)."""
    if not isinstance(configured, Mapping):
        return [], []
    found: list[ScheduleDeclaration] = []
    problems: list[str] = []
    for name, entry in configured.items():
        if not isinstance(entry, Mapping):
            problems.append(
                f"Schedule {name!r} (settings): must be a dict with 'workflow' (or 'task') "
                "and 'cron', "
                f"not {type(entry).__name__}"
            )
            continue
        unknown = sorted(set(map(str, entry)) - SETTINGS_KEYS)
        missing = [repr(key) for key in ("cron",) if key not in entry]
        if "workflow" not in entry and "task" not in entry:
            missing.insert(0, "'workflow' or 'task'")
        if unknown or missing:
            said = []
            if missing:
                said.append(f"missing {', '.join(missing)}")
            if unknown:
                said.append(
                    f"unknown key(s) {', '.join(map(repr, unknown))} (the keys: "
                    f"{', '.join(sorted(SETTINGS_KEYS))})"
                )
            problems.append(f"Schedule {name!r} (settings): {'; '.join(said)}")
            continue
        try:
            found.append(
                declaration(
                    name,
                    entry.get("workflow"),
                    entry["cron"],
                    timezone=entry.get("timezone", "UTC"),
                    input=entry.get("input"),
                    catch_up=entry.get("catch_up", "latest"),
                    overlap=entry.get("overlap", "skip"),
                    task=entry.get("task"),
                    args=entry.get("args"),
                    kwargs=entry.get("kwargs"),
                )
            )
        except ValueError as exc:
            problems.append(str(exc))
    return found, problems


# -- the built-in prune schedule ----------------------------------------------------------------

#: The schedule ``DJANGO_LEASES["PRUNE"]`` declares, the built-in workflow each of its ticks
#: starts, that workflow's one step and the step's function
#: (:mod:`django_leases.workflows.retention`).
PRUNE_SCHEDULE = "django_leases.prune"
PRUNE_WORKFLOW = "django_leases.prune"
PRUNE_FUNCTION = "django_leases.prune"
PRUNE_STEP = "prune"
#: The optional keys of ``DJANGO_LEASES["PRUNE"]`` and their defaults (``schedule`` and
#: ``older_than`` are required: how old a run may get before it is deleted is never guessed).
PRUNE_DEFAULTS: Mapping[str, Any] = {"batch_size": 500, "timezone": "UTC", "queue": DEFAULT_QUEUE}
#: Every key ``DJANGO_LEASES["PRUNE"]`` may have.
PRUNE_KEYS = ("schedule", "older_than", *PRUNE_DEFAULTS)
#: Largest ``batch_size``: a batch is one transaction, and its run ids are one ``IN`` list.
MAX_PRUNE_BATCH_SIZE = 10_000

_PRUNE = 'DJANGO_LEASES["PRUNE"]'


def prune_from_settings(
    configured: object, queues: Collection[str] | None = None
) -> tuple[ScheduleDeclaration | None, list[str]]:
    """The built-in prune schedule ``DJANGO_LEASES["PRUNE"]`` (``configured``) declares, and
    the problems found: ``(declaration, problems)``.

    ``configured`` is ``None`` (the default: nothing is pruned on a schedule, no
    declaration) or a dict with ``schedule`` (a cron expression, :func:`check_cron`),
    ``older_than`` (seconds ≥ 0 or a ``timedelta``, at most 100 years: how long after it
    finished a run is deleted), and optionally ``batch_size`` (``int``, 1 to
    :data:`MAX_PRUNE_BATCH_SIZE`, default 500: runs deleted per transaction), ``timezone``
    (the IANA zone ``schedule`` is read in, default ``"UTC"``) and ``queue`` (the queue the
    prune step is claimed from, default ``"default"``; when ``queues``, the configured queue
    names, is given it must be one of them). The declaration is :data:`PRUNE_SCHEDULE` of
    workflow :data:`PRUNE_WORKFLOW`, with ``catch_up="latest"`` (one catch-up prune after
    downtime) and the input ``{"older_than": seconds, "batch_size": n, "queue": name}``.

    Any problem (one message each, naming the key: check ``django_leases.E031``) means no
    declaration: a prune setting is used whole or not at all. A ``configured`` that is not a
    dict declares nothing and is check ``E016``'s (no problem here). Raises nothing.
    """
    if not isinstance(configured, Mapping):
        return None, []
    unknown = sorted(str(key) for key in configured if key not in PRUNE_KEYS)
    missing = [key for key in ("schedule", "older_than") if key not in configured]
    problems: list[str] = []
    if missing:
        problems.append(f"{_PRUNE} lacks {' and '.join(map(repr, missing))}")
    if unknown:
        problems.append(
            f"{_PRUNE} has unknown key(s) {', '.join(map(repr, unknown))} (the keys: "
            f"{', '.join(PRUNE_KEYS)})"
        )
    values = {**PRUNE_DEFAULTS, **configured}
    found: dict[str, Any] = {}
    rules: dict[str, Any] = {
        "schedule": check_cron,
        "older_than": lambda value: seconds(value, "older_than", maximum=TTL_CEILING),
        "batch_size": _batch_size,
        "timezone": check_timezone,
        "queue": lambda value: check_name(value, "a queue name", max_length=MAX_QUEUE_LENGTH),
    }
    for key, rule in rules.items():
        if key not in values:
            continue  # missing: said above
        try:
            found[key] = rule(values[key])
        except ValueError as exc:
            problems.append(f'{_PRUNE}["{key}"] = {values[key]!r}: {exc}')
    queue = found.get("queue")
    if queue is not None and queues is not None and queue not in queues:
        problems.append(
            f'{_PRUNE}["queue"] = {queue!r}: DJANGO_LEASES["QUEUES"] does not configure '
            f"that queue (known: {', '.join(sorted(queues))})"
        )
    if problems:
        return None, problems
    return (
        ScheduleDeclaration(
            name=PRUNE_SCHEDULE,
            workflow=PRUNE_WORKFLOW,
            cron=found["schedule"],
            timezone=found["timezone"],
            input={
                "older_than": found["older_than"],
                "batch_size": found["batch_size"],
                "queue": found["queue"],
            },
            catch_up="latest",
            origin=_PRUNE,
            overlap="skip",
        ),
        [],
    )


def _batch_size(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"batch_size must be an int, not {type(value).__name__}")
    if not 1 <= value <= MAX_PRUNE_BATCH_SIZE:
        raise ValueError(
            f"batch_size must be between 1 and {MAX_PRUNE_BATCH_SIZE} (runs deleted per "
            "transaction)"
        )
    return value


# -- ticks --------------------------------------------------------------------------------------


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError(f"a tick is computed from an aware datetime, not {moment!r}")
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        raise _out_of_years(moment) from None


def _out_of_years(moment: datetime) -> ValueError:
    """The error for a moment whose ticks would fall outside what a ``datetime`` holds."""
    return ValueError(f"{moment.isoformat()} is too near the years 1 or 9999 to tick from")


def next_tick(cron: str, zone: str, after: datetime) -> datetime | None:
    """The first tick of ``cron`` (read in time zone ``zone``) strictly after ``after`` (an
    aware ``datetime``), as an aware UTC ``datetime``; ``None`` when there is none in the next
    50 years. Raises ``ValueError`` for a bad expression or zone, or a naive ``after``."""
    try:
        moment = _utc(after)
    except OverflowError:
        raise _out_of_years(after) from None
    # cronsim reads a local time in the second pass of an hour the clocks repeat (autumn) as
    # its first pass, and may give a tick of the first pass, already gone: passed over.
    for tick in _ticks(cron, zone, after, after):
        if tick > moment:
            return tick
    return None


def latest_tick(cron: str, zone: str, at: datetime) -> datetime | None:
    """The last tick of ``cron`` (in time zone ``zone``) at or before ``at`` (an aware
    ``datetime``), as an aware UTC ``datetime``; ``None`` when there is none in the 50 years
    before. Raises ``ValueError`` as :func:`next_tick` does."""
    # cronsim going backwards from a time with microseconds looks first at that time's
    # whole second, so "at or before" is the whole second of ``at`` plus a microsecond.
    try:
        moment = _utc(at)
        start = moment.replace(microsecond=0) + timedelta(microseconds=1)
    except OverflowError:
        raise _out_of_years(at) from None
    latest = next(_ticks(cron, zone, start, at, reverse=True), None)
    # Going back from the second pass of a repeated hour, cronsim starts from its first pass
    # and can miss the ticks between the two: they are found going forwards.
    while latest is not None:
        following = next_tick(cron, zone, latest)
        if following is None or following > moment:
            break
        latest = following
    return latest


def _ticks(
    cron: str, zone: str, start: datetime, asked: datetime, *, reverse: bool = False
) -> Iterator[datetime]:
    """The ticks cronsim gives for ``cron`` in ``zone`` from ``start`` (forwards, or back
    with ``reverse``), as aware UTC ``datetime`` values, for 50 years; ``ValueError`` for a
    bad expression or zone, or a moment (``asked``) too near the years 1 or 9999."""
    # cronsim keeps its daylight-saving rules (a fixed time in a skipped hour runs at the
    # change, one in a repeated hour once) for five fields. Six fields whose seconds are
    # one number are the five-field ticks that many seconds later: so computed, they follow
    # the same rules (else 02:30:00 ran twice in autumn and never in spring).
    fields = cron.split()
    late, expression = 0, cron
    if len(fields) == 6 and _ONE_SECOND.fullmatch(fields[0]):
        late, expression = int(fields[0]), " ".join(fields[1:])
    try:
        shifted = _utc(start) - timedelta(seconds=late)
        local = shifted.astimezone(ZoneInfo(check_timezone(zone)))
        ticks = CronSim(expression, local, reverse=reverse)
    except OverflowError:
        raise _out_of_years(asked) from None
    except CronSimError as exc:
        raise ValueError(f"{cron!r} is not a cron expression: {exc}") from None
    while True:
        try:
            yield _utc(next(ticks)) + timedelta(seconds=late)
        except OverflowError:
            raise _out_of_years(asked) from None
        except StopIteration:
            return


#: A seconds field that is one second of the minute (``0`` to ``59``).
_ONE_SECOND = re.compile(r"[0-5]?[0-9]")


def run_key(name: str, tick: datetime) -> str:
    """The idempotency key of the run schedule ``name`` starts for ``tick`` (an aware
    ``datetime``): ``schedule:<name>:<tick as UTC ISO 8601>``, e.g.
    ``schedule:nightly:2026-03-29T01:00:00+00:00``. Raises ``ValueError`` for a naive tick."""
    return f"{RUN_KEY_PREFIX}{name}:{_utc(tick).isoformat()}"


def ticks_between(cron: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    """The ticks of ``cron`` (in time zone ``zone``) from ``start`` (included) to ``end``
    (excluded), both aware ``datetime`` values, as aware UTC ``datetime`` values, oldest
    first. Raises ``ValueError`` for a naive or reversed window, a bad expression or zone,
    or more than :data:`MAX_BACKFILL_TICKS` ticks."""
    first, last = _utc(start), _utc(end)
    if last <= first:
        raise ValueError(f"the window's end ({end.isoformat()}) is not after its start")
    if first == datetime.min.replace(tzinfo=UTC):
        raise _out_of_years(start)
    found: list[datetime] = []
    moment = next_tick(cron, zone, first - timedelta(microseconds=1))
    while moment is not None and moment < last:
        if len(found) == MAX_BACKFILL_TICKS:
            raise ValueError(
                f"the window holds more than {MAX_BACKFILL_TICKS} ticks: backfill it in parts"
            )
        found.append(moment)
        moment = next_tick(cron, zone, moment)
    return found

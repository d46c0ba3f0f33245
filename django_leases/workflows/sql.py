"""The workflow tables' tuned statements (PostgreSQL), beside nothing else.

Every statement here is one QuerySet method's tuned path (:mod:`django_leases.models.workflow`
has the portable ORM path of the same rule beside it, behind :func:`django_leases.db.tuned`).
This module imports no model: the methods pass in the quoted table names (:class:`Tables`),
and the SQL of rules that belong to other methods — the step fence, compiled from its ORM
filter; the lease acquire and release statements of :mod:`django_leases.models.lease` — so
that each rule is written once.

Statements take ``%s`` placeholders with a parameter list. The three statements of the
worker's hot path are installed as PL/pgSQL functions (:class:`Function`) so that each server
connection caches their plans: a function's body is its statement with the function's
arguments (:class:`Arg`) in place of parameters. Migrations install them as frozen text
(a test fails when this module's definitions and the latest migration's differ).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from django_leases.frozen import frozen
from django_leases.workflows.values import (
    REPLAYED_STEP_FIELDS,
    RETRY_DELAY_FIELDS,
    RUN_LEASE_PREFIX,
    AttemptStatus,
    RunStatus,
    StepStatus,
)


@frozen
class Tables:
    """The quoted names of the tables the statements touch (``queue``, ``queue_key``: the
    queue and queue-key tables, for :func:`claim_queue`)."""

    run: str
    step: str
    attempt: str
    lease: str
    queue: str = ""
    queue_key: str = ""
    #: The server's epoch floor (SQL), which a claim stores on the step row it claims.
    floor: str = "0"


@frozen
class NewStep:
    """The columns of a step a statement inserts claimed (values, or :class:`Arg` in a
    function's body): its name, step function, ``data`` (JSON text), retry settings
    (``retry_delay_max`` ``NULL``: no cap of its own), the step lease's ``seconds`` and
    the ``claimant`` its claim names."""

    step_name: Any
    function_name: Any
    data: Any
    retries: Any
    retry_delay: Any
    retry_backoff: Any
    retry_delay_max: Any
    seconds: Any
    claimant: Any


class Arg:
    """A function's argument, by ``name`` and SQL type, where a statement takes a parameter.

    A builder given an ``Arg`` for a value gives the body of the function that caches the
    statement's plan (see :class:`Function`)."""

    def __init__(self, name: str, sql_type: str) -> None:
        self.name = name
        self.sql_type = sql_type

    def __repr__(self) -> str:
        return f"Arg({self.name!r}, {self.sql_type!r})"


def literal(value: Any) -> str:
    """``value`` written into SQL text: an :class:`Arg` as its name, else an SQL literal."""
    if isinstance(value, Arg):
        return value.name
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"no SQL literal for {value!r}")


def _text(status: str) -> str:
    return literal(str(status))


def _is_running(column: str = "status") -> str:
    """``column = 'running'`` for a run found by its primary key, written so that no index
    can serve it (``IS TRUE``): where most runs have finished, the planner's statistics make
    the status index look cheaper than the primary key, and a lookup through it reads the
    entry of every running run — the dead ones each update of a running run leaves too."""
    return f"({column} = {_text(RunStatus.RUNNING)}) IS TRUE"


def _failed_for_good(step: str) -> str:
    """Step ``step`` (an alias) failed on its last attempt: no claim retries it. The rule of
    :func:`~django_leases.workflows.values.failed_for_good_q`, in SQL."""
    return f"({step}.status = {_text(StepStatus.FAILED)} AND {step}.attempt >= {step}.retries + 1)"


# -- statements ---------------------------------------------------------------------------------


def start_run(t: Tables) -> str:
    """:meth:`WorkflowRunQuerySet.start`: the run, due for its first pass, and the wake-up
    notification (sent when it commits), in one statement. Parameters: run id, workflow,
    input (JSON text), key (or ``NULL``), parent run id (or ``NULL``), queue key (empty:
    none), notification channel.
    Returns ``created_at``, or no row when a run of the workflow already holds the key
    (nothing inserted, nobody woken)."""
    return f"""
        WITH run AS (
            INSERT INTO {t.run} (
                id, workflow, status, input, key, parent_id, queue_key, pass_due_at,
                pass_requests, created_at, updated_at
            )
            VALUES (%s, %s, {_text(RunStatus.RUNNING)}, %s::jsonb, %s, %s, %s,
                    statement_timestamp(), 1, statement_timestamp(), statement_timestamp())
            ON CONFLICT (workflow, key) DO NOTHING
            RETURNING created_at
        )
        SELECT created_at, pg_notify(%s, '') FROM run
    """


def start_one_step(t: Tables) -> str:
    """:meth:`WorkflowRunQuerySet.start_one_step`: the run (``running``, no pass due), its
    one step (``pending`` at attempt 1, data = the run's input, due at the given time or DB
    now) and the wake-up notification (sent when it commits), in one statement. Parameters:
    run id, workflow, input (JSON text), step name, function name, retries, retry delay,
    retry backoff, retry delay max (or ``NULL``), timeout (or ``NULL``), queue, priority,
    queue key (empty: none; the run's and the step's), due time (``timestamptz`` or
    ``NULL``: DB now), notification channel. Returns the run's ``created_at``."""
    return f"""
        WITH run AS (
            INSERT INTO {t.run} (
                id, workflow, status, input, queue_key, pass_requests, branches_left,
                created_at, updated_at
            )
            VALUES (%s, %s, {_text(RunStatus.RUNNING)}, %s::jsonb, %s, 0, 0,
                    statement_timestamp(), statement_timestamp())
            RETURNING id, input, queue_key, created_at
        ), step AS (
            INSERT INTO {t.step} (
                run_id, step_name, function_name, data, status, attempt, retries, retry_delay,
                retry_backoff, retry_delay_max, timeout, queue, priority, queue_key,
                available_at, created_at, updated_at
            )
            SELECT id, %s, %s, input, {_text(StepStatus.PENDING)}, 1, %s, %s, %s,
                %s::double precision, %s::double precision, %s, %s, queue_key,
                coalesce(%s::timestamptz, statement_timestamp()), statement_timestamp(),
                statement_timestamp()
            FROM run
        )
        SELECT created_at, pg_notify(%s, '') FROM run
    """


def pass_state(run: str, step_table: str) -> str:
    """What a pass reads, for a ``RETURNING`` or select list over the run table (or its
    alias) ``run``: the run's ``id, workflow, status, input, pass_requests`` and its steps as
    one JSON array (the fields replay needs), read in the same statement. A step's
    ``result`` is in it as its JSON text (a string), decoded only should the workflow read
    it (``RecordedJSONField``)."""
    fields = ", ".join(
        f"'{name}', s.{name}::text" if name == "result" else f"'{name}', s.{name}"
        for name in ("id", *REPLAYED_STEP_FIELDS, *RETRY_DELAY_FIELDS)
    )
    return (
        f"{run}.id, {run}.workflow, {run}.status, {run}.input::text, {run}.pass_requests, "
        f"(SELECT coalesce(json_agg(json_build_object({fields}) ORDER BY s.id), '[]')::text "
        f"FROM {step_table} s WHERE s.run_id = {run}.id)"
    )


#: Columns of :func:`pass_state`, and their SQL types (for a function's result).
PASS_STATE_TYPES = ("uuid", "varchar", "varchar", "text", "bigint", "text")

#: SQL types of the columns a lease acquire statement returns (``id, key, holder, token,
#: expires_at, acquired_at, renewed_at, released_at``).
LEASE_TYPES = (
    "bigint",
    "varchar",
    "varchar",
    "bigint",
    "timestamptz",
    "timestamptz",
    "timestamptz",
    "timestamptz",
)


def pick_pass(
    t: Tables,
    acquire: Callable[[str], str],
    grant: str,
    seconds: Any,
    holder: Any,
    *,
    besides: Sequence[str] = (),
) -> tuple[str, list[Any], str, str]:
    """:meth:`WorkflowRunQuerySet.claim_due_pass` with ``lease_holder``, as CTEs for a
    statement of its own or a larger one: ``picked`` (the oldest due run of a running
    workflow, its pass pushed ``seconds`` ahead, with its pass state) and ``granted`` (its
    run lease for ``holder``, by the acquire rule: ``acquire(rows)`` is that statement over
    ``rows``, whose lease columns ``grant`` writes). ``besides``: SQL for each run id never to
    pick (the runs a larger statement writes: PostgreSQL applies only one of two updates of a
    row in one statement). Returns ``(ctes, params, columns, joined)``: what goes after
    ``WITH``, its parameters, and what goes after ``SELECT`` and ``FROM`` to read
    ``picked.*, granted.*``."""
    guard = "".join(f" AND id IS DISTINCT FROM ({run_id})" for run_id in besides)
    running = _text(RunStatus.RUNNING)
    rows = f"SELECT %s || picked.id::text, %s, {grant} FROM picked"
    ctes = f"""picked AS (
        UPDATE {t.run}
        SET pass_due_at = statement_timestamp() + make_interval(secs => %s)
        WHERE id = (
            SELECT id FROM {t.run}
            WHERE status = {running} AND pass_due_at <= statement_timestamp(){guard}
            ORDER BY pass_due_at
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        ) AND {_is_running()} AND (pass_due_at <= statement_timestamp()) IS TRUE
        RETURNING {pass_state(t.run, t.step)}
    ), granted AS ({acquire(rows)})"""
    params = [seconds, RUN_LEASE_PREFIX, holder, seconds]
    return ctes, params, "picked.*, granted.*", "picked LEFT JOIN granted ON true"


def pick_pass_alone(
    t: Tables, acquire: Callable[[str], str], grant: str, seconds: Any, holder: Any
) -> tuple[str, list[Any]]:
    """:func:`pick_pass` as a statement of its own."""
    ctes, params, columns, joined = pick_pass(t, acquire, grant, seconds, holder)
    return f"WITH {ctes} SELECT {columns} FROM {joined}", params


def take_pass(
    t: Tables, acquire: Callable[[str], str], grant: str, run_id: Any, seconds: Any, holder: Any
) -> tuple[str, list[Any]]:
    """:meth:`WorkflowRunQuerySet.take_pass`: the run lease of running run ``run_id`` for
    ``holder`` (``seconds``), by the acquire rule (``acquire(rows)``, whose lease columns
    ``grant`` writes), and the run's pass state, in one statement. Its row: the pass state,
    then the granted lease (``NULL`` when another holder has it live); no row (and no lease
    taken) when the run is not running or its pass waits on more than one unfinished
    parallel step (``branches_left`` > 1: this result asks for no pass). ``pass_due_at`` is
    left as it is: the caller takes the pass that a step's result asks for, not one that is
    due."""
    rows = f"SELECT %s || picked.id::text, %s, {grant} FROM picked"
    sql = f"""
        WITH picked AS (
            SELECT {pass_state(t.run, t.step)} FROM {t.run}
            WHERE id = %s AND {_is_running()} AND branches_left <= 1
        ), granted AS ({acquire(rows)})
        SELECT picked.*, granted.* FROM picked LEFT JOIN granted ON true
    """
    return sql, [run_id, RUN_LEASE_PREFIX, holder, seconds]


def _claim_columns(t: Tables) -> tuple[str, str]:
    """A claim's row (:data:`CLAIM_STEP_TYPES`) from CTEs ``lapsed``, ``claimed`` and
    ``begun``: what goes after ``SELECT``, and the joins after a ``FROM`` of one row."""
    columns = """(SELECT found FROM lapsed), claimed.id, claimed.run_id, claimed.step_name,
        claimed.function_name, claimed.attempt::bigint, claimed.data::text,
        claimed.waited::double precision, claimed_run.created_at,
        (SELECT started_at FROM begun), claimed_run.workflow"""
    joined = (
        f"LEFT JOIN claimed ON true LEFT JOIN {t.run} claimed_run "
        "ON claimed_run.id = claimed.run_id"
    )
    return columns, joined


def claim_step(t: Tables, seconds: Any, queues: Any, claimant: Any) -> tuple[str, list[Any]]:
    """:meth:`WorkflowStepQuerySet.claim_due` for queues without limits, in one statement:
    :func:`claim_step_ctes` as a statement of its own."""
    ctes, params, columns, joined = claim_step_ctes(t, seconds, queues, claimant=claimant)
    return f"WITH {ctes} SELECT {columns} FROM (SELECT 1) AS one {joined}", params


def claim_step_except(
    t: Tables, seconds: Any, queues: Any, excluded: Any, claimant: Any
) -> tuple[str, list[Any]]:
    """:func:`claim_step` of ``queues`` (``NULL``: every queue) but never of ``excluded`` (a
    text array): the unlimited queues' claim of a worker that also takes limited queues."""
    ctes, params, columns, joined = claim_step_ctes(
        t, seconds, queues, excluded=excluded, claimant=claimant
    )
    return f"WITH {ctes} SELECT {columns} FROM (SELECT 1) AS one {joined}", params


def _run_of_step_running(t: Tables) -> str:
    """Whether the run of step ``s`` is running (an SQL condition)."""
    return f"EXISTS (SELECT 1 FROM {t.run} r WHERE r.id = s.run_id AND {_is_running('r.status')})"


def _lapsed(t: Tables, of_queues: str, live_run: str) -> str:
    """CTE ``lapsed``: whether a running step of ``of_queues`` (an SQL condition on ``s``)
    of a running run (``live_run``) has a lapsed lease or ran past its timeout — the
    portable path takes those over first, so a claim statement claims nothing meanwhile."""
    return f"""lapsed AS (
            SELECT EXISTS (
                SELECT 1 FROM {t.step} s
                WHERE s.status = {_text(StepStatus.RUNNING)} AND {of_queues} AND (
                    s.lease_expires_at <= statement_timestamp() OR s.lease_expires_at IS NULL
                    OR s.deadline_at <= statement_timestamp()
                ) AND {live_run}
            ) AS found
        )"""


def _claimed(t: Tables, lease: str, started: str, claimant: Any) -> str:
    """CTEs ``claimed`` (the step ``picked`` — ``id, was, available_at`` — started under a
    step lease ending at ``lease``: ``running``, the attempt raised after a failure, the
    deadline from its ``timeout``, the server's epoch floor stored, the claim named
    ``claimant`` — the caller's name for this one claim, by which it finds the step again
    should the reply be lost; its row's columns) and
    ``begun`` (its attempt row, started at ``started``; a claim of an attempt given back
    restarts its row), the one way every claim statement writes a claim."""
    failed = _text(StepStatus.FAILED)
    restarted = "" if started == "statement_timestamp()" else ", started_at = excluded.started_at"
    return f"""claimed AS (
            UPDATE {t.step} AS s
            SET status = {_text(StepStatus.RUNNING)},
                attempt = CASE WHEN picked.was = {failed} THEN s.attempt + 1 ELSE s.attempt END,
                result = CASE WHEN picked.was = {failed} THEN NULL ELSE s.result END,
                error = CASE WHEN picked.was = {failed} THEN NULL ELSE s.error END,
                lease_expires_at = {lease},
                deadline_at = CASE WHEN s.timeout IS NULL THEN NULL
                    ELSE statement_timestamp() + make_interval(secs => s.timeout) END,
                fence_floor = {t.floor},
                claimant = {literal(claimant)},
                updated_at = statement_timestamp()
            FROM picked
            WHERE s.id = picked.id
            RETURNING s.id, s.run_id, s.step_name, s.function_name, s.attempt, s.data,
                extract(epoch FROM statement_timestamp() - picked.available_at) AS waited
        ), begun AS (
            INSERT INTO {t.attempt} AS a (step_id, attempt, status, started_at)
            SELECT id, attempt, {_text(AttemptStatus.RUNNING)}, {started}
            FROM claimed
            ON CONFLICT (step_id, attempt) DO UPDATE
            SET status = excluded.status, result = NULL, error = NULL, finished_at = NULL{restarted}
            RETURNING a.started_at
        )"""


def claim_step_ctes(
    t: Tables,
    seconds: Any,
    queues: Any,
    *,
    after_waits: bool = False,
    queue: str = "",
    admit: str = "",
    excluded: Any = None,
    started: str = "statement_timestamp()",
    claimant: Any,
) -> tuple[str, list[Any], str, str]:
    """:meth:`WorkflowStepQuerySet.claim_due` for queues without limits, as CTEs for a
    statement of its own or a larger one (``lapsed``, ``picked``, ``claimed``, ``begun``):
    the first due waiting step of a running run (``pending`` / ``scheduled`` / ``failed``
    with attempts left, ``available_at`` passed; highest ``priority`` first, then first due
    first), of ``queues`` (a text array; ``NULL``: every queue), picked with ``SKIP LOCKED``
    and started under a step lease of ``seconds``: ``running``, the attempt raised after a
    failure, the deadline from the step's ``timeout``, and its attempt row.

    A running step whose lease lapsed (or whose attempt ran past its timeout) is taken over
    first by the rule's portable path, which decides a lost worker's step: while one exists
    this statement claims nothing and says so. Its row: whether one does (``lapsed``), then
    the claimed step's ``id, run_id, step_name, function_name, attempt, data`` (JSON text),
    the seconds it was due before this claim, the run's ``created_at``, the attempt's
    ``started_at`` and the run's ``workflow`` (all ``NULL`` when nothing was claimed).

    A concurrent cancel is never overtaken: it writes every step it stops (a waiting step's
    ``available_at`` cleared, a running one failed) while holding their rows, so a step row
    it locked is skipped, and one it released is re-checked on its new version.

    A larger statement may write other steps (a result, with the step ``running`` in its
    snapshot, is never picked here) but no step this may pick. ``after_waits``: the larger
    statement may wait for row locks before this pick, while its snapshot ages — a run may
    have ended meanwhile (failed, suspended: only its run row changes), so the picked step's
    run row is locked too (``FOR SHARE``), and a run row that changed since the snapshot is
    re-checked on its latest version. A run row another transaction is writing is skipped
    with its steps (``SKIP LOCKED``): the caller's next look for due steps takes them.

    ``queue``: instead of ``queues``, the one queue (SQL) to claim from; ``admit``: an SQL
    condition without which nothing is picked (a limit of that queue, :func:`claim_queue_counted`);
    ``excluded``: a text array of queues never to claim from (the limited queues of a worker
    that claims those through their own statements, :func:`claim_step_except`); ``started``:
    the attempt's ``started_at`` (SQL; a claim under a queue's lock takes the time after it);
    ``claimant``: the name the claim carries (see :func:`_claimed`).

    Returns ``(ctes, params, columns, joined)``: what goes after ``WITH``, its parameters,
    the row's columns (after ``SELECT``), and the joins that read them (after a ``FROM`` of
    one row)."""
    waiting = ", ".join(
        _text(status) for status in (StepStatus.PENDING, StepStatus.SCHEDULED, StepStatus.FAILED)
    )
    of_queues = f"({literal(queues)} IS NULL OR s.queue = ANY ({literal(queues)}))"
    if queue:
        of_queues = f"s.queue = {queue}"
    if excluded is not None:
        of_queues = f"{of_queues} AND NOT (s.queue = ANY ({literal(excluded)}))"
    admitted = f" AND {admit}" if admit else ""
    live_run = _run_of_step_running(t)
    run_joined, run_live, run_locked = "", live_run, ""
    if after_waits:
        run_joined = f" JOIN {t.run} r ON r.id = s.run_id"
        run_live = _is_running("r.status")
        run_locked = " FOR SHARE OF r SKIP LOCKED"
    ctes = f"""
        {_lapsed(t, of_queues, live_run)}, picked AS (
            SELECT s.id, s.status AS was, s.available_at FROM {t.step} s{run_joined}
            WHERE NOT (SELECT found FROM lapsed){admitted}
                AND s.status IN ({waiting}) AND {of_queues}
                AND s.available_at <= statement_timestamp()
                AND NOT {_failed_for_good("s")}
                AND {run_live}
            ORDER BY s.priority DESC, s.available_at, s.id
            LIMIT 1
            FOR UPDATE OF s SKIP LOCKED{run_locked}
        ), {_claimed(t, "statement_timestamp() + make_interval(secs => %s)", started, claimant)}"""
    columns, joined = _claim_columns(t)
    return ctes, [seconds], columns, joined


#: SQL types of the columns of :func:`claim_step`.
CLAIM_STEP_TYPES = (
    "boolean",
    "bigint",
    "uuid",
    "varchar",
    "varchar",
    "bigint",
    "text",
    "double precision",
    "timestamptz",
    "timestamptz",
    "varchar",
)


def claim_queue_lock(t: Tables, queue: Any) -> str:
    """PL/pgSQL run before :func:`claim_queue` in its function: the row of queue ``queue``
    created if missing and locked until the claim commits, so that claims of the queue are
    serialised as the portable path's are (:class:`WorkflowQueueQuerySet`). The statement
    after it takes a new snapshot (the function is ``VOLATILE``, READ COMMITTED), which sees
    every claim committed before the lock was granted."""
    lock = f"PERFORM 1 FROM {t.queue} WHERE name = {literal(queue)} FOR UPDATE;"
    return f"""{lock}
    IF NOT FOUND THEN
        INSERT INTO {t.queue} (name, starts, updated_at)
        VALUES ({literal(queue)}, '[]'::jsonb, statement_timestamp())
        ON CONFLICT (name) DO NOTHING;
        {lock}
    END IF;"""


def _recent(starts: str, window: Any, at: str) -> str:
    """The epoch seconds in the JSON rate log ``starts`` later than ``window`` seconds
    before ``at`` (an epoch, SQL), as a set of ``double precision`` values ``e``."""
    return (
        f"(SELECT e::double precision AS e FROM jsonb_array_elements_text({starts}) AS e "
        f"WHERE e::double precision > {at} - {literal(window)})"
    )


def _live_count(t: Tables, queue: str) -> str:
    """How many steps of queue ``queue`` (SQL) run with a live lease: what its concurrency
    counts (an SQL expression)."""
    return (
        f"(SELECT count(*) FROM {t.step} s WHERE s.status = {_text(StepStatus.RUNNING)} "
        f"AND s.queue = {queue} AND s.lease_expires_at > statement_timestamp())"
    )


def claim_queue_counted(
    t: Tables, seconds: Any, queue: Any, concurrency: Any, claimant: Any
) -> tuple[str, list[Any]]:
    """:meth:`WorkflowStepQuerySet.claim_due` for one queue whose only limit is its
    ``concurrency``, in one statement run under the queue row's lock
    (:func:`claim_queue_lock` first, in the same function): :func:`claim_step_ctes` for the
    queue, admitted while fewer than ``concurrency`` of its steps run with a live lease. No
    skip scan over keys, no rate log, no key row: a queue without keys or rates needs none.
    The attempt starts at the time after the lock (``clock_timestamp()``), as in
    :func:`claim_queue`."""
    q = literal(queue)
    admit = f"{_live_count(t, q)} < {literal(concurrency)}"
    ctes, params, columns, joined = claim_step_ctes(
        t, seconds, None, queue=q, admit=admit, started="clock_timestamp()", claimant=claimant
    )
    return f"WITH {ctes} SELECT {columns} FROM (SELECT 1) AS one {joined}", params


def claim_queue(
    t: Tables,
    seconds: Any,
    queue: Any,
    keyed: Any,
    concurrency: Any,
    rate_starts: Any,
    rate_window: Any,
    key_concurrency: Any,
    key_rate_starts: Any,
    key_rate_window: Any,
    claimant: Any,
) -> tuple[str, list[Any]]:
    """:meth:`WorkflowStepQuerySet.claim_due` for one queue with limits, in one statement
    run under the queue row's lock (:func:`claim_queue_lock` first, in the same function).

    The queue admits a start while fewer than ``concurrency`` of its steps run with a live
    lease and fewer than ``rate_starts`` of its rate log lie within the last ``rate_window``
    seconds (``NULL``: no such limit). Its due waiting steps are looked at one key at a time
    (a skip scan by the ``dl_step_key_waiting`` index, one index probe per key: the next
    key's first step in the claim order — highest ``priority``, then first due — that may
    start). With ``keyed``, a key at ``key_concurrency`` running steps or out of its
    ``key_rate`` is passed over, and of the others' first steps the one at the highest
    priority whose key was claimed least recently (never: first) is taken — round-robin;
    without, simply the first in the claim order. Then, as :func:`claim_step_ctes` (``SKIP
    LOCKED``, lease of ``seconds``, attempt row), with the start's time taken after the lock
    (``clock_timestamp()``): appended to the queue's rate log (with a rate), and in a keyed
    queue written as the key's last claim and appended to its rate log (with a key rate).
    A running step of the queue whose lease lapsed is left to the portable path, as in
    :func:`claim_step_ctes`. Its columns are :data:`CLAIM_STEP_TYPES`'.

    A variant for a queue of one shape is built by giving the builder Python values, not
    arguments: ``keyed`` ``True``; ``None`` for ``rate_starts`` (and ``rate_window``) or
    ``key_rate_starts`` (and ``key_rate_window``) leaves out the rate logs' reading and
    writing altogether (the statement a keyed queue without rates runs)."""
    running, waiting = (
        _text(StepStatus.RUNNING),
        ", ".join(
            _text(status)
            for status in (StepStatus.PENDING, StepStatus.SCHEDULED, StepStatus.FAILED)
        ),
    )
    q = literal(queue)
    is_keyed = "true" if keyed is True else literal(keyed)
    rated = rate_starts is not None
    key_rated = key_rate_starts is not None
    live_run = _run_of_step_running(t)
    at = "(SELECT epoch FROM clock)"
    lease = f"statement_timestamp() + make_interval(secs => {literal(seconds)})"
    admits = [f"({literal(concurrency)} IS NULL OR {_live_count(t, q)} < {literal(concurrency)})"]
    if rated:
        recent = _recent(f"(SELECT starts FROM {t.queue} WHERE name = {q})", rate_window, at)
        admits.append(
            f"({literal(rate_starts)} IS NULL OR "
            f"(SELECT count(*) FROM {recent} AS recent) < {literal(rate_starts)})"
        )
    # A key's first step that may start, in the claim order, after key ``after`` (SQL; the
    # first key: none).
    first_step = """(
                SELECT s.id, s.status AS was, s.available_at, s.priority, s.queue_key
                FROM {step} s
                WHERE s.queue = {q}{after} AND s.status IN ({waiting})
                    AND s.available_at <= statement_timestamp()
                    AND NOT {failed_for_good}
                    AND {live_run}
                ORDER BY s.queue_key, s.priority DESC, s.available_at, s.id
                LIMIT 1
            )"""

    def first_after(after: str) -> str:
        return first_step.format(
            step=t.step,
            q=q,
            after=after,
            waiting=waiting,
            failed_for_good=_failed_for_good("s"),
            live_run=live_run,
        )

    # The key's row, read by one index probe per candidate (a key or two in the common case:
    # cheaper than building a hash table for a join).
    key_row = f"FROM {t.queue_key} k WHERE k.queue = {q} AND k.key = w.queue_key"
    key_rate_refused = ""
    if key_rated:
        key_rate_refused = f"""
                AND NOT ({is_keyed} AND {literal(key_rate_starts)} IS NOT NULL AND (
                    SELECT count(*)
                    FROM {_recent(f"(SELECT k.starts {key_row})", key_rate_window, at)} AS recent
                ) >= {literal(key_rate_starts)})"""
    busy, live = "", ""
    if key_concurrency is not None:
        live = f"""live AS (
            SELECT s.queue_key FROM {t.step} s
            WHERE s.status = {running} AND s.queue = {q}
                AND s.lease_expires_at > statement_timestamp()
        ), """
        busy = f"""
                AND NOT ({is_keyed} AND {literal(key_concurrency)} IS NOT NULL AND (
                    SELECT count(*) FROM live WHERE live.queue_key = w.queue_key
                ) >= {literal(key_concurrency)})"""
        admits[0] = (
            f"({literal(concurrency)} IS NULL "
            f"OR (SELECT count(*) FROM live) < {literal(concurrency)})"
        )
    ctes = f"""
        {_lapsed(t, f"s.queue = {q}", live_run)}, clock AS (
            SELECT clock_timestamp() AS at,
                extract(epoch FROM clock_timestamp())::double precision AS epoch
        ), {live}firsts AS (
            SELECT f.* FROM {first_after("")} AS f
            WHERE NOT (SELECT found FROM lapsed) AND {" AND ".join(admits)}
            UNION ALL
            SELECT f.* FROM firsts w
            CROSS JOIN LATERAL {first_after(" AND s.queue_key > w.queue_key")} AS f
        ), candidates AS (
            SELECT w.id, w.was, w.available_at, w.priority, w.queue_key,
                {f"(SELECT k.starts {key_row})" if key_rated else "NULL::jsonb"} AS starts,
                CASE WHEN {is_keyed} THEN coalesce((SELECT k.claimed_at {key_row}), '-infinity')
                    ELSE '-infinity' END AS turn
            FROM firsts w
            WHERE true{busy}{key_rate_refused}
        ), top AS (
            SELECT * FROM candidates
            WHERE priority = (SELECT max(priority) FROM candidates)
        ), turn AS (
            SELECT * FROM top WHERE turn = (SELECT min(turn) FROM top)
        ), first AS (
            SELECT * FROM turn WHERE available_at = (SELECT min(available_at) FROM turn)
        ), picked AS (
            SELECT s.id, first.was, first.available_at, first.queue_key, first.starts
            FROM {t.step} s JOIN first ON first.id = s.id
            WHERE s.id = (SELECT min(id) FROM first) AND s.status = first.was
                AND s.available_at <= statement_timestamp()
            FOR UPDATE OF s SKIP LOCKED
        ), {_claimed(t, lease, "(SELECT at FROM clock)", claimant)}"""
    if rated:
        ctes += f""", rated AS (
            UPDATE {t.queue}
            SET starts = (
                    SELECT coalesce(jsonb_agg(recent.e), '[]'::jsonb)
                    FROM {_recent("starts", rate_window, at)} AS recent
                ) || to_jsonb({at}),
                updated_at = statement_timestamp()
            WHERE name = {q} AND {literal(rate_starts)} IS NOT NULL
                AND EXISTS (SELECT 1 FROM claimed)
        )"""
    if key_rated:
        starts = f"""CASE
                WHEN {literal(key_rate_starts)} IS NULL THEN coalesce(picked.starts, '[]'::jsonb)
                ELSE (
                    SELECT coalesce(jsonb_agg(recent.e), '[]'::jsonb)
                    FROM {_recent("coalesce(picked.starts, '[]'::jsonb)", key_rate_window, at)}
                        AS recent
                ) || to_jsonb({at}) END"""
        written = "claimed_at = excluded.claimed_at, starts = excluded.starts"
    else:
        # No key rate: the key's rate log is left as it is (a new key's: empty).
        starts = "'[]'::jsonb"
        written = "claimed_at = excluded.claimed_at"
    ctes += f""", turned AS (
            INSERT INTO {t.queue_key} AS k (queue, key, claimed_at, starts)
            SELECT {q}, picked.queue_key, (SELECT at FROM clock), {starts}
            FROM picked
            WHERE {is_keyed} AND EXISTS (SELECT 1 FROM claimed)
            ON CONFLICT (queue, key) DO UPDATE
            SET {written}
        )"""
    columns, joined = _claim_columns(t)
    return f"WITH RECURSIVE {ctes} SELECT {columns} FROM (SELECT 1) AS one {joined}", []


def _claimed_insert(t: Tables, run_row: str, new: NewStep, *, name: str) -> tuple[str, list[Any]]:
    """CTEs ``{name}`` (step ``new`` inserted ``running`` at attempt 1 with its lease, its
    claim naming its claimant, into the run ``run_row`` selects — a ``FROM … WHERE …`` over
    the run table aliased ``r`` — unless the run has a step of that name; its ``id``) and
    ``{name}_history`` (its attempt row)."""
    sql = f"""{name} AS (
            INSERT INTO {t.step} (
                run_id, step_name, function_name, data, status, attempt, retries,
                retry_delay, retry_backoff, retry_delay_max, lease_expires_at, claimant,
                fence_floor, available_at, created_at, updated_at
            )
            SELECT r.id, %s, %s, %s::jsonb, {_text(StepStatus.RUNNING)}, 1, %s, %s, %s, %s,
                   statement_timestamp() + make_interval(secs => %s), %s, {t.floor},
                   statement_timestamp(), statement_timestamp(), statement_timestamp()
            {run_row}
            ON CONFLICT (run_id, step_name) DO NOTHING
            RETURNING id
        ), {name}_history AS (
            INSERT INTO {t.attempt} (step_id, attempt, status, started_at)
            SELECT id, 1, {_text(AttemptStatus.RUNNING)}, statement_timestamp() FROM {name}
        )"""
    params = [
        new.step_name,
        new.function_name,
        new.data,
        new.retries,
        new.retry_delay,
        new.retry_backoff,
        new.retry_delay_max,
        new.seconds,
        new.claimant,
    ]
    return sql, params


def insert_claimed(t: Tables, run_id: Any, new: NewStep, finish_pass: Any) -> tuple[str, list[Any]]:
    """:meth:`WorkflowStepQuerySet.schedule_claimed`: insert step ``new`` ``running`` at
    attempt 1 with its lease (its claim naming its claimant) and its attempt row, if the run
    is running and the step does not exist yet, and end the pass (``finish_pass``: the
    ``pass_requests`` the pass read) when it was inserted. Returns the new step's id, or no
    row."""
    inserted, params = _claimed_insert(
        t, f"FROM {t.run} r WHERE r.id = %s AND {_is_running('r.status')}", new, name="step"
    )
    sql = f"""
        WITH {inserted}, finished AS (
            UPDATE {t.run} SET pass_due_at = NULL
            WHERE id = %s AND pass_requests = %s AND EXISTS (SELECT 1 FROM step)
        )
        SELECT id FROM step
    """
    return sql, [*params, run_id, run_id, finish_pass]


def _result(
    t: Tables, fence: str, fence_params: Sequence[Any], payload: Any, attempt: Any
) -> tuple[str, list[Any]]:
    """A step's result ``payload`` (JSON text) written through the fence (``fence``: the
    step's WHERE for this attempt, still ``running``), its attempt row marked succeeded, as
    CTEs ``step`` (the written step's ``id, run_id``; empty when the fence refused) and
    ``history``. The result is stored once, on the step (``WorkflowStepAttempt``).
    Nothing else in a statement may land when ``step`` is empty: later CTEs test it."""
    sql = f"""step AS (
        UPDATE {t.step}
        SET status = {_text(StepStatus.SUCCEEDED)}, result = %s::jsonb, error = NULL,
            lease_expires_at = NULL, updated_at = statement_timestamp()
        WHERE {fence}
        RETURNING id, run_id
    ), history AS (
        UPDATE {t.attempt}
        SET status = {_text(AttemptStatus.SUCCEEDED)}, finished_at = statement_timestamp()
        WHERE step_id = (SELECT id FROM step) AND attempt = %s
    )"""
    return sql, [payload, *fence_params, attempt]


def set_result(
    t: Tables,
    fence: str,
    fence_params: Sequence[Any],
    payload: Any,
    attempt: Any,
    *,
    hold: Any = None,
    channel: Any = None,
) -> tuple[str, list[Any]]:
    """:meth:`WorkflowStepQuerySet.set_result`: the fenced result, its attempt row, and the
    run's pass request, in one statement. Every result raises ``pass_requests``; while the
    run's last pass waits on more than one unfinished parallel step (``branches_left`` > 1)
    it only counts one off and asks for nothing. Otherwise the pass is asked for: with
    ``hold`` (seconds) it is taken for the caller (due only ``hold`` seconds from now, no
    notification) and the run's pass state as the write left it is returned; else it is due
    now and ``channel`` is notified. Its row: written (0 or 1), then the pass state
    (``hold``; ``NULL`` when none was asked for) or whether it was asked for.

    The ``SET`` expressions (not a subquery of this statement's snapshot) decide the count:
    PostgreSQL evaluates them on the run row's latest version once it holds its lock, so of
    two branches finishing at once exactly one sees the count reach 0."""
    written, params = _result(t, fence, fence_params, payload, attempt)
    sql = f"""
        WITH {written}, run AS (
            UPDATE {t.run} AS r
            SET pass_due_at = CASE WHEN r.branches_left > 1 THEN r.pass_due_at
                    ELSE statement_timestamp() + make_interval(secs => %s) END,
                branches_left = CASE WHEN r.branches_left > 1 THEN r.branches_left - 1
                    ELSE 0 END,
                pass_requests = pass_requests + 1, updated_at = statement_timestamp()
            WHERE id = (SELECT run_id FROM step) AND {_is_running()}
            RETURNING r.id, r.workflow, r.status, r.input, r.pass_requests,
                r.branches_left = 0 AS asked
        )
    """
    params.append(0.0 if hold is None else hold)
    if hold is None:
        sql += "SELECT (SELECT count(*) FROM step), coalesce((SELECT asked FROM run), false), "
        sql += "(SELECT pg_notify(%s, '') FROM run WHERE asked)"
        params.append(channel)
    else:
        sql += f"SELECT (SELECT count(*) FROM step), {pass_state('run', t.step)} "
        sql += "FROM (SELECT 1) AS one LEFT JOIN run ON run.asked"
    return sql, params


def set_result_claiming_next(
    t: Tables,
    fence: str,
    fence_params: Sequence[Any],
    payload: Any,
    attempt: Any,
    hold: Any,
    new: NewStep,
    finish_pass: Any,
) -> tuple[str, list[Any]]:
    """:meth:`WorkflowStepQuerySet.set_result_claiming_next`: the fenced result and its
    attempt row (as :func:`set_result`), and step ``new``, the one the run's pass asks for
    next, inserted claimed for its claimant (as :func:`insert_claimed`), in one statement.

    The next step is inserted only when the result was written, the run is ``running`` and
    its last pass waits on nothing else (``branches_left`` ≤ 1), and no step of that name
    exists; the run row is locked ``FOR SHARE`` to read that, so a run that ended while this
    statement waited is seen ended. Then the pass this result asks for has been run (by the
    caller, in memory) and ends: ``pass_due_at`` is cleared, unless a pass was asked for
    since ``finish_pass`` (the ``pass_requests`` the caller's pass read), which stays due
    now. When no step was inserted the run update is :func:`set_result`'s with ``hold``.
    Its row: written (0 or 1), the step's run, the new step's id, the run's
    ``pass_requests`` when its pass ended (else ``NULL``), then the pass state (``NULL``
    unless the pass was taken for the caller: no step inserted and the run asked)."""
    written, params = _result(t, fence, fence_params, payload, attempt)
    inserted, insert_params = _claimed_insert(
        t,
        f"""FROM {t.run} r
            WHERE r.id = (SELECT run_id FROM step) AND {_is_running("r.status")}
                AND r.branches_left <= 1
            FOR SHARE OF r""",
        new,
        name="next",
    )
    sql = f"""
        WITH {written}, {inserted}, run AS (
            UPDATE {t.run} AS r
            SET pass_due_at = CASE
                    WHEN r.branches_left > 1 THEN r.pass_due_at
                    WHEN NOT EXISTS (SELECT 1 FROM next)
                        THEN statement_timestamp() + make_interval(secs => %s)
                    WHEN r.pass_requests = %s THEN NULL
                    ELSE statement_timestamp() END,
                branches_left = CASE WHEN r.branches_left > 1 THEN r.branches_left - 1
                    ELSE 0 END,
                pass_requests = pass_requests + 1, updated_at = statement_timestamp()
            WHERE id = (SELECT run_id FROM step) AND {_is_running()}
            RETURNING r.id, r.workflow, r.status, r.input, r.pass_requests, r.pass_due_at,
                r.branches_left = 0 AND NOT EXISTS (SELECT 1 FROM next) AS asked
        )
        SELECT (SELECT count(*) FROM step), (SELECT run_id FROM step), (SELECT id FROM next),
            (SELECT pass_requests FROM run WHERE pass_due_at IS NULL),
            {pass_state("run", t.step)}
        FROM (SELECT 1) AS one LEFT JOIN run ON run.asked
    """
    return sql, [*params, *insert_params, hold, finish_pass]


#: Columns of a :func:`set_result_claiming_next` row before the pass state's.
CLAIMING_NEXT_COLUMNS = 4


def completion(
    t: Tables,
    fence: str,
    fence_params: Sequence[Any],
    release: Callable[[str], str],
    payload: Any,
    attempt: Any,
    output: Any,
    key: Any,
    holder: Any,
    token: Any,
    *,
    pick: tuple[Callable[[str], str], str, Any, Any] | None = None,
) -> tuple[str, list[Any]]:
    """:meth:`WorkflowStepQuerySet.set_result_completing_run`: the fenced result, the run's
    completion with ``output`` (JSON text), the wake-up of its parent run (a child run's
    parent waiting in ``run.child``: due for a pass now), the release of the run lease
    (``release(where)`` is the lease's release-held statement for a key condition
    ``where``, taking the holder and token) and, with ``pick`` (``(acquire, grant, seconds,
    holder)`` as for :func:`pick_pass`), the pick of the next due run with its lease, never
    this step's run nor its parent. Everything but the pick depends on the fence. Its row:
    written, completed, live, the run's ``finished_at`` (see :data:`COMPLETION_COLUMNS`),
    then the picked pass."""
    written, params = _result(t, fence, fence_params, payload, attempt)
    ctes = f"""{written}, {_run_done(t, "(SELECT run_id FROM step)")}, released AS ({
        release("key = %s AND EXISTS (SELECT 1 FROM step)")
    })"""
    params += [output, key, holder, token]
    columns = (
        "(SELECT count(*) FROM step), (SELECT count(*) FROM done), (SELECT live FROM released), "
        "(SELECT finished_at FROM done)"
    )
    return _with_next(t, ctes, params, columns, "(SELECT 1) AS one", pick)


def _run_done(t: Tables, run_id: str, *, only_if: str = "") -> str:
    """CTEs ``done`` (running run ``run_id``, an SQL expression, completed with the output
    parameter; ``only_if``: a further condition) and ``woken`` (its parent, waiting in
    ``run.child``, due for a pass now). Takes the output (JSON text) as its parameter."""
    return f"""done AS (
        UPDATE {t.run}
        SET status = {_text(RunStatus.COMPLETED)}, output = %s::jsonb, error = NULL,
            pass_due_at = NULL, branches_left = 0, updated_at = statement_timestamp(),
            finished_at = statement_timestamp()
        WHERE id = {run_id} AND {_is_running()}{only_if}
        RETURNING id, parent_id, finished_at
    ), woken AS (
        UPDATE {t.run}
        SET pass_due_at = statement_timestamp(), pass_requests = pass_requests + 1,
            updated_at = statement_timestamp()
        WHERE id = (SELECT parent_id FROM done) AND {_is_running()}
    )"""


def _with_next(
    t: Tables,
    ctes: str,
    params: list[Any],
    columns: str,
    joined: str,
    pick: tuple[Callable[[str], str], str, Any, Any] | None,
    claim: tuple[Any, Any, Any] | None = None,
) -> tuple[str, list[Any]]:
    """A completion's statement from its ``ctes``, ``columns`` and ``joined`` (after
    ``FROM``), with what the writer does next appended: ``pick`` (see :func:`completion`),
    the next due run's pick, or ``claim`` (``(seconds, queues, claimant)``, see
    :func:`completion_alone`), the next due step's claim."""
    if claim is not None:
        seconds, queues, claimant = claim
        claimed, claim_params, claim_columns, claim_joined = claim_step_ctes(
            t, seconds, queues, after_waits=True, claimant=claimant
        )
        ctes += f", {claimed}"
        params = [*params, *claim_params]
        columns += f", {claim_columns}"
        joined += f" {claim_joined}"
    if pick is not None:
        acquire, grant, seconds, next_holder = pick
        picked, pick_params, pick_columns, pick_joined = pick_pass(
            t,
            acquire,
            grant,
            seconds,
            next_holder,
            besides=("SELECT run_id FROM step", "SELECT parent_id FROM done"),
        )
        ctes += f", {picked}"
        params = [*params, *pick_params]
        columns += f", {pick_columns}"
        joined += f" LEFT JOIN ({pick_joined}) ON true"
    return f"WITH {ctes} SELECT {columns} FROM {joined}", params


def completion_alone(
    t: Tables,
    fence: str,
    fence_params: Sequence[Any],
    acquire_released: Callable[[str], str],
    granted: str,
    payload: Any,
    attempt: Any,
    output: Any,
    holder: Any,
    channel: Any,
    *,
    pick: tuple[Callable[[str], str], str, Any, Any] | None = None,
    claim: tuple[Any, Any, Any] | None = None,
) -> tuple[str, list[Any]]:
    """:meth:`WorkflowStepQuerySet.set_result_completing_run` for a caller that holds no
    run lease: the fenced result, then — the run row locked (still ``running``) — the run
    lease taken for ``holder`` and released in the same instant (``acquire_released(rows)``:
    the acquire rule over ``rows`` of ``granted``, :func:`~django_leases.models.lease.
    released_grant_sql`'s columns), and with it the run's completion with ``output``
    (JSON text) and its parent's wake-up. When another holder has the run lease live (a pass
    runs), the run is not completed: its pass is asked for instead (due now, ``channel``
    notified), as a result written the ordinary way asks for it. Rows are locked in the
    house's order: the step, its run, then the run lease. ``pick`` as for
    :func:`completion`; or ``claim`` (``(seconds, queues, claimant)``, as for
    :func:`claim_step`):
    the claim of the next due step (this step is ``running`` in the statement's snapshot,
    so never the one claimed). Everything but the pick or claim depends on the fence. Its
    row: written (0 or 1), the completed run's id (``NULL``: not completed), its
    ``finished_at``, asked (0 or 1; see :data:`ALONE_COLUMNS`), the lease grant's columns
    (``NULL`` when refused), then the picked pass or the claim's columns."""
    written, params = _result(t, fence, fence_params, payload, attempt)
    rows = f"SELECT %s || locked.id::text, %s, {granted} FROM locked"
    ctes = f"""{written}, locked AS (
        SELECT id FROM {t.run}
        WHERE id = (SELECT run_id FROM step) AND {_is_running()}
        FOR UPDATE
    ), taken AS ({acquire_released(rows)}), {
        _run_done(t, "(SELECT id FROM locked)", only_if=" AND EXISTS (SELECT 1 FROM taken)")
    }, asked AS (
        UPDATE {t.run}
        SET pass_due_at = statement_timestamp(), pass_requests = pass_requests + 1,
            branches_left = 0, updated_at = statement_timestamp()
        WHERE id = (SELECT id FROM locked) AND NOT EXISTS (SELECT 1 FROM taken)
        RETURNING id
    ), notified AS (SELECT pg_notify(%s, '') FROM asked)"""
    params += [RUN_LEASE_PREFIX, holder, output, channel]
    columns = (
        "(SELECT count(*) FROM step), (SELECT id FROM done), "
        "(SELECT finished_at FROM done), (SELECT count(*) FROM notified), taken.*"
    )
    joined = "(SELECT 1) AS one LEFT JOIN taken ON true"
    return _with_next(t, ctes, params, columns, joined, pick, claim)


#: Columns of a :func:`completion_alone` row before the lease grant's.
ALONE_COLUMNS = 4


#: Columns of a :func:`completion` row before the picked pass's.
COMPLETION_COLUMNS = 4


# -- functions ----------------------------------------------------------------------------------

#: Settings every function runs its statements with. The cached plan is made when the tables
#: may still be small, where a sequential scan or a sort looks cheaper and would then stay
#: while the tables grow: every row these statements touch is found through an index (a
#: primary key, a unique key, the due-work index's order), so those are ruled out. Each
#: statement has a plan without them (``tests/test_hot_path_plans.py`` EXPLAINs them); one
#: that had none would cost ~1e10, so JIT compilation is off too (it cost 1-4.5 s a call).
FUNCTION_SETTINGS = (
    "SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off"
)

#: Prefix of every function's name: ``dl_<short>_<hash of its definition>``.
FUNCTION_PREFIX = "dl_"


@frozen
class Function:
    """One PL/pgSQL function: ``short`` name, arguments, result column types and its body
    (a statement with the arguments in place of its parameters), after ``prelude``
    (PL/pgSQL run first, e.g. a lock; empty: none)."""

    short: str
    args: tuple[Arg, ...]
    returns: tuple[str, ...]
    statement: tuple[str, list[Any]]
    prelude: str = ""

    def definition(self) -> tuple[str, str]:
        """``(name, CREATE OR REPLACE FUNCTION …)``: the name ends with a hash of the
        definition, so code whose statement changed never calls a function installed for
        another."""
        sql, params = self.statement
        text = " ".join((sql % tuple(literal(p) for p in params)).split())
        signature = ", ".join(f"{arg.name} {arg.sql_type}" for arg in self.args)
        columns = ", ".join(f"r{n} {sql_type}" for n, sql_type in enumerate(self.returns))
        template = (
            "CREATE OR REPLACE FUNCTION {name}(" + signature + ") "
            "RETURNS TABLE(" + columns + ") LANGUAGE plpgsql VOLATILE "
            f"{FUNCTION_SETTINGS} AS $dl$\n"
            "#variable_conflict use_column\n"
            "BEGIN\n"
            + (f"    {self.prelude}\n" if self.prelude else "")
            + "    RETURN QUERY "
            + text
            + ";\nEND\n$dl$"
        )
        digest = hashlib.sha256(template.encode()).hexdigest()[:12]
        name = f"{FUNCTION_PREFIX}{self.short}_{digest}"
        return name, template.replace("{name}", name, 1)

    @property
    def name(self) -> str:
        """The function's name (with its hash)."""
        return self.definition()[0]

    def call(self, *, then: str = "") -> str:
        """``SELECT * FROM <name>(%s, …)``: the statement that calls it; ``then``: an SQL
        expression read in the same statement, as one more column after the function's."""
        call = f"SELECT * FROM {self.name}({', '.join(['%s'] * len(self.args))})"
        return f"{call} CROSS JOIN (SELECT {then}) AS read_after" if then else call


__all__ = [
    "ALONE_COLUMNS",
    "CLAIMING_NEXT_COLUMNS",
    "CLAIM_STEP_TYPES",
    "COMPLETION_COLUMNS",
    "FUNCTION_PREFIX",
    "FUNCTION_SETTINGS",
    "LEASE_TYPES",
    "PASS_STATE_TYPES",
    "Arg",
    "Function",
    "Tables",
    "claim_queue",
    "claim_queue_counted",
    "claim_queue_lock",
    "claim_step",
    "claim_step_ctes",
    "claim_step_except",
    "completion",
    "completion_alone",
    "insert_claimed",
    "literal",
    "pass_state",
    "pick_pass",
    "pick_pass_alone",
    "set_result",
    "set_result_claiming_next",
    "start_one_step",
    "start_run",
    "take_pass",
]

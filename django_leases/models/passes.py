"""Runs and their orchestration passes (:class:`RunPasses`, the lower layer of
``WorkflowRun.objects``): starting a run (keyed or not, with its first step), asking for,
claiming and taking a pass under the run's lease, reading its state, and ending the pass
or the run.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, models, transaction
from django.db.models import Q, TextField, Value
from django.db.models.functions import Cast

from django_leases import clock, db, signals
from django_leases.clock import DbNow, to_stored
from django_leases.models.lease import Lease, announce
from django_leases.models.outcomes import write_pending
from django_leases.models.recorded import TEXT_SUFFIX
from django_leases.models.scheduling import check_step, step_columns
from django_leases.models.workflow_base import (
    call_function,
    falls_back,
    functions_called,
    pass_claim,
    request_passes,
    run_model,
    run_reached,
    step_model,
    tag_model,
    wake_parent,
    wake_workers,
    workflow_tables,
)
from django_leases.signals import lease_acquired
from django_leases.validation import (
    check_identifier,
    check_json,
    check_queue_key,
    check_run_key,
    check_tags,
    error_json,
    parse_run_id,
    seconds,
    ttl_seconds,
)
from django_leases.workflows import sql
from django_leases.workflows.channel import channel_name
from django_leases.workflows.values import (
    RUN_LEASE_PREFIX,
    WAITING_STEP_STATUSES,
    NextStep,
    PassClaim,
    PassState,
    PendingResult,
    RunStatus,
    StepOptions,
    StepStatus,
    failed_for_good_q,
    run_lease_key,
)

if TYPE_CHECKING:
    from django_leases.models.workflow import WorkflowRun

logger = logging.getLogger("django_leases.workflows")


class RunPasses(db.RoutedQuerySet["WorkflowRun"]):
    """Starting runs; asking for, claiming, taking and ending their passes."""

    def _create_tagged(self, alias: str, **columns: Any) -> WorkflowRun:
        """Insert a run with ``columns`` and, when ``columns["tags"]`` holds any, its tag rows
        (``WorkflowRun.objects.tagged`` reads those), inside the caller's transaction: the
        one place a run's tags are written both ways."""
        run = self.rows().create(**columns)
        if columns.get("tags"):
            tag_model().objects.db_manager(alias).write(run.pk, columns["tags"])
        return run

    def _insert_started(
        self,
        alias: str,
        *,
        wake: bool,
        then: Callable[[WorkflowRun], object] | None = None,
        **columns: Any,
    ) -> WorkflowRun:
        """Create a run with ``columns`` (:meth:`_create_tagged`) in a transaction of its own
        (a savepoint inside the caller's), calling ``then(run)`` in it and, when ``wake``
        (a ``bool``), waking idle workers; the run comes back ``started``, its
        ``run_started`` sent once that commits. Where ``columns["key"]`` is already held,
        that key's run comes back instead (``started=False``) and nothing is written.

        On MariaDB / MySQL, starts racing on one key can deadlock (InnoDB rolls the whole
        transaction back): a call that owns its transaction starts over
        (:func:`~django_leases.db.again_after_whole_rollback`); inside the caller's
        transaction the ``OperationalError`` is raised."""
        workflow, key = columns["workflow"], columns.get("key")

        def insert() -> WorkflowRun:
            with transaction.atomic(using=alias):
                run = self._create_tagged(alias, **columns)
                if then is not None:
                    then(run)
                if wake:
                    wake_workers(alias)
            return run

        try:
            run = db.again_after_whole_rollback(alias, insert)
        except IntegrityError:
            if key is None:
                raise
            return self._keyed(workflow, key)
        run.started = True
        self._started(alias, run.pk, workflow)
        return run

    def _check_start(
        self, workflow: str, input: Any, key: str | None, tags: object, queue_key: object
    ) -> tuple[dict[str, str] | None, str]:
        """The arguments every start shares, checked (``ValueError``): the ``workflow`` name,
        JSON ``input``, ``key``, ``tags`` and ``queue_key``. Returns the tags as
        :func:`~django_leases.validation.check_tags` gives them and the queue key (``""``:
        none)."""
        check_identifier(workflow, "Workflow name")
        check_json(input, "Workflow input", using=self.write_alias())
        if key is not None:
            check_run_key(key)
        return check_tags(tags), check_queue_key(queue_key) or ""

    def start(
        self,
        workflow: str,
        input: Any = None,
        *,
        key: str | None = None,
        parent: uuid.UUID | None = None,
        tags: Mapping[str, str] | None = None,
        queue_key: str | None = None,
    ) -> WorkflowRun:
        """Create a ``running`` run of ``workflow`` with JSON ``input``, due for its first pass.

        ``queue_key`` (``str`` of 1–255 characters, or ``None``): the key the run's steps
        count under for a queue's per-key limits (``WorkflowRun.queue_key``).

        ``key`` (a non-empty ``str`` of at most 255 characters) makes the start idempotent:
        while a run of ``workflow`` with that key exists, that run is returned and nothing is
        written — enforced by a unique constraint on ``(workflow, key)``, so concurrent starts
        with one key create one run. ``run.started`` tells them apart: ``False`` for a run
        found by its key. ``parent``: the id of the run this one is a child of
        (``run.child``); the parent is asked for a pass when this run finishes. ``tags``
        (``dict[str, str]``, :func:`~django_leases.validation.check_tags`) are stored on the
        run and in its tag rows (``WorkflowRun.objects.tagged``); a run found by its key
        keeps its own.

        Does not check that the workflow is registered (``start_workflow`` does). Safe inside an
        outer transaction. Raises ``ValueError`` for a bad name, key or tags, or non-JSON
        input.
        """
        tagged, queue_key = self._check_start(workflow, input, key, tags, queue_key)
        alias = self.write_alias()
        connection = connections[alias]
        value = {} if input is None else input
        # A tagged start writes its tag rows too: the portable path's transaction does.
        if tagged is None and db.tuned(connection, "postgresql"):
            # One statement (atomic on its own, or part of the caller's transaction): the
            # run, due for its first pass, and the notification (sent when it commits); a
            # key already taken inserts nothing and notifies nobody.
            run = self.model(
                workflow=workflow,
                input=value,
                status=RunStatus.RUNNING,
                pass_requests=1,
                key=key,
                parent_id=parent,
                queue_key=queue_key,
            )
            params: list[Any] = [
                run.id,
                workflow,
                json.dumps(value),
                key,
                parent,
                queue_key,
                channel_name(alias),
            ]
            with connection.cursor() as cursor:
                cursor.execute(sql.start_run(workflow_tables(connection)), params)
                row = cursor.fetchone()
            if row is None:
                return self._keyed(workflow, key)
            run.created_at = run.updated_at = run.pass_due_at = row[0]
            run._state.adding = False
            run._state.db = alias
            run.started = True
            self._started(alias, run.id, workflow)
            return run
        return self._insert_started(
            alias,
            wake=True,
            workflow=workflow,
            input=value,
            key=key,
            parent_id=parent,
            tags=tagged,
            queue_key=queue_key,
            pass_due_at=DbNow(),
            pass_requests=1,
        )

    def _keyed(self, workflow: str, key: str | None) -> WorkflowRun:
        """The run of ``workflow`` holding ``key`` (a start that found it), ``started=False``."""
        run = self.rows().get(workflow=workflow, key=key)
        run.started = False
        return run

    def id_for_key(self, workflow: str, key: str) -> uuid.UUID | None:
        """The id of the run of ``workflow`` started with ``key``, or ``None``."""
        found = self.rows().filter(workflow=workflow, key=key).values_list("pk", flat=True)
        return found.first()

    def start_one_step(
        self,
        workflow: str,
        input: Any,
        *,
        step_name: str,
        function_name: str,
        options: StepOptions | None = None,
        available_at: datetime | None = None,
        key: str | None = None,
    ) -> WorkflowRun:
        """Create a ``running`` run of ``workflow`` (JSON ``input``) together with its one step
        ``step_name`` (step function ``function_name``, data = ``input``), in one transaction
        (joining the caller's: the step is claimable once that commits). No first pass: the
        step is due at ``available_at`` (an aware ``datetime``, compared with the database
        clock by the claim; ``None``: DB now), with ``options`` (:class:`~values.StepOptions`;
        ``None``: no retries, the defaults otherwise; its ``queue_key`` is also the run's).
        The run's pass comes when the step
        finishes and replays ``workflow``, which must call ``run.step(step_name,
        function_name, ...)``. Idle workers are woken when it commits. Used by the Django
        Tasks backend.

        ``key`` (a non-empty ``str`` of at most 255 characters) makes the start idempotent as
        in :meth:`start`: while a run of ``workflow`` holds it, that run is returned
        (``started=False``) and nothing is written.

        Raises ``ValueError`` for a bad name or key, non-JSON input or a naive
        ``available_at``; nothing is written then.
        """
        check_identifier(workflow, "Workflow name")
        step = check_step(
            NextStep(step_name, function_name, input, options or StepOptions(retries=0)),
            self.write_alias(),
        )
        options = step.options
        if available_at is not None and (
            not isinstance(available_at, datetime) or available_at.tzinfo is None
        ):
            raise ValueError(f"available_at must be an aware datetime, not {available_at!r}")
        if available_at is not None:  # in UTC: PostgreSQL refuses offsets beyond ±15:59
            available_at = available_at.astimezone(UTC)
        if key is not None:
            check_run_key(key)
        value = {} if input is None else input
        alias = self.write_alias()
        connection = connections[alias]
        if key is None and db.tuned(connection, "postgresql"):
            # One statement (atomic on its own, or part of the caller's transaction): the
            # run, its step and the notification (sent when it commits).
            run = self.model(
                workflow=workflow,
                input=value,
                status=RunStatus.RUNNING,
                queue_key=options.queue_key or "",
            )
            params: list[Any] = [
                run.id,
                workflow,
                json.dumps(value),
                options.queue_key or "",
                step_name,
                function_name,
                options.retries,
                options.retry_delay,
                options.retry_backoff,
                options.retry_delay_max,
                options.timeout,
                options.queue,
                options.priority,
                available_at,
                channel_name(alias),
            ]
            with connection.cursor() as cursor:
                cursor.execute(sql.start_one_step(workflow_tables(connection)), params)
                (created_at, _) = cursor.fetchone()
            run.created_at = run.updated_at = created_at
            run._state.adding = False
            run._state.db = alias
            self._started(alias, run.id, workflow)
            run.started = True
            return run
        return self._insert_started(
            alias,
            wake=True,
            then=lambda run: (
                step_model()
                .objects.db_manager(alias)
                .rows()
                .create(
                    run_id=run.pk,
                    **step_columns(step),
                    available_at=DbNow()
                    if available_at is None
                    else to_stored(available_at, alias),
                )
            ),
            workflow=workflow,
            input=value,
            key=key,
            queue_key=options.queue_key or "",
        )

    @staticmethod
    def _started(alias: str, run_id: uuid.UUID, workflow: str) -> None:
        """Send ``run_started`` for a run just created, once its transaction commits."""
        db.after_commit(
            lambda: signals.run_started.send_robust(
                sender=run_model(), run_id=run_id, workflow=workflow, using=alias
            ),
            alias,
        )

    def request_pass(self, run_id: uuid.UUID | str, delay: float = 0.0) -> bool:
        """Mark a running run due for an orchestration pass ``delay`` seconds (≥ 0) from DB now.

        Returns ``True`` if the run is running (and now due), ``False`` otherwise.
        """
        delay = seconds(delay, "delay")
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            return bool(request_passes(alias, Q(pk=run_id), delay))

    @falls_back
    def claim_due_pass(self, ttl: float, lease_holder: str | None = None) -> PassClaim | None:
        """Pick one running run whose pass is due (``pass_due_at <= DB now``), with its run
        lease ``workflow-run:<id>`` for ``lease_holder``; ``None`` when no pass is due.

        The pick pushes ``pass_due_at`` to DB now + ``ttl`` seconds: no other worker picks the
        run meanwhile, and if this worker dies before the pass ends, the run is picked again
        after ``ttl``. Rows are picked with ``SKIP LOCKED`` where the database has it, so
        concurrent workers pick different runs. The lease is taken by the acquire rule of
        ``Lease.objects.acquire`` (``lease_acquired`` is sent) for ``ttl`` seconds:
        ``PassClaim.lease`` is the granted lease, or ``None`` with ``lease_refused`` when
        another holder has it live (the caller asks for the pass again later, as a pass that
        finds the lease taken does). Without ``lease_holder`` no lease is taken (the caller
        takes it) and ``lease_refused`` is ``False``. ``PassClaim.state`` holds the run and
        its steps as the pick read them. Tuned (PostgreSQL, with a holder): all of it is one
        statement; elsewhere the pick and the lease are one transaction.

        A database error ends the call (it is raised) with no pass left taken: a pick that
        failed rolled back, and one whose reply was lost (it may have landed) is put back
        (:meth:`put_back_passes`, for ``lease_holder``, when the database still answers), so
        the run's pass is due again at once rather than after ``ttl``. ``lease_acquired`` is
        sent once the grant commits: never for one rolled back.
        """
        ttl = ttl_seconds(ttl)
        alias = self.write_alias()
        sent = time.monotonic()
        try:
            return self._pick_pass(alias, ttl, lease_holder, sent)
        except db.DATABASE_FAULTS:
            if lease_holder is not None:
                self.put_back_passes(lease_holder)
            raise

    def _pick_pass(
        self, alias: str, ttl: float, lease_holder: str | None, sent: float
    ) -> PassClaim | None:
        """:meth:`claim_due_pass` without its clean-up after a database error."""
        connection = connections[alias]
        if lease_holder is not None and functions_called(connection):
            row = call_function(connection, "pick_pass", [ttl, lease_holder])
            return None if row is None else pass_claim(alias, row, lease_holder, sent, connection)
        return self._claim_due_pass_portably(alias, ttl, lease_holder, sent)

    def put_back_passes(self, lease_holder: str, announced: Sequence[Lease] = ()) -> int:
        """After a pick or a take of a pass by ``lease_holder`` failed (its reply lost: it may
        have landed), give back what it may hold: every run lease ``lease_holder`` holds is
        released and its run's pass made due now. ``lease_holder`` names one pick (a fresh
        holder each time, :func:`~django_leases.leases.new_holder`), so nothing else is
        touched. Best effort, on a fresh connection when the database still answers: a
        database error is logged and swallowed (the lease then lapses after its TTL). Does
        nothing inside a transaction (the caller's would be left broken).

        A grant given back is announced (``lease_acquired``) before its release unless it is
        one of ``announced`` (grants the failed call had already announced): a lost reply
        lost the announcement with it, and each release announced follows its grant's.

        Returns the number of run leases given back.
        """
        alias = self.write_alias()
        connection = connections[alias]
        if not db.outside_transactions(connection):
            return 0
        leases = Lease.objects.db_manager(alias)
        given = 0
        try:
            connection.close()  # the next statement reconnects: the old one may be dead
            held = leases.filter(
                holder=lease_holder, key__startswith=RUN_LEASE_PREFIX, released_at__isnull=True
            )
            told = {(lease.key, lease.token) for lease in announced}
            for lease in held:
                if (lease.key, lease.token) not in told:
                    announce(lease_acquired, lease, alias)
                leases.release(lease)
                self.request_pass(lease.key.removeprefix(RUN_LEASE_PREFIX))
                given += 1
        except db.DATABASE_FAULTS:
            logger.warning("Could not give back the passes of %s", lease_holder, exc_info=True)
        return given

    def _claim_due_pass_portably(
        self,
        alias: str,
        ttl: float,
        lease_holder: str | None,
        sent: float,
        besides: uuid.UUID | None = None,
    ) -> PassClaim | None:
        """:meth:`claim_due_pass`'s portable path; ``besides``: a run never to pick (the run
        a completion just wrote, as the tuned completion's pick leaves it out)."""
        connection = connections[alias]
        # One transaction with the lease: a failure between the pick and the grant rolls the
        # pick back (else the run would wait out ``ttl``). The house's order: run, then lease.
        with transaction.atomic(using=alias):
            due = self.rows().filter(status=RunStatus.RUNNING, pass_due_at__lte=DbNow())
            if besides is not None:
                due = due.exclude(pk=besides)
            if connection.features.has_select_for_update_skip_locked:
                due = due.select_for_update(skip_locked=True)
            run_id = due.order_by("pass_due_at").values_list("pk", flat=True).first()
            if run_id is None:
                return None
            # Guarded, so the pick stays exclusive even where the SELECT locks nothing.
            picked = (
                self.rows()
                .filter(pk=run_id, status=RunStatus.RUNNING, pass_due_at__lte=DbNow())
                .update(pass_due_at=clock.db_now_plus(ttl))
            )
            state = self.pass_state(run_id) if picked else None
            if state is None:
                return None
            lease = None
            if lease_holder is not None:
                key = run_lease_key(run_id)
                lease = Lease.objects.db_manager(alias).acquire(key, lease_holder, ttl)
        return PassClaim(
            run_id=run_id,
            using=alias,
            state=state,
            lease=lease,
            lease_refused=lease_holder is not None and lease is None,
            sent=sent,
        )

    @falls_back
    def take_pass(self, run_id: uuid.UUID | str, ttl: float, lease_holder: str) -> PassClaim | None:
        """Take the pass of running run ``run_id`` for a worker that has just run one of its
        steps (before it writes the result, so that it can write the run's completion with
        it): the run lease ``workflow-run:<id>`` for ``lease_holder`` (``ttl`` seconds, by
        the acquire rule of ``Lease.objects.acquire``; ``lease_acquired`` is sent) and the
        pass state, read once the lease is held. ``pass_due_at`` is not touched.

        Returns the :class:`PassClaim` (``lease`` ``None`` with ``lease_refused`` when
        another holder has the lease live: the caller writes its result the ordinary way),
        or ``None`` when the run is not running (or unknown), or when its pass waits on more
        than one unfinished parallel step (``branches_left`` > 1: the result asks for no
        pass, so nothing is taken — a wide fan-out's branches read nothing here). Tuned
        (PostgreSQL): one statement.

        A database error is raised after any run lease the call may have taken (its reply
        lost) is given back (:meth:`put_back_passes`, when the database still answers).
        """
        ttl = ttl_seconds(ttl)
        pk = parse_run_id(run_id)
        announced: list[Lease] = []
        try:
            return self._take_pass(pk, ttl, lease_holder, announced)
        except db.DATABASE_FAULTS:
            self.put_back_passes(lease_holder, announced)
            raise

    def _take_pass(
        self, pk: uuid.UUID, ttl: float, lease_holder: str, announced: list[Lease]
    ) -> PassClaim | None:
        """:meth:`take_pass` without its clean-up after a database error; the grant it made
        and announced (the portable path) is added to ``announced``."""
        alias = self.write_alias()
        connection = connections[alias]
        sent = time.monotonic()
        if functions_called(connection):
            row = call_function(connection, "take_pass", [pk, ttl, lease_holder])
            return None if row is None else pass_claim(alias, row, lease_holder, sent, connection)
        if not self.rows().filter(pk=pk, status=RunStatus.RUNNING, branches_left__lte=1).exists():
            return None
        lease = Lease.objects.db_manager(alias).acquire(run_lease_key(pk), lease_holder, ttl)
        if lease is not None:
            announced.append(lease)
        state = self.pass_state(pk)
        if state is None or state.run.status != RunStatus.RUNNING:
            if lease is not None:
                Lease.objects.db_manager(alias).release(lease)
            return None
        return PassClaim(
            run_id=pk,
            using=alias,
            state=state,
            lease=lease,
            lease_refused=lease is None,
            sent=sent,
        )

    def pass_state(self, run_id: uuid.UUID | str) -> PassState | None:
        """The run (``id``, ``workflow``, ``status``, ``input``, ``pass_requests``) and its
        steps by name, read in one transaction; ``None`` for an unknown run."""
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            run = (
                self.rows()
                .filter(pk=run_id)
                .only("id", "workflow", "status", "input", "pass_requests")
                .first()
            )
            if run is None:
                return None
            # Each result as its JSON text, decoded only should the workflow read it.
            steps = (
                step_model()
                .objects.db_manager(alias)
                .filter(run_id=run.pk)
                .defer("result")
                .annotate(**{"result" + TEXT_SUFFIX: Cast("result", TextField())})
                .order_by("id")
            )
            return PassState(run=run, steps={step.step_name: step for step in steps})

    def work_due_within(self, horizon: float) -> bool:
        """Whether a pass or a waiting step of a running run is due within ``horizon``
        seconds of DB now.

        A live run's deadline passing counts too. Waiting steps are ``pending`` /
        ``scheduled`` / ``failed`` with attempts left; a running step counts when its
        attempt's ``timeout`` ends within the horizon (a lease lapsing is not foreseen here).
        """
        alias = self.write_alias()
        until = clock.db_now_plus(horizon)
        due = Q(status=RunStatus.RUNNING, pass_due_at__lte=until) | Q(
            status__in=(RunStatus.RUNNING, RunStatus.SUSPENDED), deadline_at__lte=until
        )
        if self.rows().filter(due).exists():
            return True
        waiting = (
            Q(status__in=WAITING_STEP_STATUSES, available_at__lte=until) & ~failed_for_good_q()
        )
        timing_out = Q(status=StepStatus.RUNNING, deadline_at__lte=until)  # a step timeout
        return (
            step_model()
            .objects.db_manager(alias)
            .filter(waiting | timing_out, run__status=RunStatus.RUNNING)
            .exists()
        )

    def finish_pass(
        self,
        run_id: uuid.UUID | str,
        pass_requests: int,
        due_at: datetime | None = None,
        branches: int = 0,
        *,
        pending: PendingResult | None = None,
    ) -> bool:
        """End a pass: clear ``pass_due_at`` — or set it to ``due_at`` (a ``datetime`` from
        the database clock: when the wait the pass ended at needs the next pass, a sleep's
        end or an event's timeout) — unless the run was asked for another pass since
        ``pass_requests`` was read (that pass will see the wait again). ``branches``: the
        pass ended at a ``run.parallel`` with that many of its steps not finished (an
        ``int`` ≥ 0); only the result that finishes the last of them asks for the next pass
        (:meth:`WorkflowStepQuerySet.set_result`). ``pending``: a result the pass carries,
        written first in the same transaction (:func:`write_pending`). Returns ``True`` if
        the pass was ended.

        Raises:
            WorkflowStepSupersededError: ``pending``'s attempt was superseded (nothing
                written).
        """
        ended = self.rows().filter(pk=run_id, pass_requests=pass_requests)
        values = {"pass_due_at": due_at, "branches_left": max(int(branches), 0)}
        if pending is None:
            # One statement: atomic on its own (autocommit), no transaction around it.
            return bool(ended.update(**values))
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            write_pending(alias, pending)
            return bool(ended.update(**values))

    def complete(
        self, run_id: uuid.UUID | str, output: Any, *, pending: PendingResult | None = None
    ) -> bool:
        """Mark a running run ``completed`` with JSON ``output``; ``True`` if it was running.

        A non-JSON ``output`` fails the run instead, with a clear error. ``pending``: a
        result the run's pass carries, written first in the same transaction
        (:func:`write_pending`; :class:`WorkflowStepSupersededError` when refused).
        """
        try:
            check_json(output, "Workflow output", using=self.write_alias())
        except ValueError as exc:
            return self._finish(run_id, RunStatus.FAILED, error=error_json(exc), pending=pending)
        return self._finish(run_id, RunStatus.COMPLETED, output=output, pending=pending)

    def fail(
        self,
        run_id: uuid.UUID | str,
        error: BaseException | Mapping[str, Any] | str,
        *,
        pending: PendingResult | None = None,
    ) -> bool:
        """Mark a running run ``failed`` with ``error``; ``True`` if it was running.
        ``pending``: as for :meth:`complete`."""
        return self._finish(run_id, RunStatus.FAILED, error=error_json(error), pending=pending)

    def suspend(
        self, run_id: uuid.UUID | str, error: BaseException | Mapping[str, Any] | str
    ) -> bool:
        """Mark a running run ``suspended`` (waits for an operator); ``True`` if it was running."""
        return self._finish(run_id, RunStatus.SUSPENDED, error=error_json(error))

    def _finish(
        self,
        run_id: uuid.UUID | str,
        status: str,
        *,
        output: Any = None,
        error: Any = None,
        pending: PendingResult | None = None,
    ) -> bool:
        values: dict[str, Any] = {
            "status": status,
            "error": error,
            "pass_due_at": None,
            "branches_left": 0,  # no pass waits on parallel steps any more
            "updated_at": DbNow(),
        }
        if status == RunStatus.COMPLETED:
            values["output"] = Value(output, output_field=models.JSONField())
        if status in (RunStatus.COMPLETED, RunStatus.FAILED):
            values["finished_at"] = DbNow()
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            write_pending(alias, pending)
            finished = bool(
                self.rows().filter(pk=run_id, status=RunStatus.RUNNING).update(**values)
            )
            if finished and status != RunStatus.SUSPENDED:
                wake_parent(alias, run_id)
        if finished:
            details = {"output": output} if status == RunStatus.COMPLETED else {"error": error}
            run_reached(alias, run_id, status, **details)
        return finished

"""A run's durable waits and the rules that decide them (DESIGN §5a): ``WorkflowWait.objects``.

A wait is recorded like a step — one row per name and run, replayed by name — so a pass that
reaches it either finds its outcome or ends there; no thread ever sleeps on one. Its outcome
is decided once, by a compare-and-set from ``waiting`` (an event arriving, a timeout passing):
every later pass replays that recorded outcome. Times are the database clock's. Runs and
steps, whose passes these waits wake, are :mod:`django_leases.models.workflow`'s.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, ClassVar

from django.db import IntegrityError, connections, models, transaction
from django.db.models import BooleanField, ExpressionWrapper, Q, Value
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_leases import clock, db
from django_leases.clock import DbNow
from django_leases.exceptions import WorkflowEventRefusedError
from django_leases.models.workflow import WorkflowRun, request_passes, write_pending
from django_leases.models.workflow_base import refused_in_state
from django_leases.validation import (
    MAX_NAME_LENGTH,
    check_event_payload,
    check_identifier,
    check_json,
    json_depth,
    parse_run_id,
    wait_seconds,
)
from django_leases.workflows.values import (
    FINISHED_RUN_STATUSES,
    PendingResult,
    RunStatus,
    WaitKind,
    WaitStatus,
)

logger = logging.getLogger("django_leases.workflows")


class WorkflowWaitQuerySet(db.RoutedQuerySet["WorkflowWait"]):
    """Domain methods of ``WorkflowWait.objects``: a run's durable waits (DESIGN §5a).

    A wait is recorded like a step — one row per name and run, replayed by name — so a pass
    that reaches it either finds its outcome or ends there; no thread ever sleeps on one.
    Its outcome is decided once, by a compare-and-set from ``waiting`` (an event arriving,
    a timeout passing): every later pass replays that recorded outcome. Times are the
    database clock's.
    """

    def for_pass(self, run_id: uuid.UUID | str) -> dict[str, WorkflowWait]:
        """The run's waits by name, each annotated ``over`` (``due_at`` has passed on the
        database clock; ``None`` without a ``due_at``), with their child runs loaded."""
        rows = self.rows().filter(run_id=parse_run_id(run_id)).annotate(over=_over())
        return {wait.name: wait for wait in rows.select_related("child").order_by("id")}

    def for_replay(self, run_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[WorkflowWait]]:
        """The waits the runs ``run_ids`` reached (a kept event no run reached yet is left
        out), in one read, by run, each run's in the order reached (database clock, then
        id), with their child runs' ``workflow``, ``status``, ``output`` and ``error``
        loaded."""
        found: dict[uuid.UUID, list[WorkflowWait]] = {pk: [] for pk in run_ids}
        rows = (
            self.rows()
            .filter(run_id__in=list(run_ids), reached_at__isnull=False)
            .select_related("child")
            .only(
                "run_id",
                "name",
                "kind",
                "status",
                "payload",
                "reached_at",
                "child_id",
                "child__workflow",
                "child__status",
                "child__output",
                "child__error",
            )
            .order_by("run_id", "reached_at", "id")
        )
        for wait in rows:
            found[wait.run_id].append(wait)
        return found

    def _one(self, wait_id: int) -> WorkflowWait:
        return self.rows().annotate(over=_over()).select_related("child").get(pk=wait_id)

    def reach(
        self,
        run_id: uuid.UUID | str,
        name: str,
        kind: str,
        *,
        seconds: float | None = None,
        pending: PendingResult | None = None,
    ) -> WorkflowWait:
        """Record that the run reached wait ``name`` of ``kind`` (a :class:`WaitKind`), or
        find it: on first reach the row is created ``waiting`` with ``due_at`` = database
        now + ``seconds`` (``None``: no due time) — never recomputed later. An event that
        arrived first already has its row (``done``); it is marked reached — or, when the
        run reaches a sleep (not an event wait) under its name, the row becomes the sleep
        and the event is dropped, never delivered (logged as a warning). Returns the row
        (annotated as :meth:`for_pass`). ``pending``: a step result the run's pass carries,
        written first in the same transaction (:func:`~django_leases.models.workflow.
        write_pending`).

        Raises ``ValueError`` for a bad name or seconds, or when ``name`` is already a wait
        of another kind that this run reached, and :class:`WorkflowStepSupersededError`
        when ``pending``'s attempt was superseded (nothing written).
        """
        check_identifier(name, "Wait name")
        if seconds is not None:
            seconds = wait_seconds(seconds, "Wait seconds")
        pk = parse_run_id(run_id)
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            write_pending(alias, pending)
            due_at = None if seconds is None else clock.db_now_plus(seconds)
            wait, created = self.rows().get_or_create(
                run_id=pk,
                name=name,
                defaults={
                    "kind": kind,
                    "status": WaitStatus.WAITING,
                    "due_at": due_at,
                    "reached_at": DbNow(),
                },
            )
            if not created and _kept_event(wait, kind):
                self._take_name(wait, kind, due_at=due_at)
            elif not created:
                _same_kind(wait, kind)
                if wait.reached_at is None:
                    self.rows().filter(pk=wait.pk).update(reached_at=DbNow())
        return self._one(wait.pk)

    def _take_name(self, kept: WorkflowWait, kind: str, **fields: Any) -> None:
        """Make ``kept`` — an event kept for a wait of its name that the run has not reached
        (:func:`_kept_event`) — the wait of ``kind`` the run reaches under that name now,
        ``waiting``, with ``fields``: the event is dropped, never delivered, and logged once
        that commits.

        A name belongs to the wait the workflow reaches: a kept event cannot claim one that
        the workflow uses for a sleep or a child run, and no wait of the run will ever take
        it (a name is used once per pass). One guarded ``UPDATE`` of the row, so its name is
        never free for a second event meanwhile: an event sent later is refused as one to
        another kind of wait."""
        taken = (
            self.rows()
            .filter(pk=kept.pk, kind=WaitKind.EVENT, reached_at__isnull=True)
            .update(
                kind=kind,
                status=WaitStatus.WAITING,
                payload=None,
                done_at=None,
                reached_at=DbNow(),
                **fields,
            )
        )
        if not taken:  # not a kept event any longer: whatever it is now decides
            _same_kind(self.rows().get(pk=kept.pk), kind)
            return
        db.after_commit(
            lambda: logger.warning(
                "Run %s reached %s wait %r: the event of that name sent before it got there, "
                "kept for a wait_for_event, is dropped, never delivered",
                kept.run_id,
                _a(kind),
                kept.name,
            ),
            self.write_alias(),
        )

    def start_child(
        self,
        run_id: uuid.UUID | str,
        name: str,
        workflow: str,
        input: Any = None,
        *,
        pending: PendingResult | None = None,
        deadline: float | timedelta | None = None,
    ) -> WorkflowWait:
        """Record that the run reached ``run.child(name, workflow, input)``: on first reach,
        the child run (``workflow`` with JSON ``input``, its ``parent`` the run) and the wait
        are created in one transaction; later, the wait is found. ``deadline`` (seconds > 0
        or a ``timedelta``, ``None``: none of its own): the child's, from its start; it is
        never later than the parent's (``WorkflowRun.objects.start``). Returns the wait, its child
        loaded (annotated as :meth:`for_pass`). The parent is asked for a pass when the child
        completes, fails or is cancelled. ``pending``: as for :meth:`reach`.

        An event kept for ``name`` (sent before the run reached any wait of that name) is
        dropped, never delivered, as :meth:`reach` drops it: the name is the child's.

        Raises ``ValueError`` for a bad name, workflow or input, when ``name`` is another
        kind of wait the run reached, or when its child is of another workflow,
        :class:`WorkflowRunStateError` when the run is no longer running (cancelled while
        its pass ran), and :class:`WorkflowStepSupersededError` as :meth:`reach`; nothing is
        written then.
        """
        check_identifier(name, "Wait name")
        check_identifier(workflow, "Workflow name")
        check_json(input, f"Input of child run {name!r}", using=self.write_alias())
        pk = parse_run_id(run_id)
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            write_pending(alias, pending)
            named = self.rows().filter(run_id=pk, name=name).select_related("child")
            wait = named.first()
            if wait is None or _kept_event(wait, WaitKind.CHILD):
                # The parent locked and running: a cancel that committed while this pass
                # ran found no child to cancel, so none may start after it.
                runs = WorkflowRun._default_manager.using(alias).filter(pk=pk)
                status = db.for_update(runs, alias).values_list("status", flat=True).first()
                if status != RunStatus.RUNNING:
                    raise refused_in_state(
                        pk,
                        status or gettext("missing"),
                        gettext("given a child run"),
                        gettext("only a running run can be"),
                    )
                # Read again under that lock, which every pass starting a child takes: another
                # pass of the run (a stale one, or the one that took over) may have started
                # the child while this one waited for it. A second child would run its work
                # again, read by no wait.
                wait = named.first()
            if wait is None or _kept_event(wait, WaitKind.CHILD):
                child = WorkflowRun.objects.db_manager(alias).start(
                    workflow, input, parent=pk, deadline=deadline
                )
                if wait is not None:  # an event kept for the name: the child's wait takes it
                    self._take_name(wait, WaitKind.CHILD, child_id=child.pk)
                else:
                    wait = self.rows().create(
                        run_id=pk,
                        name=name,
                        kind=WaitKind.CHILD,
                        status=WaitStatus.WAITING,
                        child_id=child.pk,
                        reached_at=DbNow(),
                    )
            else:
                _same_kind(wait, WaitKind.CHILD)
                if wait.child is not None and wait.child.workflow != workflow:
                    raise ValueError(
                        f"Child run {name!r} of run {pk} is a run of {wait.child.workflow!r}; "
                        f"the workflow now asks for {workflow!r}"
                    )
        return self._one(wait.pk)

    def settle_child(
        self, wait: WorkflowWait, *, pending: PendingResult | None = None
    ) -> WorkflowRun | None:
        """Mark a child wait ``done`` once its child run has finished: the outcome the pass
        goes on from is then read (the outcome itself is the child's status). The child is
        read again under its row's lock — the lock an operator's resume or retry of the
        child takes, which refuses a child whose wait is ``done`` — so the two never both
        go on. Returns the child as read under that lock; ``None`` when it is no longer
        finished (reopened since the pass read it; the wait stays ``waiting``, and the
        child's end asks the parent for its next pass). One transaction, with ``pending``
        (as for :meth:`reach`) written first."""
        alias = self.write_alias()
        with transaction.atomic(using=alias):
            write_pending(alias, pending)
            runs = WorkflowRun._default_manager.using(alias).filter(pk=wait.child_id)
            child = db.for_update(runs, alias).first()
            if child is None or child.status not in FINISHED_RUN_STATUSES:
                return None
            self.rows().filter(pk=wait.pk, status=WaitStatus.WAITING).update(
                status=WaitStatus.DONE, done_at=DbNow()
            )
            return child

    def settle(self, wait: WorkflowWait, *, pending: PendingResult | None = None) -> WorkflowWait:
        """Decide a ``waiting`` wait whose ``due_at`` has passed on the database clock: a
        sleep becomes ``done``, an event wait ``timed_out`` — one guarded ``UPDATE``; an
        event that landed before its timeout stays the outcome, and one sent after the
        timeout passed is refused by :meth:`send_event` whether or not this ran yet.
        Returns the row as it now is (annotated as :meth:`for_pass`). ``pending``: as for
        :meth:`reach`."""
        outcome = WaitStatus.DONE if wait.kind == WaitKind.SLEEP else WaitStatus.TIMED_OUT
        rows = self.rows().filter(pk=wait.pk, status=WaitStatus.WAITING, due_at__lte=DbNow())
        with _with_pending(self.write_alias(), pending):
            rows.update(status=outcome, done_at=DbNow())
        return self._one(wait.pk)

    def make_due(self, run_id: uuid.UUID | str, name: str) -> WorkflowWait:
        """End wait ``name`` of a run now: an event wait's timeout (or a sleep's end) is
        moved to database now and the run asked for a pass, in one transaction. The pass
        then decides the wait as if its time had come: a sleep ``done``, an event wait
        ``timed_out`` (``WorkflowEventTimeout`` in the workflow). For tests
        (:func:`django_leases.testing.time_out`) and operators who cut a wait short.

        Returns the wait row as it now is.

        Raises (nothing written):
            ValueError: a bad run id or name; the run has not reached a wait of that name;
                it is a child run's wait or an event wait without a ``timeout`` (no time to
                move); it is no longer ``waiting`` (its event came, or it is decided).
            WorkflowRunStateError: (a ``ValueError``) the run has completed, failed or been
                cancelled: its waits are over, though a cancelled run's still reads
                ``waiting``.
        """
        check_identifier(name, "Wait name")
        pk = parse_run_id(run_id)
        alias = self.write_alias()
        runs = WorkflowRun._default_manager.using(alias).filter(pk=pk)
        with transaction.atomic(using=alias):
            # The run's row first, as send_event locks it: the two take turns.
            status = db.for_update(runs, alias).values_list("status", flat=True).first()
            wait = db.for_update(self.rows().filter(run_id=pk, name=name), alias).first()
            if wait is None or wait.reached_at is None:
                raise ValueError(
                    f"Run {pk} has not reached a wait named {name!r} (drive the run there first)"
                )
            if wait.kind == WaitKind.CHILD:
                raise ValueError(f"Wait {name!r} of run {pk} is a child run's: no time to move")
            if wait.due_at is None:
                raise ValueError(
                    f"Wait {name!r} of run {pk} waits for its event without a timeout: "
                    "no time to move (send the event instead)"
                )
            if wait.status != WaitStatus.WAITING:
                raise ValueError(f"Wait {name!r} of run {pk} is {wait.status}, no longer waiting")
            if status in FINISHED_RUN_STATUSES:
                raise refused_in_state(
                    pk,
                    status,
                    gettext("have a wait cut short"),
                    gettext("only a running or suspended run can"),
                )
            self.rows().filter(pk=wait.pk).update(due_at=DbNow())
            request_passes(alias, Q(pk=pk))
        return self._one(wait.pk)

    def send_event(self, run_id: uuid.UUID | str, name: str, payload: Any = None) -> WorkflowWait:
        """Deliver event ``name`` with JSON ``payload`` to a run, exactly once.

        One transaction, the run row locked: the run must be ``running`` or ``suspended``.
        If the run waits at ``run.wait_for_event(name)``, the wait becomes ``done`` with the
        payload; if it has not reached the wait yet, the event is kept (a ``done`` wait not
        yet reached) and consumed when it does — or dropped, never delivered, if the run
        reaches a sleep or a child run under that name instead (:meth:`reach`,
        :meth:`start_child`). Either way the run is asked for a pass (its
        idle workers are woken), in the same transaction. Returns the wait row.

        Raises:
            WorkflowRun.DoesNotExist: no such run (nothing written).
            WorkflowRunStateError: the run is completed, failed or cancelled.
            WorkflowEventRefusedError: the wait already has its event, its timeout has
                passed on the database clock (recorded by a pass or not yet), or ``name``
                is another kind of wait (nothing written).
            ValueError: a bad run id or name, or a payload that is not JSON the database
                stores (nested too deep: 100 levels, 31 on MariaDB) or is larger than
                ``DJANGO_LEASES["MAX_EVENT_PAYLOAD"]`` bytes of JSON (nothing written).
        """
        check_identifier(name, "Event name")
        alias = self.write_alias()
        check_event_payload(payload, name, max_depth=json_depth(connections[alias]))
        pk = parse_run_id(run_id)
        runs = WorkflowRun._default_manager.using(alias)
        with transaction.atomic(using=alias):
            status = db.for_update(runs.filter(pk=pk), alias).values_list("status", flat=True)
            found = status.first()
            if found is None:
                raise WorkflowRun.DoesNotExist(f"No workflow run with id {pk}")
            if found not in (RunStatus.RUNNING, RunStatus.SUSPENDED):
                raise refused_in_state(
                    pk,
                    found,
                    gettext("sent an event"),
                    gettext("only a running or suspended run can be"),
                )
            waits = self.rows().filter(run_id=pk, name=name)
            wait = waits.first()
            if wait is None:
                try:
                    with transaction.atomic(using=alias):
                        wait = self.rows().create(
                            run_id=pk,
                            name=name,
                            kind=WaitKind.EVENT,
                            status=WaitStatus.DONE,
                            payload=payload,
                            done_at=DbNow(),
                        )
                except IntegrityError:  # the run reached the wait meanwhile
                    wait = waits.get()
                else:
                    request_passes(alias, Q(pk=pk))
                    return self._one(wait.pk)
            if wait.kind != WaitKind.EVENT:
                raise WorkflowEventRefusedError(
                    pk,
                    name,
                    (
                        gettext("%(name)r is a sleep wait of this run, not an event")
                        if wait.kind == WaitKind.SLEEP
                        else gettext("%(name)r is a child wait of this run, not an event")
                    )
                    % {"name": name},
                )
            # The timeout is judged on the database clock, not on whether a pass has
            # recorded it yet (a lapsed lease cannot be refreshed though nobody took it).
            in_time = Q(due_at__isnull=True) | Q(due_at__gt=DbNow())
            landed = waits.filter(in_time, status=WaitStatus.WAITING).update(
                status=WaitStatus.DONE,
                payload=Value(payload, output_field=models.JSONField()),
                done_at=DbNow(),
            )
            if not landed:
                wait = waits.get()
                reason = (
                    gettext("the wait timed out before it arrived")
                    if wait.status in (WaitStatus.TIMED_OUT, WaitStatus.WAITING)
                    else gettext("that event was already sent (an event is delivered once)")
                )
                raise WorkflowEventRefusedError(pk, name, reason)
            request_passes(alias, Q(pk=pk))
        return self._one(wait.pk)


@contextmanager
def _with_pending(alias: str, pending: PendingResult | None) -> Iterator[None]:
    """The block in one transaction with ``pending`` written first; without it, the block
    alone (its one statement is atomic on its own)."""
    if pending is None:
        yield
        return
    with transaction.atomic(using=alias):
        write_pending(alias, pending)
        yield


def _over() -> ExpressionWrapper[Q]:
    """``due_at <= now`` on the database clock (``NULL`` without a due time)."""
    return ExpressionWrapper(Q(due_at__lte=DbNow()), output_field=BooleanField())


def _a(kind: str) -> str:
    """``kind`` of wait with its article: "a sleep", "an event", "a child"."""
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def _kept_event(wait: WorkflowWait, kind: str) -> bool:
    """Whether ``wait`` is an event kept for a wait the run has not reached (sent early),
    and the run now reaches another ``kind`` of wait under its name."""
    return wait.kind == WaitKind.EVENT and wait.reached_at is None and kind != WaitKind.EVENT


def _same_kind(wait: WorkflowWait, kind: str) -> None:
    if wait.kind != kind:
        raise ValueError(
            f"Wait {wait.name!r} of run {wait.run_id} was recorded as {_a(wait.kind)} wait; "
            f"the workflow now uses it as {_a(kind)} wait"
        )


class WorkflowWait(models.Model):
    """A durable wait of a run (DESIGN §5a): a ``run.sleep`` (``due_at``: when it ends), a
    ``run.wait_for_event`` (``due_at``: its timeout, if any; ``payload``: the event's) or
    a ``run.child``. One row per name and run, recorded when the run first reaches it — or,
    for an event sent before that, when the event arrives (``reached_at`` still empty).
    Times come from the database clock."""

    # Served by the unique (run, name) index, whose leading column it is.
    run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, related_name="waits", db_index=False
    )
    name = models.CharField(max_length=MAX_NAME_LENGTH)
    kind = models.CharField(max_length=16, choices=WaitKind.choices)
    status = models.CharField(max_length=16, choices=WaitStatus.choices, default=WaitStatus.WAITING)
    due_at = models.DateTimeField(
        null=True, blank=True, help_text=_("A sleep's end, or an event's timeout.")
    )
    payload = models.JSONField(null=True, blank=True)
    child = models.ForeignKey(
        WorkflowRun,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text=_("The child run a run.child wait started."),
    )
    created_at = models.DateTimeField(db_default=DbNow())
    reached_at = models.DateTimeField(null=True, blank=True)
    done_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[WorkflowWaitQuerySet] = WorkflowWaitQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("id",)
        verbose_name = _("workflow wait")
        verbose_name_plural = _("workflow waits")
        constraints = (models.UniqueConstraint(fields=["run", "name"], name="dl_wait_unique_name"),)

    def __str__(self) -> str:
        return f"{self.kind} {self.name} ({self.status})"

    def is_over(self) -> bool:
        """Whether ``due_at`` had passed on the database clock when the row was read (rows
        read through ``WorkflowWait.objects``, which annotate ``over``)."""
        return bool(getattr(self, "over", False))


__all__ = ["WorkflowWait", "WorkflowWaitQuerySet"]

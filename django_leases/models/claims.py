"""Claims of due steps (:class:`StepClaims`): which due step a worker takes, under its
queue's limits, with a lapsed lease taken over or timed out, decided on the database
clock; and the counts operators read (:class:`QueueCounts`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypedDict

from django.conf import settings
from django.db import connections, models, transaction
from django.db.models import F, Q
from django.db.models.functions import Coalesce

from django_leases import clock, db
from django_leases.clock import DbNow
from django_leases.conf import QueueLimits, queue_limits
from django_leases.frozen import frozen
from django_leases.models.lease import EpochFloor
from django_leases.models.outcomes import StepOutcomes, retry_delay_after
from django_leases.models.queue import Admission, KeyRefusal, WorkflowQueue, WorkflowQueueKey
from django_leases.models.workflow_base import (
    FunctionsGone,
    attempt_finished,
    attempt_model,
    attempt_started,
    call_function,
    claim_from_row,
    claim_of_step,
    claims_in_one,
    due_q,
    falls_back,
    functions_called,
    is_due,
    lease_is_live,
    request_passes,
    run_model,
    step_model,
    wake_workers,
)
from django_leases.validation import check_identifier, parse_run_id, ttl_seconds
from django_leases.workflows.values import (
    STEP_LEASE_LAPSED,
    STEP_TIMED_OUT,
    WAITING_STEP_STATUSES,
    AttemptStatus,
    Claim,
    RunStatus,
    StepStatus,
    exhausted,
    failed_for_good_q,
    fresh_claimant,
)

logger = logging.getLogger("django_leases.workflows")

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django_stubs_ext import WithAnnotations

    from django_leases.models.workflow import WorkflowStep

    class _LockingAnnotations(TypedDict):
        """What :meth:`StepClaims._annotated` annotates a step with."""

        lease_live: bool | None  # NULL while the step has no lease
        due: bool
        run_status: str
        run_workflow: str
        db_now: datetime  # the database clock, when the step was read
        server_floor: int  # the server's epoch floor, when the step was read

    _LockedStep = WithAnnotations["WorkflowStep", _LockingAnnotations]


#: MariaDB / MySQL: how many due steps a claim reads (no lock) before it locks them one at
#: a time, and how many such reads it makes before one locking read decides
#: (:meth:`StepClaims._lock_first`).
LOCK_CANDIDATES = 16
LOCK_ROUNDS = 4

#: What a refused claim passes over from then on (:func:`_queue_admits`): a queue's name
#: (the queue is full), or a key of a keyed queue (:class:`KeyRefusal`).
Refused = set[str | KeyRefusal]


def _queue_admits(
    alias: str, step: WorkflowStep, refused: Refused | None, *, inline: bool = False
) -> tuple[bool, Admission | None]:
    """Whether a claim of ``step`` may start under its queue's limits, and the queue's
    admission to record when it does (``None`` for a queue without limits). A limited queue
    is asked under its lock (:meth:`WorkflowQueueQuerySet.admit`); a refusal adds the queue
    (or, in a keyed queue, the step's key) to ``refused``. ``inline``: the claim names its
    step (a pass running it inline), so in a keyed queue it waits its key's turn: it is
    refused while a due step of another key whose turn comes first (claimed less recently)
    waits at its priority or above."""
    queue = step.queue
    limits = queue_limits().get(queue)
    if limits is None or not limits.limited:
        return True, None
    steps = step_model()._default_manager.using(alias)
    key = step.queue_key
    turn = None
    if inline and limits.keyed:

        def turn(claimed_at: datetime | None) -> bool:
            return not steps.others_first(queue, key, step.priority, claimed_at)

    admission = WorkflowQueue.objects.admit(
        alias,
        limits,
        running=lambda: steps.running_in([queue]).get(queue, 0),
        key=key,
        key_running=lambda: steps.key_running(queue, key),
        turn=turn,
    )
    if not isinstance(admission, Admission):
        if refused is not None:
            refused.add(queue if admission is None else admission)
        return False, None
    return True, admission


def _never() -> datetime:
    """A keyed queue's turn for a key never claimed: before any claim (aware when
    ``USE_TZ``)."""
    return datetime(1970, 1, 1, tzinfo=UTC if settings.USE_TZ else None)


def _counted(steps: models.QuerySet[Any], field: str) -> dict[Any, int]:
    """How many of ``steps`` there are per value of ``field`` (values with none left out)."""
    return {
        value: int(n)
        for value, n in steps.values_list(field)
        .annotate(n=models.Count("pk"))
        .values_list(field, "n")
    }


@frozen
class QueueCounts:
    """A queue's steps as operators count them (:meth:`WorkflowStepQuerySet.queue_counts`):
    ``waiting`` (due, unclaimed), ``running`` (live lease) and ``oldest_waiting`` (seconds
    the longest-waiting due step has been due, database clock; ``None`` when none waits)."""

    waiting: int
    running: int
    oldest_waiting: float | None


@frozen
class KeyCounts:
    """A queue key's steps as operators count them (:meth:`StepClaims.key_counts`):
    ``running`` (live lease) and ``waiting`` (due, unclaimed); ``key`` empty: none."""

    key: str
    running: int
    waiting: int


class StepClaims(StepOutcomes):
    """Claims of due steps under their queues' limits (database clock)."""

    def claim_for_execution(
        self,
        run_id: uuid.UUID | str,
        step_name: str,
        function_name: str,
        lease_ttl_seconds: float,
        *,
        claimant: str = "",
    ) -> Claim | None:
        """Claim step ``step_name`` of a run for execution under a ``lease_ttl_seconds`` lease;
        the claim names ``claimant`` (``WorkflowStep.claimant``, empty: none).

        Rules (DESIGN §5, all judged on the database clock, one transaction, row locked):

        * ``function_name`` differs from the recorded one → ``ValueError`` before any write;
        * the run is not ``running``, the step ``succeeded``, the step ``running`` with a live
          lease, or not yet due (``available_at`` in the future) → ``None``;
        * ``pending`` / ``scheduled`` → ``running`` at the **same** attempt, lease granted;
        * ``failed`` with attempts left, or ``running`` with a **lapsed** lease →
          ``attempt + 1`` in the same guarded ``UPDATE`` that grants the lease, plus an
          attempt row; every write of an earlier attempt is refused from then on;
        * ``failed`` with no attempts left → ``None``; ``running``, lapsed and out of attempts
          → the step fails with a "lost its worker on every attempt" error and the run is
          asked for a pass; ``None``.

        Exactly one of many concurrent claimers gets a :class:`Claim`.

        Raises:
            ValueError: bad names, run id or TTL, or a function name mismatch (nothing written).
            WorkflowStep.DoesNotExist: no such step.
        """
        check_identifier(step_name, "Step name")
        check_identifier(function_name, "Step function name")
        ttl = ttl_seconds(lease_ttl_seconds)
        alias = self.write_alias()
        sent = time.monotonic()
        with transaction.atomic(using=alias):
            step = (
                self._locking(alias, skip_locked=False)
                .filter(run_id=parse_run_id(run_id), step_name=step_name)
                .first()
            )
            if step is None:
                raise self.model.DoesNotExist(f"Run {run_id} has no step named {step_name!r}")
            if step.function_name != function_name:
                raise ValueError(
                    f"Step {step_name!r} of run {run_id} runs step function "
                    f"{step.function_name!r}, not {function_name!r}"
                )
            return self._claim_locked(alias, step, ttl, sent, claimant=claimant, inline=True)

    def claim_due(
        self, lease_ttl_seconds: float, *, queues: Sequence[str] | None = None
    ) -> Claim | None:
        """Claim one due step of a running run for a worker, or ``None`` if none is due.

        Due: ``running`` with a lapsed lease (taken first), or ``pending`` / ``scheduled`` /
        ``failed``-with-attempts-left whose ``available_at`` has passed — highest
        ``priority`` first, then first due first. Only steps of ``queues`` (names; ``None``
        or empty: every queue), and none of a queue at its concurrency limit or out of its
        rate (``DJANGO_LEASES["QUEUES"]``; decided under the queue's lock, see
        :class:`WorkflowQueueQuerySet`). Rows are picked with ``SKIP LOCKED`` where the
        database has it. The claim follows :meth:`claim_for_execution`'s rules; a lapsed
        step out of attempts is failed on the way and the next one tried. Tuned (PostgreSQL):
        one statement when no queue the caller may take has limits, or ``queues`` names one
        queue, with limits (function ``claim_queue`` or its variants); else two (see
        :meth:`_claim_mixed`); unless a lapsed step waits to be taken over.

        The claim carries a name of its own (:func:`~values.fresh_claimant`). When the call
        fails, its claim may have committed all the same (the reply lost): the step it may
        hold is handed back by that name (:meth:`hand_back_claimed`), so a step nobody ran
        does not spend an attempt by lapsing.

        Raises:
            QueueConfigError: ``DJANGO_LEASES["QUEUES"]`` is not usable.
            DatabaseError: the database failed (whatever it claimed handed back).
        """
        ttl = ttl_seconds(lease_ttl_seconds)
        claimant = fresh_claimant()
        with self.handing_back(claimant, ttl):
            return self._claim_due(ttl, queues, claimant)

    @contextmanager
    def handing_back(self, claimant: str, ttl: float) -> Iterator[None]:
        """Run the block, a call whose claim is named ``claimant`` under a step lease of
        ``ttl`` seconds; should it raise, hand back what that claim may hold
        (:meth:`hand_back_claimed`, within what is left of ``ttl``) and raise on. A
        :class:`FunctionsGone` is raised on alone: it ran nothing."""
        sent = time.monotonic()
        try:
            yield
        except FunctionsGone:
            raise
        except Exception:
            self.hand_back_claimed(claimant, within=ttl - (time.monotonic() - sent))
            raise

    def hand_back_claimed(self, claimant: str, *, within: float) -> int:
        """Hand back the step a claim named ``claimant`` took, if it took one, after the call
        that made it failed (its reply lost: it may have committed): the step is
        ``scheduled`` again at the attempt the claim gave it, due now, its lease cleared —
        nobody ran that attempt, so it is not spent (the next claim runs it). Only that claim
        names ``claimant`` (:func:`~values.fresh_claimant`): a later claim names its own, and
        a step leaving ``running`` drops its claim's name. And only while that claim's lease
        can still be live: ``within`` (seconds) is what is left of its TTL by the caller's
        clock — none left, nothing is done — and the step's lease must be live and its
        attempt short of its timeout on the database clock (so a step some worker of an
        earlier release claimed since, which names no claimant, is never handed back). Best
        effort, on a fresh connection when the database still answers: a database error is
        logged and swallowed (the step's lease then lapses, and the attempt counts). Does
        nothing inside a transaction (the caller's would be left broken). Returns how many
        steps were handed back (0 or 1).

        Raises:
            ValueError: an empty ``claimant`` (it would name every unnamed claim).
        """
        if not claimant:
            raise ValueError("hand_back_claimed needs the name the claim carried")
        alias = self.write_alias()
        connection = connections[alias]
        if within <= 0 or not db.outside_transactions(connection):
            return 0
        try:
            connection.close()  # the next statement reconnects: the old one may be dead
            mine = self.rows().filter(
                Q(deadline_at__isnull=True) | Q(deadline_at__gt=DbNow()),
                claimant=claimant,
                status=StepStatus.RUNNING,
                lease_expires_at__gt=DbNow(),
            )
            return self._unclaim(alias, mine, StepStatus.SCHEDULED)
        except db.DATABASE_FAULTS as exc:
            logger.warning(
                "Could not hand back the step a failed claim may hold (%s): its lease lapses "
                "instead",
                exc,
            )
            return 0

    def _unclaim(self, alias: str, rows: models.QuerySet[Any], status: str) -> int:
        """Hand back ``rows`` — running under a claim nobody ran — as ``status`` at the attempt
        they have, due now, their lease cleared and their claim's name dropped; wake waiting
        workers. Returns how many."""
        handed = rows.update(
            status=status,
            lease_expires_at=None,
            deadline_at=None,
            claimant="",
            available_at=DbNow(),
            updated_at=DbNow(),
        )
        if handed:
            wake_workers(alias)
        return handed

    @falls_back
    def _claim_due(self, ttl: float, queues: Sequence[str] | None, claimant: str) -> Claim | None:
        """:meth:`claim_due` for a claim named ``claimant``."""
        alias = self.write_alias()
        limits = queue_limits()
        taken = list(queues or ())
        connection = connections[alias]
        if claims_in_one(connection, limits, taken):
            # No queue this worker takes has limits: one statement, unless a lapsed step
            # is to be taken over (below).
            lapsed, claim = self._claim_unlimited(connection, ttl, taken, claimant)
            if not lapsed:
                return claim
        elif len(taken) == 1 and taken[0] in limits and functions_called(connection):
            # One limited queue: one statement under its lock, the same exception aside.
            lapsed, claim = self._claim_limited(connection, ttl, limits[taken[0]], claimant)
            if not lapsed:
                return claim
        elif functions_called(connection):
            # Limited queues and others: the first due step's queue looked up, then claimed
            # by its own statement.
            lapsed, claim = self._claim_mixed(connection, ttl, limits, taken, claimant)
            if not lapsed:
                return claim
        blocked: set[str] = set()  # limited queues found full: passed over from then on
        keys: set[tuple[str, str]] = set()  # keys of keyed queues found full: passed over
        looked: set[str] = set()  # limited queues whose fullness was looked at
        for _round in range(20):
            sent = time.monotonic()
            refused: Refused = set()
            with transaction.atomic(using=alias):
                step = self._next_due(alias, taken, blocked, keys)
                if step is None:
                    return None
                queue = limits.get(step.queue)
                # A running step past its timeout, or lapsed on its last attempt, is failed
                # below without a slot of its queue: it needs no room (its own slot is
                # what a full queue is waiting for).
                takes_room = step.status != StepStatus.RUNNING or (
                    not step.lease_live and not exhausted(step.attempt, step.retries)
                )
                if queue is not None and queue.limited and takes_room and step.queue not in looked:
                    # An unlocked look first: a full queue, and in a keyed queue every key
                    # at its limit, is passed over without waiting for the queue's lock (the
                    # claim below still decides under the lock). Keys found full one claim
                    # at a time would take a round each: behind more full keys than rounds,
                    # a key with room would never be reached.
                    looked.add(step.queue)
                    full = self._full_queues(alias, {step.queue: queue})
                    if full:
                        blocked |= full
                        continue
                    if queue.keyed:
                        keys |= self._full_keys(alias, queue)
                        if (step.queue, step.queue_key) in keys:
                            continue
                claim = self._claim_locked(alias, step, ttl, sent, refused, claimant=claimant)
            if claim is not None:
                return claim
            for what in refused:
                if isinstance(what, KeyRefusal):
                    keys.add((what.queue, what.key))
                else:
                    blocked.add(what)
        return None

    def holding_slots(self) -> models.QuerySet[Any]:
        """The steps that take a slot of their queue's limits: running with a live lease
        (database clock), whatever their run's status (a failed run's sibling still runs).
        What the claim counts, and what operators' views show as running."""
        return self.rows().filter(status=StepStatus.RUNNING, lease_expires_at__gt=DbNow())

    def awaiting_claim(self) -> models.QuerySet[Any]:
        """The steps of running runs a claim would take now: due and unclaimed (with attempts
        left), or running with a lapsed lease (their worker is gone: taken over)."""
        due = Q(status__in=WAITING_STEP_STATUSES, available_at__lte=DbNow()) & ~failed_for_good_q()
        lapsed = Q(status=StepStatus.RUNNING, lease_expires_at__lte=DbNow())
        return self.rows().filter(due | lapsed, run__status=RunStatus.RUNNING)

    def running_in(self, queues: Sequence[str]) -> dict[str, int]:
        """How many steps of each of ``queues`` hold a slot (:meth:`holding_slots`): what a
        queue's concurrency limit counts. Queues with none are left out."""
        return _counted(self.holding_slots().filter(queue__in=list(queues)), "queue")

    def key_running(self, queue: str, key: str) -> int:
        """How many steps of ``queue`` under queue key ``key`` hold a slot
        (:meth:`holding_slots`): what the queue's ``key_concurrency`` counts."""
        return self.holding_slots().filter(queue=queue, queue_key=key).count()

    def others_first(
        self, queue: str, key: str, priority: int, claimed_at: datetime | None
    ) -> bool:
        """Whether a due waiting step of ``queue`` of another key than ``key``, at
        ``priority`` or above, comes before a step of ``key`` (last claimed at
        ``claimed_at``; ``None``: never) in the queue's round-robin order: its key was
        claimed less recently, or never."""
        if claimed_at is None:
            return False
        keys = WorkflowQueueKey.objects.using(self.write_alias())
        before = keys.filter(queue=queue, claimed_at__lt=claimed_at).values("key")
        known = keys.filter(queue=queue, key=models.OuterRef("queue_key"))
        return (
            self.rows()
            .filter(
                queue=queue,
                status__in=WAITING_STEP_STATUSES,
                available_at__lte=DbNow(),
                priority__gte=priority,
                run__status=RunStatus.RUNNING,
            )
            .exclude(queue_key=key)
            .exclude(failed_for_good_q())
            .filter(Q(queue_key__in=before) | ~models.Exists(known))
            .exists()
        )

    def key_counts(self, queue: str, *, limit: int = 10) -> list[KeyCounts]:
        """The busiest keys of ``queue`` (most running, then most waiting; at most
        ``limit``): each key's running steps (:meth:`holding_slots`) and waiting ones
        (:meth:`awaiting_claim`), database clock. Operators' views read this."""
        waiting = _counted(self.awaiting_claim().filter(queue=queue), "queue_key")
        running = _counted(self.holding_slots().filter(queue=queue), "queue_key")
        found = [
            KeyCounts(key, int(running.get(key, 0)), int(waiting.get(key, 0)))
            for key in set(waiting) | set(running)
        ]
        found.sort(key=lambda row: (-row.running, -row.waiting, row.key))
        return found[: max(0, limit)]

    def _full_queues(self, alias: str, limits: Mapping[str, QueueLimits]) -> set[str]:
        """Of the limited queues in ``limits``, those that look full now: at their
        concurrency limit, or out of their rate (unlocked reads: a hint that spares a claim
        the lock of a queue that would refuse it; the claim still decides under the lock)."""
        limited = {name: queue for name, queue in limits.items() if queue.limited}
        counted = {name: q.concurrency for name, q in limited.items() if q.concurrency is not None}
        running = self.using(alias).running_in(sorted(counted)) if counted else {}
        full = {name for name, limit in counted.items() if running.get(name, 0) >= limit}
        return full | WorkflowQueue.objects.rate_used_up(alias, limited)

    def _full_keys(self, alias: str, limits: QueueLimits) -> set[tuple[str, str]]:
        """Of the keys of keyed queue ``limits``, those that look full now, as ``(queue,
        key)``: at their ``key_concurrency``, or out of their ``key_rate`` (unlocked reads:
        a hint, as :meth:`_full_queues`; the claim decides under the queue's lock)."""
        full: set[str] = set()
        if limits.key_concurrency is not None:
            running = _counted(
                self.using(alias).holding_slots().filter(queue=limits.name), "queue_key"
            )
            full |= {key for key, n in running.items() if n >= limits.key_concurrency}
        if limits.key_rate is not None:
            rows = WorkflowQueueKey.objects.using(alias).rate_used_up({limits.name: limits})
            full |= {row.key for row in rows}
        return {(limits.name, key) for key in full}

    def queue_counts(self) -> dict[str, QueueCounts]:
        """Per queue named by a waiting or running step: its waiting steps
        (:meth:`awaiting_claim`), running steps (:meth:`holding_slots`: what its limits
        count) and the age of its oldest waiting step in seconds on the database clock
        (``None`` when none waits; a step whose worker is gone waits since its lease
        lapsed). Operators' views read this."""
        since = models.Case(
            models.When(status=StepStatus.RUNNING, then=F("lease_expires_at")),
            default=F("available_at"),
        )
        waiting = {
            row["queue"]: row
            for row in self.awaiting_claim()
            .values("queue")
            .annotate(
                n=models.Count("pk"),
                oldest=models.Min(since),
                db_now=models.Max(DbNow()),
            )
        }
        running = _counted(self.holding_slots(), "queue")
        found = {}
        for name in set(waiting) | set(running):
            row = waiting.get(name)
            oldest = None
            if row is not None and row["oldest"] is not None:
                oldest = max(0.0, (row["db_now"] - row["oldest"]).total_seconds())
            found[name] = QueueCounts(
                waiting=0 if row is None else int(row["n"]),
                running=int(running.get(name, 0)),
                oldest_waiting=oldest,
            )
        return found

    def _claim_unlimited(
        self, connection: BaseDatabaseWrapper, ttl: float, queues: Sequence[str], claimant: str
    ) -> tuple[bool, Claim | None]:
        """:meth:`claim_due`'s tuned path (function ``claim_step``) for queues without
        limits: ``(lapsed, claim)`` — ``lapsed`` when a lapsed step waits to be taken over
        (nothing was claimed: the portable path decides it), else the claim or ``None``."""
        sent = time.monotonic()
        row = call_function(connection, "claim_step", [ttl, list(queues) or None, claimant])
        return claim_from_row(connection.alias, row, ttl, sent)

    def _claim_limited(
        self, connection: BaseDatabaseWrapper, ttl: float, limits: QueueLimits, claimant: str
    ) -> tuple[bool, Claim | None]:
        """:meth:`claim_due`'s tuned path for a worker of one queue with limits
        (``limits``): as :meth:`_claim_unlimited`, the limits, per-key limits and
        round-robin order decided in the statement under the queue's lock — the function of
        the queue's shape: ``claim_queue_keyed`` (keyed, no rate), ``claim_queue_counted``
        (a concurrency alone), else ``claim_queue``."""
        sent = time.monotonic()
        if limits.rate is None and limits.key_rate is None:
            # The statement of the queue's shape: no rate log read or written, and in a
            # queue without keys no skip scan over keys and no key row.
            if limits.keyed:
                short = "claim_queue_keyed"
                args: list[Any] = [ttl, limits.name, limits.concurrency, limits.key_concurrency]
            else:
                short = "claim_queue_counted"
                args = [ttl, limits.name, limits.concurrency]
            args.append(claimant)
            row = call_function(connection, short, args)
            return claim_from_row(connection.alias, row, ttl, sent)
        rate = limits.rate is not None
        key_rate = limits.key_rate is not None
        row = call_function(
            connection,
            "claim_queue",
            [
                ttl,
                limits.name,
                limits.keyed,
                limits.concurrency,
                limits.rate_starts if rate else None,
                limits.rate_window if rate else None,
                limits.key_concurrency,
                limits.key_rate_starts if key_rate else None,
                limits.key_rate_window if key_rate else None,
                claimant,
            ],
        )
        return claim_from_row(connection.alias, row, ttl, sent)

    def _claim_mixed(
        self,
        connection: BaseDatabaseWrapper,
        ttl: float,
        limits: Mapping[str, QueueLimits],
        taken: Sequence[str],
        claimant: str,
    ) -> tuple[bool, Claim | None]:
        """:meth:`claim_due`'s tuned path for a worker of limited queues and others
        (``taken``; empty: every queue): one statement reads the first due step of the
        unlimited queues and of each limited one (and whether a lapsed step waits: then
        ``(True, None)``, the portable path takes it over); then the first of those, by
        priority and then by when it became due, is claimed by its own statement
        (``claim_step_except`` for the unlimited queues, :meth:`_claim_limited` for a
        limited one: its limits and round-robin decided there). A limited queue that admits
        nothing now is passed over for the next. Order across queues: priority, then the
        time each queue takes its turn at — its first due step's due time, or in a keyed
        queue its first due step's key's last claim (never: first), where the portable path
        takes the last claim of the key whose turn it is in the queue (the same key, or one
        claimed less recently: the tuned path may then place the keyed queue later)."""
        alias = connection.alias
        limited = sorted(
            name for name, queue in limits.items() if queue.limited and (not taken or name in taken)
        )
        others = [name for name in taken if name not in limited]
        steps = self.using(alias).rows().filter(run__status=RunStatus.RUNNING)
        of_taken = steps.filter(queue__in=taken) if taken else steps
        lapsed = (
            of_taken.filter(status=StepStatus.RUNNING)
            .filter(
                Q(lease_expires_at__lte=DbNow())
                | Q(lease_expires_at__isnull=True)
                | Q(deadline_at__lte=DbNow())
            )
            .annotate(source=models.Value(-1), order_at=F("available_at"))
            .values_list("source", "priority", "order_at")[:1]
        )
        waiting = steps.filter(status__in=WAITING_STEP_STATUSES, available_at__lte=DbNow()).exclude(
            failed_for_good_q()
        )
        at = models.DateTimeField()
        heads = []
        if others or not taken:
            rest = waiting.filter(queue__in=others) if taken else waiting.exclude(queue__in=limited)
            heads.append(
                rest.annotate(source=models.Value(len(limited)), order_at=F("available_at"))
            )
        # A source is an index into ``limited`` (its queue), or past it (the others). A keyed
        # queue takes its turn at its first due step's key's last claim (never: first), as
        # in the portable path's order; any other queue at its first due step's due time.
        for index, name in enumerate(limited):
            head = waiting.filter(queue=name).annotate(source=models.Value(index))
            if limits[name].keyed:
                turn = models.Subquery(
                    WorkflowQueueKey.objects.using(alias)
                    .filter(queue=name, key=models.OuterRef("queue_key"))
                    .values("claimed_at")[:1]
                )
                order_at: Any = Coalesce(turn, models.Value(_never(), output_field=at))
            else:
                order_at = F("available_at")
            heads.append(head.annotate(order_at=order_at))
        firsts = [
            head.order_by("-priority", "available_at", "id").values_list(
                "source", "priority", "order_at"
            )[:1]
            for head in heads
        ]
        found = list(lapsed.union(*firsts, all=True))
        if any(source < 0 for source, _, _ in found):
            return True, None
        found.sort(key=lambda row: (-row[1], row[2]))
        for source, _, _ in found:
            if source == len(limited):
                sent = time.monotonic()
                row = call_function(
                    connection, "claim_step_except", [ttl, others or None, limited, claimant]
                )
                lapsed_now, claim = claim_from_row(alias, row, ttl, sent)
            else:
                lapsed_now, claim = self._claim_limited(
                    connection, ttl, limits[limited[source]], claimant
                )
            if lapsed_now or claim is not None:
                return lapsed_now, claim
        return False, None

    def _annotated(self, alias: str) -> models.QuerySet[_LockedStep]:
        """Steps with what a claim decides on (:class:`_LockedStep`), not yet locked."""
        run_status: Any = F("run__status")
        run_workflow: Any = F("run__workflow")
        if not connections[alias].features.has_select_for_update_of:
            # No FOR UPDATE OF (MariaDB, SQLite): read the run's status in a subquery, whose
            # rows a locking read leaves unlocked (a join's would be locked too, so steps of
            # one run could not be claimed side by side).
            runs = run_model()._default_manager.using(alias).filter(pk=models.OuterRef("run_id"))
            run_status = models.Subquery(runs.values("status")[:1])
            run_workflow = models.Subquery(runs.values("workflow")[:1])
        return self.rows().annotate(
            lease_live=lease_is_live(),
            due=is_due(),
            run_status=run_status,
            run_workflow=run_workflow,
            db_now=DbNow(),
            server_floor=EpochFloor(),
        )

    @staticmethod
    def _locked(
        steps: models.QuerySet[_LockedStep], alias: str, *, skip_locked: bool
    ) -> models.QuerySet[_LockedStep]:
        """``steps`` read with a row lock on the steps (``SKIP LOCKED`` where asked for and
        the database has it), never on the runs."""
        features = connections[alias].features
        of = ("self",) if features.has_select_for_update_of else ()
        if skip_locked and features.has_select_for_update_skip_locked:
            return steps.select_for_update(skip_locked=True, of=of)
        return steps.select_for_update(of=of)

    def _locking(self, alias: str, *, skip_locked: bool) -> models.QuerySet[_LockedStep]:
        return self._locked(self._annotated(alias), alias, skip_locked=skip_locked)

    def _lock_first(self, alias: str, ordered: models.QuerySet[_LockedStep]) -> _LockedStep | None:
        """The first step of ``ordered`` that no other transaction has locked, locked, read
        as the lock found it; ``None`` if there is none.

        PostgreSQL locks only the rows a locking read returns: one ``SKIP LOCKED`` read.
        InnoDB (MariaDB / MySQL) locks every row the read's plan reads, matching or not,
        where it reads through a secondary index, even at READ COMMITTED, and keeps the
        locks until the transaction ends; other claims then skip those steps and can find
        none due while many are. There the candidates are read without a lock, then locked
        one at a time by primary key, their conditions checked again under the lock. A
        candidate another claim took meanwhile stays locked too until the transaction ends
        (InnoDB keeps the lock of a row it read under lock, matching or not): a claim holds
        its step and those few, not the rows its search read. When
        :data:`LOCK_CANDIDATES` × :data:`LOCK_ROUNDS` candidates are all taken meanwhile,
        the one locking read decides."""
        if connections[alias].vendor != "mysql":
            return self._locked(ordered, alias, skip_locked=True).first()
        tried: list[int] = []
        for _round in range(LOCK_ROUNDS):
            candidates = list(
                ordered.exclude(pk__in=tried).values_list("pk", flat=True)[:LOCK_CANDIDATES]
            )
            for pk in candidates:
                one = ordered.order_by().filter(pk=pk)
                step = self._locked(one, alias, skip_locked=True).first()
                if step is not None:
                    return step
            if len(candidates) < LOCK_CANDIDATES:
                return None
            tried += candidates
        return self._locked(ordered, alias, skip_locked=True).first()

    def _next_due(
        self,
        alias: str,
        queues: Sequence[str] = (),
        blocked: set[str] | frozenset[str] = frozenset(),
        keys: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset(),
    ) -> _LockedStep | None:
        base = self._annotated(alias).filter(run_status=RunStatus.RUNNING)
        if queues:
            base = base.filter(queue__in=[name for name in queues if name not in blocked])
        elif blocked:
            base = base.exclude(queue__in=sorted(blocked))
        passed_over: dict[str, list[str]] = {}
        for queue, key in sorted(keys):
            passed_over.setdefault(queue, []).append(key)
        for queue, names in passed_over.items():
            base = base.exclude(queue=queue, queue_key__in=names)
        # Running steps whose lease lapsed, or whose attempt ran past its timeout.
        lapsed = self._lock_first(
            alias,
            base.filter(
                Q(lease_expires_at__lte=DbNow())
                | Q(lease_expires_at__isnull=True)
                | Q(deadline_at__lte=DbNow()),
                status=StepStatus.RUNNING,
            ).order_by("lease_expires_at"),
        )
        if lapsed is not None:
            return lapsed
        waiting = base.filter(status__in=WAITING_STEP_STATUSES, available_at__lte=DbNow()).exclude(
            failed_for_good_q()
        )
        keyed = sorted(
            name
            for name, limits in queue_limits().items()
            if limits.keyed and (not queues or name in queues)
        )
        if not keyed:
            return self._lock_first(alias, waiting.order_by("-priority", "available_at", "id"))
        # Keyed queues serve their keys round-robin: within a priority, the step whose key
        # was claimed least recently (never: first) goes first, then first due first. A step
        # of another queue takes its turn at the time it became due, so a keyed queue and
        # the others interleave by time, and neither starves the other.
        turn = models.Subquery(
            WorkflowQueueKey.objects.using(alias)
            .filter(queue=models.OuterRef("queue"), key=models.OuterRef("queue_key"))
            .values("claimed_at")[:1]
        )
        never = _never()
        order = models.Case(
            models.When(
                queue__in=keyed,
                then=Coalesce(turn, models.Value(never, output_field=models.DateTimeField())),
            ),
            default=F("available_at"),
            output_field=models.DateTimeField(),
        )
        # Ordered by the expression, not an annotation: nothing is read back (MariaDB
        # returns a CASE over datetimes as text).
        return self._lock_first(
            alias, waiting.order_by("-priority", order.asc(), "available_at", "id")
        )

    def _claim_locked(
        self,
        alias: str,
        step: _LockedStep,
        ttl: float,
        sent: float,
        refused: Refused | None = None,
        *,
        claimant: str = "",
        inline: bool = False,
    ) -> Claim | None:
        """Decide and write a claim of the locked, annotated ``step`` (inside a transaction),
        naming ``claimant`` (empty: none).

        A step of a limited queue starts only if the queue admits it (under the queue's lock,
        :meth:`WorkflowQueueQuerySet.admit`); else ``None``, and the queue (or the step's
        key) is added to ``refused``. ``inline``: the caller named the step (see
        :func:`_queue_admits`)."""
        if step.run_status != RunStatus.RUNNING or step.status == StepStatus.SUCCEEDED:
            return None
        if step.status == StepStatus.RUNNING and step.lease_live:
            if step.deadline_at is not None and step.deadline_at <= step.db_now:
                self._time_out(alias, step)
            return None
        # Guarded on what was read, and on the run still running: a cancel that committed
        # while this claim waited for the step row is seen here (a new statement).
        rows = self.rows().filter(
            pk=step.pk, attempt=step.attempt, status=step.status, run__status=RunStatus.RUNNING
        )
        lease = clock.db_now_plus(ttl)
        deadline = None if step.timeout is None else clock.db_now_plus(step.timeout)
        admission: Admission | None = None
        if step.status in (StepStatus.PENDING, StepStatus.SCHEDULED):
            if not step.due:
                return None
            admitted, admission = _queue_admits(alias, step, refused, inline=inline)
            if not admitted:
                return None
            attempt = step.attempt
            granted = rows.filter(due_q()).update(
                status=StepStatus.RUNNING,
                lease_expires_at=lease,
                claimant=claimant,
                fence_floor=step.server_floor,
                deadline_at=deadline,
                updated_at=DbNow(),
            )
        else:  # failed, or running with a lapsed lease
            lapsed_q = Q(lease_expires_at__lte=DbNow()) | Q(lease_expires_at__isnull=True)
            if exhausted(step.attempt, step.retries):
                if step.status == StepStatus.RUNNING:
                    self._fail_lost_worker(alias, step, rows.filter(lapsed_q))
                return None
            if step.status == StepStatus.FAILED and not step.due:
                return None
            guard = due_q() if step.status == StepStatus.FAILED else lapsed_q
            admitted, admission = _queue_admits(alias, step, refused, inline=inline)
            if not admitted:
                return None
            attempt = step.attempt + 1
            # The new attempt and the lease in one guarded UPDATE: from here on, every write
            # carrying an earlier attempt matches no row.
            granted = rows.filter(guard).update(
                status=StepStatus.RUNNING,
                attempt=F("attempt") + 1,
                lease_expires_at=lease,
                claimant=claimant,
                fence_floor=step.server_floor,
                deadline_at=deadline,
                result=None,
                error=None,
                updated_at=DbNow(),
            )
        if granted != 1:
            return None
        history: dict[str, Any] = {
            "status": AttemptStatus.RUNNING,
            "error": None,
            "finished_at": None,
        }
        if admission is not None:
            # The start the queue's rate log records is the attempt's start.
            WorkflowQueue.objects.record_start(alias, admission)
            history["started_at"] = admission.started_at
        attempt_model()._default_manager.using(alias).update_or_create(
            step_id=step.pk, attempt=attempt, defaults=history
        )
        claim = claim_of_step(
            alias,
            step,
            ttl,
            sent,
            attempt=attempt,
            fence_floor=step.server_floor,
            run_workflow=step.run_workflow,
        )
        waited = None
        if step.available_at is not None and step.status != StepStatus.RUNNING:
            waited = (step.db_now - step.available_at).total_seconds()
        return attempt_started(claim, waited)

    def _time_out(self, alias: str, step: WorkflowStep) -> None:
        """Fail the locked ``step``'s running attempt, past its ``timeout`` on the database
        clock, with a ``STEP_TIMED_OUT`` error, through the fence (inside the caller's
        transaction), as :meth:`set_error` would: retried after the step's retry delay for
        this attempt (:func:`retry_delay_after`) if attempts remain, else the run is asked
        for a pass. Its worker's renewals, result and error are refused from then on."""
        error = {
            "code": STEP_TIMED_OUT,
            "message": (
                f"Step {step.step_name!r} attempt {step.attempt} ran longer than its timeout "
                f"of {step.timeout:g} s"
            ),
        }
        last = exhausted(step.attempt, step.retries)
        delay = retry_delay_after(
            step.attempt, step.retry_delay, step.retry_backoff, step.retry_delay_max
        )
        self._record_outcome(
            alias,
            step.pk,
            step.attempt,
            step={
                "status": StepStatus.FAILED,
                "error": error,
                "result": None,
                "lease_expires_at": None,
                "deadline_at": None,
                "available_at": None if last else clock.db_now_plus(delay),
            },
            history={"status": AttemptStatus.FAILED, "error": error},
        )
        if last:
            request_passes(alias, Q(pk=step.run_id))
        elif not delay:
            wake_workers(alias)

    def _fail_lost_worker(
        self, alias: str, step: WorkflowStep, rows: models.QuerySet[WorkflowStep]
    ) -> None:
        error = {
            "code": STEP_LEASE_LAPSED,
            "message": (
                f"Step {step.step_name!r} lost its worker on every attempt "
                f"({step.attempt} of {step.max_attempts}): its lease lapsed each time"
            ),
        }
        failed = rows.update(
            status=StepStatus.FAILED,
            error=error,
            lease_expires_at=None,
            available_at=None,
            claimant="",
            updated_at=DbNow(),
        )
        if failed:
            attempt_model()._default_manager.using(alias).filter(
                step_id=step.pk, attempt=step.attempt, status=AttemptStatus.RUNNING
            ).update(status=AttemptStatus.FAILED, error=error, finished_at=DbNow())
            attempt_finished(alias, step.pk, step.attempt, StepStatus.FAILED, step.run_id)
            request_passes(alias, Q(pk=step.run_id))

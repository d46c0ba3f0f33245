"""The workflow worker: threads that pick due orchestration passes and due steps and run them.

``manage.py run_workflow_worker`` is a thin wrapper over :class:`Worker`::

    from django_leases.workflows.worker import Worker

    Worker(concurrency=4).run()          # until SIGTERM / SIGINT
    Worker(concurrency=2).run(once=True)  # until nothing is due, then return

Each thread loops: pick a run whose pass is due and replay it, else claim a due step and
execute it, else wait for a wake-up or the poll interval. On PostgreSQL rows are picked with
``SKIP LOCKED`` so threads and processes never wait for each other. Recovery of a dead
worker's step comes from its lease lapsing on the database clock, never from worker identity.

Waking up (:mod:`django_leases.workflows.wakeup`): on PostgreSQL each worker process keeps
one LISTEN connection, and the store NOTIFYs in every transaction that makes work due now,
so an idle worker starts a new run's first pass or a newly scheduled step within
milliseconds. The poll interval then only bounds how late work that becomes due by the
clock is seen (a lapsed step lease, a retry after its retry delay): it defaults to
:data:`LISTENING_POLL_INTERVAL` (1 s). Elsewhere (SQLite) idle threads poll every
:data:`POLLING_POLL_INTERVAL` (0.25 s) by default. ``WORKER_POLL_INTERVAL`` (or the
``poll_interval`` argument) overrides both.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence

from django.db import close_old_connections, connections, router

from django_leases import db
from django_leases.conf import MAX_POLL_INTERVAL, check_queue_names, leases_settings
from django_leases.exceptions import MisuseError
from django_leases.health import functions_missing
from django_leases.leases import HeldLease, new_holder
from django_leases.models import WorkflowRun, WorkflowSchedule, WorkflowStep, WorkflowWorker
from django_leases.models.schedule import Fired, TaskStarter
from django_leases.process import on_stop, signal_name
from django_leases.validation import seconds, ttl_seconds
from django_leases.workflows import aio, registry
from django_leases.workflows.driver import (
    PASS_RETRY_DELAY,
    RunDriver,
    record_alone,
    run_lease_ttl,
)
from django_leases.workflows.engine import record_step, run_step_function
from django_leases.workflows.registry import one_step_output
from django_leases.workflows.values import WORKER_LEASE_PREFIX, Claim, PassClaim
from django_leases.workflows.wakeup import WakeSignal, WakeupListener, listens, wakeup_method

logger = logging.getLogger("django_leases.worker")

#: Exit status when a worker thread died (the other threads were stopped).
EXIT_THREAD_DIED = 3
#: Exit status of ``once`` mode when the database stayed unreachable (the status every
#: command exits with for an unreachable database, ``health.EXIT_UNREACHABLE``).
EXIT_DATABASE_UNREACHABLE = 4
#: Exit status when in-flight work was still running at the end of the shutdown grace.
EXIT_ABANDONED = 5

#: Default poll interval where LISTEN/NOTIFY wakes idle workers (PostgreSQL), seconds.
LISTENING_POLL_INTERVAL = 1.0
#: Default poll interval where idle workers can only poll (SQLite), seconds.
POLLING_POLL_INTERVAL = 0.25
#: First back-off after a failed unit of work (doubled per consecutive failure), seconds.
FAILURE_BACKOFF = 0.1
#: Longest back-off after a failed unit of work, seconds.
MAX_BACKOFF = 30.0
#: Seconds between two looks for due schedule ticks in a worker's main loop.
SCHEDULE_INTERVAL = 1.0
#: Consecutive failures after which ``once`` mode gives up.
ONCE_MAX_FAILURES = 10
#: ``once`` mode also waits for work due within this many seconds: a pass retried because
#: the run lease was still held by the pass before it, or a step retried without delay.
ONCE_HORIZON = PASS_RETRY_DELAY + 1.0


class _Heartbeat:
    """The worker's heartbeat lease (``workflow-worker:<host>:<pid>:<id>``, the id its own)
    and its ``WorkflowWorker`` row: taken when the worker starts (and again whenever it is not held:
    the database was unreachable, or the lease was lost), renewed every TTL/3 by the lease's
    own renewal thread, its units in flight written every TTL/3, released when the worker
    stops. Never fatal: without a database the worker runs on, unseen."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.ttl = run_lease_ttl()
        self.host = socket.gethostname()[:200]
        self.pid = os.getpid()
        # host and pid say where it runs; they are not unique (containers on the host's
        # network each have its hostname and their own low pids), so the key ends with an id
        # of this worker's own: two workers never share a heartbeat lease.
        self.key = f"{WORKER_LEASE_PREFIX}{self.host}:{self.pid}:{uuid.uuid4().hex[:12]}"
        self.held: HeldLease | None = None
        self._next_try = 0.0
        self._next_beat = 0.0
        self._in_flight = -1

    def tick(self, in_flight: int) -> None:
        """From the worker's main loop: hold the lease, and write the units in flight."""
        now = time.monotonic()
        try:
            if self.held is None or self.held.lost.is_set():
                if now < self._next_try:
                    return
                self._next_try = now + min(self.ttl / 3, 5.0)
                self._release()
                held = HeldLease(self.key, self.ttl, using=self.worker.alias)
                held.acquire()
                self.held = held
                WorkflowWorker.objects.db_manager(self.worker.alias).register(
                    self.key,
                    host=self.host,
                    pid=self.pid,
                    concurrency=self.worker.concurrency,
                    queues=list(self.worker.queues),
                    wakeup=self.worker.wakeup,
                )
                self._in_flight, self._next_beat = 0, now + self.ttl / 3
            if in_flight != self._in_flight or now >= self._next_beat:
                WorkflowWorker.objects.db_manager(self.worker.alias).beat(self.key, in_flight)
                self._in_flight, self._next_beat = in_flight, now + self.ttl / 3
        except Exception as exc:  # unreachable, or the lease lost: later
            logger.info("Workflow worker heartbeat %r: %s; trying again later", self.key, exc)
        finally:
            db.close_thread_connections()

    def _release(self) -> None:
        if self.held is not None:
            self.held.finish(vouch=False)
            self.held = None

    def stop(self) -> None:
        """Release the lease and record the stop (best effort)."""
        try:
            if self.held is not None:
                self._release()
                WorkflowWorker.objects.db_manager(self.worker.alias).stopped(self.key)
        except Exception as exc:
            logger.info("Workflow worker heartbeat %r: %s", self.key, exc)
        finally:
            db.close_thread_connections()


def task_starter() -> TaskStarter:
    """What enqueues a task schedule's tick: the Tasks backend's
    :func:`~django_leases.tasks.start_scheduled_task` (imported only when a task schedule is
    declared: it needs Django's Tasks framework)."""
    # deferred: django_leases.tasks needs Django's Tasks framework (an optional dependency)
    # and registers the task workflow as it loads
    from django_leases.tasks import start_scheduled_task

    return start_scheduled_task


class _Schedules:
    """The worker's part in firing schedules (:mod:`django_leases.workflows.schedules`): on
    its first look it syncs the declared schedules to their rows, then at most once per
    :data:`SCHEDULE_INTERVAL` it fires the due ticks (``WorkflowSchedule.objects.fire_due``,
    exactly once across every worker). Never fatal: a failure is logged and tried again at the
    next look."""

    def __init__(self, worker: Worker, interval: float = SCHEDULE_INTERVAL) -> None:
        self.worker = worker
        self.interval = interval
        self.synced = False
        self._next = 0.0
        #: Enqueues the ticks of task schedules (``None``: none is declared).
        self.start_task: TaskStarter | None = None

    def tick(self) -> None:
        """From the worker's main loop: sync once, then fire what is due (rate-limited)."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.interval
        schedules = WorkflowSchedule.objects.db_manager(self.worker.alias)
        try:
            if not self.synced:
                declared = registry.declared_schedules()
                schedules.sync(declared)
                self.start_task = task_starter() if any(s.task for s in declared) else None
                self.synced = True
            for fired in schedules.fire_due(start_task=self.start_task):
                if fired.tick is None:
                    logger.warning(
                        "Schedule %r: %d missed tick(s) skipped (catch_up none)",
                        fired.name,
                        fired.skipped,
                    )
                else:
                    logger.info(
                        "Schedule %r: tick %s %s", fired.name, fired.tick.isoformat(), _did(fired)
                    )
        except Exception as exc:  # unreachable, or not migrated yet: at the next look
            logger.warning("Workflow schedules: %s; trying again later", exc)
        finally:
            db.close_thread_connections()


def _log_attempt(claim: Claim, outcome: str) -> None:
    """Log (info) how the attempt of ``claim`` the worker ran ended: ``outcome``, a word."""
    logger.info(
        "Run %s: step %r attempt %d %s", claim.run_id, claim.step_name, claim.attempt, outcome
    )


def _did(fired: Fired) -> str:
    """What the schedule did with ``fired``'s tick, for the worker's log line."""
    if fired.action == "skipped":
        return f"skipped ({fired.reason})"
    if fired.action == "buffered":
        return "waits for the previous run"
    missed = f" ({fired.skipped} missed tick(s) before it)" if fired.skipped else ""
    return f"started run {fired.run_id}{missed}"


class Worker:
    """Runs workflow passes and steps on ``concurrency`` threads.

    Args:
        concurrency: number of worker threads (``int`` ≥ 1).
        using: database alias (default: the router's choice for ``WorkflowStep``).
        poll_interval: seconds an idle thread waits before looking again, unless woken
            earlier by a notification (default ``WORKER_POLL_INTERVAL``; when that is unset,
            :data:`LISTENING_POLL_INTERVAL` on PostgreSQL, :data:`POLLING_POLL_INTERVAL`
            elsewhere).
        shutdown_grace: seconds in-flight work may take to finish after a stop request
            (default ``WORKER_SHUTDOWN_GRACE``).
        step_lease_ttl: TTL of a claimed step's lease, seconds (default ``STEP_LEASE_TTL``).
        queues: names of the queues whose steps it takes (``DJANGO_LEASES["QUEUES"]``, or
            ``"default"``); ``None`` or empty: every queue. Runs' orchestration passes are
            not queued: every worker takes them (a step a pass schedules in another queue is
            left to that queue's workers).

    Raises ``ValueError`` for a bad argument, and
    :class:`~django_leases.exceptions.QueueConfigError` for a queue not configured.
    """

    def __init__(
        self,
        concurrency: int = 1,
        *,
        using: str | None = None,
        poll_interval: float | None = None,
        shutdown_grace: float | None = None,
        step_lease_ttl: float | None = None,
        queues: Sequence[str] | None = None,
    ) -> None:
        self.queues: tuple[str, ...] = tuple(check_queue_names(list(queues or ())))
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an int >= 1, not {concurrency!r}")
        self.concurrency = concurrency
        self.using = using
        if poll_interval is None:
            poll_interval = leases_settings.WORKER_POLL_INTERVAL
        if poll_interval is None:
            poll_interval = (
                LISTENING_POLL_INTERVAL if listens(self.alias) else POLLING_POLL_INTERVAL
            )
        self.poll_interval = seconds(poll_interval, "poll_interval", maximum=MAX_POLL_INTERVAL)
        self.shutdown_grace = seconds(
            leases_settings.WORKER_SHUTDOWN_GRACE if shutdown_grace is None else shutdown_grace,
            "shutdown_grace",
        )
        self.step_lease_ttl = ttl_seconds(
            leases_settings.STEP_LEASE_TTL if step_lease_ttl is None else step_lease_ttl
        )
        self._stop = threading.Event()  # stop claiming
        self._abandon = threading.Event()  # a second signal: do not wait for in-flight work
        self._stop_requested = False  # stop() was called
        self._drained = False  # once mode stopped because it found nothing to do
        #: Signals received, each with whether the worker was stopping already (main thread).
        self._signals: list[tuple[int, bool]] = []
        self._signals_reported = 0
        self._lock = threading.Lock()
        self._busy = 0
        #: Threads working on a unit they claimed (a pass or a step), as opposed to looking.
        self._working = 0
        self._claimed_here = threading.local()
        self._progress = 0
        self._gave_up = False
        self._died: list[str] = []  # names of threads that ended by an unexpected exception
        self._steps_first_at = 0.0  # monotonic time of the next look for due steps first
        self._deadlines_at = 0.0  # monotonic time of the next look for runs past deadline
        self._passes_first_at = 0.0  # monotonic time a thread on a run of steps looks at passes
        #: Wake-ups of idle threads (from the listener, and from a thread that found work).
        self.wake = WakeSignal(concurrency)
        #: The LISTEN connection's thread while :meth:`run` runs on PostgreSQL (not in
        #: ``once`` mode), else ``None``.
        self.listener: WakeupListener | None = None
        #: The heartbeat of the process while :meth:`run` runs (``None`` before).
        self.heartbeat: _Heartbeat | None = None

    @property
    def alias(self) -> str:
        """The database alias the worker uses (``using``, else the router's choice)."""
        return self.using or router.db_for_write(WorkflowStep)

    # -- control --------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming new work; in-flight work finishes. Safe from any thread (not from a
        signal handler: :meth:`run` handles signals itself)."""
        self._stop_requested = True
        self._stop.set()
        self.wake.interrupt()

    def _stop_drained(self) -> None:
        """``once`` mode found nothing to do: stop, as :meth:`stop` but not asked for."""
        self._drained = True
        self._stop.set()
        self.wake.interrupt()

    def _left_work_behind(self, threads: list[threading.Thread]) -> bool:
        """Whether ``once`` mode stopped as drained while work is due: every thread of the
        round has ended, nobody asked the worker to stop, and work is due now or within
        :data:`ONCE_HORIZON` seconds."""
        if not self._drained or self._stop_requested or self._signals or self._died:
            return False
        if self._gave_up or any(t.is_alive() for t in threads):
            return False

        try:
            return WorkflowRun.objects.db_manager(self.alias).work_due_within(ONCE_HORIZON)
        except Exception:
            logger.warning("Workflow worker: could not look for work due soon", exc_info=True)
            return False
        finally:
            db.close_thread_connections()

    @property
    def stopping(self) -> bool:
        """``True`` once the worker stopped claiming (stop request, signal or drained)."""
        return self._stop.is_set()

    def _on_signal(self, signum: int) -> None:
        # Runs on the main thread between two bytecodes, wherever it is: it only records the
        # signal and sets flags whose locks the main thread never takes. The main loop says
        # what it does (a log line from here could re-enter a stream the main thread writes).
        self._signals.append((signum, self._stop.is_set()))
        if self._stop.is_set():
            self._abandon.set()
        else:
            self._stop.set()

    def _report_signals(self) -> None:
        """Log the signals :meth:`_on_signal` recorded since the last call (main thread)."""
        while self._signals_reported < len(self._signals):
            signum, stopping = self._signals[self._signals_reported]
            self._signals_reported += 1
            if stopping:
                logger.warning(
                    "Second signal (%s): not waiting for in-flight work", signal_name(signum)
                )
            else:
                logger.info(
                    "%s: stopping; in-flight work has %.0f s to finish",
                    signal_name(signum),
                    self.shutdown_grace,
                )

    # -- running --------------------------------------------------------------------------------

    def run(self, once: bool = False, *, handle_signals: bool = True) -> int:
        """Run the worker threads until stopped; returns an exit status.

        Args:
            once: return as soon as no pass and no step is due now or within
                :data:`ONCE_HORIZON` seconds (work due later, such as a retry after a longer
                retry delay, or a step whose lease has not lapsed yet, is left for the
                next worker).
            handle_signals: on the main thread, turn SIGTERM / SIGINT into :meth:`stop`
                (a second one stops waiting for in-flight work); the previous handlers are
                put back on return.

        Returns ``0`` when every thread finished, :data:`EXIT_ABANDONED` when in-flight work
        was still running at the end of the shutdown grace (its step leases will lapse and
        another worker takes the steps over), :data:`EXIT_DATABASE_UNREACHABLE` when ``once``
        mode gave up on an unreachable database, :data:`EXIT_THREAD_DIED` when a worker
        thread died (it is logged; the other threads are stopped as on :meth:`stop`, so a
        supervisor restarts the process rather than it running on short-handed).
        """
        with on_stop(self._on_signal) if handle_signals else contextlib.nullcontext():
            return self._run(once)

    def _threads(self, once: bool) -> list[threading.Thread]:
        threads = [
            threading.Thread(
                target=self._thread_main, args=(once,), name=f"workflow-worker-{i}", daemon=True
            )
            for i in range(self.concurrency)
        ]
        for thread in threads:
            thread.start()
        return threads

    def _run(self, once: bool) -> int:
        self._check_ready()
        alias = self.alias
        if not once and listens(alias):
            self.listener = WakeupListener(
                alias,
                self.wake.wake,
                on_reconnect=lambda: self.wake.wake(self.concurrency),
            )
        logger.info("%s", self.describe(once))
        heartbeat = _Heartbeat(self)
        self.heartbeat = heartbeat
        schedules = _Schedules(self)
        try:
            if self.listener is not None:
                self.listener.start()
            threads = self._threads(once)
            while True:
                while any(t.is_alive() for t in threads) and not self._stop.is_set():
                    with self._lock:
                        in_flight = self._busy
                    heartbeat.tick(in_flight)
                    schedules.tick()
                    for thread in threads:
                        thread.join(0.2)
                # A signal handler only sets the flag; idle threads are woken from here.
                self._report_signals()
                self.wake.interrupt()
                if self.listener is not None:
                    self.listener.stop()
                deadline = time.monotonic() + self.shutdown_grace
                for thread in threads:
                    while thread.is_alive() and not self._abandon.is_set():
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        thread.join(min(remaining, 0.2))
                        self._report_signals()
                self._report_signals()
                if not self._left_work_behind(threads):
                    break
                # Drained too soon: a thread claimed a unit as another found the worker
                # idle, and finished it as a stopping worker does (what it made due left
                # for the queue). Every thread has ended: go round again.
                logger.debug("Workflow worker: work is due after draining; going on")
                self._drained = False
                self._stop.clear()
                threads = self._threads(once)
            with self._lock:
                in_flight = self._busy
            # Threads still alive with nothing in flight are idle ones on their way out (a
            # second signal can come before they wake): nothing is abandoned.
            stuck = [t.name for t in threads if t.is_alive()] if in_flight else []
        finally:
            self.wake.interrupt()
            if self.listener is not None:
                self.listener.stop()
            heartbeat.stop()
        if self._died:
            logger.error("Workflow worker stopped because %s died", ", ".join(sorted(self._died)))
            return EXIT_THREAD_DIED
        if stuck:
            logger.warning(
                "Shutdown grace over with work in flight on %s; their step leases will lapse "
                "and another worker will take the steps over",
                ", ".join(stuck),
            )
            return EXIT_ABANDONED
        if self._gave_up:
            return EXIT_DATABASE_UNREACHABLE
        logger.info("Workflow worker stopped")
        return 0

    @property
    def wakeup(self) -> str:
        """How this worker's idle threads learn of new work, in words."""
        return wakeup_method(self.alias, self.poll_interval)

    def describe(self, once: bool = False) -> str:
        """The worker's first line: threads, database, how it is woken."""
        return (
            f"Workflow worker started: {self.concurrency} thread(s){' (once)' if once else ''} "
            f"on database {self.alias!r}, {'until drained' if once else self.wakeup}"
            + (f", queues {', '.join(self.queues)}" if self.queues else "")
        )

    def _check_ready(self) -> None:
        """Refuse to start where the tuned statements' functions are missing (the migrations
        install them): every unit of work would fail."""
        connection = connections[self.alias]
        if not db.outside_transactions(connection):
            # Its threads have connections of their own: they would never see this
            # transaction's rows (a TestCase's), and wait for work that is not there.
            raise MisuseError(
                f"A workflow worker cannot run inside transaction.atomic() (or with "
                f"autocommit off) on database {self.alias!r} (a TestCase runs each test in "
                "one): its threads use their own "
                "connections and cannot see this transaction's rows. In tests, drive the runs "
                "on this thread with django_leases.testing.drive(), or use "
                "TransactionTestCase or django_db(transaction=True)."
            )
        missing = functions_missing(connection)
        if missing is not None:
            raise missing

    def work_once(self) -> bool:
        """Do one unit of work on the calling thread: one due pass, else one due step.

        The thread keeps the run it is working on (:class:`~driver.RunDriver`): a step its
        pass schedules, it runs at once, and after a step it runs the run's next pass itself.
        Returns ``True`` if there was something to do. Database errors propagate.
        """
        try:
            return self._work_once()
        finally:
            with self._lock:
                if getattr(self._claimed_here, "working", False):
                    self._claimed_here.working = False
                    self._working -= 1

    def _claimed(self) -> None:
        """Note that this thread claimed a unit of work (until its ``work_once`` returns)."""
        with self._lock:
            if not getattr(self._claimed_here, "working", False):
                self._claimed_here.working = True
                self._working += 1

    def _work_once(self) -> bool:

        if self._stop.is_set():
            return False
        alias = self.alias
        if self._deadlines_due() and WorkflowRun.objects.db_manager(alias).expire_deadlines():
            return True
        # A driven run keeps its thread for all its steps, so due passes (new runs) would
        # otherwise always come first: once per poll interval a thread looks for a due step
        # (a lapsed lease first) before taking a new run, which bounds how long a dead
        # worker's step waits behind a backlog of new runs.
        # A thread whose last unit was a step from the queue that left no pass to drive (a
        # task, say) looks for the next step first too: where steps are what is due, the
        # look for a pass would find nothing each time. Passes still come first once per
        # poll interval.
        steps_first = self._steps_first(getattr(self._claimed_here, "on_steps", False))
        if steps_first and self._run_due_step(alias):
            return True
        runs = WorkflowRun.objects.db_manager(alias)
        picked = runs.claim_due_pass(run_lease_ttl(), lease_holder=new_holder())
        if picked is None:
            return False if self._stop.is_set() else self._run_due_step(alias)
        self._claimed()
        # A run's completion picks the next due pass in the same statement (until a look for
        # due steps is due again, or the worker stops): drive that one next.
        self._drive_following(picked)
        return True

    def _deadlines_due(self) -> bool:
        """Whether this thread looks for runs past their deadline now: one thread of the
        worker once per poll interval (a run is failed within about one interval of it)."""
        with self._lock:
            now = time.monotonic()
            if now < self._deadlines_at:
                return False
            self._deadlines_at = now + self.poll_interval
            return True

    def _keep_going(self) -> bool:
        """Whether a pass may claim and run its run's next step on this thread: not once the
        worker stops, nor when the look for runs past their deadline is overdue by a whole
        poll interval (every thread busy driving runs: none came back to take it) and a run
        is past its deadline. The pass then leaves the step to its queue and this thread
        takes the look first, so a run driven step after step still fails at its deadline.
        With none past it, the look is counted as done (one read) and the pass goes on."""
        if self._stop.is_set():
            return False
        # At most one such read a second, however short the poll interval.
        grace = max(self.poll_interval, 1.0)
        with self._lock:
            if time.monotonic() < self._deadlines_at + grace:
                return True
        if WorkflowRun.objects.db_manager(self.alias).past_deadline().exists():
            return False
        with self._lock:
            self._deadlines_at = time.monotonic()
        return True

    def _steps_first(self, on_steps: bool) -> bool:
        """Whether this thread's next unit of work is a due step rather than a due pass (see
        :meth:`_work_once`); ``on_steps``: its last unit was a step that left no pass to
        drive. Moves the times at which a look for steps, or for passes, comes first."""
        with self._lock:
            now = time.monotonic()
            if now >= self._steps_first_at:
                self._steps_first_at = now + self.poll_interval
                return True
            if not on_steps:
                return False
            if now < self._passes_first_at:
                return True
            self._passes_first_at = now + self.poll_interval
            return False

    def _run_due_step(self, alias: str) -> bool:
        """Claim one due step and run it (then drive its run, or run the step its result's
        write claimed next, and so on); ``False`` if none is due."""
        if self._stop.is_set():
            return False
        claim = WorkflowStep.objects.db_manager(alias).claim_due(
            self.step_lease_ttl, queues=self.queues
        )
        self._claimed_here.on_steps = False
        if claim is None:
            return False
        self._claimed()
        following: Claim | PassClaim | None = claim
        while isinstance(following, Claim):
            logger.info(
                "Run %s: step %r attempt %d claimed",
                following.run_id,
                following.step_name,
                following.attempt,
            )
            following = self._run_claimed(alias, following)
        self._drive_following(following)
        return True

    def _run_claimed(self, alias: str, claim: Claim) -> Claim | PassClaim | None:
        """Run claimed step ``claim`` and write what came of it; returns what this thread does
        next: a step or a pass the write claimed, else ``None``. A result of a run's only
        step whose workflow returns it (a task's) completes the run in the same write; any
        other result is carried into the run's pass, which this thread runs (its lease taken
        now); a failure, or a result while stopping, is written on its own."""
        ran = run_step_function(claim)
        if self._stop.is_set() or not ran.succeeded:
            outcome = record_step(ran).outcome
            _log_attempt(claim, outcome)
            return None
        output_of = one_step_output(claim.run_workflow, claim.step_name)
        if output_of is not None:
            # Where the next unit is a step (steps are what is due), the write claims it too.
            if not self._stop.is_set() and self._steps_first(on_steps=True):
                outcome, following = record_alone(
                    ran, output_of, next_step=(self.step_lease_ttl, self.queues)
                )
            else:
                outcome, following = record_alone(ran, output_of, chain=self._may_chain())
            _log_attempt(claim, outcome)
            self._claimed_here.on_steps = following is None
            if following is not None:
                self.wake.wake_if_waiting()  # there may be more: an idle thread looks too
            return following
        try:
            picked = WorkflowRun.objects.db_manager(alias).take_pass(
                claim.run_id, run_lease_ttl(), new_holder()
            )
        except db.DATABASE_FAULTS:
            # The unit of work ends, but not the result this thread holds: written on its
            # own (fenced; its run asked for a pass), as an interrupted pass writes one.
            with contextlib.suppress(*db.DATABASE_FAULTS):
                record_step(ran)
            raise
        driver = self._driver(claim.run_id, picked, chain=self._may_chain())
        logger.debug("Run %s: after its step, %s", claim.run_id, driver.drive(carrying=ran))
        if driver.next_pass is None:
            self._claimed_here.on_steps = True
        return driver.next_pass

    def _drive_following(self, following: PassClaim | None) -> None:
        """Drive the runs that completions picked, one after another (see :meth:`work_once`)."""
        while following is not None:
            driver = self._driver(following.run_id, following, chain=self._may_chain())
            logger.debug("Run %s: pass %s", following.run_id, driver.drive())
            following = driver.next_pass

    def _may_chain(self) -> bool:
        """Whether a completion may pick the next pass: not stopping, and no look for due
        steps is due (see :meth:`work_once`)."""
        with self._lock:
            return not self._stop.is_set() and time.monotonic() < self._steps_first_at

    def _driver(
        self, run_id: uuid.UUID, picked: PassClaim | None = None, *, chain: bool = False
    ) -> RunDriver:
        return RunDriver(
            run_id,
            using=self.alias,
            step_lease_ttl=self.step_lease_ttl,
            keep_going=self._keep_going,
            picked=picked,
            chain=chain,
            queues=self.queues,
        )

    def _thread_main(self, once: bool) -> None:
        try:
            self._loop(once)
        except BaseException:
            # Never silent: the worker stops and run() reports the death in its exit status.
            name = threading.current_thread().name
            logger.critical(
                "Workflow worker thread %s died; stopping the worker", name, exc_info=True
            )
            with self._lock:
                self._died.append(name)
            self.stop()
        finally:
            aio.close_thread_loop()
            db.close_thread_connections()

    def _loop(self, once: bool) -> None:
        failures = 0
        while not self._stop.is_set():
            with self._lock:
                self._busy += 1
                seen = self._progress
            failed = False
            did = False
            try:
                close_old_connections()
                did = self.work_once()
                failures = 0
            except BaseException as exc:
                # Whatever a unit of work raises (SystemExit from user code included)
                # is logged and the thread carries on: it must not die from it.
                failed = True
                failures += 1
                if failures > 1:
                    # The streak's first failure had its traceback; a database that stays
                    # away would otherwise fill the log with one per thread and backoff.
                    logger.warning(
                        "Workflow worker: a unit of work failed again (%d in a row: %s: %s); "
                        "backing off %.1f s",
                        failures,
                        type(exc).__name__,
                        " ".join(str(exc).split()),
                        _backoff(failures),
                    )
                elif db.refused_as_read_only(exc):
                    # Not a fault of the work: the database turned read-only (a failover
                    # demoted it, a standby behind the address). Said in one line.
                    logger.error(
                        "Workflow worker: database %r refuses writes (%s): a standby or a "
                        "read-only session behind its address? Backing off",
                        self.alias,
                        str(exc).strip(),
                    )
                else:
                    logger.exception("Workflow worker: a unit of work failed; backing off")
                db.close_thread_connections()
            finally:
                try:
                    close_old_connections()
                except Exception:
                    db.close_thread_connections()
            with self._lock:
                self._busy -= 1
                if did:
                    self._progress += 1
                # Quiet: no thread works on a unit it claimed, and none finished one since
                # this look began. Threads that are only looking do not count: several of
                # them, each slow to look (waiting for a lock other workers hold), would
                # otherwise overlap for ever and keep a draining worker from ever ending.
                quiet = self._working == 0 and self._progress == seen
            if did:
                # There may be more: let an idle thread look too (a burst fans out).
                self.wake.wake_if_waiting()
            if once and not did and not failed and quiet and self._is_drained(seen):
                self._stop_drained()
            if failed:
                if once and failures >= ONCE_MAX_FAILURES:
                    self._gave_up = True
                    self.stop()
                    break
                self._stop.wait(_backoff(failures))
            elif not did:
                self.wake.wait(min(self.poll_interval, 0.05) if once else self.poll_interval)

    def _is_drained(self, seen: int) -> bool:
        """No thread works on a claimed unit, nothing finished since the look that found
        nothing began, and nothing is due soon: ``once`` mode stops. A thread still looking
        finds nothing due, or claims what became due since and finishes it as a stopping
        worker does; once every thread has ended, :meth:`_left_work_behind` sends the worker
        round again if that left work due."""
        alias = self.alias
        try:
            soon = WorkflowRun.objects.db_manager(alias).work_due_within(ONCE_HORIZON)
        except Exception:
            logger.warning("Workflow worker: could not look for work due soon", exc_info=True)
            db.close_thread_connections()
            return False
        with self._lock:
            return not soon and self._working == 0 and self._progress == seen


def _backoff(failures: int) -> float:
    """Seconds a worker thread waits after ``failures`` failed units in a row: from
    :data:`FAILURE_BACKOFF`, doubling, at most :data:`MAX_BACKOFF`."""
    return float(min(FAILURE_BACKOFF * 2 ** min(failures - 1, 10), MAX_BACKOFF))


__all__ = ["EXIT_ABANDONED", "EXIT_DATABASE_UNREACHABLE", "EXIT_THREAD_DIED", "Worker"]

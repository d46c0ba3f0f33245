"""The failover scenario: holders take leases and make fenced writes through a libpq
multi-host URL while the primary is SIGKILLed and its streaming standby promoted.

Used by ``tests/test_failover.py`` (one run per mode, asserting what
``docs/operations/replication.md`` promises) and by ``bench/failover.py`` (several runs per
mode, the figures of that page's table).

A run (:func:`run_failover`):

1. a primary and a standby made with ``pg_basebackup`` (:mod:`tests.pgcluster`), the standby
   asynchronous or, with ``synchronous``, named in ``synchronous_standby_names``
   (``synchronous_commit`` as given); the lease table and the lease functions of both the
   previous and this release installed (0017's and the latest lease functions migration's);
2. ``holders`` threads, each on its own connection through
   ``host=127.0.0.1,127.0.0.1 port=<primary>,<standby> target_session_attrs=read-write``, loop:
   acquire one of ``keys`` keys under a fresh holder name, write the grant's token to an
   external compare-and-set store (:class:`ExternalStore`, outside the cluster: it survives
   the failover, as a storage service or another database would), write a row in the cluster
   inside ``Lease.objects.fenced()`` (the acknowledged writes), release;
3. once ``grants`` grants were acknowledged, the primary's WAL senders are stopped (SIGSTOP):
   the standby receives nothing more. Asynchronous: the primary goes on acknowledging; the
   scenario waits for ``grants`` more. Synchronous: commits wait for the standby; the
   scenario waits until every holder waits so (``SyncRep``);
4. the whole primary is SIGKILLed and the standby promoted (``pg_promote``); the holders
   reconnect through the same URL and go on until ``grants`` grants were acknowledged by the
   promoted server;
5. the figures: tokens issued twice (one key and token granted to two holders), tokens below
   an earlier grant (a grant whose token is below one acknowledged before it was asked for),
   acknowledged writes lost (rows whose commit a holder saw succeed, missing on the promoted
   server), and writes from two holders under one token accepted by the external store.

Beside the holders, ``steppers`` worker threads claim the due steps of one workflow run
(``WorkflowStep.objects.claim_due``, the tuned statement) through the same URL, "run" each
by writing its fence token (``ctx.fence.token``: the attempt above the claim's epoch floor)
to another external store under the step's key, and record its result. Their figures: step
attempts run twice (one step and attempt executed by two workers: a claim the promoted
server never received is granted again), step fence tokens issued twice (one step and token
executed by two workers), and acknowledged step results lost.

Nothing is timed: each phase waits for what it needs (grants acknowledged, holders waiting)
with generous timeouts. ``epoch=False`` makes the holders call the previous release's acquire
function (tokens without epochs) and the steppers' claims read no epoch floor (fence tokens
are bare attempt numbers, as before this release), for the "before" figures.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from django.db import DatabaseError, connections

from tests.pgcluster import Cluster, Clusters

#: The workflow (and step function) name of the steppers' run.
STEPS_WORKFLOW = "failover.steps"

#: The previous release's acquire function (migration 0017): tokens without epochs.
PREVIOUS_ACQUIRE = "dl_lease_acquire_f76a713eb454"


@dataclass(frozen=True)
class Grant:
    """One acknowledged grant: ``asked`` and ``answered`` are ``time.monotonic()``."""

    key: str
    token: int
    holder: str
    asked: float
    answered: float


@dataclass(frozen=True)
class Execution:
    """One step attempt a stepper ran: its fence ``token`` and who ran it."""

    step_id: int
    attempt: int
    token: int
    executor: str
    claimed: float


class ExternalStore:
    """A compare-and-set store outside the cluster: a write under ``token`` is taken when no
    higher token wrote to its key before (the usual fence of a storage service)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._highest: dict[str, int] = {}
        self.accepted: list[tuple[str, int, str]] = []
        self.refused = 0

    def write(self, key: str, token: int, holder: str) -> bool:
        """Take the write of ``holder`` under ``token`` on ``key``, or refuse it."""
        with self._lock:
            if token < self._highest.get(key, 0):
                self.refused += 1
                return False
            self._highest[key] = token
            self.accepted.append((key, token, holder))
            return True


def _named_twice(pairs: Iterable[tuple[Hashable, str]]) -> int:
    """How many of the things in ``(thing, who)`` pairs more than one ``who`` names."""
    names: dict[Hashable, set[str]] = defaultdict(set)
    for thing, who in pairs:
        names[thing].add(who)
    return sum(len(who) > 1 for who in names.values())


@dataclass
class Outcome:
    """What one run saw. The figures are properties."""

    synchronous: bool
    epoch: bool
    grants: list[Grant] = field(default_factory=list)
    acknowledged: list[tuple[str, int, str]] = field(default_factory=list)
    surviving: set[tuple[str, int, str]] = field(default_factory=set)
    store: ExternalStore = field(default_factory=ExternalStore)
    failed_calls: int = 0
    #: ``time.monotonic()`` when the WAL senders were stopped, the primary killed, and the
    #: promotion returned.
    cut_at: float = 0.0
    killed_at: float = 0.0
    promoted_at: float = 0.0
    #: Holders waiting for the synchronous standby when the primary was killed.
    waiting_at_kill: int = 0
    #: ``db.replication()``'s warning on the primary before the failover (``None``: none).
    warning: str | None = None
    #: The promoted server's timeline.
    timeline: int = 0
    seconds: float = 0.0
    #: What ``observe`` returned, by phase (``"before"``, ``"after"``).
    observed: dict[str, Any] = field(default_factory=dict)
    #: The steppers' executions, the step results they saw recorded (``(step id, attempt,
    #: stepper)``), the results the promoted server has, and their external store.
    executions: list[Execution] = field(default_factory=list)
    results: list[tuple[int, int, str]] = field(default_factory=list)
    surviving_results: set[tuple[int, int, str]] = field(default_factory=set)
    step_store: ExternalStore = field(default_factory=ExternalStore)

    @property
    def steps_run_twice(self) -> int:
        """Step attempts (step and attempt number) executed by more than one stepper."""
        return _named_twice(((e.step_id, e.attempt), e.executor) for e in self.executions)

    @property
    def step_tokens_issued_twice(self) -> int:
        """Step fence tokens (step and token) executed by more than one stepper."""
        return _named_twice(((e.step_id, e.token), e.executor) for e in self.executions)

    @property
    def step_results_lost(self) -> int:
        """Step results a stepper saw recorded, missing on the promoted server."""
        return sum(result not in self.surviving_results for result in self.results)

    @property
    def tokens_issued_twice(self) -> int:
        """Keys and tokens granted to more than one holder."""
        return _named_twice(((g.key, g.token), g.holder) for g in self.grants)

    @property
    def tokens_below_an_earlier_grant(self) -> int:
        """Grants whose token is below a token of the same key acknowledged before they were
        asked for."""
        below = 0
        by_key: dict[str, list[Grant]] = defaultdict(list)
        for grant in self.grants:
            by_key[grant.key].append(grant)
        for grants in by_key.values():
            answered = sorted(grants, key=lambda g: g.answered)
            for grant in grants:
                earlier = [g.token for g in answered if g.answered < grant.asked]
                if earlier and grant.token < max(earlier):
                    below += 1
        return below

    @property
    def acknowledged_writes_lost(self) -> int:
        """Fenced writes whose commit a holder saw succeed, missing on the promoted server."""
        return sum(write not in self.surviving for write in self.acknowledged)

    @property
    def store_writes_under_a_shared_token(self) -> int:
        """Keys and tokens under which the external store took writes of two holders."""
        return _named_twice(((key, token), holder) for key, token, holder in self.store.accepted)

    def after_promotion(self) -> list[Grant]:
        """The grants asked for once the promotion had returned."""
        return [g for g in self.grants if g.asked >= self.promoted_at]

    def before_cut(self) -> list[Grant]:
        """The grants answered before the WAL senders were stopped."""
        return [g for g in self.grants if g.answered < self.cut_at]

    def figures(self) -> dict[str, Any]:
        """The figures as JSON-ready data."""
        return {
            "synchronous": self.synchronous,
            "epoch": self.epoch,
            "grants": len(self.grants),
            "grants_after_promotion": len(self.after_promotion()),
            "acknowledged_writes": len(self.acknowledged),
            "tokens_issued_twice": self.tokens_issued_twice,
            "tokens_below_an_earlier_grant": self.tokens_below_an_earlier_grant,
            "acknowledged_writes_lost": self.acknowledged_writes_lost,
            "store_writes_under_a_shared_token": self.store_writes_under_a_shared_token,
            "store_writes_refused": self.store.refused,
            "failed_calls": self.failed_calls,
            "step_executions": len(self.executions),
            "step_results": len(self.results),
            "steps_run_twice": self.steps_run_twice,
            "step_tokens_issued_twice": self.step_tokens_issued_twice,
            "step_results_lost": self.step_results_lost,
            "step_store_writes_under_a_shared_token": _named_twice(
                ((key, token), who) for key, token, who in self.step_store.accepted
            ),
            "step_store_writes_refused": self.step_store.refused,
            "waiting_at_kill": self.waiting_at_kill,
            "timeline": self.timeline,
            "seconds": round(self.seconds, 1),
        }


@contextlib.contextmanager
def database_alias(alias: str, hosts: list[Cluster], dbname: str) -> Iterator[str]:
    """A Django database alias ``alias`` for ``hosts`` (a libpq multi-host URL with
    ``target_session_attrs=read-write``), PostgreSQL like ``default``; removed on exit."""
    base = dict(connections["default"].settings_dict)
    base.update(
        NAME=dbname,
        USER="postgres",
        PASSWORD="",
        HOST=",".join("127.0.0.1" for _ in hosts),
        PORT=",".join(str(c.port) for c in hosts),
        OPTIONS={"target_session_attrs": "read-write", "connect_timeout": 5},
        CONN_MAX_AGE=0,
        TEST={},
    )
    connections.settings[alias] = base
    try:
        yield alias
    finally:
        with contextlib.suppress(Exception):
            connections[alias].close()
        del connections.settings[alias]
        with contextlib.suppress(AttributeError):
            delattr(connections._connections, alias)  # type: ignore[attr-defined]


def install_schema(alias: str, steps: int = 0) -> None:
    """The app's tables, the lease functions of 0017 and of the latest lease functions
    migration, the workflow functions, and the fenced writes' table, on ``alias``; with
    ``steps``, one running workflow run with that many due steps."""
    from django.apps import apps

    from django_leases import health
    from django_leases.clock import DbNow
    from django_leases.models import WorkflowRun, WorkflowStep, WorkflowStepAttempt
    from django_leases.models.lease import LEASE_FUNCTIONS_MIGRATION

    connection = connections[alias]
    with connection.schema_editor() as editor:
        for model in apps.get_app_config("django_leases").get_models():
            if model._meta.managed and not model._meta.proxy:
                editor.create_model(model)
        # The column 0039 keeps in the table for a release (the model has forgotten it;
        # the functions still clear it): the tables as the migrations leave them.
        editor.execute(
            f"ALTER TABLE {WorkflowStepAttempt._meta.db_table} ADD COLUMN result jsonb NULL"
        )
        for name in ("0017_lease_functions", LEASE_FUNCTIONS_MIGRATION):
            module = importlib.import_module(f"django_leases.migrations.{name}")
            for statement in module.LEASE_FUNCTIONS.values():
                editor.execute(statement)
        editor.execute(
            "CREATE TABLE failover_write (id bigserial PRIMARY KEY, key text NOT NULL, "
            "token bigint NOT NULL, holder text NOT NULL)"
        )
    health.install_functions(connection)
    if steps:
        run = WorkflowRun.objects.db_manager(alias).start(STEPS_WORKFLOW, {})
        made = WorkflowStep.objects.db_manager(alias)
        made.bulk_create(
            WorkflowStep(run=run, step_name=f"s{n}", function_name=STEPS_WORKFLOW)
            for n in range(steps)
        )
        made.filter(run=run).update(available_at=DbNow())  # due (as schedule() makes them)
    connection.close()


def _wait(what: str, predicate: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.01)


class _Holders:
    """The holder threads of one run."""

    role = "holder"

    def __init__(self, alias: str, outcome: Outcome, count: int, keys: list[str], ttl: float):
        self.alias = alias
        self.outcome = outcome
        self.keys = keys
        self.ttl = ttl
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(
                target=self._run, args=(n,), name=f"failover-{self.role}-{n}", daemon=True
            )
            for n in range(count)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
            assert not thread.is_alive(), f"{thread.name} hung"

    def _failed(self) -> None:
        with self.lock:
            self.outcome.failed_calls += 1
        with contextlib.suppress(Exception):
            connections[self.alias].close()
        time.sleep(0.02)  # back-off before the next try (the server may be starting)

    def _run(self, number: int) -> None:
        from django_leases.exceptions import LeaseLostError
        from django_leases.models import Lease

        leases = Lease.objects.db_manager(self.alias)
        rng = random.Random(number)
        made = 0
        try:
            while not self.stop.is_set():
                key = rng.choice(self.keys)
                made += 1
                holder = f"holder-{number}:{made}"
                asked = time.monotonic()
                try:
                    lease = leases.acquire(key, holder, self.ttl)
                except DatabaseError:
                    self._failed()
                    continue
                answered = time.monotonic()
                if lease is None:
                    time.sleep(0.002)
                    continue
                with self.lock:
                    self.outcome.grants.append(Grant(key, lease.token, holder, asked, answered))
                self.outcome.store.write(key, lease.token, holder)
                try:
                    with leases.fenced(lease), connections[self.alias].cursor() as cursor:
                        cursor.execute(
                            "INSERT INTO failover_write (key, token, holder) VALUES (%s, %s, %s)",
                            [key, lease.token, holder],
                        )
                    with self.lock:
                        self.outcome.acknowledged.append((key, lease.token, holder))
                except LeaseLostError:
                    pass
                except DatabaseError:
                    self._failed()
                    continue
                try:
                    leases.release(lease)
                except DatabaseError:
                    self._failed()
        finally:
            connections[self.alias].close()

    def acknowledged_since(self, moment: float) -> int:
        with self.lock:
            return sum(g.answered >= moment for g in self.outcome.grants)


class _Steppers(_Holders):
    """The stepper threads of one run: each claims a due step, writes its fence token to
    the steps' external store, records its result, and goes on after a short pause (so the
    run's steps last the whole failover)."""

    role = "stepper"

    def _run(self, number: int) -> None:
        from django_leases.exceptions import WorkflowStepSupersededError
        from django_leases.fencing import step_fence
        from django_leases.models import WorkflowStep

        steps = WorkflowStep.objects.db_manager(self.alias)
        executor = f"stepper-{number}"
        try:
            while not self.stop.is_set():
                try:
                    claim = steps.claim_due(self.ttl)
                except DatabaseError:
                    self._failed()
                    continue
                if claim is None:
                    time.sleep(0.01)
                    continue
                # What a step function does with ctx.fence: its token, sent outside.
                fence = step_fence(
                    claim.step_id, claim.attempt, using=self.alias, floor=claim.fence_floor
                )
                ran = Execution(
                    claim.step_id, claim.attempt, fence.token, executor, time.monotonic()
                )
                with self.lock:
                    self.outcome.executions.append(ran)
                self.outcome.step_store.write(f"step:{claim.step_id}", fence.token, executor)
                try:
                    steps.set_result(claim.step_id, executor, claim.attempt)
                except WorkflowStepSupersededError:
                    continue
                except DatabaseError:
                    self._failed()
                    continue
                with self.lock:
                    self.outcome.results.append((claim.step_id, claim.attempt, executor))
                time.sleep(0.005)
        finally:
            connections[self.alias].close()

    def executed_since(self, moment: float) -> int:
        with self.lock:
            return sum(e.claimed >= moment for e in self.outcome.executions)


def _waiting(primary: Cluster) -> tuple[int, int]:
    """How many backends of the holders wait for the synchronous standby to confirm their
    commit, and how many wait for them (a row lock: a transaction waiting to be confirmed
    keeps its locks, and is invisible to others until it is)."""
    rows = primary.execute(
        "SELECT count(*) FILTER (WHERE wait_event = 'SyncRep'), "
        "count(*) FILTER (WHERE wait_event_type = 'Lock') "
        "FROM pg_stat_activity WHERE datname = 'failover' AND pid <> pg_backend_pid()",
        dbname="postgres",
    )
    return int(rows[0][0]), int(rows[0][1])


def run_failover(
    clusters: Clusters,
    *,
    synchronous: bool,
    epoch: bool = True,
    commit: str = "on",
    holders: int = 4,
    keys: int = 3,
    ttl: float = 2.0,
    grants: int = 30,
    name: str = "",
    patience: float = 120.0,
    observe: Callable[[str, str], Any] | None = None,
    steppers: int = 2,
    steps: int = 5000,
) -> Outcome:
    """One failover (module docstring); returns its :class:`Outcome`.

    Args:
        clusters: where to make the primary and the standby.
        synchronous: the standby is synchronous (``synchronous_standby_names``), with
            ``synchronous_commit = commit``; else asynchronous.
        epoch: the holders call this release's acquire (tokens with epochs); ``False``: the
            previous release's (:data:`PREVIOUS_ACQUIRE`).
        holders: holder threads; ``keys``: lease keys they share; ``ttl``: lease TTL, s.
        grants: acknowledged grants each phase waits for (before the cut, during it when
            asynchronous, after the promotion).
        name: a suffix for the clusters' names (several runs in one :class:`Clusters`).
        patience: seconds any phase may take before the run fails.
        observe: called as ``observe(phase, alias)`` with the multi-host alias once the
            standby streams (``"before"``, no holder started yet) and once the holders have
            stopped after the promotion (``"after"``); what it returns is kept in
            :attr:`Outcome.observed`.
        steppers: stepper threads (0: none); ``steps``: the due steps they share. Each phase
            also waits for ``grants`` of their executions (none before the cut).
    """
    from django_leases import db
    from django_leases.models import WorkflowStep, workflow_base
    from django_leases.models import lease as lease_module

    started = time.monotonic()
    outcome = Outcome(synchronous=synchronous, epoch=epoch)
    standby_name = f"standby{name}"
    primary = clusters.primary(f"primary{name}").start()
    primary.execute("CREATE DATABASE failover")
    with database_alias(f"failover-setup{name}", [primary], "failover") as setup:
        install_schema(setup, steps if steppers else 0)
    standby = clusters.standby_of(primary, standby_name).start()
    if synchronous:  # once the standby exists: until then every commit would wait for it
        primary.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{standby_name}'")
        primary.execute(f"ALTER SYSTEM SET synchronous_commit = '{commit}'")
        primary.execute("SELECT pg_reload_conf()")
    wanted = "sync" if synchronous else "async"
    _wait(
        f"the standby streaming ({wanted})",
        lambda: primary.execute(
            "SELECT 1 FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = %s",
            [wanted],
        ),
        patience,
    )
    replaced = contextlib.ExitStack()
    if not epoch:
        replaced.enter_context(
            mock.patch.object(
                lease_module, "PG_ACQUIRE", f"SELECT * FROM {PREVIOUS_ACQUIRE}(%s, %s, %s)"
            )
        )
        # Claims without the epoch floor (tuned and portable): a step's fence token is its
        # bare attempt number.
        for module in (workflow_base, lease_module):
            replaced.enter_context(mock.patch.object(module, "epoch_floor_sql", lambda c: None))
        replaced.callback(workflow_base._calls.clear)
    workflow_base._calls.clear()
    with database_alias(f"failover{name}", [primary, standby], "failover") as alias, replaced:
        state = db.replication(connections[alias])
        outcome.warning = None if state is None else state.warning()
        if observe is not None:
            outcome.observed["before"] = observe("before", alias)
        connections[alias].close()
        team = _Holders(alias, outcome, holders, [f"failover:{n}" for n in range(keys)], ttl)
        stepping = _Steppers(alias, outcome, steppers, [], ttl)
        team.start()
        stepping.start()

        def stepped(since: float) -> bool:
            return not steppers or stepping.executed_since(since) >= grants

        try:
            _wait(f"{grants} grants", lambda: team.acknowledged_since(0.0) >= grants, patience)
            senders = primary.walsender_pids()
            assert senders, "no WAL sender to stop"
            for pid in senders:
                os.kill(pid, signal.SIGSTOP)
            outcome.cut_at = time.monotonic()
            if synchronous:

                def all_waiting() -> int:
                    confirming, locked = _waiting(primary)
                    return confirming if confirming and confirming + locked >= holders else 0

                outcome.waiting_at_kill = _wait(
                    "every holder waiting for the synchronous standby", all_waiting, patience
                )
            else:
                _wait(
                    f"{grants} grants and step executions the standby never received",
                    lambda: (
                        team.acknowledged_since(outcome.cut_at) >= grants
                        and stepped(outcome.cut_at)
                    ),
                    patience,
                )
            primary.kill()
            outcome.killed_at = time.monotonic()
            standby.promote()
            outcome.promoted_at = time.monotonic()
            _wait(
                f"{grants} grants and step executions after the promotion",
                lambda: (
                    team.acknowledged_since(outcome.promoted_at) >= grants
                    and stepped(outcome.promoted_at)
                ),
                patience,
            )
        finally:
            if primary.process is not None and primary.process.poll() is None:
                primary.kill()  # a phase failed: end the holders' calls waiting on it
            team.finish()
            stepping.finish()
        if observe is not None:
            outcome.observed["after"] = observe("after", alias)
    rows = standby.execute("SELECT key, token, holder FROM failover_write", dbname="failover")
    outcome.surviving = {(str(k), int(t), str(h)) for k, t, h in rows}
    rows = standby.execute(
        f"SELECT id, attempt, result #>> '{{}}' FROM {WorkflowStep._meta.db_table} "
        "WHERE status = 'succeeded'",
        dbname="failover",
    )
    outcome.surviving_results = {(int(i), int(a), str(r)) for i, a, r in rows}
    (timeline,) = standby.execute(
        "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"
    )[0]
    outcome.timeline = int(timeline)
    outcome.seconds = time.monotonic() - started
    standby.stop()
    return outcome


def summary(outcomes: list[Outcome]) -> Counter[str]:
    """The figures of several runs, summed."""
    total: Counter[str] = Counter()
    for outcome in outcomes:
        for name, value in outcome.figures().items():
            if isinstance(value, int) and not isinstance(value, bool):
                total[name] += value
    return total

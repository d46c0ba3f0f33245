"""Schedules at the edges: daylight-saving changes (the hour lived twice in autumn, read in
its second pass; the hour skipped in spring), declarations the database cannot store, racing
firings on every backend, pause and resume with a waiting tick (docs/howto/schedules.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, models
from django.db.models import Value
from django.db.models.functions import Cast

from django_leases.clock import DbNow, to_aware, to_stored
from django_leases.models import WorkflowRun, WorkflowSchedule
from django_leases.models import schedule as schedule_module
from django_leases.workflows.schedules import (
    MAX_CRON_LENGTH,
    declaration,
    latest_tick,
    next_tick,
    run_key,
    ticks_between,
)
from django_leases.workflows.values import RunStatus
from tests.helpers import race
from tests.test_schedule_overlap import WORKFLOW, clock, noop  # noqa: F401  (noop: a fixture)

#: Every test here may start runs of WORKFLOW: the fixture registers it.
pytestmark = pytest.mark.usefixtures("noop")

BERLIN = "Europe/Berlin"


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


@pytest.fixture
def fake_db_clock(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make the schedule store read "database now" as a fixed instant (set by calling the
    returned function): every ``DbNow()`` of django_leases.models.schedule becomes that
    literal. Only the schedules' own clock reads are replaced."""
    state: dict[str, datetime] = {}

    def fake() -> Any:
        # Cast: MariaDB hands a bare parameter back as text.
        stored = Value(to_stored(state["now"], connection.alias))
        return Cast(stored, output_field=models.DateTimeField())

    monkeypatch.setattr(schedule_module, "DbNow", fake)

    def set_now(moment: datetime) -> None:
        state["now"] = moment

    return set_now


def row_of(name: str) -> WorkflowSchedule:
    return WorkflowSchedule.objects.get(name=name)


def keys_of(name: str) -> list[str]:
    return sorted(
        WorkflowRun.objects.filter(key__startswith=f"schedule:{name}:").values_list(
            "key", flat=True
        )
    )


# -- the repeated autumn hour -------------------------------------------------------------------

# (zone, daily cron, an instant in the *second* pass of the repeated hour, before the cron's
# minute there). Each day's tick ran in the first pass; the next tick is the next day's.
SECOND_PASS = [
    (BERLIN, "30 2 * * *", utc(2026, 10, 25, 1, 5)),  # 02:05 CET (second 02:05)
    ("America/New_York", "30 1 * * *", utc(2026, 11, 1, 6, 5)),  # 01:05 EST
    ("Australia/Lord_Howe", "45 1 * * *", utc(2026, 4, 4, 15, 5)),  # 01:35 LHST (half hour)
    ("America/Sao_Paulo", "30 23 * * *", utc(2019, 2, 17, 2, 5)),  # 23:05, midnight change
    ("America/Santiago", "30 23 * * *", utc(2026, 4, 5, 3, 5)),  # 23:05, midnight change
]


@pytest.mark.parametrize(("zone", "cron", "after"), SECOND_PASS)
def test_next_tick_is_strictly_after_in_the_second_pass_of_a_repeated_hour(
    zone: str, cron: str, after: datetime
) -> None:
    # next_tick() promises "the first tick strictly after `after`".
    tick = next_tick(cron, zone, after)
    assert tick is not None and tick > after, (zone, cron, after, tick)


@pytest.mark.parametrize(("zone", "cron", "at"), SECOND_PASS)
def test_latest_tick_in_the_second_pass_of_a_repeated_hour_is_today_s(
    zone: str, cron: str, at: datetime
) -> None:
    # latest_tick() promises "the last tick at or before `at`": that day's tick (in the first
    # pass of the hour), not the previous day's.
    tick = latest_tick(cron, zone, at)
    assert tick is not None and at - tick < timedelta(hours=2), (zone, cron, at, tick)


@pytest.mark.parametrize(("zone", "cron", "after"), SECOND_PASS)
def test_a_backfill_window_starting_in_the_repeated_hour_holds_no_earlier_tick(
    zone: str, cron: str, after: datetime
) -> None:
    # "Every tick of the window from --start (included) to --end (excluded)".
    ticks = ticks_between(cron, zone, after, after + timedelta(days=2))
    assert ticks and all(tick >= after for tick in ticks), ticks


@pytest.mark.django_db(transaction=True)
def test_catch_up_in_the_repeated_autumn_hour_runs_once_and_moves_on(fake_db_clock: Any) -> None:
    # Workers down over Berlin's 02:30 CEST on the fall-back day, back at 02:05 CET (the
    # second pass of the hour). Docs: catch_up "latest" starts ONE run for the latest due
    # tick; the schedule then waits for its next tick (the next day's 02:30).
    tick = utc(2026, 10, 25, 0, 30)
    yesterday = utc(2026, 10, 24, 0, 30)  # fired on time the day before
    WorkflowRun.objects.start(WORKFLOW, {}, key=run_key("fallback", yesterday))
    WorkflowSchedule.objects.create(
        name="fallback",
        workflow=WORKFLOW,
        cron="30 2 * * *",
        timezone=BERLIN,
        overlap="allow",
        next_tick=to_stored(tick, connection.alias),
    )
    now = utc(2026, 10, 25, 1, 5)
    fake_db_clock(now)
    fired = WorkflowSchedule.objects.fire_due()
    # Today's 02:30 gets its run (not "yesterday's tick again", which had its run already).
    assert keys_of("fallback") == [run_key("fallback", yesterday), run_key("fallback", tick)]
    row = row_of("fallback")
    assert to_aware(row.next_tick, "default") == utc(2026, 10, 26, 1, 30), row.next_tick
    # One firing, not a loop of MAX_ROUNDS firings of the same past tick.
    assert len(fired) == 1, [(f.action, f.tick) for f in fired]
    assert WorkflowSchedule.objects.fire_due() == []


@pytest.mark.django_db(transaction=True)
def test_catch_up_none_in_the_repeated_hour_counts_skipped_ticks_once(fake_db_clock: Any) -> None:
    tick = utc(2026, 10, 25, 0, 30)
    WorkflowSchedule.objects.create(
        name="fallback-none",
        workflow=WORKFLOW,
        cron="30 2 * * *",
        timezone=BERLIN,
        catch_up="none",
        overlap="allow",
        next_tick=to_stored(tick, connection.alias),
    )
    fake_db_clock(utc(2026, 10, 25, 1, 5))
    fired = WorkflowSchedule.objects.fire_due()
    row = row_of("fallback-none")
    assert len(fired) == 1 and fired[0].action == "missed", len(fired)
    assert row.skipped_ticks == 1, row.skipped_ticks
    assert to_aware(row.next_tick, "default") == utc(2026, 10, 26, 1, 30)


@pytest.mark.django_db(transaction=True)
def test_a_schedule_created_in_the_repeated_hour_counts_from_the_next_tick_after_now(
    fake_db_clock: Any,
) -> None:
    # Docs: "A new schedule ... counts from the next tick after now." Synced at 02:05 CET on
    # the fall-back day (after that day's 02:30 CEST passed), its first tick is tomorrow's.
    now = utc(2026, 10, 25, 1, 5)
    fake_db_clock(now)
    (row,) = WorkflowSchedule.objects.sync(
        [declaration("fresh-at-fallback", WORKFLOW, "30 2 * * *", timezone=BERLIN)]
    )
    assert row.next_tick is not None and to_aware(row.next_tick, "default") > now, row.next_tick
    # And firing at that moment starts nothing: the tick before the schedule existed never runs.
    assert WorkflowSchedule.objects.fire_due() == []
    assert keys_of("fresh-at-fallback") == []


@pytest.mark.django_db(transaction=True)
def test_a_schedule_resumed_in_the_repeated_hour_runs_no_tick_that_passed_while_paused(
    fake_db_clock: Any,
) -> None:
    # Docs: "Resuming counts from the next tick after now: ticks that passed while it was
    # paused never run."
    fake_db_clock(utc(2026, 10, 24, 12))
    WorkflowSchedule.objects.sync([declaration("resumed", WORKFLOW, "30 2 * * *", timezone=BERLIN)])
    WorkflowSchedule.objects.set_paused("resumed", True)
    now = utc(2026, 10, 25, 1, 5)  # 02:30 CEST passed while paused
    fake_db_clock(now)
    WorkflowSchedule.objects.set_paused("resumed", False)
    row = row_of("resumed")
    assert to_aware(row.next_tick, "default") > now, row.next_tick
    WorkflowSchedule.objects.fire_due()
    assert keys_of("resumed") == []


# -- the skipped spring hour --------------------------------------------------------------------


@pytest.mark.parametrize("cron", ["0,30 2 * * *", "0-59/30 2 * * *"])
def test_ticks_in_the_skipped_spring_hour_run_at_the_change(cron: str) -> None:
    """A tick in the hour skipped in spring runs at the change (03:00)."""
    ticks = ticks_between(cron, BERLIN, utc(2026, 3, 29, 0), utc(2026, 3, 29, 12))
    assert ticks == [utc(2026, 3, 29, 1)], ticks


def test_a_star_in_the_minute_field_does_not_tick_in_the_skipped_spring_hour() -> None:
    """``*/30 2 * * *`` counts as a frequent expression, as in Debian's cron (the docs say
    so): no tick in the skipped hour, none moved to the change; the next day's run as usual."""
    ticks = ticks_between("*/30 2 * * *", BERLIN, utc(2026, 3, 29, 0), utc(2026, 3, 30, 12))
    assert ticks == [utc(2026, 3, 30, 0), utc(2026, 3, 30, 0, 30)], ticks


def test_the_spring_change_catch_up_finds_the_moved_tick() -> None:
    # the latest tick at 03:00:30 CEST is the 02:30 moved to 03:00.
    assert latest_tick("30 2 * * *", BERLIN, utc(2026, 3, 29, 1, 0, 30)) == utc(2026, 3, 29, 1)


# -- declarations the database cannot store -----------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_cron_expression_longer_than_its_column_is_refused_at_declaration() -> None:
    """A valid expression cronsim reads, longer than the 200-character ``cron`` column: a
    ``ValueError`` when it is declared, never a ``DataError`` in the sync (one transaction
    for every schedule: one bad row would keep them all from syncing)."""
    cron = ",".join(["0"] * 120) + " * * * *"
    assert len(cron) > MAX_CRON_LENGTH
    with pytest.raises(ValueError, match=f"at most {MAX_CRON_LENGTH} characters"):
        declaration("long-cron", WORKFLOW, cron)
    # One of exactly the column's length is taken, and stored whole.
    exactly = ",".join(["0"] * 95) + ",10 * * * *"
    assert len(exactly) == MAX_CRON_LENGTH
    (row,) = WorkflowSchedule.objects.sync([declaration("long-cron", WORKFLOW, exactly)])
    assert WorkflowSchedule.objects.get(pk=row.pk).cron == exactly


# -- racing firings on every backend ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_threads_racing_fire_due_start_each_tick_once_on_every_backend() -> None:
    # Docs: "Safe to call from any number of threads and processes at once" (the suite's own
    # race test is PostgreSQL-only).
    first = clock().replace(microsecond=0) - timedelta(seconds=5)
    WorkflowSchedule.objects.create(
        name="raced-everywhere",
        workflow=WORKFLOW,
        cron="* * * * * *",
        overlap="allow",
        next_tick=to_stored(first, connection.alias),
    )
    outcomes = race([WorkflowSchedule.objects.fire_due] * 4)
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert not errors, errors
    ticks = [f.tick for outcome in outcomes for f in outcome if f.tick is not None]
    assert len(ticks) == len(set(ticks))
    keys = keys_of("raced-everywhere")
    starts = [datetime.fromisoformat(key.split(":", 2)[2]) for key in keys]
    assert starts == [first + timedelta(seconds=i) for i in range(len(starts))]


# -- pause and a waiting tick -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_paused_schedule_with_a_waiting_tick_starts_nothing_until_resumed() -> None:
    # held or not: a buffered tick must not start while paused.
    now = clock().replace(microsecond=0)
    live = WorkflowRun.objects.start(WORKFLOW, {}, key="previous")
    WorkflowSchedule.objects.create(
        name="buffered-paused",
        workflow=WORKFLOW,
        cron="0 3 * * *",
        overlap="buffer_one",
        next_tick=to_stored(now + timedelta(days=1), connection.alias),
        last_run_id=live.id,
        buffered_tick=to_stored(now - timedelta(seconds=5), connection.alias),
        paused=True,
    )
    WorkflowRun.objects.filter(pk=live.id).update(status=RunStatus.COMPLETED)
    assert WorkflowSchedule.objects.fire_due() == []
    assert keys_of("buffered-paused") == []


# -- an edit between a firing's read and its tick ------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_tick_taken_after_an_edit_committed_starts_the_edited_schedule() -> None:
    """A tick is taken by the guarded UPDATE that moves ``next_tick``; what it starts is read
    again under that lock. So an edit of the input (a deploy's ``sync``) committed between a
    worker's read of the due row and its firing is the input the tick's run gets, never the
    one read before the edit. The interleaving is made exact by firing a row read before the
    edit, as ``fire_due`` does between its read and ``_fire``."""
    alias = connection.alias
    WorkflowSchedule.objects.sync([declaration("edited", WORKFLOW, "* * * * * *", input={"v": 1})])
    WorkflowSchedule.objects.filter(name="edited").update(
        next_tick=to_stored(clock() - timedelta(seconds=1), alias)
    )
    stale = WorkflowSchedule.objects.filter(name="edited").annotate(db_now=DbNow()).get()
    WorkflowSchedule.objects.sync([declaration("edited", WORKFLOW, "* * * * * *", input={"v": 2})])
    fired = WorkflowSchedule.objects.all()._fire(alias, stale)
    assert fired is not None and fired.run_id is not None
    assert WorkflowRun.objects.get(pk=fired.run_id).input == {"v": 2}


@pytest.mark.django_db(transaction=True)
def test_a_buffered_tick_started_after_an_edit_committed_starts_the_edited_schedule() -> None:
    """The same for a waiting (``buffer_one``) tick: started once its previous run ended,
    with the input read under the row's lock, not the one read before an edit."""
    alias = connection.alias
    now = clock().replace(microsecond=0)
    WorkflowSchedule.objects.sync(
        [declaration("edited-buffer", WORKFLOW, "0 3 * * *", input={"v": 1}, overlap="buffer_one")]
    )
    WorkflowSchedule.objects.filter(name="edited-buffer").update(
        buffered_tick=to_stored(now - timedelta(seconds=5), alias)
    )
    stale = row_of("edited-buffer")
    WorkflowSchedule.objects.sync(
        [declaration("edited-buffer", WORKFLOW, "0 3 * * *", input={"v": 2}, overlap="buffer_one")]
    )
    fired = WorkflowSchedule.objects.all()._start_buffered(alias, stale, None)
    assert fired is not None and fired.run_id is not None
    assert WorkflowRun.objects.get(pk=fired.run_id).input == {"v": 2}


@pytest.mark.django_db(transaction=True)
def test_a_schedule_turned_task_between_read_and_tick_is_left_due() -> None:
    """``fire_due()`` without ``start_task`` leaves task schedules due for a caller that has
    one. A schedule turned into a task schedule (a deploy's ``sync``) after this caller read
    it, and before its tick was taken, is left due too: nothing started, nothing raised (the
    scheduler round of every worker without tasks would fail on it), ``next_tick`` kept."""
    alias = connection.alias
    due = clock().replace(microsecond=0) - timedelta(seconds=1)
    WorkflowSchedule.objects.sync([declaration("turns-task", WORKFLOW, "0 3 * * *")])
    WorkflowSchedule.objects.filter(name="turns-task").update(next_tick=to_stored(due, alias))
    stale = WorkflowSchedule.objects.filter(name="turns-task").annotate(db_now=DbNow()).get()
    WorkflowSchedule.objects.filter(name="turns-task").update(task="tests.workapp.tasks.add")
    assert WorkflowSchedule.objects.all()._fire(alias, stale) is None
    assert to_aware(row_of("turns-task").next_tick, alias) == due  # type: ignore[arg-type]
    assert keys_of("turns-task") == []


@pytest.mark.django_db(transaction=True)
def test_racing_syncs_all_return_the_rows() -> None:
    """Every worker process syncs the schedules on its first look, and ``workflow_schedules
    sync`` runs at each deploy: several processes starting together sync at once. Each
    call, made outside any transaction, returns the rows — never a deadlock (MariaDB's
    1213, which racing ``INSERT IGNORE``s of one name ended in) — and one row per name
    stands, whether the names are new or already there."""
    names = [f"synced-{n}" for n in range(5)]
    declared = [declaration(name, WORKFLOW, "0 0 1 1 *") for name in names]
    for round_ in range(4):  # new names, then rows already there
        outcomes = race([lambda: WorkflowSchedule.objects.sync(declared)] * 8)
        raised = [o for o in outcomes if isinstance(o, BaseException)]
        assert raised == [], f"round {round_}: {len(raised)} of 8 syncs raised {raised[0]!r}"
        assert all([row.name for row in o] == names for o in outcomes)
        assert WorkflowSchedule.objects.filter(name__in=names).count() == len(names)

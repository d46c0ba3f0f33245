"""A run's timeline: its steps' attempts and its waits as bars on one time axis (DESIGN §5c).

The run page draws it as server-rendered SVG (no JavaScript): one lane per step — a bar per
attempt, coloured by its outcome, a superseded attempt hatched and said so — and one lane per
wait (a sleep, an event wait, a child run, linked to the child's page), from when the run
reached it to when it was decided (or now). Times are the rows' (the database clock's);
the axis runs from the run's creation to its end (or now), with ticks at round offsets.

The geometry is pure: :func:`build` takes the run's rows as plain values (:class:`AttemptRow`,
:class:`WaitRow`) and returns a :class:`Timeline` of numbers and labels that the template
``django_leases/timeline.html`` turns into SVG; :func:`timeline_for` reads a run's rows through
the models' QuerySet methods and calls it. A run of 200 steps is 200 lanes of
:data:`LANE_HEIGHT` user units in a :data:`WIDTH`-unit wide drawing: it fits the run page of a
1280 px window across and scrolls down, never sideways.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import field
from datetime import datetime, timedelta

from django.db import router
from django.utils import timezone
from django.utils.translation import gettext, pgettext

from django_leases.clock import DbNow
from django_leases.frozen import frozen
from django_leases.models.wait import WorkflowWait
from django_leases.models.workflow import WorkflowRun, WorkflowStepAttempt

#: The drawing's width, in SVG user units (it scales to the page's width).
WIDTH = 900
#: Width of the lane labels (step and wait names) at the left.
LABEL_WIDTH = 170
#: Room at the right of the axis.
RIGHT_PAD = 12
#: Height of the axis with its tick labels, above the lanes.
AXIS_HEIGHT = 22
#: Height of one lane, and of the bars in it.
LANE_HEIGHT = 14
BAR_HEIGHT = 9
#: Height of the legend under the lanes.
LEGEND_HEIGHT = 26
#: A bar is drawn at least this wide, so an attempt of a millisecond is still seen.
MIN_BAR_WIDTH = 2.0
#: Lanes drawn at most; a run with more says how many were left out.
MAX_LANES = 1000
#: Characters of a lane's name shown; the whole name is in its tooltip.
NAME_SHOWN = 26

#: Round tick steps, seconds: the smallest giving at most :data:`MAX_TICKS` ticks is used.
TICK_STEPS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800,
    3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800, 2592000,
)  # fmt: skip
MAX_TICKS = 8


@frozen
class AttemptRow:
    """One attempt of a step, as the timeline reads it.

    Attributes:
        step_name: its step.
        attempt: its number (1, 2, …).
        status: ``running``, ``succeeded`` or ``failed`` (``WorkflowStepAttempt.status``).
        superseded: a later attempt of its step was claimed (its row still says running).
        started_at: when it was claimed.
        finished_at: when its result or error was written (``None``: not yet, or never).
    """

    step_name: str
    attempt: int
    status: str
    superseded: bool
    started_at: datetime
    finished_at: datetime | None = None


@frozen
class WaitRow:
    """One durable wait of the run, as the timeline reads it.

    Attributes:
        name: the wait's name.
        kind: ``sleep``, ``event`` or ``child``.
        status: ``waiting``, ``done`` or ``timed_out``.
        created_at: when the row was made (the run reached it, or an event came early).
        reached_at: when the run reached it (``None``: an event sent before it did).
        done_at: when it was decided.
        due_at: a sleep's end, or an event's timeout.
        child_id: a child wait's child run.
    """

    name: str
    kind: str
    status: str
    created_at: datetime
    reached_at: datetime | None = None
    done_at: datetime | None = None
    due_at: datetime | None = None
    child_id: uuid.UUID | None = None


@frozen
class Bar:
    """A bar on a lane: ``x`` and ``width`` in user units; ``state`` picks its colour (a CSS
    class ``dl-tl-<state>``); ``tooltip`` says what and when; ``child_id`` links a child's."""

    x: float
    width: float
    state: str
    tooltip: str
    child_id: uuid.UUID | None = None


@frozen
class Lane:
    """One row of the drawing: ``kind`` ``step`` or a wait's kind, its ``name`` (shown cut
    to :data:`NAME_SHOWN` characters in ``label``), its bars, and ``y`` (the bars' top)."""

    kind: str
    name: str
    label: str
    y: float
    bars: tuple[Bar, ...]
    marker_x: float | None = None  # a sleep's end or an event's timeout, still ahead

    @property
    def text_y(self) -> float:
        """The baseline of the lane's label, level with its bars."""
        return self.y + BAR_HEIGHT - 1

    @property
    def bottom(self) -> float:
        """The bottom of the bars (where a marker line ends)."""
        return self.y + BAR_HEIGHT


@frozen
class Tick:
    """A tick of the time axis: ``x`` and its label (an offset from the run's start)."""

    x: float
    label: str


@frozen
class Timeline:
    """The drawing: its size, axis, lanes and legend, in user units (``viewBox`` ``0 0 width
    height``); ``left_out``: lanes not drawn (over :data:`MAX_LANES`)."""

    width: int
    height: float
    axis_left: float
    axis_right: float
    axis_y: float
    lanes_bottom: float
    ticks: tuple[Tick, ...]
    lanes: tuple[Lane, ...]
    legend: tuple[tuple[str, str, float, float], ...]
    legend_y: float
    start: datetime
    end: datetime
    left_out: int = 0
    lane_height: int = LANE_HEIGHT
    bar_height: int = BAR_HEIGHT
    label_width: int = LABEL_WIDTH
    states: frozenset[str] = field(default_factory=frozenset)

    @property
    def label_x(self) -> float:
        """Where lane labels end (they are right-aligned against the axis)."""
        return self.axis_left - 6

    @property
    def tick_label_y(self) -> float:
        """The baseline of the tick labels, above the axis line."""
        return self.axis_y - 5

    @property
    def legend_text_y(self) -> float:
        """The baseline of the legend's labels."""
        return self.legend_y + BAR_HEIGHT - 1


#: A lane before it is drawn: when it begins, its kind, its name, its bars (start, end,
#: state, tooltip, child run), and a time still ahead to mark (a sleep's end, a timeout).
_Span = tuple[
    datetime, str, str, list[tuple[datetime, datetime, str, str, uuid.UUID | None]], datetime | None
]


def _seconds(delta: timedelta) -> float:
    return delta.total_seconds()


def offset_label(seconds: float) -> str:
    """An offset from the run's start as a tick says it: ``0``, ``250 ms``, ``1.5 s``,
    ``2 min 30 s``, ``1 h 5 min``, ``2 d 3 h`` (units in the active language)."""
    if seconds <= 0:
        return "0"
    if seconds < 1:
        return gettext("%(count)s ms") % {"count": _number(seconds * 1000)}
    if seconds < 60:
        return gettext("%(count)s s") % {"count": _number(seconds)}
    units = (
        (86400, gettext("%(count)s d")),
        (3600, gettext("%(count)s h")),
        (60, gettext("%(count)s min")),
        (1, gettext("%(count)s s")),
    )
    parts: list[str] = []
    left = round(seconds)
    for size, text in units:
        if left >= size and len(parts) < 2:
            parts.append(text % {"count": left // size})
            left %= size
        elif parts:
            break
    return " ".join(parts)


def _number(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def tick_step(span: float) -> float:
    """The tick interval, seconds, for an axis of ``span`` seconds: the smallest of
    :data:`TICK_STEPS` giving at most :data:`MAX_TICKS` intervals."""
    for step in TICK_STEPS:
        if span / step <= MAX_TICKS:
            return float(step)
    return float(TICK_STEPS[-1]) * max(1.0, span / (TICK_STEPS[-1] * MAX_TICKS))


def _attempt_end(row: AttemptRow, later: AttemptRow | None, now: datetime) -> datetime:
    if row.finished_at is not None:
        return row.finished_at
    if row.superseded and later is not None:
        return max(later.started_at, row.started_at)  # it ran, as far as we know, until then
    return now


def _attempt_state(row: AttemptRow) -> str:
    if row.superseded:
        return "superseded"
    return row.status if row.status in ("succeeded", "failed") else "running"


def _wait_state(row: WaitRow) -> str:
    if row.status == "timed_out":
        return "timed_out"
    if row.status == "done":
        return f"{row.kind}-done"
    return "waiting"


def build(
    *,
    start: datetime,
    end: datetime | None,
    now: datetime,
    attempts: Iterable[AttemptRow],
    waits: Iterable[WaitRow] = (),
) -> Timeline:
    """The timeline of a run that started at ``start`` and ended at ``end`` (``None``: still
    live, drawn up to ``now``), from its attempts and its waits.

    Args:
        start: the run's ``created_at``.
        end: its ``finished_at``, or ``None``.
        now: the current time (the database clock's), where open bars end.
        attempts: every attempt of every step (:class:`AttemptRow`), any order.
        waits: the run's waits (:class:`WaitRow`), any order.

    Returns a :class:`Timeline`: one lane per step (in the order its first attempt started)
    and per wait (when it was reached), merged in time order, at most :data:`MAX_LANES`.
    Pure: reads nothing, writes nothing.
    """
    by_step: dict[str, list[AttemptRow]] = {}
    for row in attempts:
        by_step.setdefault(row.step_name, []).append(row)
    spans: list[_Span] = []
    for name, rows in by_step.items():
        rows.sort(key=lambda row: (row.attempt, row.started_at))
        bars: list[tuple[datetime, datetime, str, str, uuid.UUID | None]] = []
        for index, row in enumerate(rows):
            later = rows[index + 1] if index + 1 < len(rows) else None
            finish = _attempt_end(row, later, now)
            state = _attempt_state(row)
            bars.append((row.started_at, finish, state, _attempt_tooltip(name, row, state), None))
        spans.append((rows[0].started_at, "step", name, bars, None))
    for wait in waits:
        began = wait.reached_at or wait.created_at
        finish = wait.done_at or now
        state = _wait_state(wait)
        ahead = wait.due_at if wait.status == "waiting" and wait.due_at is not None else None
        bar = (began, max(finish, began), state, _wait_tooltip(wait), wait.child_id)
        spans.append((began, wait.kind, wait.name, [bar], ahead))
    spans.sort(key=lambda span: (span[0], span[2]))
    left_out = max(0, len(spans) - MAX_LANES)
    spans = spans[:MAX_LANES]

    # The axis ends with the run (or now): a timeout or a sleep's end still ahead is marked
    # where it falls inside it, never stretching it (an hour's timeout would squash the rest).
    last = end or now
    for _, _, _, span_bars, _ in spans:
        for _, finish, _, _, _ in span_bars:
            last = max(last, finish)
    total = max(_seconds(last - start), 0.001)
    left, right = float(LABEL_WIDTH), float(WIDTH - RIGHT_PAD)
    scale = (right - left) / total

    def x_of(moment: datetime) -> float:
        return round(left + max(0.0, _seconds(moment - start)) * scale, 1)

    lanes = []
    states: set[str] = set()
    for number, (_, kind, name, lane_bars, ahead) in enumerate(spans):
        drawn = []
        for began, finish, state, tooltip, child_id in lane_bars:
            x = x_of(began)
            width = max(MIN_BAR_WIDTH, round(x_of(finish) - x, 1))
            x = min(x, right - MIN_BAR_WIDTH)
            drawn.append(Bar(x, min(width, right - x), state, tooltip, child_id))
            states.add(state)
        shown = name if len(name) <= NAME_SHOWN else name[: NAME_SHOWN - 1] + "…"
        lanes.append(
            Lane(
                kind=kind,
                name=name,
                label=shown,
                y=AXIS_HEIGHT + number * LANE_HEIGHT + (LANE_HEIGHT - BAR_HEIGHT) / 2,
                bars=tuple(drawn),
                marker_x=None if ahead is None or ahead > last else x_of(ahead),
            )
        )
    step = tick_step(total)
    ticks = []
    count = 0
    while count * step <= total + 1e-9 and count <= MAX_TICKS + 1:
        ticks.append(Tick(round(left + count * step * scale, 1), offset_label(count * step)))
        count += 1
    lanes_bottom = AXIS_HEIGHT + len(lanes) * LANE_HEIGHT
    legend = _legend(states, left)
    return Timeline(
        width=WIDTH,
        height=lanes_bottom + LEGEND_HEIGHT,
        axis_left=left,
        axis_right=right,
        axis_y=AXIS_HEIGHT - 4,
        lanes_bottom=lanes_bottom,
        ticks=tuple(ticks),
        lanes=tuple(lanes),
        legend=legend,
        legend_y=lanes_bottom + 8,
        start=start,
        end=last,
        left_out=left_out,
        states=frozenset(states),
    )


def state_labels() -> dict[str, str]:
    """What each bar colour means, in the active language (the legend's and tooltips' words)."""
    return {
        "succeeded": gettext("succeeded"),
        "failed": gettext("failed"),
        "running": gettext("running"),
        "superseded": gettext("superseded"),
        "waiting": gettext("waiting"),
        "sleep-done": gettext("slept"),
        "event-done": gettext("event received"),
        "child-done": gettext("child run finished"),
        "timed_out": gettext("timed out"),
    }


def _legend(states: set[str], left: float) -> tuple[tuple[str, str, float, float], ...]:
    """``(state, label, x of its swatch, x of its label)`` of each state drawn, in a fixed
    order, left to right."""
    labels = state_labels()
    out = []
    x = left
    for state, label in labels.items():
        if state in states:
            out.append((state, label, round(x, 1), round(x + 14, 1)))
            x += 24 + 6.2 * len(label)
    return tuple(out)


def _when(moment: datetime | None) -> str:
    return "—" if moment is None else moment.isoformat(sep=" ", timespec="milliseconds")


def _attempt_tooltip(name: str, row: AttemptRow, state: str) -> str:
    return gettext("step %(name)s, attempt %(attempt)d: %(state)s (%(start)s → %(end)s)") % {
        "name": name,
        "attempt": row.attempt,
        "state": state_labels()[state],
        "start": _when(row.started_at),
        "end": _when(row.finished_at),
    }


def _wait_tooltip(row: WaitRow) -> str:
    kinds = {
        "sleep": pgettext("timeline wait kind", "sleep"),
        "event": pgettext("timeline wait kind", "event"),
        "child": pgettext("timeline wait kind", "child run"),
    }
    return gettext("%(kind)s %(name)s: %(state)s (%(start)s → %(end)s)") % {
        "kind": kinds.get(row.kind, row.kind),
        "name": row.name,
        "state": state_labels()[_wait_state(row)],
        "start": _when(row.reached_at or row.created_at),
        "end": _when(row.done_at),
    }


def timeline_for(run: WorkflowRun, *, now: datetime | None = None) -> Timeline:
    """The :class:`Timeline` of ``run`` (a ``WorkflowRun``), its attempts and waits read
    through ``WorkflowStepAttempt.objects.for_run(...).with_superseded()`` and
    ``WorkflowWait.objects``, on the run's database. ``now``: where open bars end (default:
    the database clock's now)."""
    alias = run._state.db or router.db_for_read(WorkflowRun)
    attempts = WorkflowStepAttempt.objects.using(alias)
    waits = WorkflowWait.objects.using(alias)
    if now is None:
        read = WorkflowRun.objects.using(alias).filter(pk=run.pk).annotate(clock=DbNow())
        now = read.values_list("clock", flat=True).first() or timezone.now()
    attempt_rows = [
        AttemptRow(
            step_name=entry.step.step_name,
            attempt=entry.attempt,
            status=entry.status,
            superseded=bool(getattr(entry, "superseded", False)),
            started_at=entry.started_at,
            finished_at=entry.finished_at,
        )
        for entry in attempts.for_run(run.pk).with_superseded()
    ]
    wait_rows = [
        WaitRow(
            name=wait.name,
            kind=wait.kind,
            status=wait.status,
            created_at=wait.created_at,
            reached_at=wait.reached_at,
            done_at=wait.done_at,
            due_at=wait.due_at,
            child_id=wait.child_id,
        )
        for wait in waits.filter(run_id=run.pk).order_by("id")
    ]
    return build(
        start=run.created_at,
        end=run.finished_at,
        now=now,
        attempts=attempt_rows,
        waits=wait_rows,
    )


__all__: Sequence[str] = [
    "AttemptRow",
    "Bar",
    "Lane",
    "Tick",
    "Timeline",
    "WaitRow",
    "build",
    "offset_label",
    "state_labels",
    "tick_step",
    "timeline_for",
]

"""The workflow benchmark's sequential stage: what a step costs as a run grows longer.

One run of ``k`` no-op steps, one worker, the worker frozen while the run is committed and
released at once (as for every drain). The times come from the rows the run leaves, not from
the harness's polling (every 20 ms, too coarse for a 10-step run of a few milliseconds):

* ours: step ``j`` is created (and claimed) by the statement that writes step ``j - 1``'s
  result, so ``created_at`` of step ``j`` is when ``j`` steps had started and ``j - 1`` were
  done; the last step's result is written with the run's completion (``finished_at``). Both are
  PostgreSQL's ``statement_timestamp()``;
* DBOS Transact: each step's row in ``dbos.operation_outputs`` has ``started_at_epoch_ms`` and
  ``completed_at_epoch_ms`` (the worker's clock, in milliseconds); the workflow's completion
  is ``dbos.workflow_status.updated_at`` (milliseconds).

The database runs on this machine (the stage checks that the URL is a loopback one), so the
harness's ``time.time()`` at the release, PostgreSQL's clock and DBOS's are one clock.

:func:`tenths` turns the ``k + 1`` boundaries (the first step's start, then the end of each
step) into milliseconds per step for each tenth of the run, so growth along the run shows.

CPU: ``/proc/<pid>/stat`` counts in clock ticks (10 ms), as much as a whole 10-step run costs.
:func:`thread_cpu_ns` reads each thread's ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds
on the CPU); :func:`cpu_window` sums a window over the threads, and says it is not exact when
a thread ended within it (its time is then lost: the caller falls back to the ticks).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

#: The lengths measured by default (``--seq-steps``).
DEFAULT_STEPS = (10, 100, 1000)
#: The workflows (ours and DBOS's) of the stage: ``input["steps"]`` / the argument no-op steps.
SEQ = "bench-seq"


def thread_cpu_ns(pid: int) -> dict[tuple[int, int], int] | None:
    """Nanoseconds each thread of process ``pid`` has spent on a CPU so far, by ``(pid,
    tid)``; ``None`` where ``/proc`` has no schedstat for it (the process is gone, or the
    kernel keeps none)."""
    found = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            found[(pid, int(task.name))] = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return found or None


def threads_cpu_ns(pids: list[int]) -> dict[tuple[int, int], int] | None:
    """:func:`thread_cpu_ns` of every process of ``pids``, merged (``None`` if any has none)."""
    merged: dict[tuple[int, int], int] = {}
    for pid in pids:
        found = thread_cpu_ns(pid)
        if found is None:
            return None
        merged.update(found)
    return merged


def cpu_window(
    before: dict[tuple[int, int], int] | None, after: dict[tuple[int, int], int] | None
) -> tuple[float | None, bool]:
    """CPU seconds the threads spent between two readings of :func:`threads_cpu_ns` (a thread
    started meanwhile counts whole), and whether that is exact: ``False`` when a thread of the
    first reading was gone at the second (what it spent in the window is lost) or a reading
    is missing (``None`` seconds then)."""
    if before is None or after is None:
        return None, False
    spent = sum(ns - before.get(key, 0) for key, ns in after.items())
    return spent / 1e9, all(key in after for key in before)


def tenths(boundaries: list[float]) -> dict[str, Any]:
    """Milliseconds per step over each tenth of a run, from its ``k + 1`` boundaries (seconds
    on one clock: the first step's start, then the end of step 1, …, step ``k``).

    A tenth is ``k // 10`` steps (the last one takes the remainder): ``first_tenth_ms`` and
    ``last_tenth_ms`` are its first and last, ``tenths_ms`` all ten, ``steps_ms`` the whole
    run from the first step's start (the release's start-up is not in it), ``growth`` last ÷
    first. ``ValueError`` for a run of fewer than 10 steps or boundaries that go back."""
    k = len(boundaries) - 1
    if k < 10:
        raise ValueError(f"a run of {k} steps has no tenths")
    if any(b < a for a, b in itertools.pairwise(boundaries)):
        raise ValueError("the step boundaries go back in time")
    size = k // 10
    edges = [index * size for index in range(10)] + [k]
    each = [
        1e3 * (boundaries[high] - boundaries[low]) / (high - low)
        for low, high in itertools.pairwise(edges)
    ]
    first, last = each[0], each[-1]
    return {
        "tenths_ms": each,
        "first_tenth_ms": first,
        "last_tenth_ms": last,
        "steps_ms": 1e3 * (boundaries[-1] - boundaries[0]) / k,
        "growth": last / first if first > 0 else math.inf,
    }


def ours_boundaries(
    rows: Any, step_table: str, run_table: str, run_id: Any, steps: int
) -> list[float]:
    """The ``steps + 1`` boundaries of run ``run_id`` of ours (seconds since the epoch): each
    step's ``created_at`` (the write of the previous step's result made it), then the run's
    ``finished_at``. ``rows(sql, params)`` runs a query on the run's database."""
    found = rows(
        f"SELECT step_name, extract(epoch FROM created_at)::float8 FROM {step_table} "
        "WHERE run_id = %s",
        (run_id,),
    )
    created = {name: at for name, at in found}
    missing = [i for i in range(steps) if f"step-{i}" not in created]
    if missing:
        raise ValueError(f"run {run_id}: {len(missing)} of its {steps} steps are missing")
    ((finished,),) = rows(
        f"SELECT extract(epoch FROM finished_at)::float8 FROM {run_table} WHERE id = %s",
        (run_id,),
    )
    return [created[f"step-{i}"] for i in range(steps)] + [float(finished)]


def dbos_boundaries(rows: Any, workflow_id: str, steps: int) -> list[float]:
    """The ``steps + 1`` boundaries of DBOS workflow ``workflow_id`` (seconds since the epoch,
    millisecond resolution): the first step's ``started_at_epoch_ms``, then each step's
    ``completed_at_epoch_ms``. ``rows(sql, params)`` runs a query on DBOS's database."""
    found = rows(
        "SELECT function_id, started_at_epoch_ms, completed_at_epoch_ms "
        "FROM dbos.operation_outputs WHERE workflow_uuid = %s ORDER BY function_id",
        (workflow_id,),
    )
    if len(found) != steps or any(done is None for _, _, done in found):
        raise ValueError(f"DBOS workflow {workflow_id}: {len(found)} step rows for {steps} steps")
    first_start = found[0][1] if found[0][1] is not None else found[0][2]
    return [first_start / 1e3] + [done / 1e3 for _, _, done in found]

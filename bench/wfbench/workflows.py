"""Ours: the no-op workflows of the benchmark (found by django_leases' autodiscovery).

``bench-noop``: one step (the task-queue comparison). ``bench-seq10``: ten steps, one after
another (``run.step``). ``bench-seq``: ``input["steps"]`` steps one after another (the
sequential stage). ``bench-fanout``: ``input["width"]`` steps at once (``run.parallel``).
Every step runs the same no-op step function, so a run's cost is the engine's alone.
"""

from __future__ import annotations

from typing import Any

from django_leases.workflows import step_function, workflow
from wfbench.payloads import sized_result

WORKFLOW = "bench-noop"
SEQ10 = "bench-seq10"
SEQ = "bench-seq"
FANOUT = "bench-fanout"
STEP_FUNCTION = "bench.noop"
SIZED_FUNCTION = "bench.sized"
STEPS = 10


@step_function(STEP_FUNCTION)
def noop_step(data: Any, ctx: Any) -> None:
    """Does nothing; the run's cost is the engine's alone."""
    return None


@step_function(SIZED_FUNCTION)
def sized_step(data: Any, ctx: Any) -> Any:
    """Returns about ``data["bytes"]`` bytes of JSON (``wfbench/payloads.py``)."""
    return sized_result(int(data["index"]), int(data["bytes"]))


@workflow(WORKFLOW)
def noop_workflow(run: Any, payload: Any) -> Any:
    """One step, its result is the run's output."""
    return run.step("noop", STEP_FUNCTION)


@workflow(SEQ10)
def seq10_workflow(run: Any, payload: Any) -> Any:
    """Ten no-op steps, one after another; the output is their count."""
    for index in range(STEPS):
        run.step(f"step-{index}", STEP_FUNCTION, index)
    return STEPS


@workflow(SEQ)
def seq_workflow(run: Any, payload: Any) -> Any:
    """``payload["steps"]`` no-op steps, one after another; the output is their count. With
    ``payload["result_bytes"]`` (``--seq-result-bytes``), each step returns that many bytes
    of JSON instead of nothing."""
    steps = int(payload["steps"])
    size = int(payload.get("result_bytes") or 0)
    for index in range(steps):
        if size:
            run.step(f"step-{index}", SIZED_FUNCTION, {"index": index, "bytes": size})
        else:
            run.step(f"step-{index}", STEP_FUNCTION, index)
    return steps


@workflow(FANOUT)
def fanout_workflow(run: Any, payload: Any) -> Any:
    """``payload["width"]`` no-op steps at once; the output is how many finished."""
    width = int(payload["width"])
    results = run.parallel([(f"branch-{i}", STEP_FUNCTION, i) for i in range(width)])
    return len(results)

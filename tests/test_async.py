"""Async (issue 29, DESIGN §5c): ``async def`` step functions awaited on their worker thread's
event loop, ``astart_workflow`` / ``asend_event`` from async views (ASGI), and the coroutine
forms of ``Lease.objects`` (their lease rules are the conformance suite's ``*_async_*``
tests; a superseded async attempt there is F13–F14)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.test import TestCase, override_settings
from django.urls import path
from pytest_httpserver import HTTPServer

from django_leases.models import (
    Lease,
    LeaseQuerySet,
    RunStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
)
from django_leases.testing import drive
from django_leases.workflows import (
    asend_event,
    astart_workflow,
    send_event,
    start_workflow,
    step_function,
    workflow,
)
from django_leases.workflows.engine import execute_step
from django_leases.workflows.worker import Worker
from tests.helpers import (
    lapse_step_lease,
    no_queue_limits,
    start_thread,
    tuned_sql,
    unique_key,
    wait_until,
)

# -- step functions and workflows -------------------------------------------------------------

#: What the async steps saw, by key: loops, threads (filled by the steps; tests reset it).
seen: dict[str, list[Any]] = collections.defaultdict(list)
_seen_lock = threading.Lock()


def note(what: str, value: Any) -> None:
    with _seen_lock:
        seen[what].append(value)


@step_function("tests.async.nap")
async def nap(data: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Awaits ``asyncio.sleep``; notes its loop, the thread it runs on and the thread its
    thread-sensitive sync calls run on."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(data.get("seconds", 0.01))
    note("loops", loop)
    note("loop_threads", threading.current_thread().name)
    note("sync_threads", await sync_to_async(threading.get_ident)())
    return {"napped": data.get("seconds", 0.01), "attempt": ctx.attempt}


@step_function("tests.async.plain")
def plain(data: Any, ctx: Any) -> bool:
    """A sync step: True when it runs on an event loop (it must not)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@step_function("tests.async.leave-a-task")
async def leave_a_task(data: Any, ctx: Any) -> str:
    """Starts a task that would run forever and returns without awaiting it."""

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            note("cancelled", ctx.step_name)
            raise

    asyncio.get_running_loop().create_task(forever())
    await asyncio.sleep(0)
    return "left"


@step_function("tests.async.take-lease")
async def take_lease(data: dict[str, Any], ctx: Any) -> int:
    """Takes a lease through the async ORM form; returns its token."""
    lease = await Lease.objects.aacquire(data["key"], "an-async-step", 600)
    assert lease is not None
    return lease.token


@step_function("tests.async.http")
async def call_out(data: dict[str, Any], ctx: Any) -> Any:
    """An async HTTP call (httpx.AsyncClient) with an idempotency key per attempt."""
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        response = await client.post(
            data["url"],
            json={"amount": data["amount"]},
            headers={"Idempotency-Key": f"{ctx.run_id}:{ctx.step_name}"},
        )
        response.raise_for_status()
        return response.json()


@workflow("tests.async.naps")
def naps(run: Any, input: dict[str, Any]) -> Any:
    before = run.step("before", "tests.async.plain", {})
    first = run.step("first", "tests.async.nap", {"seconds": 0.01})
    second = run.step("second", "tests.async.nap", {"seconds": 0})
    after = run.step("after", "tests.async.plain", {})
    return {"before": before, "first": first, "second": second, "after": after}


@workflow("tests.async.one-step")
def one_step(run: Any, input: dict[str, Any]) -> Any:
    return run.step("only", input["function"], input.get("data", {}))


@workflow("tests.async.count")
def count(run: Any, input: dict[str, Any]) -> Any:
    return [run.step(f"s{i}", "tests.async.counted", {"i": i}) for i in range(input["steps"])]


@workflow("tests.async.approval")
def approval(run: Any, input: dict[str, Any]) -> Any:
    greeting = run.step("greet", "tests.async.nap", {"seconds": 0})
    decision = run.wait_for_event("approval")
    return {"greeting": greeting, "by": decision["by"], "order": input["order"]}


#: Executions of ``tests.async.counted``, by (run id, step name, attempt).
executions: collections.Counter[tuple[str, str, int]] = collections.Counter()


@step_function("tests.async.counted")
async def counted(data: dict[str, Any], ctx: Any) -> int:
    await asyncio.sleep(0)
    # A query through the async ORM: it runs on the worker thread, on its connection.
    lease = await Lease.objects.aacquire(f"tests.async:{ctx.run_id}:{ctx.step_name}", "s", 600)
    assert lease is not None
    note("loops", asyncio.get_running_loop())
    note("sync_threads", await sync_to_async(lambda: threading.current_thread().name)())
    with _seen_lock:
        executions[(str(ctx.run_id), ctx.step_name, ctx.attempt)] += 1
    return int(data["i"])


@pytest.fixture(autouse=True)
def _fresh_notes() -> Iterator[None]:
    seen.clear()
    executions.clear()
    yield
    seen.clear()
    executions.clear()


# -- async step functions -----------------------------------------------------------------------


@pytest.mark.django_db
def test_an_async_step_awaits_on_the_threads_own_loop_and_a_sync_step_on_none() -> None:
    """Two async steps in one drive: each awaited ``asyncio.sleep`` on one loop (the same,
    reused), run on the driving thread's companion thread, their sync calls back on the
    driving thread; the sync steps around them ran on no loop."""
    run_id = start_workflow("tests.async.naps", {})
    run = drive(run_id)
    assert run is not None and run.status == RunStatus.COMPLETED, run and run.error
    assert run.output == {
        "before": False,
        "first": {"napped": 0.01, "attempt": 1},
        "second": {"napped": 0, "attempt": 1},
        "after": False,
    }
    first_loop, second_loop = seen["loops"]
    assert first_loop is second_loop, "a loop per step, not one per thread"
    me = threading.current_thread()
    assert seen["loop_threads"] == [f"{me.name}:event-loop"] * 2
    assert seen["sync_threads"] == [me.ident] * 2


@pytest.mark.django_db
def test_an_async_steps_queries_run_in_the_test_transaction() -> None:
    """The step's ``aacquire`` ran on the driving thread's connection: inside this test's
    transaction (another connection would not see the lease, or on SQLite wait for the
    write lock this transaction holds)."""
    key = unique_key("async-orm")
    run_id = start_workflow(
        "tests.async.one-step", {"function": "tests.async.take-lease", "data": {"key": key}}
    )
    run = drive(run_id)
    assert run is not None and run.status == RunStatus.COMPLETED, run and run.error
    assert run.output == 1
    held = Lease.objects.current(key)
    assert held is not None and held.holder == "an-async-step"


@pytest.mark.django_db
def test_tasks_an_async_step_leaves_running_are_cancelled_when_it_returns() -> None:
    run_id = start_workflow("tests.async.one-step", {"function": "tests.async.leave-a-task"})
    run = drive(run_id)
    assert run is not None and run.output == "left"
    assert seen["cancelled"] == ["only"]


@pytest.fixture(scope="session")
def httpserver_listen_address() -> tuple[str, int]:
    """IPv4 loopback: "localhost" may try ::1 first and wait on each connection."""
    return ("127.0.0.1", 0)


@pytest.mark.django_db
def test_an_async_step_makes_an_async_http_call(httpserver: HTTPServer) -> None:
    httpserver.expect_oneshot_request("/charges", method="POST").respond_with_json({"charged": 42})
    run_id = start_workflow(
        "tests.async.one-step",
        {
            "function": "tests.async.http",
            "data": {"url": httpserver.url_for("/charges"), "amount": 42},
        },
    )
    run = drive(run_id)
    assert run is not None and run.status == RunStatus.COMPLETED, run and run.error
    assert run.output == {"charged": 42}
    httpserver.check_assertions()
    ((request, _),) = httpserver.log
    assert json.loads(request.data) == {"amount": 42}
    assert request.headers["Idempotency-Key"] == f"{run_id}:only"


def sql_path(path: str) -> contextlib.AbstractContextManager[None]:
    """``"tuned"``: the tuned statements, queue limits off (so PostgreSQL claims in one
    statement); ``"portable"``: the portable ORM path (``TUNED_SQL`` off)."""
    if path == "portable":
        return tuned_sql(False)
    stack = contextlib.ExitStack()
    stack.enter_context(tuned_sql(True))
    stack.enter_context(no_queue_limits())
    return stack


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["tuned", "portable"])
def test_200_async_steps_on_4_worker_threads_run_once_per_attempt(path: str) -> None:
    """20 runs of 10 async steps each on a worker of 4 threads: every run completes, every
    attempt the history records ran exactly once (and nothing ran that it does not record),
    each step's query ran on a worker thread, at most one loop per worker thread, and the
    loops' threads end with the worker. On both SQL paths."""
    run_ids = [start_workflow("tests.async.count", {"steps": 10}) for _ in range(20)]
    with sql_path(path):
        worker = Worker(concurrency=4, poll_interval=0.05)
        assert worker.run(once=True, handle_signals=False) == 0
    runs = WorkflowRun.objects.in_bulk(run_ids)
    assert {run.status for run in runs.values()} == {RunStatus.COMPLETED}
    assert all(run.output == list(range(10)) for run in runs.values())
    recorded = {
        (str(run_id), step_name, attempt)
        for run_id, step_name, attempt in WorkflowStepAttempt.objects.filter(
            step__run_id__in=run_ids
        ).values_list("step__run_id", "step__step_name", "attempt")
    }
    assert len(recorded) >= 200
    assert set(executions) == recorded
    assert set(executions.values()) == {1}, "an attempt ran more than once"
    assert len({id(loop) for loop in seen["loops"]}) <= 4
    assert {name.split(":")[0] for name in seen["sync_threads"]} <= {
        f"workflow-worker-{i}" for i in range(4)
    }
    assert not [t for t in threading.enumerate() if t.name.startswith("workflow-worker-")]
    assert all(loop.is_closed() for loop in seen["loops"])
    assert Lease.objects.filter(key__startswith="tests.async:").count() == 200


# -- a superseded async attempt, with real threads -------------------------------------------

_gates: dict[str, threading.Event] = {}


@step_function("tests.async.gated")
async def gated(data: dict[str, Any], ctx: Any) -> str:
    """Says it started, then awaits (off the loop) until the test opens its gate."""
    _gates[data["started"]].set()
    await asyncio.to_thread(_gates[data["gate"]].wait, 60)
    return f"attempt {ctx.attempt}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["tuned", "portable"])
def test_a_superseded_async_attempt_returning_late_is_refused(path: str) -> None:
    """Attempt 1 awaits on a worker thread while its lease lapses (database clock) and
    attempt 2 claims and finishes the step; attempt 1 then returns: its result is refused,
    attempt 2's stays, and attempt 1's dispatch ends quietly (``"superseded"``)."""
    started, gate = uuid.uuid4().hex, uuid.uuid4().hex
    _gates[started], _gates[gate] = threading.Event(), threading.Event()
    try:
        stack = contextlib.ExitStack()
        stack.enter_context(sql_path(path))
        stack.callback(_gates[gate].set)
        with stack:
            _supersede_an_awaiting_attempt(started, gate)
    finally:
        _gates.pop(started, None)
        _gates.pop(gate, None)


def _supersede_an_awaiting_attempt(started: str, gate: str) -> None:
    run = WorkflowRun.objects.start("tests.async.one-step", {})
    WorkflowStep.objects.schedule(
        run.id, "only", "tests.async.gated", {"started": started, "gate": gate}
    )
    stale = WorkflowStep.objects.claim_for_execution(run.id, "only", "tests.async.gated", 60)
    assert stale is not None
    outcome: list[str] = []
    dispatch = start_thread(lambda: outcome.append(execute_step(stale)))
    assert _gates[started].wait(60), "attempt 1 never started"
    lapse_step_lease(run_id=run.id, step_name="only")
    current = WorkflowStep.objects.claim_for_execution(run.id, "only", "tests.async.gated", 60)
    assert current is not None and current.attempt == 2
    WorkflowStep.objects.set_result(current.step_id, "attempt 2", current.attempt)
    _gates[gate].set()
    dispatch.join(60)
    assert outcome == ["superseded"]
    step = WorkflowStep.objects.get(pk=current.step_id)
    assert (step.status, step.result, step.attempt) == ("succeeded", "attempt 2", 2)
    history = {attempt.attempt: attempt.result for attempt in WorkflowStep.objects.history(run.id)}
    assert history == {1: None, 2: "attempt 2"}


# -- astart_workflow / asend_event from async views under ASGI ----------------------------------


async def start_order(request: HttpRequest) -> JsonResponse:
    order = json.loads(request.body)
    run_id = await astart_workflow("tests.async.approval", order, key=f"order-{order['order']}")
    return JsonResponse({"run_id": str(run_id)}, status=201)


async def approve(request: HttpRequest, run_id: str) -> JsonResponse:
    await asend_event(run_id, "approval", {"by": request.GET["by"]})
    return JsonResponse({"sent": True}, status=202)


urlpatterns = [
    path("orders/", start_order),
    path("orders/<str:run_id>/approve/", approve),
]


@override_settings(ROOT_URLCONF=__name__)
class AsyncViewTests(TestCase):
    """The views above under Django's ``AsyncClient`` (the ASGI handler), in a ``TestCase``."""

    async def test_an_async_view_starts_a_run_and_another_sends_its_event(self) -> None:
        response = await self.async_client.post(
            "/orders/", {"order": 7}, content_type="application/json"
        )
        self.assertEqual(response.status_code, 201)
        run_id = response.json()["run_id"]
        again = await self.async_client.post(
            "/orders/", {"order": 7}, content_type="application/json"
        )
        self.assertEqual(again.json()["run_id"], run_id, "the start key made it idempotent")
        waiting = await sync_to_async(drive)(run_id)
        assert waiting is not None
        self.assertEqual(waiting.status, RunStatus.RUNNING)  # at its wait for the approval
        response = await self.async_client.post(f"/orders/{run_id}/approve/?by=ada")
        self.assertEqual(response.status_code, 202)
        run = await sync_to_async(drive)(run_id)
        assert run is not None
        self.assertEqual(run.status, RunStatus.COMPLETED, run.error)
        self.assertEqual(run.output["by"], "ada")
        self.assertEqual(run.output["order"], 7)
        self.assertEqual(await WorkflowRun.objects.acount(), 1)


# -- thread_sensitive: the coroutine forms run on the caller's sync thread and connection ------


def _awaited(call: Callable[[], Any]) -> Any:
    async def awaiting() -> Any:
        return await call()

    return async_to_sync(awaiting)()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "start",
    [
        lambda key: _awaited(lambda: astart_workflow("tests.async.naps", {}, key=key)),
        lambda key: _awaited(lambda: Lease.objects.aacquire(key, "h", 60)),
    ],
    ids=["astart_workflow", "aacquire"],
)
def test_the_coroutine_forms_join_the_callers_transaction(start: Callable[[str], Any]) -> None:
    """Run from async code called by this thread (``async_to_sync``), the write lands on this
    thread's connection, inside its open transaction, and rolls back with it: what
    ``thread_sensitive=True`` gives (a pool thread's connection would have committed it, or
    on SQLite waited for this transaction's write lock)."""
    key = unique_key("async-tx")
    with transaction.atomic():
        start(key)
        assert WorkflowRun.objects.filter(key=key).exists() or Lease.objects.current(key)
        transaction.set_rollback(True)
    assert not WorkflowRun.objects.filter(key=key).exists()
    assert not Lease.objects.filter(key=key).exists()


@pytest.mark.django_db
def test_asend_event_delivers_like_send_event() -> None:
    run_id = start_workflow("tests.async.approval", {"order": 1})
    drive(run_id)
    _awaited(lambda: asend_event(run_id, "approval", {"by": "grace"}))
    with pytest.raises(Exception, match="approval") as refused:
        _awaited(lambda: asend_event(run_id, "approval", {"by": "again"}))
    with pytest.raises(type(refused.value)):
        send_event(run_id, "approval", {"by": "again"})
    run = drive(run_id)
    assert run is not None and run.output["by"] == "grace"


@pytest.mark.parametrize(
    ("coroutine_form", "sync_form"),
    [
        (astart_workflow, start_workflow),
        (asend_event, send_event),
        (LeaseQuerySet.aacquire, LeaseQuerySet.acquire),
        (LeaseQuerySet.arefresh, LeaseQuerySet.refresh),
        (LeaseQuerySet.arelease, LeaseQuerySet.release),
        (LeaseQuerySet.acurrent, LeaseQuerySet.current),
    ],
    ids=lambda f: getattr(f, "__name__", "?"),
)
def test_each_coroutine_form_takes_what_its_sync_form_takes(
    coroutine_form: Callable[..., Any], sync_form: Callable[..., Any]
) -> None:
    """Same parameters (names, kinds, defaults, annotations) and return annotation: a
    parameter added to one and not the other fails here."""
    assert inspect.iscoroutinefunction(coroutine_form)
    ours, theirs = inspect.signature(coroutine_form), inspect.signature(sync_form)
    assert list(ours.parameters.values()) == list(theirs.parameters.values())
    assert ours.return_annotation == theirs.return_annotation


def test_the_worker_threads_loops_end_with_them() -> None:
    """A thread that ran an async step and ended leaves no loop thread behind."""
    from django_leases.workflows import aio

    loops: list[asyncio.AbstractEventLoop] = []

    async def which() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def on_a_thread() -> None:
        loops.append(aio.run_on_thread_loop(which))
        loops.append(aio.run_on_thread_loop(which))

    thread = start_thread(on_a_thread, name="tests-async-owner")
    thread.join(60)
    assert loops[0] is loops[1]
    wait_until(
        lambda: not [t for t in threading.enumerate() if t.name == "tests-async-owner:event-loop"],
        30,
        what="the loop thread to end with its owner",
    )
    assert loops[0].is_closed()

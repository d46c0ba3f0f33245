"""A database that stops answering, or a connection that is killed, at the end of a hold.

* The final check and the release of a hold never wait longer than the lease's local deadline
  (a second at least) and ``RELEASE_TIMEOUT``: past that, the connection is cut (its socket
  shut down), the check cannot vouch, and ``hold_lease`` raises ``LeaseLostError`` instead of
  hanging. The database is "black-holed" by a TCP proxy in front of PostgreSQL that stops
  forwarding (the connection stays open; nothing comes back).
* A release whose connection was killed is tried once more on a fresh connection, so the key
  is free at once instead of after its TTL — for ``hold_lease`` and for a worker's run lease.

The threads that could hang are joined with a generous timeout: a liveness guard (a hang fails
the test), not a timing assertion.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, connections

from django_leases.exceptions import LeaseLostError
from django_leases.leases import hold_lease
from django_leases.models import Lease, LeaseQuerySet, RunStatus, WorkflowRun
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.values import run_lease_key
from django_leases.workflows.worker import Worker
from tests.helpers import backend_pid, end_renewers, unique_key

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

#: How long a thread may take before the test calls it hung (a liveness guard).
HUNG = 60.0


class FreezableProxy:
    """A TCP proxy to PostgreSQL that forwards both ways until :meth:`freeze`: then it reads
    and forwards nothing more, and keeps every connection open (a black hole)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.frozen = threading.Event()
        self.closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._sockets += [client, server]
            for source, target in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        while not self.closed.is_set():
            if self.frozen.is_set():
                self.closed.wait(0.05)
                continue
            try:
                ready, _, _ = select.select([source], [], [], 0.05)
                if not ready or self.frozen.is_set():
                    continue
                data = source.recv(65536)
                if not data:
                    target.shutdown(socket.SHUT_WR)
                    return
                target.sendall(data)
            except OSError:
                return

    def freeze(self) -> None:
        self.frozen.set()

    def close(self) -> None:
        self.closed.set()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


@pytest.fixture
def through_proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[FreezableProxy]:
    """Every new connection of the test database goes through a :class:`FreezableProxy`,
    the renewer's too (its threads, and their connection, end first)."""
    end_renewers(monkeypatch)
    settings = connections.settings["default"]
    proxy = FreezableProxy((settings.get("HOST") or "127.0.0.1", int(settings.get("PORT") or 5432)))
    saved = (settings.get("HOST"), settings.get("PORT"))
    connection.close()
    settings["HOST"], settings["PORT"] = "127.0.0.1", proxy.port
    try:
        yield proxy
    finally:
        settings["HOST"], settings["PORT"] = saved
        proxy.close()
        connection.close()


def _in_thread(call: Callable[[], Any]) -> list[Any]:
    """Run ``call`` on a thread (closing its connections after); its outcome (the value, or
    the exception it raised) once it ended, or a failure if it hung."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HUNG)
    assert not thread.is_alive(), "it hung on a database that stopped answering"
    return outcome


def test_a_final_check_without_an_answer_cannot_vouch_and_does_not_hang(
    through_proxy: FreezableProxy,
) -> None:
    key = unique_key("black-hole")

    def hold() -> str:
        with hold_lease(key, ttl=3):
            through_proxy.freeze()
        return "vouched"

    (outcome,) = _in_thread(hold)
    assert isinstance(outcome, LeaseLostError), outcome


def test_a_renewal_without_an_answer_loses_the_lease_and_the_body_is_told(
    through_proxy: FreezableProxy,
) -> None:
    key = unique_key("black-hole")

    def hold() -> str:
        with hold_lease(key, ttl=3) as held:
            through_proxy.freeze()
            assert held.lost.wait(HUNG), "the body was never told"
        return "vouched"

    (outcome,) = _in_thread(hold)
    assert isinstance(outcome, LeaseLostError), outcome


def _kill_before(method: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make ``LeaseQuerySet.<method>`` find its connection killed (the first time only), as a
    pooler restart or ``pg_terminate_backend`` would; returns the pids killed."""
    real = getattr(LeaseQuerySet, method)
    killed: list[int] = []

    def killed_first(self: LeaseQuerySet, *args: Any, **kwargs: Any) -> Any:
        if not killed:
            pid = backend_pid()
            killed.append(pid)
            # From another connection: the main thread's (the test's own).
            _in_thread(lambda: _terminate(pid))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LeaseQuerySet, method, killed_first)
    return killed


def _terminate(pid: int) -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_a_release_whose_connection_was_killed_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = unique_key("killed")
    killed = _kill_before("release", monkeypatch)
    with hold_lease(key, ttl=30):
        pass
    assert killed, "the release was never reached"
    state = Lease.objects.with_state().get(key=key).state  # type: ignore[attr-defined]
    assert state == "released", "the release was not tried again on a fresh connection"


@step_function("tests.timeouts")
def timeouts_step(data: Any, ctx: Any) -> Any:
    return "done"


@workflow("tests.timeouts-one")
def one_step(run: Any, input: Any) -> Any:
    return run.step("only", "tests.timeouts")


@workflow("tests.timeouts-two")
def two_steps(run: Any, input: Any) -> Any:
    run.step("first", "tests.timeouts")
    return run.step("second", "tests.timeouts")


def test_a_run_lease_whose_release_found_its_connection_killed_is_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's final check and release of a run lease (one statement) on a killed
    connection: the run lease is still released at once, not after its 30 s TTL."""
    run_id = start_workflow("tests.timeouts-two", {})
    monkeypatch.setattr(
        "django_leases.models.workflow.WorkflowStepQuerySet.set_result_completing_run",
        _ordinary_completion,
    )
    killed = _kill_before("release_held", monkeypatch)
    worker = Worker(1, step_lease_ttl=30, poll_interval=3600)
    worker.work_once()
    assert killed, "the run lease's release was never reached"
    run = WorkflowRun.objects.get(pk=run_id)
    lease = Lease.objects.with_state().get(key=run_lease_key(run_id))
    assert lease.state == "released", "the run lease waits out its TTL"  # type: ignore[attr-defined]
    assert run.status in (RunStatus.COMPLETED, RunStatus.RUNNING)


def _ordinary_completion(self: Any, *args: Any, **kwargs: Any) -> Any:
    """No folded completion: the run completes by an ordinary pass, whose end releases the
    run lease through ``release_held``."""
    from django_leases.workflows.values import RunCompletion

    return RunCompletion(written=False, completed=False, lease_live=None)

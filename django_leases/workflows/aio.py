"""Async step functions: one event loop per worker thread (DESIGN §5c).

An ``async def`` step function is awaited on the event loop of the thread that claimed its
step (a worker thread, or the thread :func:`~django_leases.testing.drive` runs on): one loop
per such thread, created on its first async step and reused by every later one, stopped
when the thread ends (or at :func:`close_thread_loop`). A sync step function never runs on
it: it is called on the claiming thread as before.

Where the loop runs, and why. The loop runs on a companion thread of its own, while the
claiming thread waits for the step **and runs its synchronous calls**: what the coroutine
hands to ``sync_to_async`` (``thread_sensitive=True``, the default, which Django's async ORM
methods ``aget``, ``acreate``, … use) runs back on the claiming thread, as under Django's
``async_to_sync``. So an async step's queries use the claiming thread's connection, exactly
like a sync step's: the worker closes it between units of work, the test transaction of a
``TestCase`` (with ``drive()``) sees them, and a transaction the engine opens on that thread
around a step covers them. A loop on the claiming thread itself could not do that: Django
refuses queries from a thread whose event loop is running, so they would go to another
thread, another connection, outside any such transaction.

Tasks a step function starts and leaves running when it returns are cancelled then (as
``asyncio.run`` does), so nothing of one step runs on into the next step's turn.

Everything around the call is the engine's as for a sync step: the claim, the step lease's
renewal (on its own threads), and the result written fenced to the attempt afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import SyncToAsync, async_to_sync, iscoroutinefunction

logger = logging.getLogger("django_leases.workflows")

#: How long :func:`close_thread_loop` waits for a loop to wind down, seconds.
CLOSE_TIMEOUT = 10.0

_local = threading.local()


def is_async(func: Callable[..., Any]) -> bool:
    """Whether ``func`` is a coroutine function (``async def``, also behind
    ``functools.partial`` or marked with ``asgiref.sync.markcoroutinefunction``), or an
    object whose ``__call__`` is one."""
    if iscoroutinefunction(func) or inspect.iscoroutinefunction(func):
        return True
    call = None if inspect.isroutine(func) else inspect.getattr_static(type(func), "__call__", None)
    return inspect.iscoroutinefunction(call)


class _ThreadLoop:
    """One thread's event loop, run forever on its companion thread. Kept in the owning
    thread's ``threading.local``: when that thread ends, this object goes and the loop is
    stopped (the companion thread then cancels what is left, closes the loop and ends)."""

    def __init__(self, owner: threading.Thread) -> None:
        self.loop = asyncio.new_event_loop()
        # The target holds the loop, never this object: its finalizer must be able to run.
        self.thread = threading.Thread(
            target=_serve, args=(self.loop,), name=f"{owner.name}:event-loop", daemon=True
        )
        self.thread.start()
        self.stop = weakref.finalize(self, _stop, self.loop)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
        _cancel_all(loop)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    except Exception:
        logger.warning("Stopping an async step loop failed", exc_info=True)
    finally:
        loop.close()


def _stop(loop: asyncio.AbstractEventLoop) -> None:
    with contextlib.suppress(RuntimeError):  # already closed
        loop.call_soon_threadsafe(loop.stop)


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    left = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in left:
        task.cancel()
    if left:
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))


def thread_loop() -> asyncio.AbstractEventLoop:
    """The calling thread's event loop for async step functions, started on first use
    (running on its companion thread, named ``<thread name>:event-loop``)."""
    held: _ThreadLoop | None = getattr(_local, "loop", None)
    if held is None or not held.thread.is_alive():
        held = _ThreadLoop(threading.current_thread())
        _local.loop = held
    return held.loop


def close_thread_loop(timeout: float = CLOSE_TIMEOUT) -> None:
    """Stop the calling thread's event loop, if it has one, and wait up to ``timeout``
    seconds for its companion thread to end (tasks left on it are cancelled). The next
    async step on this thread starts a new loop. Worker threads call it when they end."""
    held: _ThreadLoop | None = getattr(_local, "loop", None)
    if held is None:
        return
    del _local.loop
    held.stop()
    held.thread.join(timeout)


async def _tidily(call: Callable[[], Awaitable[Any]]) -> Any:
    """Await ``call()``; then cancel the tasks it left running on this loop, and wait for
    them to end."""
    try:
        return await call()
    finally:
        me = asyncio.current_task()
        left = [task for task in asyncio.all_tasks() if task is not me and not task.done()]
        for task in left:
            task.cancel()
        if left:
            await asyncio.gather(*left, return_exceptions=True)


def run_on_thread_loop(call: Callable[[], Awaitable[Any]]) -> Any:
    """Await ``call()`` on the calling thread's event loop (:func:`thread_loop`) and return
    its result or raise its exception, while this thread runs the coroutine's thread-sensitive
    ``sync_to_async`` calls (its connection, its transaction). Tasks it leaves running are
    cancelled when it ends.

    Raises ``RuntimeError`` when called from a thread whose own event loop is running (await
    the coroutine there instead).
    """
    loop = thread_loop()
    # asgiref's async_to_sync runs the coroutine on the "main event loop" of a thread that
    # sync_to_async runs, and serves that coroutine's thread-sensitive calls on this thread:
    # make this thread's loop that main loop for the call (and put back what was there).
    # Should a later asgiref stop reading these two, async_to_sync falls back to a new loop
    # per call (its sync calls still served here): correct, only not reused; the suite's
    # "one loop, reused" test says so.
    local = SyncToAsync.threadlocal
    saved = (getattr(local, "main_event_loop", None), getattr(local, "main_event_loop_pid", None))
    local.main_event_loop, local.main_event_loop_pid = loop, os.getpid()
    try:
        return async_to_sync(_tidily)(call)
    finally:
        local.main_event_loop, local.main_event_loop_pid = saved


def call_step_function(func: Callable[..., Any], data: Any, ctx: Any) -> Any:
    """Call step function ``func(data, ctx)`` on the calling thread and return its result; a
    coroutine function's coroutine (or a coroutine a plain function returned) is awaited on
    this thread's event loop (:func:`run_on_thread_loop`). What it raises is raised."""
    if is_async(func):
        return run_on_thread_loop(lambda: func(data, ctx))
    result = func(data, ctx)
    if inspect.iscoroutine(result):  # e.g. an async function behind an unmarked decorator
        return run_on_thread_loop(lambda: result)
    return result


__all__ = [
    "call_step_function",
    "close_thread_loop",
    "is_async",
    "run_on_thread_loop",
    "thread_loop",
]

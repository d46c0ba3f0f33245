"""Fault points: named places in the library's writes where a test injects a fault.

A fault point is a call :func:`reached` placed at one exact spot of a write — between the
statement that made a row durable and the moment its caller learns of it, say — so that a
test can make that spot fail as the network or the database would (a lost reply, a dropped
connection) or order a second worker against it, and prove what the library promises there.
Points are off unless a test turns one on with :func:`injected`; off, :func:`reached` is one
dictionary lookup.

The points (their names are stable; each one's docstring in the code says where it is):

* ``"workflow.next-step-written"`` (context: ``run_id``, ``step_name`` of the new step) — a
  step's result was recorded and the step its workflow asks for next was created (claimed
  for the writer where the write could claim it); the rows are committed and the writer has
  not returned yet. A hook that raises :class:`django.db.OperationalError` here is a reply
  lost after the commit. (Where the step that ran was a transactional one that the pass
  carried, this write is made inside that step's open transaction: the rows commit with it,
  at ``"workflow.step-transaction-committed"``.)
* ``"workflow.step-transaction-committed"`` (context: ``run_id``, ``step_name`` of the
  transactional step) — a transactional step's transaction committed: its function's writes,
  its result and whatever the pass wrote with them (the next step created and claimed, a
  wait, the run's completion…); the writer has not returned yet. A hook that raises
  :class:`django.db.OperationalError` here is the commit's reply lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: Every fault point's name.
POINTS = frozenset({"workflow.next-step-written", "workflow.step-transaction-committed"})

_hooks: dict[str, Callable[..., None]] = {}
_lock = threading.Lock()


def reached(point: str, **context: Any) -> None:
    """The write has come to fault point ``point`` (a name of :data:`POINTS`): call the hook
    a test injected there, if any, with ``context`` (what the point names, as keywords).
    Whatever the hook raises propagates to the write."""
    if _hooks:
        hook = _hooks.get(point)
        if hook is not None:
            hook(**context)


@contextmanager
def injected(point: str, hook: Callable[..., None]) -> Iterator[None]:
    """Call ``hook`` with the point's context (keywords) each time any thread reaches fault
    point ``point``, for the duration of the ``with`` block. For tests; one hook per point at
    a time.

    Raises:
        ValueError: ``point`` is not a fault point, or already has a hook.
    """
    if point not in POINTS:
        raise ValueError(f"{point!r} is not a fault point (they are: {', '.join(sorted(POINTS))})")
    with _lock:
        if point in _hooks:
            raise ValueError(f"fault point {point!r} already has a hook")
        _hooks[point] = hook
    try:
        yield
    finally:
        with _lock:
            _hooks.pop(point, None)


__all__ = ["POINTS", "injected", "reached"]

"""Count what a process sends to PostgreSQL, for the statements-per-task figures.

:func:`install` wraps psycopg's (sync and async) ``Cursor.execute`` / ``executemany`` and
``Connection.commit`` / ``rollback``, below every library's own layer, so Django (ours,
django-ox, django-tasks-db) and Procrastinate's own psycopg connector are counted alike. A
daemon thread writes the totals to a JSON file every 50 ms (and at exit), which the harness
reads before and after a counted drain.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
from typing import Any

_counts = {"statements": 0, "transactions": 0}
_lock = threading.Lock()


def _bump(kind: str) -> None:
    with _lock:
        _counts[kind] += 1


def _wrap(cls: Any, name: str, kind: str, is_async: bool) -> None:
    original = getattr(cls, name)

    if is_async:

        async def wrapped_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            _bump(kind)
            return await original(self, *args, **kwargs)

        setattr(cls, name, wrapped_async)
    else:

        def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
            _bump(kind)
            return original(self, *args, **kwargs)

        setattr(cls, name, wrapped)


def install(path: str) -> None:
    """Start counting in this process; totals go to ``path`` (JSON) every 50 ms and at exit."""
    import psycopg

    for cls, is_async in ((psycopg.Cursor, False), (psycopg.AsyncCursor, True)):
        _wrap(cls, "execute", "statements", is_async)
        _wrap(cls, "executemany", "statements", is_async)
    for cls, is_async in ((psycopg.Connection, False), (psycopg.AsyncConnection, True)):
        _wrap(cls, "commit", "transactions", is_async)
        _wrap(cls, "rollback", "transactions", is_async)

    def write() -> None:
        with _lock:
            text = json.dumps(_counts)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)

    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.05):
            write()

    threading.Thread(target=loop, name="bench-statement-counter", daemon=True).start()
    atexit.register(write)

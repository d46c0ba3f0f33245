"""A worker thread whose units keep failing logs the streak's first failure with its
traceback, and each later one on a single line with the count and the backoff: a database
that stays away for minutes must not fill the log (or a pipe nobody drains, which then
blocks every thread in ``logging``) with a traceback per thread and retry."""

from __future__ import annotations

import logging
import threading

import pytest
from django.db import OperationalError

from django_leases.workflows.worker import Worker


def test_a_failure_streak_logs_one_traceback_then_one_line_each(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = Worker(concurrency=1)
    tries: list[int] = []

    def work_once() -> bool:
        tries.append(1)
        if len(tries) <= 3:
            raise OperationalError("server closed the connection\nunexpectedly")
        worker.stop()
        return False

    monkeypatch.setattr(worker, "work_once", work_once)
    caplog.set_level(logging.WARNING, logger="django_leases")
    thread = threading.Thread(target=worker._loop, args=(False,))
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    failures = [r for r in caplog.records if "unit of work failed" in r.getMessage()]
    assert [r.exc_info is not None for r in failures] == [True, False, False]
    assert "2 in a row: OperationalError: server closed the connection unexpectedly" in (
        failures[1].getMessage()
    )
    assert "3 in a row" in failures[2].getMessage()
    assert "backing off 0.4 s" in failures[2].getMessage()

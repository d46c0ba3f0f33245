"""``make demo`` in no-serve mode, as CI runs it: every stage must do what it says.

The tour runs as a subprocess on a fresh database of its own, of the suite's kind (a SQLite
file; or a PostgreSQL database created for it on the suite's server), with its own server,
workers, singleton job and fake GitHub API.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.helpers import start_process

#: Seconds one tour may take (about a minute on an idle machine, several on a busy one).
TOUR_TIMEOUT = 540

# Two tours per test: pytest-timeout's default (300 s) is too short for a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * TOUR_TIMEOUT + 300)]


@pytest.fixture
def database_url(tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database for the tour, of the kind the suite runs on."""
    default = settings.DATABASES["default"]
    if default["ENGINE"].endswith("sqlite3"):
        yield f"sqlite:///{tmp_path / 'demo.sqlite3'}"
        return
    if default["ENGINE"].endswith("mysql"):
        yield from _mysql_database(default)
        return
    name = "demo_tour" + os.environ.get("DL_TEST_DB_SUFFIX", "")
    user = default.get("USER") or "postgres"
    host, port = default.get("HOST") or "127.0.0.1", default.get("PORT") or 5432
    server = f"host={host} port={port} user={user} dbname=postgres"

    def admin(statement: str) -> None:
        # The driver Django runs on: psycopg 3, or psycopg2 on the psycopg2 pass.
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        if is_psycopg3:
            import psycopg

            with psycopg.connect(server, autocommit=True) as connection:
                connection.execute(statement)
            return
        import psycopg2

        connection = psycopg2.connect(server)
        try:
            connection.autocommit = True
            connection.cursor().execute(statement)
        finally:
            connection.close()

    admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://{user}@{host}:{port}/{name}"
    finally:
        admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _mysql_database(default: dict[str, Any]) -> Iterator[str]:
    """MariaDB / MySQL: ``<test database>_tour``, created as the test database is."""
    name = f"{default['NAME']}_tour"
    charset = default["TEST"].get("CHARSET") or "utf8mb4"
    collation = default["TEST"].get("COLLATION") or "utf8mb4_nopad_bin"
    user, password = default.get("USER") or "root", default.get("PASSWORD") or ""
    host, port = default.get("HOST") or "127.0.0.1", int(default.get("PORT") or 3306)

    def admin(*statements: str) -> None:
        import MySQLdb

        server = MySQLdb.connect(host=host, port=port, user=user, password=password)
        try:
            for statement in statements:
                server.cursor().execute(statement)
        finally:
            server.close()

    admin(
        f"DROP DATABASE IF EXISTS `{name}`",
        f"CREATE DATABASE `{name}` CHARACTER SET {charset} COLLATE {collation}",
    )
    try:
        yield f"mysql://{user}{':' + password if password else ''}@{host}:{port}/{name}"
    finally:
        admin(f"DROP DATABASE IF EXISTS `{name}`")


def run_tour(tmp_path: Path, database_url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}
    env.update(
        DEMO_NO_SERVE="1",
        DATABASE_URL=database_url,
        TMPDIR=str(tmp_path),
        PYTHONUNBUFFERED="1",
    )
    tour = start_process([sys.executable, "-m", "demo_project.tour"], env=env)
    try:
        stdout, stderr = tour.communicate(timeout=TOUR_TIMEOUT)
    finally:
        if tour.poll() is None:  # timed out, or the test was interrupted: stop it all
            tour.send_signal(signal.SIGTERM)  # the tour stops its children
            try:
                tour.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                tour.kill()  # its children get SIGTERM from the kernel (PR_SET_PDEATHSIG)
                tour.communicate()
    (tmp_path / f"tour-{time.monotonic_ns()}.out").write_text(stdout)
    return subprocess.CompletedProcess(tour.args, tour.returncode, stdout, stderr)


def test_the_tour_does_what_it_says_and_again_on_the_same_database(
    tmp_path: Path, database_url: str
) -> None:
    done = run_tour(tmp_path, database_url)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "every stage did what it said" in out
    assert "FAILED" not in out
    assert len(re.findall(r"^   ok$", out, flags=re.M)) == 10
    # A hook per GitHub source was registered at the fake GitHub and deleted again.
    assert len(re.findall(r"the fake GitHub has hook \d+ on octo-org/octo-repo", out)) == 2
    assert "the fake GitHub has no hook left" in out
    # The real payloads (or the samples) were accepted and their runs completed.
    accepted = re.findall(r"^   \S+\.json \([\w.]+\): 202, run ([0-9a-f-]{36})$", out, flags=re.M)
    assert len(accepted) >= 4
    assert re.search(r"runs completed: (\d+) of \1$", out, flags=re.M)
    # The paused worker's step was finished by the other worker as attempt 2, and its own
    # late write refused — read from its log and the database.
    assert re.search(r"attempt 1 was superseded \(current attempt 2\)", out)
    assert "build          succeeded  attempts: #1 running, #2 succeeded" in out
    assert re.search(
        r"attempt 1's own PreviewBuild write: (write refused|stopped: step lease lost)", out
    )
    assert "superseded attempts (stale writes refused): 1" in out
    # The pull request: its run fanned out the checks, slept, waited; the reviews that are
    # not approvals were recorded and left it waiting; the approval finished it.
    assert "pull request #8 opened: run" in out
    assert re.search(r"run\.parallel: the 3 checks were scheduled by one pass", out)
    assert re.search(r"run\.sleep\('settle', 4\): recorded when the pass reached it", out)
    assert "the sleep ended; the next pass came at" in out
    assert "now waiting for event 'approved'" in out  # workflow_runs show, while it waits
    assert len(re.findall(r"is '(commented|changes_requested)', not an approval", out)) == 2
    assert "the run still waits for 'approved': no event sent, no pass asked for" in out
    assert re.search(r"recorded: event 'approved' sent to run [0-9a-f-]{36}", out)
    assert "approved by grace-demo; the run finished" in out
    assert "deliveries that sent an event to a waiting run (202): 1" in out
    assert "deliveries to the disabled sources: 404, nothing recorded" in out
    assert re.search(r"singleton token: (\d+) -> (\d+)", out)
    # The @task receipts: each SUCCESSFUL, read back with get_result(), and one at a time on
    # the 'mail' queue (concurrency 1) although four workers run ten threads.
    assert "schedule 'demo-tick' (every second) paused until the last stage" in out
    assert "4 workers, 10 threads in all" in out
    receipts = re.findall(
        r"^      [0-9a-f-]{36} SUCCESSFUL: sent to customer\d@example\.com", out, re.M
    )
    assert len(receipts) == 5
    assert "one at a time: each receipt started after the one before it finished" in out
    assert re.search(
        r"@task receipts on queue 'mail' \(concurrency 1\): 5 sent, one at a time", out
    )
    # The per-second schedule: resumed, three (or more) consecutive ticks with one run each,
    # each fired by one worker, then paused again.
    assert "$ manage.py workflow_schedules resume demo-tick" in out
    assert "$ manage.py workflow_schedules pause demo-tick: Schedule 'demo-tick' paused." in out
    ticks = re.findall(
        r"^      schedule:demo-tick:(\S+): run [0-9a-f-]{36}, fired by worker-\d", out, re.M
    )
    assert len(ticks) >= 3 and len(set(ticks)) == len(ticks)
    assert re.search(
        r"schedule 'demo-tick' \(every second\): \d+ consecutive ticks, exactly one run", out
    )
    # The child processes were all stopped.
    assert not re.search(r"Traceback", done.stderr), done.stderr

    # Re-running ``make demo`` keeps working: the admin user exists, the sources are left as
    # the first tour left them, the Stripe events were already received (answered 200 and
    # not processed twice).
    again = run_tour(tmp_path, database_url)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "every stage did what it said" in again.stdout
    assert "already received by an earlier tour" in again.stdout
    # A pull request has one review run (its key): the second tour opens the next one.
    assert "this one opens #9 (the samples, renumbered)" in again.stdout
    assert "approved by grace-demo; the run finished: #9" in again.stdout
    # The schedule's runs of the first tour are not counted again; it was paused throughout.
    assert len(re.findall(r"^   ok$", again.stdout, flags=re.M)) == 10

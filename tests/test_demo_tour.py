"""``make demo`` in no-serve mode, as CI runs it: every stage must do what it says.

The tour runs as a subprocess on a fresh SQLite database of its own (whatever database the
suite runs on), with its own server, workers, singleton job and fake GitHub API.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"),
        reason="the tour test runs in the SQLite pass (the tour uses a SQLite file of its own)",
    ),
]


def run_tour(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}
    env.update(
        DEMO_NO_SERVE="1",
        DATABASE_URL=f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        TMPDIR=str(tmp_path),
        PYTHONUNBUFFERED="1",
    )
    return subprocess.run(
        [sys.executable, "-m", "demo_project.tour"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_tour_does_what_it_says_and_again_on_the_same_database(tmp_path: Path) -> None:
    done = run_tour(tmp_path)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "every stage did what it said" in out
    assert "FAILED" not in out
    assert len(re.findall(r"^   ok$", out, flags=re.M)) == 8
    # The hook was registered at the fake GitHub and deleted again.
    assert re.search(r"the fake GitHub has hook \d+ on octo-org/octo-repo", out)
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
    assert "delivery to the disabled source: 404, nothing recorded" in out
    assert re.search(r"singleton token: (\d+) -> (\d+)", out)
    # The child processes were all stopped.
    assert not re.search(r"Traceback", done.stderr), done.stderr

    # Re-running ``make demo`` keeps working: the admin user exists, the sources are left as
    # the first tour left them, the Stripe events were already received (answered 200 and
    # not processed twice).
    again = run_tour(tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "every stage did what it said" in again.stdout
    assert "already received by an earlier tour" in again.stdout

"""Driving ``manage.py hold_lease`` as a real subprocess: the :class:`Holders` that start
holders, the small child program (``CHILD``) they run, which records what it saw — its pid,
the lease variables and any signal it got — in files under ``tmp_path``, and the
``holders`` fixture (``tests/conftest.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from django_leases.models import Lease
from tests.helpers import MANAGE_PY, ROOT, wait_until

TTL = 3.0
#: Upper bound for anything that should happen "soon" (process start-up on a loaded machine).
PATIENCE = 60.0


# The child: writes NAME.json (pid, process group, lease variables) as soon as it starts;
# on SIGTERM/SIGINT writes NAME.sig with the signal number and exits 42 (or, with
# --ignore-term, keeps running); with --hold, runs until NAME.finish appears.
CHILD = r"""
import json, os, signal, sys, time
from pathlib import Path

out, name, flags = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]

def on_signal(signum, frame):
    with open(out / f"{name}.sig", "a") as f:
        f.write(f"{signum}\n")
    if "--ignore-term" not in flags:
        os._exit(42)

signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
info = {
    "pid": os.getpid(),
    "pgid": os.getpgid(0),
    "key": os.environ.get("DJANGO_LEASES_KEY"),
    "token": os.environ.get("DJANGO_LEASES_TOKEN"),
    "holder": os.environ.get("DJANGO_LEASES_HOLDER"),
}
(out / f"{name}.json.tmp").write_text(json.dumps(info))
(out / f"{name}.json.tmp").rename(out / f"{name}.json")
if "--hold" in flags:
    deadline = time.monotonic() + 150
    while not (out / f"{name}.finish").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _signals_as_from_a_terminal() -> None:
    """In the holder's process before it runs: SIGINT and SIGQUIT back to their defaults.
    A shell without job control starts a background job (CI's ``.ci/run &``) with them
    ignored, an ignored signal stays ignored across ``exec``, and a holder respects that
    (as ``nohup`` means it to): the tests send them as a terminal would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


class Holders:
    """Starts ``manage.py hold_lease`` processes and cleans up whatever is left of them."""

    def __init__(self, env: dict[str, str], tmp_path: Path) -> None:
        self.env = env
        self.dir = tmp_path
        self.child_py = tmp_path / "child.py"
        self.child_py.write_text(CHILD)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}

    def child(self, name: str, *flags: str) -> list[str]:
        """The command line of a ``CHILD`` called ``name``."""
        return [sys.executable, str(self.child_py), str(self.dir), name, *flags]

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        """``manage.py hold_lease *args``; stdout and stderr go to a file (see :meth:`log`)."""
        log = self.dir / f"holder-{len(self.procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*MANAGE_PY, "hold_lease", *args],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_signals_as_from_a_terminal,
            )
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def run(self, *args: str) -> tuple[int, str]:
        """Run ``manage.py hold_lease *args`` to the end: (exit code, output)."""
        proc = self.start(*args)
        code = proc.wait(timeout=PATIENCE)
        return code, self.log(proc)

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return self.logs[proc.pid].read_text(errors="replace")

    def marker(self, name: str) -> Path:
        return self.dir / f"{name}.json"

    def info(self, name: str) -> dict[str, Any]:
        """What child ``name`` recorded at start (waits for it)."""
        path = self.marker(name)
        wait_until(path.exists, PATIENCE, what=f"child {name} to start")
        return json.loads(path.read_text())

    def signals(self, name: str) -> list[int]:
        """The signals child ``name`` received (in order)."""
        path = self.dir / f"{name}.sig"
        return [int(line) for line in path.read_text().split()] if path.exists() else []

    def finish(self, name: str) -> None:
        (self.dir / f"{name}.finish").touch()

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for marker in self.dir.glob("*.json"):
            pgid = json.loads(marker.read_text())["pgid"]
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)


def lease_row(key: str) -> Any:
    """The lease row of ``key``, with its state."""
    return Lease.objects.with_state().get(key=key)

"""What both benchmarks (``bench/leases.py``, ``bench/workflows.py``) share.

The facts recorded beside every figure (machine, load average, versions, the commit measured),
reading a process's CPU time from ``/proc``, turning a ``postgres://`` URL into a libpq one, and
writing a report to ``bench/results/``. Nothing here measures anything.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"

try:
    CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):
    CLOCK_TICKS = 100


class BenchError(RuntimeError):
    """A contender did not do what the measurement assumes (a refused grant, a failed task)."""


def libpq_conninfo(database_url: str) -> str:
    """A libpq URL for psycopg from a django-environ style ``postgres://`` URL.

    Raises ``SystemExit`` for a URL of another database: the benchmarks need PostgreSQL.
    """
    if database_url.startswith(("postgres://", "postgresql://", "pgsql://")):
        return "postgresql://" + database_url.split("://", 1)[1]
    raise SystemExit(f"bench needs a PostgreSQL database URL, not {database_url!r}")


def process_cpu_seconds(pid: int | None, *, with_children: bool = False) -> float | None:
    """User + system CPU seconds process ``pid`` has used so far (Linux ``/proc``), or None.

    ``with_children`` adds the CPU time of its children it has reaped (a worker's subprocesses).
    """
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        used = (11, 12, 13, 14) if with_children else (11, 12)
        return sum(int(fields[i]) for i in used) / CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return None


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None where the platform has none."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def settle(below: float = 1.0, within: float = 240.0) -> list[float] | None:
    """Wait, at most ``within`` seconds, for the 1-minute load average to fall below ``below``
    (the work of a stage that just ended — eight contending processes — keeps it up for
    minutes after). Returns the load averages then; says on stderr when it waits or gives
    up. ``within`` 0: no wait."""
    deadline = time.monotonic() + within
    said = False
    while True:
        load = load_average()
        if load is None or load[0] < below or time.monotonic() >= deadline:
            if said and load is not None and load[0] >= below:
                print(f"load {load[0]:.2f} after {within:g} s: going on", file=sys.stderr)
            return load
        if not said:
            print(
                f"load {load[0]:.2f}: waiting up to {within:g} s for < {below:g}", file=sys.stderr
            )
            said = True
        time.sleep(5)


def add_settle_argument(parser: argparse.ArgumentParser) -> None:
    """``--settle SECONDS``, for :func:`settle` (``args.settle``)."""
    parser.add_argument(
        "--settle",
        type=float,
        default=240.0,
        help="seconds to wait at most, before measuring, for the 1-minute load average to "
        "fall below 1 (a stage just ended keeps it up for minutes; 0: no wait)",
    )


def machine_facts() -> dict[str, Any]:
    """Host, platform, CPU model and count, Python, and the load average now."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_at_start": load_average(),
    }


def versions(packages: Iterable[str]) -> dict[str, Any]:
    """Installed versions of ``packages`` (None when missing), psycopg's build, and the commit.

    ``django_leases_uncommitted_changes`` lists the files under ``django_leases/`` that differ
    from ``git_commit``: a figure measured on uncommitted code says so.
    """
    from importlib.metadata import PackageNotFoundError, version

    import psycopg

    found: dict[str, Any] = {}
    for package in ("django", "django-leases", "psycopg", *packages):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = None
    found["psycopg_impl"] = psycopg.pq.__impl__
    found["libpq"] = psycopg.pq.version()
    try:
        found["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "django_leases"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        found["django_leases_uncommitted_changes"] = sorted(
            line[3:] for line in changed.splitlines() if line.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        found["git_commit"] = None
    return found


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Write ``report`` as indented JSON to ``path`` (values JSON lacks become strings)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n")


def recreate_database(database_url: str) -> str:
    """Drop and create the bench database (it must be a bench-only one). Returns its name."""
    import psycopg
    from psycopg import sql

    conninfo = libpq_conninfo(database_url)
    name = str(psycopg.conninfo.conninfo_to_dict(conninfo).get("dbname") or "")
    if "bench" not in name:
        raise SystemExit(f"refusing to drop {name!r}: the bench database's name must say 'bench'")
    admin = psycopg.conninfo.make_conninfo(conninfo, dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name

"""The failover table of ``docs/operations/replication.md``: the scenario of
``tests/failover.py`` (holders granting and writing, and workers claiming and running steps,
through a multi-host URL, the primary SIGKILLed, its standby promoted) repeated for each
replication mode, the figures summed.

Modes: ``async-no-epoch`` (an asynchronous standby, the previous release's acquire: tokens
without epochs, and step fence tokens that are bare attempt numbers), ``async`` (this
release), ``sync-on`` and ``sync-remote-apply`` (a synchronous standby,
``synchronous_commit`` = ``on`` / ``remote_apply``).

Private clusters on ports 5441-5449 in a temporary directory (``tests/pgcluster.py``: as
root the server runs as ``postgres``); the Django settings are the test suite's, on the
PostgreSQL of ``--database-url`` (only its settings are used, not its database)::

    .venv/bin/python bench/failover.py --runs 5
    .venv/bin/python bench/failover.py --runs 5 --mode async --mode sync-on

Prints the table and writes ``bench/results/failover-<date>-<HHMM>.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

from common import RESULTS_DIR, load_average, machine_facts, versions, write_report  # noqa: E402

MODES = {
    "async-no-epoch": {"synchronous": False, "epoch": False},
    "async": {"synchronous": False, "epoch": True},
    "sync-on": {"synchronous": True, "commit": "on"},
    "sync-remote-apply": {"synchronous": True, "commit": "remote_apply"},
}

COLUMNS = (
    ("runs", "runs"),
    ("grants", "grants"),
    ("tokens_issued_twice", "tokens issued twice"),
    ("tokens_below_an_earlier_grant", "tokens below an earlier grant"),
    ("acknowledged_writes", "acknowledged writes"),
    ("acknowledged_writes_lost", "acknowledged writes lost"),
    ("store_writes_under_a_shared_token", "store: two holders, one token"),
    ("store_writes_refused", "store: writes refused"),
    ("failed_calls", "failed calls"),
    ("step_executions", "step executions"),
    ("steps_run_twice", "step attempts run twice"),
    ("step_tokens_issued_twice", "step fence tokens issued twice"),
    ("step_results", "step results acknowledged"),
    ("step_results_lost", "step results lost"),
    ("step_store_writes_under_a_shared_token", "store: two executions, one step token"),
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="failovers per mode (default 5)")
    parser.add_argument(
        "--mode", action="append", choices=sorted(MODES), help="a mode (repeatable; default all)"
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        help="a PostgreSQL URL for the Django settings (its database is not used)",
    )
    args = parser.parse_args(argv)
    os.environ["DATABASE_URL"] = args.database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()

    from tests.failover import run_failover, summary
    from tests.pgcluster import Clusters, server_bindir

    bindir = server_bindir(None)
    if bindir is None:
        raise SystemExit("no PostgreSQL server programs (initdb, pg_basebackup, postgres) found")
    modes = args.mode or list(MODES)
    report: dict[str, Any] = {
        "machine": machine_facts(),
        "versions": versions(()),
        "server_programs": str(bindir),
        "runs_per_mode": args.runs,
        "modes": {},
    }
    for mode in modes:
        outcomes = []
        loads = []
        with Clusters(bindir) as clusters:
            for number in range(args.runs):
                loads.append(load_average())
                outcome = run_failover(clusters, name=f"_{number}", **MODES[mode])
                outcomes.append(outcome)
                print(f"{mode} run {number + 1}: {outcome.figures()}", file=sys.stderr)
        total = dict(summary(outcomes))
        total["runs"] = len(outcomes)
        report["modes"][mode] = {
            "total": total,
            "runs": [o.figures() for o in outcomes],
            "load_average_at_each_start": loads,
        }
    print(render(report))
    path = RESULTS_DIR / f"failover-{time.strftime('%Y-%m-%d-%H%M')}.json"
    write_report(path, report)
    print(f"written to {path.relative_to(BENCH.parent)}")


def render(report: dict[str, Any]) -> str:
    """The table: one row per figure, one column per mode (sums over the runs)."""
    modes = list(report["modes"])
    width = max(len(label) for _, label in COLUMNS)
    lines = [f"{'':<{width}}  " + "  ".join(f"{m:>18}" for m in modes)]
    for name, label in COLUMNS:
        cells = [str(report["modes"][m]["total"].get(name, 0)) for m in modes]
        lines.append(f"{label:<{width}}  " + "  ".join(f"{c:>18}" for c in cells))
    return "\n".join(lines)


if __name__ == "__main__":
    main()

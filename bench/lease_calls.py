"""What one acquire+release costs in a source tree, counted rather than timed (for a bisect).

On a machine shared with other work, CPU per operation drifts by ±30 % between repetitions,
more than the regressions a bisect looks for. This counts what does not drift, in one fresh
process per tree: the Python function calls per acquire+release and per refresh
(``cProfile``'s call counts, after a warm-up), the SQL sent (holder fixed, token numbers
masked, so identical text means identical statements), and the lease table's indexes and
triggers (the server's work per statement follows from the SQL and the schema). Usage, one
line of JSON per tree::

    bench/lease_calls.py --database-url postgres://postgres@127.0.0.1:5432/some_bench TREE...

Each ``TREE`` is a source tree (e.g. a ``git worktree add --detach /tmp/at-abc123 abc123``);
its ``django_leases`` is imported, and the database is migrated by it first (``--no-migrate``
to skip). The database name must contain ``bench``. ``git bisect run`` can use the exit
status of ``--below CALLS`` (0 when the count is below it, 1 otherwise).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import pstats
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

CYCLES = 200


def measure(tree: str, database_url: str, migrate: bool) -> dict[str, Any]:
    """Run in a child process: this tree's django_leases, counted (see the module docstring)."""
    sys.path.insert(0, tree)
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
    from bench.leases import configure_django  # the same settings as the benchmark's

    configure_django(database_url, {})
    import django_leases

    if not str(Path(django_leases.__file__).resolve()).startswith(str(Path(tree).resolve())):
        raise SystemExit(f"imported {django_leases.__file__}, not the tree's")
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_leases.models import Lease

    objects = Lease.objects
    holder = "bench-holder"

    def cycle() -> None:
        objects.release(objects.acquire("bench:calls", holder, 30.0))

    for _ in range(50):
        cycle()
    held = objects.acquire("bench:calls-renew", holder, 30.0)
    with CaptureQueriesContext(connection) as captured:
        cycle()
        held = objects.refresh(held, 30.0)
    # The token rises from run to run on a shared database: not part of the statement.
    sql = [re.sub(r"token = \d+", "token = N", q["sql"]) for q in captured.captured_queries]

    def calls(operation: Any) -> float:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(CYCLES):
            operation()
        profile.disable()
        stats: Any = pstats.Stats(profile)
        return sum(entry[1] for entry in stats.stats.values()) / CYCLES

    per_cycle = calls(cycle)
    box = [held]
    per_refresh = calls(lambda: box.__setitem__(0, objects.refresh(box[0], 30.0)))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'django_leases_lease' ORDER BY 1"
        )
        indexes = [row[0] for row in cursor.fetchall()]
        cursor.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'django_leases_lease'::regclass"
        )
        triggers = cursor.fetchone()[0]
    return {
        "tree": tree,
        "calls_per_acquire_release": round(per_cycle, 1),
        "calls_per_refresh": round(per_refresh, 1),
        "sql_sha1": hashlib.sha1("\n".join(sql).encode()).hexdigest()[:12],
        "sql": sql,
        "indexes": indexes,
        "triggers": triggers,
    }


def _create_database(database_url: str) -> None:
    """Create the database if it is missing."""
    import psycopg
    from psycopg import sql

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.common import libpq_conninfo

    params = psycopg.conninfo.conninfo_to_dict(libpq_conninfo(database_url))
    name = str(params.pop("dbname"))
    with psycopg.connect(**params, dbname="postgres", autocommit=True) as server:
        if not server.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            server.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", metavar="TREE")
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/django_leases_bench_calls"
        ),
    )
    parser.add_argument("--no-migrate", action="store_true")
    parser.add_argument("--below", type=float, default=None, metavar="CALLS")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if "bench" not in args.database_url.rsplit("/", 1)[-1]:
        parser.error("the database name must contain 'bench'")
    if args.child:
        print(json.dumps(measure(args.trees[0], args.database_url, not args.no_migrate)))
        return 0
    _create_database(args.database_url)
    worst = 0.0
    for tree in args.trees:
        command = [sys.executable, __file__, "--child", "--database-url", args.database_url]
        command += ["--no-migrate"] if args.no_migrate else []
        done = subprocess.run([*command, tree], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 125  # git bisect run: this commit cannot be tested
        found = json.loads(done.stdout.strip().splitlines()[-1])
        worst = max(worst, found["calls_per_acquire_release"])
        print(json.dumps(found))
    if args.below is not None:
        return 0 if worst < args.below else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Finding runs by tag and by key among a million on PostgreSQL (``tagged``, ``key_starts_with``
and the admin's run list that calls them).

Not part of ``make bench``: it creates a scratch database (``<name>_search_runs``), migrates
it, fills it with 1 000 000 runs (``--runs``), each with a key ``owner/repo-<r % 1000>#<r>``
and two tags (``team=team-<r % 50>``: 20 000 runs a team; ``pr=<r>``: one run), then times
the queries an operator's search sends — each the best and the median of ``--repeat`` (10)
tries, after one untimed try — and prints each plan's index names (``EXPLAIN``). The
admin's run list is timed end to end too (Django's test client, a superuser, the page
rendered: 100 rows and their count). The 1-minute load average is printed beside the
figures and written with them to ``bench/results/search-runs-<date>-<HHMM>.json``.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/django_leases \\
        .venv/bin/python bench/search_runs.py [--runs 1000000] [--keep]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    RESULTS_DIR,
    add_settle_argument,
    load_average,
    machine_facts,
    settle,
    write_report,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="Runs to fill (1000000).")
    parser.add_argument("--repeat", type=int, default=10, help="Timed tries per query (10).")
    parser.add_argument("--keep", action="store_true", help="Keep the scratch database.")
    add_settle_argument(parser)
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/django_leases")
    parsed = urlparse(url)
    if not parsed.scheme.startswith("postgres"):
        print("DATABASE_URL must name a PostgreSQL database", file=sys.stderr)
        return 2
    scratch = (parsed.path.lstrip("/") or "django_leases") + "_search_runs"
    admin_url = urlunparse(parsed._replace(path="/postgres"))

    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{scratch}"')
        conn.execute(f'CREATE DATABASE "{scratch}"')
    os.environ["DATABASE_URL"] = urlunparse(parsed._replace(path="/" + scratch))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
    try:
        return measure(scratch, args)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{scratch}"')


def measure(scratch: str, args: argparse.Namespace) -> int:
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from django_leases.models import WorkflowRun

    call_command("migrate", verbosity=0)
    started = time.monotonic()
    fill(args.runs)
    filled = time.monotonic() - started
    print(f"filled {scratch} with {args.runs:,} runs and {2 * args.runs:,} tags in {filled:.0f} s")
    load = settle(within=args.settle)
    runs = WorkflowRun.objects
    middle = args.runs // 2
    listing = runs.order_by("-created_at")

    def first_page(rows: Any) -> Callable[[], Any]:
        return lambda: list(rows.values_list("pk", flat=True)[:100])

    queries: dict[str, Callable[[], Any]] = {
        "tagged(pr=<one run>)": first_page(listing.tagged(pr=str(middle))),
        "tagged(team=<20k runs>), newest 100": first_page(listing.tagged(team="team-7")),
        "tagged(team=..., pr=...)": first_page(
            listing.tagged(team=f"team-{middle % 50}", pr=str(middle))
        ),
        "tagged(team=<20k runs>).count()": lambda: runs.tagged(team="team-7").count(),
        "key_starts_with(<a whole key>)": first_page(
            listing.key_starts_with(f"owner/repo-{middle % 1000}#{middle}")
        ),
        "key_starts_with(<1000 runs' prefix>), newest 100": first_page(
            listing.key_starts_with(f"owner/repo-{middle % 1000}#")
        ),
    }
    User.objects.create_superuser("bench", "bench@example.invalid", "x")
    client = Client()
    client.login(username="bench", password="x")
    changelist = "/admin/django_leases/workflowrun/"

    def page(query: dict[str, str]) -> Callable[[], Any]:
        def get() -> Any:
            response = client.get(changelist + "?" + urlencode(query))
            assert response.status_code == 200, response.status_code
            return response

        return get

    queries["admin list ?tag=team=<20k runs>"] = page({"tag": "team=team-7"})
    queries["admin list ?q=<a whole key>"] = page({"q": f"owner/repo-{middle % 1000}#{middle}"})
    queries["admin list ?q=<1000 runs' prefix>"] = page({"q": f"owner/repo-{middle % 1000}#"})

    results = []
    print(f"\nload average {load}\n")
    print(f"{'query':<52} {'best ms':>9} {'median ms':>10}  indexes used")
    for name, call in queries.items():
        call()
        times = []
        for _ in range(args.repeat):
            begin = time.perf_counter()
            call()
            times.append((time.perf_counter() - begin) * 1000)
        indexes = plan_indexes(connection, call, CaptureQueriesContext)
        best, median = min(times), statistics.median(times)
        print(f"{name:<52} {best:>9.2f} {median:>10.2f}  {', '.join(indexes) or '-'}")
        results.append({"query": name, "best_ms": best, "median_ms": median, "indexes": indexes})
    after = load_average()
    print(f"\nload average after: {after}")
    stamp = datetime.now().strftime("%Y-%m-%d-%H%M")
    report = {
        "benchmark": "search_runs",
        "runs": args.runs,
        "tags_per_run": 2,
        "repeat": args.repeat,
        "fill_seconds": filled,
        "load_average_before": load,
        "load_average_after": after,
        "machine": machine_facts(),
        "results": results,
    }
    path = RESULTS_DIR / f"search-runs-{stamp}.json"
    write_report(path, report)
    print(f"written to {path.relative_to(ROOT)}")
    return 0


def plan_indexes(connection: Any, call: Callable[[], Any], capture: Any) -> list[str]:
    """The indexes the SELECTs of ``call`` read through, by ``EXPLAIN``."""
    with capture(connection) as captured:
        call()
    found: list[str] = []
    for query in captured.captured_queries:
        sql = query["sql"]
        if not sql.startswith("SELECT") or "django_leases_workflowrun" not in sql:
            continue
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql)
            for (line,) in cursor.fetchall():
                if " using " in line or (" on " in line and "Index" in line):
                    words = line.split()
                    for marker in ("using", "on"):
                        if marker in words:
                            name = words[words.index(marker) + 1]
                            if name.startswith("dl_") or name.endswith("_pkey"):
                                found.append(name)
                if "Seq Scan on django_leases_workflowrun" in line:
                    found.append("SEQ SCAN workflowrun")
    return sorted(set(found))


def fill(count: int) -> None:
    """``count`` finished runs with keys and two tags each (JSON and tag rows); ANALYZE."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO django_leases_workflowrun
                (id, workflow, status, input, pass_requests, branches_left, key, tags,
                 created_at, updated_at, finished_at)
            SELECT md5('run' || g)::uuid, 'wf-' || (g %% 20), 'completed', '{}'::jsonb, 1, 0,
                   'owner/repo-' || (g %% 1000) || '#' || g,
                   jsonb_build_object('team', 'team-' || (g %% 50), 'pr', g::text),
                   now() - (g || ' seconds')::interval, now(), now()
            FROM generate_series(1, %s) AS g
            """,
            [count],
        )
        cursor.execute(
            """
            INSERT INTO django_leases_workflowruntag (run_id, name, value)
            SELECT md5('run' || g)::uuid, t.name, CASE t.name WHEN 'team'
                   THEN 'team-' || (g %% 50) ELSE g::text END
            FROM generate_series(1, %s) AS g, (VALUES ('team'), ('pr')) AS t(name)
            """,
            [count],
        )
        cursor.execute("VACUUM ANALYZE django_leases_workflowrun")
        cursor.execute("VACUUM ANALYZE django_leases_workflowruntag")


if __name__ == "__main__":
    sys.exit(main())

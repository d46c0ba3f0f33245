"""MkDocs hook: the settings and system-check tables come from the code, never copied by hand.

* ``<!-- settings-table -->`` becomes a table of every key of ``django_leases.conf.DEFAULTS``
  with its default (from the code) and its meaning (from the table in ``conf.py``'s
  docstring). A key without a row, or a row without a key, fails the build.
* ``<!-- checks-table -->`` becomes the table of ids in ``checks.py``'s docstring; an id used
  in the code but missing from the table fails the build.
* ``<!-- exit-codes: NAME -->`` becomes the exit-code table of command NAME, rendered from
  ``EXIT_CODES`` in ``django_leases/management/base.py`` (which also renders each command's
  ``--help``). A status the command's code exits with but its table lacks, or a command
  without a table, fails the build.
* ``<!-- bench: KIND FILE -->`` becomes a table of the figures in ``bench/results/FILE``
  (KIND: ``leases``, ``tasks`` or ``shapes``), with the run's commit, versions and machine
  under it: measured numbers are read from the results ``make bench`` wrote, never copied.
  A missing file, or a contender or figure the table needs and the file lacks, fails the
  build.
* A line ending with ``<!-- unbuilt-note -->`` is for readers of the raw Markdown (on
  GitHub, where the markers show nothing); the built page drops it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_leases"
BORDER = re.compile(r"^=+( +=+)+$")


def _docstring(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not doc:
        raise PluginError(f"{path} has no docstring")
    return doc


def _table(doc: str, source: str) -> tuple[list[int], list[str]]:
    """Column starts and body lines of the first RST simple table in ``doc``."""
    lines = doc.splitlines()
    borders = [i for i, line in enumerate(lines) if BORDER.match(line)]
    if len(borders) < 3:
        raise PluginError(f"no table in the docstring of {source}")
    starts = [m.start() for m in re.finditer(r"=+", lines[borders[0]])]
    return starts, lines[borders[1] + 1 : borders[2]]


def _joined(parts: list[str]) -> str:
    """Wrapped cell text as one line ("read-decide-" + "write" → "read-decide-write")."""
    text = ""
    for part in parts:
        text += part if not text or text.endswith("-") else " " + part
    return text


def _markdown(text: str) -> str:
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)  # Sphinx roles → code
    return text.replace("``", "`").replace("|", "\\|")


def settings_table() -> str:
    from django_leases.conf import DEFAULTS

    starts, body = _table(_docstring(PACKAGE / "conf.py"), "conf.py")
    meaning: dict[str, list[str]] = {}
    current = None
    for line in body:
        key = line[: starts[1]].strip()
        if key:
            current = key.strip("`")
            rest = re.sub(r"^``[^`]*``\s*", "", line[starts[1] :].strip())
            meaning[current] = [rest]
        elif current is not None and line.strip():
            meaning[current].append(line.strip())
    meaning = {key: [_joined(parts)] for key, parts in meaning.items()}
    missing = sorted(set(DEFAULTS) - set(meaning))
    unknown = sorted(set(meaning) - set(DEFAULTS))
    if missing or unknown:
        raise PluginError(
            f"conf.py's docstring table and DEFAULTS disagree: no row for {missing}, "
            f"no default for {unknown}"
        )
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for key, default in DEFAULTS.items():
        shown = _default(default)
        rows.append(f"| `{key}` | {shown} | {_markdown(meaning[key][0])} |")
    return "\n".join(rows)


def _default(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value!r}`"


def checks_table() -> str:
    path = PACKAGE / "checks.py"
    starts, body = _table(_docstring(path), "checks.py")
    rows: list[list[str]] = []
    for line in body:
        check_id = line[: starts[1]].strip()
        text = line[starts[1] :].strip()
        if check_id:
            rows.append([check_id.strip("`"), text])
        elif rows and text:
            rows[-1][1] = _joined([rows[-1][1], text])
    documented = {row[0] for row in rows}
    used = set(re.findall(r'id="(django_leases\.[EW]\d{3})"', path.read_text(encoding="utf-8")))
    if used - documented:
        lacking = sorted(used - documented)
        raise PluginError(f"checks.py uses ids its docstring table lacks: {lacking}")
    lines = ["| id | what it reports |", "|---|---|"]
    lines += [f"| `{check_id}` | {_markdown(text)} |" for check_id, text in rows]
    return "\n".join(lines)


def _django() -> None:
    """Django set up enough to import the commands (their models), when nothing else did."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["django.contrib.contenttypes", "django_leases"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            USE_TZ=True,
        )
        django.setup()


def exit_codes_table(name: str) -> str:
    _django()
    from django_leases.management import base

    problems = [
        problem for command in base.command_names() for problem in base.exit_code_problems(command)
    ]
    if name not in base.EXIT_CODES:
        problems.append(f"no exit-code table for the command {name!r} named in the docs")
    if problems:
        raise PluginError("exit codes: " + "; ".join(problems))
    return base.exit_codes_markdown(name)


BENCH_RESULTS = ROOT / "bench" / "results"
PEERS = ("django-pglock", "redis", "django-ox", "procrastinate", "django-tasks-db", "dbos")

#: KIND → (contenders and how the table names them, the figures shown: (key, heading, format)).
BENCH_TABLES: dict[str, tuple[dict[str, str], list[tuple[str, str, str]]]] = {
    "leases": (
        {
            "ours": "django-leases (`Lease.objects`)",
            "floor": "raw-SQL floor (psycopg, one statement)",
            "pglock": "django-pglock (advisory lock)",
            "redis": "Redis (redis-py `Lock`)",
        },
        [
            ("acquire_release", "acquire + release /s, 1 connection", "{:,.0f}"),
            ("renew", "renewals /s", "{:,.0f}"),
            ("contended_grants", "grants /s, 8 processes on one key", "{:,.0f}"),
        ],
    ),
    "tasks": (
        {
            "ours-tasks": "django-leases `TaskBackend` (a `@task`)",
            "ours": "django-leases, a 1-step workflow",
            "django-ox": "django-ox",
            "procrastinate": "Procrastinate",
            "django-tasks-db": "django-tasks-db",
        },
        [
            ("end_to_end", "end to end /s", "{:,.0f}"),
            ("drain_1", "drain, 1 worker /s", "{:,.0f}"),
            ("drain_4", "drain, 4 workers /s", "{:,.0f}"),
            ("latency_p50_ms", "idle latency p50 ms", "{:,.1f}"),
            ("latency_p99_ms", "p99 ms", "{:,.1f}"),
        ],
    ),
    "shapes": (
        {
            "ours": "django-leases",
            "dbos": "DBOS Transact (defaults)",
            "dbos-poll0.1": "DBOS Transact (polling 0.1 s)",
            "django-ox": "django-ox",
            "procrastinate": "Procrastinate",
            "django-tasks-db": "django-tasks-db",
        },
        [
            ("seq10_steps_per_s_1", "10-step workflow, steps /s, 1 worker", "{:,.0f}"),
            ("seq10_steps_per_s_4", "4 workers", "{:,.0f}"),
            ("fanout_seconds_1", "fan-out of 100, s, 1 worker", "{:,.2f}"),
            ("fanout_seconds_4", "4 workers", "{:,.2f}"),
        ],
    ),
}


def bench_table(kind: str, name: str) -> str:
    """The table of ``bench/results/<name>`` for ``kind`` (see :data:`BENCH_TABLES`)."""
    import json

    path = BENCH_RESULTS / name
    if kind not in BENCH_TABLES:
        raise PluginError(f"bench table: unknown kind {kind!r}")
    if not path.is_file():
        raise PluginError(f"bench table: no results file {path}")
    run = json.loads(path.read_text(encoding="utf-8"))
    figures = run["shapes"]["figures"] if kind == "shapes" else run["figures"]
    contenders, shown = BENCH_TABLES[kind]
    rows = [
        "| | " + " | ".join(heading for _, heading, _ in shown) + " |",
        "|---|" + "---:|" * len(shown),
    ]
    for contender, label in contenders.items():
        if contender not in figures:
            raise PluginError(f"bench table: {name} has no figures of {contender!r}")
        cells = []
        for key, _, form in shown:
            if key not in figures[contender]:
                raise PluginError(f"bench table: {name} has no {key} of {contender!r}")
            value = figures[contender][key]  # None: not applicable to that contender
            cells.append("—" if value is None else form.format(value))
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    versions = run["versions"]
    machine = run["machine"]
    peers = ", ".join(f"{package} {versions[package]}" for package in PEERS if package in versions)
    rows.append("")
    server = str(run["postgresql"]["server_version"]).split(" ")[0]
    rows.append(
        f"*`bench/results/{name}`: django-leases at `{versions['git_commit'][:7]}`, Django "
        f"{versions['django']}, psycopg {versions['psycopg']}, {peers}; PostgreSQL {server} "
        f"on the same machine ({machine['cpu_count']} CPUs, {machine['cpu']}).*"
    )
    return "\n".join(rows)


MARKERS = {"<!-- settings-table -->": settings_table, "<!-- checks-table -->": checks_table}
BENCH_MARKER = re.compile(r"<!-- bench: (\w+) ([\w.-]+\.json) -->")
EXIT_CODES_MARKER = re.compile(r"<!-- exit-codes: (\w+) -->")


UNBUILT_NOTE = re.compile(r"^.*<!-- unbuilt-note -->[ \t]*\n?", re.M)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    markdown = UNBUILT_NOTE.sub("", markdown)
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    markdown = BENCH_MARKER.sub(lambda match: bench_table(match[1], match[2]), markdown)
    return EXIT_CODES_MARKER.sub(lambda match: exit_codes_table(match[1]), markdown)

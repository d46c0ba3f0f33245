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


MARKERS = {"<!-- settings-table -->": settings_table, "<!-- checks-table -->": checks_table}
EXIT_CODES_MARKER = re.compile(r"<!-- exit-codes: (\w+) -->")


UNBUILT_NOTE = re.compile(r"^.*<!-- unbuilt-note -->[ \t]*\n?", re.M)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    markdown = UNBUILT_NOTE.sub("", markdown)
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return EXIT_CODES_MARKER.sub(lambda match: exit_codes_table(match[1]), markdown)

"""The code blocks of README.md and docs/: each says whether it runs, and those that run, run.

Every fenced block carries a marker, an HTML comment on the line before its fence (invisible
on the site and on GitHub):

``<!-- run -->``
    Python executed as written, here, in order with the page's other ``run`` blocks (one
    namespace per page, so a later block uses what an earlier one defined), with this suite's
    settings and database. Workflows, step functions and trigger sources it declares are
    declared in registries of its own, emptied for the page, so a page's ``build-preview``
    is its own and not the demo's. ``<!-- run: drive NAME INPUT -->`` then starts workflow
    NAME with the JSON INPUT and drives it to the end (``django_leases.testing.drive``): it
    must complete. ``<!-- run: settings -->`` then applies the block's upper-case names
    (``DJANGO_LEASES``, ``TASKS``…) with ``override_settings`` and runs the system checks:
    no error of ours may be reported.
``<!-- commands -->``
    Shell lines ``python manage.py COMMAND ARGS`` (any interpreter path; continuation lines
    and comments allowed): each is parsed by that command's own parser, so the command and
    every option exist as written. Nothing else may be in such a block.
``<!-- tutorial: shell|file PATH|append PATH -->``
    The tutorial's steps, done in order in a new project by ``tests/test_tutorial.py``.
``<!-- fragment: WHY -->``
    Not complete on its own (it uses names the text around it or your project defines, or
    it is a line from a larger file): not run. WHY says what it lacks.
``<!-- not run: WHY -->``
    Complete but not something this suite can run (``make test``, ``pip install``, a systemd
    unit, a program's output, SQL for one database…). WHY says which.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.core.management import get_commands, load_command_class
from django.core.management.base import CommandError
from django.test import override_settings

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
MARKER = re.compile(r"^<!--\s*(run|commands|fragment|not run|tutorial)(?::\s*(.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page."""

    path: Path
    line: int  # of its opening fence, 1-based
    language: str
    code: str
    marker: str | None  # run, commands, fragment, not run, tutorial; None: unmarked
    argument: str  # what follows the marker's colon ("" when nothing does)

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> Iterator[Block]:
    """The fenced code blocks of the Markdown file at ``path``, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        closing = re.compile(rf"^{re.escape(indent)}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = index + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        code = "\n".join(line.removeprefix(indent) for line in lines[index + 1 : end])
        before = index - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        found = MARKER.match(lines[before].strip()) if before >= 0 else None
        yield Block(
            path=path,
            line=index + 1,
            language=opening["info"].strip().split(" ")[0],
            code=code + "\n",
            marker=found[1] if found else None,
            argument=(found[2] or "") if found else "",
        )
        index = end + 1


def every_block() -> list[Block]:
    return [block for path in PAGES for block in blocks(path)]


def test_every_code_block_says_whether_it_runs() -> None:
    problems = []
    for block in every_block():
        if block.marker is None:
            problems.append(f"{block}: no marker (<!-- run -->, <!-- fragment: why -->…)")
        elif block.marker in ("fragment", "not run") and not block.argument:
            problems.append(f"{block}: <!-- {block.marker}: … --> must say why")
        elif block.marker == "run" and block.language != "python":
            problems.append(f"{block}: only Python runs here, not {block.language!r}")
        elif block.marker == "tutorial" and block.path.name != "tutorial.md":
            problems.append(f"{block}: tutorial steps belong in docs/tutorial.md")
    assert problems == []


# -- run --------------------------------------------------------------------------------------


def _pages_that_run() -> list[Path]:
    return [path for path in PAGES if any(b.marker == "run" for b in blocks(path))]


@pytest.fixture
def own_registries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty workflow and trigger-source registries for one page's code."""
    from django_leases.triggers import registry as triggers
    from django_leases.workflows import registry as workflows

    for name in ("_workflows", "_step_functions", "_schedules", "_step_options", "_one_step"):
        monkeypatch.setattr(workflows, name, {})
    monkeypatch.setattr(triggers, "_declarations", {})


def _run(block: Block, namespace: dict[str, Any]) -> None:
    from django_leases.testing import drive
    from django_leases.workflows import start_workflow

    try:
        exec(compile(block.code, str(block), "exec"), namespace)
    except Exception as exc:
        raise AssertionError(f"{block} raised {exc!r}") from exc
    kind, _, rest = block.argument.partition(" ")
    if kind == "drive":
        name, _, given = rest.partition(" ")
        run = drive(start_workflow(name, json.loads(given or "null")))
        assert run is not None and run.status == "completed", (str(block), run and run.error)
    elif kind == "settings":
        named = {key: value for key, value in namespace.items() if key.isupper()}
        assert named, f"{block}: no setting"
        with override_settings(**named):
            ours = [
                message
                for message in checks.run_checks(include_deployment_checks=False)
                if str(message.id).startswith("django_leases.") and message.is_serious()
            ]
        assert ours == [], str(block)
    else:
        assert not block.argument, f"{block}: unknown run argument {block.argument!r}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("own_registries")
@pytest.mark.parametrize("page", _pages_that_run(), ids=lambda path: str(path.relative_to(ROOT)))
def test_the_page_s_code_runs(page: Path) -> None:
    namespace: dict[str, Any] = {"__name__": f"docs.{page.stem}"}
    for block in blocks(page):
        if block.marker == "run":
            _run(block, namespace)


# -- commands -------------------------------------------------------------------------------


def command_lines(code: str) -> Iterator[list[str]]:
    """Each shell command of ``code`` as its words (continuations joined, comments and a
    ``$`` prompt dropped)."""
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line.strip().removeprefix("$ "), comments=True)
        if words:
            yield words


def manage_py(words: list[str]) -> tuple[str, list[str]]:
    """``(command, arguments)`` of a ``[python] manage.py COMMAND ARGS`` line."""
    scripts = [i for i, word in enumerate(words) if word.endswith("manage.py")]
    if not scripts or scripts[0] + 1 >= len(words):
        raise ValueError(f"not a manage.py command: {shlex.join(words)}")
    first = scripts[0]
    before = words[:first]
    if before and not (len(before) == 1 and Path(before[0]).name.startswith("python")):
        raise ValueError(f"not a manage.py command: {shlex.join(words)}")
    return words[first + 1], words[first + 2 :]


def _parses(command: str, arguments: list[str]) -> None:
    known = get_commands()
    assert command in known, f"no command {command!r}"
    parser = load_command_class(known[command], command).create_parser("manage.py", command)
    if command == "hold_lease" and "--" in arguments:
        # As hold_lease's run_from_argv: what follows "--" is the child's command line.
        arguments = arguments[: arguments.index("--")]
    try:
        parser.parse_args(arguments)
    except CommandError as exc:
        raise AssertionError(f"manage.py {command} {shlex.join(arguments)}: {exc}") from exc


@pytest.mark.parametrize("block", [b for b in every_block() if b.marker == "commands"], ids=str)
def test_the_commands_parse(block: Block) -> None:
    lines = list(command_lines(block.code))
    assert lines, f"{block}: no command"
    for words in lines:
        _parses(*manage_py(words))


@pytest.mark.django_db(transaction=True)
def test_a_bad_setting_or_a_failing_workflow_is_found(own_registries: None) -> None:
    def block(code: str, argument: str) -> Block:
        return Block(ROOT / "README.md", 1, "python", code, "run", argument)

    with pytest.raises(AssertionError):
        _run(block('DJANGO_LEASES = {"DEFAULT_TTL": -1}', "settings"), {})
    failing = (
        "from django_leases.workflows import workflow\n"
        "@workflow('docs-test.fails')\n"
        "def fails(run, input):\n"
        "    raise ValueError('no')\n"
    )
    with pytest.raises(AssertionError, match="completed"):
        _run(block(failing, "drive docs-test.fails {}"), {})


def test_a_wrong_option_is_found() -> None:
    with pytest.raises(AssertionError, match="unrecognized arguments"):
        _parses("hold_lease", ["KEY", "--tll", "60", "--", "true"])
    with pytest.raises(ValueError, match=r"not a manage\.py command"):
        manage_py(["make", "test"])

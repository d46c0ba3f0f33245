"""The README: its first lines give the two set-up commands, then it speaks to users with
absolute links (a package index shows it away from the repository), and its workflow example
runs as written: the ``myapp/workflows.py`` block is executed as a module, the
``start_workflow`` line of the shell block after it is run through ``call_command``, and the
run is driven to its end on this thread (``django_leases.testing.drive``)."""

from __future__ import annotations

import json
import re
import shlex
import types
from pathlib import Path

import pytest
from django.core.management import call_command

from django_leases.models import RunStatus, WorkflowRun
from django_leases.testing import drive
from django_leases.workflows import registry

README = Path(__file__).resolve().parent.parent / "README.md"
REPOSITORY = "https://github.com/django-leases/django-leases"


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced code block: (language, body)."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def test_the_first_lines_give_the_two_set_up_commands() -> None:
    text = _text()
    lines = text.splitlines()
    assert lines[0] == "# django-leases"
    language, first = _blocks(text)[0]
    assert language == "sh"
    commands = [line.split("#")[0].strip() for line in first.splitlines()]
    assert [command for command in commands if command] == ["make demo", "make test"]
    assert text.index("```sh") < text.index("\n---\n") < text.index("## Install")


def test_every_link_is_absolute() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", _text())
    assert links
    relative = [link for link in links if not link.startswith("https://")]
    assert not relative, f"links a package index cannot follow: {relative}"
    ours = [link for link in links if link.startswith(REPOSITORY)]
    for link in ours:
        path = link.removeprefix(f"{REPOSITORY}/blob/main/").split("#")[0]
        if path != link.split("#")[0]:
            assert (README.parent / path).exists(), f"{link} names no file of the repository"


@pytest.fixture
def own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's workflow and step functions registered for this test only."""
    for table in ("_workflows", "_step_functions", "_step_options"):
        if hasattr(registry, table):
            monkeypatch.setattr(registry, table, dict(getattr(registry, table)))


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("own_registry")
def test_the_workflow_example_runs_as_written() -> None:
    blocks = _blocks(_text())
    (index,) = [
        i
        for i, (language, body) in enumerate(blocks)
        if language == "python" and body.startswith("# myapp/workflows.py")
    ]
    module = types.ModuleType("myapp_workflows_from_the_readme")
    exec(compile(blocks[index][1], "README.md", "exec"), module.__dict__)

    language, shell = blocks[index + 1]
    assert language == "sh"
    (start,) = [line for line in shell.splitlines() if " start_workflow " in line]
    argv = shlex.split(start.split("#")[0])
    assert argv[:3] == ["python", "manage.py", "start_workflow"]
    call_command(*argv[2:])

    run = WorkflowRun.objects.get(workflow="myapp.preview")
    driven = drive(run.pk)
    assert driven is not None and driven.status == RunStatus.COMPLETED
    promised = re.search(r"output `(\{.*?\})`", _text())
    assert promised, "the README no longer says what the run returns"
    assert driven.output == json.loads(promised[1])

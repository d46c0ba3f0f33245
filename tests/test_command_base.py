"""``django_leases.management.base``: the plumbing every command shares, and the docs hook
that renders (and checks) the exit-code tables from it."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import uuid
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path
from types import ModuleType

import pytest
from django.core.management import CommandError

from django_leases.management import base
from django_leases.management.base import (
    DATABASE_UNREACHABLE,
    EXIT_CODES,
    EXIT_WRONG_STATE,
    USAGE_ERROR,
    Column,
    ExitCode,
    database_alias,
    database_aliases,
    exit_code_problems,
    exit_codes_help,
    exit_codes_markdown,
    write_rows,
)
from django_leases.management.commands.leases import Command as LeasesCommand
from django_leases.models import Lease
from tests.helpers import manage

HOOK = Path(__file__).resolve().parent.parent / "docs" / "_hooks" / "reference_tables.py"

COLUMNS = (
    Column("NAME", "name"),
    Column("WHEN", "when"),
    Column("ON", "on", lambda on: "on" if on else "off"),
    Column("NOTE", "note"),
)


def rows_out(output_format: str, rows: list[dict[str, object]]) -> str:
    out = StringIO()
    write_rows(out, output_format, COLUMNS, rows, empty="Nothing here.")
    return out.getvalue()


# -- the table printer ------------------------------------------------------------------------


def test_a_table_aligns_columns_under_the_header_and_leaves_the_last_unpadded() -> None:
    when = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    rows: list[dict[str, object]] = [
        {"name": "alpha", "when": when, "on": True, "note": None},
        {"name": "b", "when": None, "on": False, "note": "a note"},
    ]
    assert rows_out("table", rows).splitlines() == [
        "NAME   WHEN                       ON   NOTE",
        "alpha  2030-01-02T03:04:05+00:00  on   -",
        "b      -                          off  a note",
    ]


def test_json_is_an_array_of_the_rows_with_json_types() -> None:
    when = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    ident = uuid.uuid4()
    rows: list[dict[str, object]] = [
        {"name": "alpha", "when": when, "on": True, "note": None, "id": ident, "n": 1.5},
    ]
    assert json.loads(rows_out("json", rows)) == [
        {
            "name": "alpha",
            "when": "2030-01-02T03:04:05.678901+00:00",
            "on": True,
            "note": None,
            "id": str(ident),
            "n": 1.5,
        }
    ]


def test_an_empty_listing_is_a_sentence_or_an_empty_array() -> None:
    assert rows_out("table", []).strip() == "Nothing here."
    assert json.loads(rows_out("json", [])) == []


def test_format_takes_table_or_json_and_the_aliases_given() -> None:
    parser = LeasesCommand().create_parser("manage.py", "leases")
    assert parser.parse_args(["list"]).format == "table"
    assert parser.parse_args(["list", "--format", "json"]).format == "json"
    with pytest.raises(CommandError, match=r"invalid choice: 'text' \(choose from 'table', 'json'"):
        parser.parse_args(["list", "--format", "text"])

    from django_leases.management.commands.leases_check import Command as CheckCommand

    check = CheckCommand().create_parser("manage.py", "leases_check")
    assert check.parse_args(["--format", "text"]).format == "table"
    assert check.parse_args([]).format == "table"


# -- --database -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_database_defaults_to_the_router_and_refuses_an_unknown_alias_as_usage() -> None:
    assert database_alias({"database": None}, Lease) == "default"
    assert database_alias({"database": "default"}, Lease) == "default"
    with pytest.raises(CommandError, match=r"Unknown database alias 'typo' \(configured: 'de"):
        database_alias({"database": "typo"}, Lease)
    try:
        database_alias({"database": "typo"}, Lease)
    except CommandError as exc:
        assert exc.returncode == USAGE_ERROR == 2
    assert database_aliases({"database": None}) is None
    assert database_aliases({"database": ["default"]}) == ["default"]
    with pytest.raises(CommandError, match="'typo'") as refused:
        database_aliases({"database": ["default", "typo"]})
    assert refused.value.returncode == USAGE_ERROR


def test_every_command_with_database_shares_one_help_text() -> None:
    helps = set()
    for name in base.command_names():
        module = importlib.import_module(f"{base.COMMANDS_PACKAGE}.{name}")
        parser = module.Command().create_parser("manage.py", name)
        subparsers = [
            sub
            for action in parser._actions
            if isinstance(action.choices, dict)
            for sub in action.choices.values()
        ]
        for each in [parser, *subparsers]:
            for action in each._actions:
                if "--database" in action.option_strings:
                    helps.add(action.help.split(" Default:")[0])
    assert helps == {"Database alias to use.", "Database alias to use; repeat for several."}


# -- subcommands take Django's options after their name ---------------------------------------


def test_django_options_parse_before_or_after_a_subcommand() -> None:
    parser = LeasesCommand().create_parser("manage.py", "leases")
    plain = parser.parse_args(["list"])
    assert (plain.verbosity, plain.settings, plain.traceback) == (1, None, False)
    after = parser.parse_args(["list", "-v", "0", "--settings", "s", "--pythonpath", "p"])
    assert (after.verbosity, after.settings, after.pythonpath) == (0, "s", "p")
    before = parser.parse_args(["--verbosity", "3", "--traceback", "release", "k"])
    assert (before.verbosity, before.traceback) == (3, True)  # not reset by the subcommand
    assert parser.parse_args(["release", "k", "--skip-checks"]).skip_checks is True


# -- exit codes -------------------------------------------------------------------------------


def test_every_command_has_a_complete_exit_code_table() -> None:
    assert sorted(EXIT_CODES) == base.command_names()
    assert [problem for name in EXIT_CODES for problem in exit_code_problems(name)] == []


def test_help_and_docs_render_the_same_rows() -> None:
    for name, table in EXIT_CODES.items():
        text = exit_codes_help(name)
        markdown = exit_codes_markdown(name).splitlines()
        assert text.startswith("exit codes:\n")
        assert all(len(line) <= 79 for line in text.splitlines()), name
        assert markdown[:2] == ["| exit code | meaning |", "|---|---|"]
        assert len(markdown) == 2 + len(table.rows)
        for row, line in zip(table.rows, markdown[2:], strict=True):
            assert line.startswith(f"| {row.shown} | ")
            assert f"  {row.shown} " in text
            assert "`" not in text
    assert "| 126 / 127 |" in exit_codes_markdown("hold_lease")


def test_every_exit_status_of_a_command_has_one_meaning() -> None:
    # A script must tell "bad usage" (2) from a command's own failure: no status is on two
    # rows of one command's table.
    doubled = {}
    for name, table in EXIT_CODES.items():
        codes = [code for row in table.rows for code in row.codes]
        twice = sorted({code for code in codes if codes.count(code) > 1})
        if twice:
            doubled[name] = twice
    assert doubled == {}


@pytest.mark.parametrize(
    "command", [["leases", "list"], ["workflow_runs", "list"], ["trigger_sources", "list"]]
)
def test_a_command_says_the_database_is_unreachable_without_a_traceback(
    command: list[str],
) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": "postgres://postgres@127.0.0.1:1/dl_unreachable",  # nobody listens
    }
    done = manage(*command, env=env)
    assert "Traceback" not in done.stderr, done.stderr[-600:]
    assert "Database 'default' is unreachable" in done.stderr, done.stderr
    assert done.returncode == DATABASE_UNREACHABLE == 4


def _without(name: str, code: int) -> base.ExitCodeTable:
    table = EXIT_CODES[name]
    return dataclasses.replace(table, rows=tuple(r for r in table.rows if code not in r.codes))


def test_a_status_the_code_uses_but_the_table_lacks_is_a_problem(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(EXIT_CODES, "workflow_runs", _without("workflow_runs", EXIT_WRONG_STATE))
    assert exit_code_problems("workflow_runs") == [
        "workflow_runs exits with 3, which its exit-code table lacks"
    ]
    # A status forwarded from a module (the worker's) counts as used too.
    monkeypatch.setitem(EXIT_CODES, "run_workflow_worker", _without("run_workflow_worker", 3))
    assert exit_code_problems("run_workflow_worker") == [
        "run_workflow_worker exits with 3, which its exit-code table lacks"
    ]
    # So do CommandError's default (1), usage errors (2) and an unreachable database (4).
    monkeypatch.setitem(
        EXIT_CODES, "leases", EXIT_CODES["leases"].__class__((ExitCode((0,), "ok"),))
    )
    assert exit_code_problems("leases") == [
        "leases exits with 1, which its exit-code table lacks",
        "leases exits with 2, which its exit-code table lacks",
        "leases exits with 4, which its exit-code table lacks",
    ]


def test_a_computed_status_needs_its_source_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        EXIT_CODES, "hold_lease", dataclasses.replace(EXIT_CODES["hold_lease"], forwards=())
    )
    [problem] = exit_code_problems("hold_lease")
    assert "computed status (code)" in problem
    monkeypatch.delitem(EXIT_CODES, "hold_lease")
    assert exit_code_problems("hold_lease") == [
        "command 'hold_lease' has no exit-code table in EXIT_CODES"
    ]


# -- the docs hook ----------------------------------------------------------------------------


@pytest.fixture
def hook() -> ModuleType:
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("reference_tables", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_hook_renders_the_table_at_its_marker(hook: ModuleType) -> None:
    page = "Before.\n\n<!-- exit-codes: workflow_runs -->\n*On GitHub.* <!-- unbuilt-note -->\n"
    rendered = hook.on_page_markdown(page)
    assert rendered == "Before.\n\n" + exit_codes_markdown("workflow_runs") + "\n"


def test_the_docs_build_fails_on_a_missing_exit_code(
    hook: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mkdocs.exceptions import PluginError

    monkeypatch.setitem(EXIT_CODES, "workflow_runs", _without("workflow_runs", EXIT_WRONG_STATE))
    with pytest.raises(PluginError, match="workflow_runs exits with 3, which its exit-code table"):
        hook.on_page_markdown("<!-- exit-codes: leases -->")
    monkeypatch.undo()
    with pytest.raises(PluginError, match="no exit-code table for the command 'nope'"):
        hook.on_page_markdown("<!-- exit-codes: nope -->")


NO_ADMIN_SETTINGS = """\
SECRET_KEY = "not-a-secret"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_leases"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {name!r}}}}}
"""


def test_every_command_loads_in_a_project_without_the_admin(tmp_path: Path) -> None:
    """The admin is optional: a project without ``django.contrib.admin`` runs every
    command (loading one must not import ``django_leases.admin``, whose ModelAdmins need
    the admin installed). ``--help`` loads a command's module and builds its parser."""
    import subprocess
    import sys

    (tmp_path / "noadmin_settings.py").write_text(
        NO_ADMIN_SETTINGS.format(name=str(tmp_path / "db.sqlite3"))
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "noadmin_settings"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    commands = Path(base.__file__).parent / "commands"
    names = sorted(p.stem for p in commands.glob("*.py") if p.stem != "__init__")
    assert "run_workflow_worker" in names
    for name in names:
        done = subprocess.run(
            [sys.executable, "-m", "django", name, "--help"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, (name, done.stderr[-2000:])


#: The byte 0xff on a command line, as Python's ``sys.argv`` holds it (``surrogateescape``).
UNDECODABLE = "caf\udcff"


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(("workflow_runs", "list", "--key", UNDECODABLE), id="runs-list-key"),
        pytest.param(("workflow_runs", "list", "--workflow", UNDECODABLE), id="runs-list-workflow"),
        pytest.param(
            ("workflow_runs", "cancel", "--workflow", UNDECODABLE), id="runs-cancel-workflow"
        ),
        pytest.param(("workflow_schedules", "pause", UNDECODABLE), id="schedules-pause"),
        pytest.param(("workflow_schedules", "resume", UNDECODABLE), id="schedules-resume"),
        pytest.param(
            (
                "workflow_schedules",
                "backfill",
                UNDECODABLE,
                "--start",
                "2024-01-01",
                "--end",
                "2024-01-02",
            ),
            id="schedules-backfill",
        ),
        pytest.param(("trigger_sources", "enable", UNDECODABLE), id="sources-enable"),
        pytest.param(("trigger_sources", "forget", UNDECODABLE), id="sources-forget"),
        pytest.param(("leases", "release", UNDECODABLE), id="leases-release"),
        pytest.param(("hold_lease", UNDECODABLE, "--wait"), id="hold-lease-key"),
    ],
)
@pytest.mark.django_db
def test_an_argument_that_is_not_utf8_is_a_usage_error(argv: tuple[str, ...]) -> None:
    """A byte the terminal could not decode as UTF-8 reaches a command as a lone surrogate,
    which no database driver encodes: every command refuses it as bad usage, naming it,
    before anything is done — not an uncaught ``UnicodeEncodeError`` from the driver."""
    from django.core.management import call_command

    with pytest.raises(CommandError, match="is not valid UTF-8 text") as raised:
        call_command(*argv, stdout=StringIO(), stderr=StringIO())
    assert raised.value.returncode == base.USAGE_ERROR


def test_a_program_s_arguments_go_to_it_as_the_system_gave_them() -> None:
    """``hold_lease``'s program line is the operating system's, not text for the database:
    an argument that is not UTF-8 (a file name in Latin-1) is not refused."""
    from django_leases.management.commands.hold_lease import Command

    Command()._refuse_undecodable((), {"key": "nightly", "command": ["cat", UNDECODABLE]})

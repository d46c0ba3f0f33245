"""``docs/reference/commands.md`` against the commands: each command's section names every
option its parser takes (Django's own options aside), and a synopsis line lists every one."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from django.core.management import load_command_class

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "commands.md"

#: Django's own options, which the page says every command takes without listing them.
DJANGOS_OWN = {
    "-h",
    "--help",
    "--version",
    "-v",
    "--verbosity",
    "--settings",
    "--pythonpath",
    "--traceback",
    "--no-color",
    "--force-color",
    "--skip-checks",
}

#: Old spellings still accepted, which the page names as such.
OLD_SPELLINGS = {"--json"}


def _sections() -> dict[str, str]:
    parts = re.split(r"^## `(\w+)`", PAGE.read_text(encoding="utf-8"), flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``parser`` and of its subcommands."""
    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _options(sub)
        else:
            found |= set(action.option_strings)
    return found - DJANGOS_OWN - OLD_SPELLINGS


SECTIONS = _sections()


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_each_command_s_section_names_every_option(name: str) -> None:
    body = SECTIONS[name]
    options = _options(load_command_class("django_leases", name).create_parser("manage.py", name))
    assert options - set(re.findall(r"--[a-z][a-z0-9-]*", body)) == set()
    synopses = re.findall(r"```text\n(.*?)```", body, re.S)
    assert synopses, f"{name}: no synopsis"
    in_synopses = set(re.findall(r"--[a-z][a-z0-9-]*", "".join(synopses)))
    assert options - in_synopses == set(), f"{name}: options missing from its synopsis"

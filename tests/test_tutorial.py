"""docs/tutorial.md, done as written: from ``startproject`` to its tests passing.

In an empty folder, each ``<!-- tutorial: … -->`` block of the page in order: ``shell`` runs
its commands (``django-admin`` and ``python`` being this interpreter, with the installed
django-leases), ``file PATH`` writes the block as the file PATH, ``append PATH`` adds it to
the end of PATH. Every command must succeed; the last one runs the tutorial's own tests, which
must pass, as many as the page says.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_docs_code import ROOT, blocks, command_lines

PAGE = ROOT / "docs" / "tutorial.md"

pytestmark = pytest.mark.slow


def _argv(words: list[str]) -> list[str]:
    program, *rest = words
    if program == "django-admin":
        return [sys.executable, "-m", "django", *rest]
    if program == "python":
        return [sys.executable, *rest]
    raise AssertionError(f"the tutorial runs only python and django-admin, not {program!r}")


def test_the_tutorial_runs_from_startproject_to_passing_tests(tmp_path: Path) -> None:
    steps = [block for block in blocks(PAGE) if block.marker == "tutorial"]
    assert steps, "no tutorial step"
    # A project of its own: none of this suite's settings or database.
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH")
    }
    last = ""
    for step in steps:
        kind, _, path = step.argument.partition(" ")
        if kind == "shell":
            for words in command_lines(step.code):
                done = subprocess.run(
                    _argv(words),
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                last = done.stdout + done.stderr
                assert done.returncode == 0, f"{step}: {' '.join(words)}\n{last}"
                if words[-1] == "check":  # the page says it reports nothing
                    assert "System check identified no issues" in last, last
        elif kind == "file":
            target = tmp_path / path
            assert target.parent.is_dir(), f"{step}: no folder for {path}"
            target.write_text(step.code, encoding="utf-8")
        elif kind == "append":
            target = tmp_path / path
            assert target.is_file(), f"{step}: nothing to append to at {path}"
            with target.open("a", encoding="utf-8") as file:
                file.write("\n\n" + step.code)
        else:
            raise AssertionError(f"{step}: unknown tutorial step {step.argument!r}")
    ran = re.search(r"^Ran (\d+) tests? in", last, re.M)
    assert ran is not None and re.search(r"^OK$", last, re.M), last
    said = {"One": 1, "Two": 2, "Three": 3, "Four": 4, "Five": 5}
    told = re.search(r"^(\w+) tests pass\.", PAGE.read_text(encoding="utf-8"), re.M)
    assert told is not None and said[told[1]] == int(ran[1]), (told and told[0], ran[1])
    # "Run it" outside the tests (which swap in Django's locmem backend): the receipt step
    # must have a mail backend that works on a development machine, with no SMTP server.
    sent = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            "from django.core.mail import send_mail; "
            "send_mail('Your receipt', 'paid', None, ['ada@example.com'])",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sent.returncode == 0, sent.stdout + sent.stderr

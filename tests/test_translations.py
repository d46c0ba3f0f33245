"""The German and French catalogues (``django_leases/locale/``): current, complete, compiled.

* Every string the package marks for translation is in both catalogues, and nothing else
  is: ``makemessages`` run on a copy of the package finds the same messages as the
  committed ``.po`` files hold (``make messages`` refreshes them).
* Every message is translated (no empty or fuzzy entry), ``msgfmt --check`` accepts each
  catalogue (placeholders kept, plural forms right), and the committed ``.mo`` holds what
  ``compilemessages`` makes of its ``.po``.
* Marking the models' verbose names changed no schema: the migration Django wrote for them
  has no SQL on this backend.

These need GNU gettext (``xgettext``, ``msgmerge``, ``msgfmt``), as ``makemessages`` and
``compilemessages`` do: Debian's ``gettext`` package.
"""

from __future__ import annotations

import gettext
import os
import re
import shutil
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

PACKAGE = Path(__file__).resolve().parent.parent / "django_leases"
LANGUAGES = sorted(path.name for path in (PACKAGE / "locale").iterdir() if path.is_dir())

Message = tuple[str | None, str, str | None]  # (context, id, plural id)


def _gettext(program: str) -> str:
    found = shutil.which(program)
    if found is None:
        pytest.fail(f"{program} is missing: install GNU gettext (Debian: apt-get install gettext)")
    return found


def _unquoted(lines: list[str]) -> str:
    text = "".join(line[line.index('"') + 1 : line.rindex('"')] for line in lines)
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape")


def entries(path: Path) -> dict[Message, dict[str, object]]:
    """The live (not obsolete) messages of the ``.po`` file at ``path`` but the header:
    their translations (``msgstr`` or ``msgstr[N]``, as text) and flags."""
    found: dict[Message, dict[str, object]] = {}
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        lines = [line for line in block.splitlines() if line.strip()]
        if all(line.startswith("#") for line in lines):
            continue  # nothing, or an obsolete message (``#~``)
        flags = {
            flag.strip() for line in lines if line.startswith("#,") for flag in line[2:].split(",")
        }
        fields: dict[str, list[str]] = {}
        current = None
        for line in lines:
            if line.startswith("#"):
                continue
            match = re.match(r"^(msgctxt|msgid_plural|msgid|msgstr(?:\[\d+\])?) ", line)
            if match:
                current = match[1]
                fields[current] = [line[match.end() :]]
            elif current is not None:
                fields[current].append(line)
        if "msgid" not in fields:
            continue
        text = {name: _unquoted(value) for name, value in fields.items()}
        if text["msgid"] == "":
            continue  # the header
        key = (text.get("msgctxt"), text["msgid"], text.get("msgid_plural"))
        found[key] = {
            "flags": flags,
            "translations": [value for name, value in text.items() if name.startswith("msgstr")],
        }
    return found


def test_the_catalogues_hold_every_marked_string_and_no_other(tmp_path: Path) -> None:
    assert LANGUAGES == ["de", "fr"]
    for program in ("xgettext", "msgmerge", "msguniq"):
        _gettext(program)
    copy = tmp_path / "django_leases"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.mo"))
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-m", "django", "makemessages", "--all", "--add-location", "file"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for language in LANGUAGES:
        po = Path("locale", language, "LC_MESSAGES", "django.po")
        marked = set(entries(copy / po))
        kept = set(entries(PACKAGE / po))
        assert sorted(marked - kept, key=str) == [], f"{language}: not in the catalogue yet"
        assert sorted(kept - marked, key=str) == [], f"{language}: no longer marked anywhere"


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_catalogue_is_translated_checked_and_compiled(language: str, tmp_path: Path) -> None:
    po = PACKAGE / "locale" / language / "LC_MESSAGES" / "django.po"
    messages = entries(po)
    assert len(messages) > 150
    untranslated = [key for key, entry in messages.items() if not all(entry["translations"])]
    fuzzy = [key for key, entry in messages.items() if "fuzzy" in entry["flags"]]  # type: ignore[operator]
    assert untranslated == [] and fuzzy == []
    assert '#, fuzzy\nmsgid ""' not in po.read_text(encoding="utf-8"), "a fuzzy header"
    compiled = tmp_path / "django.mo"
    checked = subprocess.run(
        [_gettext("msgfmt"), "--check", "-o", str(compiled), str(po)],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr
    with compiled.open("rb") as fresh, po.with_suffix(".mo").open("rb") as committed:
        assert (
            gettext.GNUTranslations(committed)._catalog  # type: ignore[attr-defined]
            == gettext.GNUTranslations(fresh)._catalog  # type: ignore[attr-defined]
        ), "the committed .mo is stale: run make messages"


@pytest.mark.django_db(transaction=True)
def test_the_verbose_names_migration_changes_no_schema() -> None:
    out = StringIO()
    call_command("sqlmigrate", "django_leases", "0029_verbose_names", stdout=out)
    statements = [
        line
        for line in out.getvalue().splitlines()
        if line.strip() and not line.startswith("--") and line not in ("BEGIN;", "COMMIT;")
    ]
    assert statements == []

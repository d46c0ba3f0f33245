"""The lean install: cryptography and httpx come with the ``webhooks`` extra, are imported only
when a trigger source uses them, and system check E033 names the extra when a declared source
needs it and it is missing.

The suite's own venv has the extra, so the child Pythons here take the modules away
(``sys.modules[name] = None`` makes their import fail as if they were not installed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from django_leases.checks import check_webhooks_extra

ROOT = Path(__file__).resolve().parent.parent

EXTRA = ("cryptography", "httpx")


def _child(body: str, *, without: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run ``body`` in a child Python on the suite's settings (SQLite: no database is
    touched), ``without`` the given modules; returns what it printed as ``RESULT {json}``."""
    script = (
        "import json, sys\n"
        f"for name in {without!r}:\n"
        "    sys.modules[name] = None\n"
        "import django\n"
        "django.setup()\n" + body
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": "",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return dict(json.loads(line.removeprefix("RESULT ")))


def test_starting_django_imports_neither_cryptography_nor_httpx() -> None:
    # The suite's settings declare the demo's three trigger sources and register every app.
    found = _child(
        "from django.core import checks\n"
        "from django.urls import get_resolver\n"
        "get_resolver().url_patterns\n"  # the URLconf, the admin's and ours
        "from django_leases.management.commands import trigger_sources\n"
        "checks.run_checks()\n"
        f"loaded = [name for name in {EXTRA!r} if name in sys.modules]\n"
        "print('RESULT ' + json.dumps({'loaded': loaded}))\n"
    )
    assert found == {"loaded": []}


def test_without_the_extra_a_check_names_it_and_a_use_says_how_to_install_it() -> None:
    found = _child(
        "from django.core import checks\n"
        "from django.core.exceptions import ImproperlyConfigured\n"
        "from django_leases.models.trigger import fernet\n"
        "from django_leases.triggers.providers import http\n"
        "messages = [m for m in checks.run_checks() if m.id == 'django_leases.E033']\n"
        "uses = {}\n"
        "for name, use in (('fernet', fernet),\n"
        "                  ('call', lambda: http.call('GitHub', 'ping', 'GET', 'http://x'))):\n"
        "    try:\n"
        "        use()\n"
        "    except ImproperlyConfigured as exc:\n"
        "        uses[name] = str(exc)\n"
        "print('RESULT ' + json.dumps({'messages': [[m.msg, m.hint] for m in messages],\n"
        "                              'uses': uses}))\n",
        without=EXTRA,
    )
    ((message, hint),) = found["messages"]  # said once
    for source in ("'github-pushes'", "'github-pull-requests'", "'stripe-orders'"):
        assert source in message
    assert "cryptography (" in message and "httpx (" in message
    assert 'pip install "django-leases[webhooks]"' in hint
    assert "cryptography" in found["uses"]["fernet"]
    assert "httpx" in found["uses"]["call"]
    for text in found["uses"].values():
        assert 'pip install "django-leases[webhooks]"' in text


def _source(name: str, provider: str) -> Any:
    return SimpleNamespace(name=name, provider=provider)


def test_the_check_asks_only_for_what_each_source_needs() -> None:
    manual = _source("by-hand", "manual")
    github = _source("pushes", "github")
    # Nothing missing: nothing said.
    assert check_webhooks_extra([manual, github], {}, []) == []
    # A manual source whose secret comes from WEBHOOK_SECRETS needs neither module.
    assert check_webhooks_extra([manual], {"by-hand": "s3cret"}, list(EXTRA)) == []
    # Its secret in the credential store: cryptography, not httpx.
    (only,) = check_webhooks_extra([manual], {}, ["httpx"]) or [None]
    assert only is None
    (crypto,) = check_webhooks_extra([manual], {}, ["cryptography"])
    assert crypto.id == "django_leases.E033" and "'by-hand'" in crypto.msg
    assert "httpx" not in crypto.msg
    # GitHub calls its API with httpx, whatever the secret.
    (api,) = check_webhooks_extra([github], {"pushes": "s3cret"}, list(EXTRA))
    assert "httpx (" in api.msg and "cryptography" not in api.msg
    # One message for every source and module.
    (both,) = check_webhooks_extra([manual, github], {}, list(EXTRA))
    assert "'by-hand', 'pushes'" in both.msg
    assert "cryptography (" in both.msg and "httpx (" in both.msg


def test_without_the_extra_set_secret_says_how_to_install_it_without_a_traceback() -> None:
    """``trigger_sources set-secret`` of a source registered by hand, on an install without
    the ``webhooks`` extra: one line naming the extra (a ``CommandError``), no traceback."""
    found = _child(
        "import io\n"
        "from django.core.management import CommandError, call_command\n"
        "from django_leases.models import TriggerSource\n"
        "from django_leases.triggers import registry\n"
        "from django_leases.triggers.registry import StartWorkflow, webhook_source\n"
        "call_command('migrate', verbosity=0)\n"
        "webhook_source('by-hand', provider='manual', events={'push': StartWorkflow('w')})\n"
        "TriggerSource.objects.sync(registry.declarations())\n"
        "try:\n"
        "    call_command('trigger_sources', 'set-secret', 'by-hand',\n"
        "                 stdin=io.StringIO('s3cret'), stdout=io.StringIO())\n"
        "    said = None\n"
        "except CommandError as exc:\n"
        "    said = str(exc)\n"
        "print('RESULT ' + json.dumps({'said': said}))\n",
        without=EXTRA,
    )
    assert found["said"] is not None and 'pip install "django-leases[webhooks]"' in found["said"]

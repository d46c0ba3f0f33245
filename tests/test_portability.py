"""Windows: the package and every command module import without POSIX-only names.

No Windows machine runs the suite, so a child Python takes away what Windows lacks before
anything is imported — the POSIX-only signals (SIGHUP, SIGKILL…), ``os.killpg``, ``os.fork``
and friends, and the modules ``fcntl``, ``resource``, ``pwd``, ``grp``, ``termios`` — then
sets Django up, imports every module of the package (each command's too), shows each
command's ``--help``, and runs ``hold_lease``, which must say that it needs POSIX instead of
failing with an ``AttributeError``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: What the child runs: the names Windows lacks taken away, then the imports.
SIMULATED_WINDOWS = r"""
import json, os, signal, sys

# The standard library's own platform branches were taken when it was built for this
# system: on Windows they take theirs. Imported first, so that only what *we* (and Django)
# name at import time meets the missing names.
import asyncio, concurrent.futures, multiprocessing, selectors, shutil, socket, ssl
import subprocess, tempfile, uuid

for name in ("SIGHUP", "SIGKILL", "SIGSTOP", "SIGCONT", "SIGQUIT", "SIGUSR1", "SIGUSR2",
             "SIGALRM", "SIGCHLD", "SIGPIPE", "SIGTSTP", "SIGTTIN", "SIGTTOU", "SIGWINCH"):
    if hasattr(signal, name):
        delattr(signal, name)
for name in ("killpg", "getpgid", "setsid", "setpgid", "fork", "forkpty", "register_at_fork",
             "getuid", "geteuid", "getpgrp"):
    if hasattr(os, name):
        delattr(os, name)
for name in ("fcntl", "resource", "pwd", "grp", "termios", "tty", "pty"):
    sys.modules[name] = None  # import raises ImportError, as on Windows

import django
django.setup()

import io, pkgutil, importlib
from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import CommandError
import django_leases

imported = []
for module in pkgutil.walk_packages(django_leases.__path__, "django_leases."):
    if ".migrations." in module.name:
        continue
    importlib.import_module(module.name)
    imported.append(module.name)

helps = {}
for name, app in sorted(get_commands().items()):
    if app != "django_leases":
        continue
    command = load_command_class(app, name)
    parser = command.create_parser("manage.py", name)
    helps[name] = len(parser.format_help())

try:
    call_command("hold_lease", "windows-key", command=["true"])
    hold_lease = "ran"
except CommandError as exc:
    hold_lease = str(exc)

from django_leases.holder import POSIX

print("RESULT " + json.dumps(
    {"imported": imported, "helps": helps, "hold_lease": hold_lease, "posix": POSIX}
))
"""


def test_the_package_imports_without_posix_names_and_hold_lease_says_it_needs_posix() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", SIMULATED_WINDOWS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))

    commands = sorted(
        path.stem
        for path in (ROOT / "django_leases" / "management" / "commands").glob("*.py")
        if path.stem != "__init__"
    )
    assert sorted(result["helps"]) == commands
    assert all(length > 0 for length in result["helps"].values())
    for name in commands:
        assert f"django_leases.management.commands.{name}" in result["imported"]
    for name in ("django_leases.holder", "django_leases.testing.providers"):
        assert name in result["imported"]
    assert result["posix"] is False
    assert "needs a POSIX system" in result["hold_lease"], result["hold_lease"]


@pytest.mark.skipif(sys.platform == "win32", reason="the real thing is POSIX")
def test_this_system_is_posix_for_the_holder() -> None:
    from django_leases.holder import POSIX

    assert POSIX is True

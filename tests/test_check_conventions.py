"""Django's conventions for checks and commands: the checks that ask a database are tagged
``database`` (so ``migrate`` on a fresh database does not tell you to run ``migrate``),
``check --deploy`` warns of plain-http URLs, ``-v 0`` is quiet, and a command run on a
database django-leases' migrations never reached says so in one line, not a traceback."""

from __future__ import annotations

import inspect
import io
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core import checks as django_checks
from django.core.management import call_command
from django.test.utils import override_settings

from django_leases import apps, checks
from django_leases.models import Lease, WorkflowSchedule
from django_leases.triggers import registry
from django_leases.triggers.registry import webhook_source
from tests.helpers import ADMIN_PROJECT_SETUP, in_fresh_interpreter, manage, unique_key


def _on_file(database: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``manage.py ARGS`` on the suite's settings and a SQLite file of its own."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"sqlite:///{database}",
    }
    return manage(*args, env=env, timeout=300)


def test_migrate_on_a_fresh_database_does_not_ask_to_run_migrate(tmp_path: Path) -> None:
    # The suite's settings declare the demo's trigger sources, two of them with their secret
    # in the credential store: the store is read by a database check, which waits for it.
    database = tmp_path / "fresh.sqlite3"
    done = _on_file(database, "migrate", "--noinput")
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert "django_leases.W014" not in said and "django_leases.W008" not in said
    # Once migrated, check --database reads the store: the manual source has no secret.
    checked = _on_file(database, "check", "--database", "default")
    assert "django_leases.W008" in checked.stdout + checked.stderr
    assert "'stripe-orders'" in checked.stdout + checked.stderr
    # Plain check asks no database.
    plain = _on_file(database, "check")
    assert "django_leases.W008" not in plain.stdout + plain.stderr


def test_every_check_that_queries_a_database_is_tagged_database() -> None:
    # Run with databases=None, a database check must not touch any database: pytest-django
    # refuses database access in this test, so one that did would fail or say W014.
    webhook_source("conventions-manual", provider="manual", events={})
    try:
        messages = django_checks.run_checks(tags=["django_leases"])
    finally:
        registry.unregister("conventions-manual")
    assert not [m for m in messages if m.id in ("django_leases.W014", "django_leases.W008")]
    registered = {
        check.__name__: set(check.tags)
        for check in django_checks.registry.registry.get_checks(include_deployment_checks=True)
        if check.__module__ == apps.__name__
    }
    assert django_checks.Tags.database in registered["stored_secrets_check"]
    assert django_checks.Tags.database in registered["workflow_functions_check"]
    assert django_checks.Tags.database not in registered["django_leases_checks"]


def test_every_entry_point_of_the_checks_module_is_registered_once() -> None:
    """The registered names are the checks module's entry points (the functions Django may
    call with ``app_configs``), each registered once, deploy-only where it says so."""
    entry_points = {
        name
        for name, value in vars(checks).items()
        if inspect.isfunction(value)
        and value.__module__ == checks.__name__
        and "app_configs" in inspect.signature(value).parameters
    }
    registered = [
        check
        for check in django_checks.registry.registry.get_checks(include_deployment_checks=True)
        if check.__module__ == apps.__name__
    ]
    assert sorted(check.__name__ for check in registered) == sorted(entry_points)
    deploy_only = {check.__name__ for check in django_checks.registry.registry.deployment_checks}
    assert deploy_only >= {"deploy_checks"}
    assert not deploy_only & (entry_points - {"deploy_checks"})


#: A project with the admin and django-leases: which of the modules named on its command line
#: ``django.setup()`` leaves unloaded.
_UNLOADED_AFTER_SETUP = (
    "import sys\n" + ADMIN_PROJECT_SETUP + "print(sorted(set(sys.argv[1:]) - set(sys.modules)))\n"
)


def test_start_up_registers_the_checks_without_loading_them() -> None:
    """Django's start-up registers the checks without importing the checks module: it loads
    when checks first run, never in a process that runs none (a web process)."""
    modules = ["django_leases.checks"]
    done = in_fresh_interpreter(_UNLOADED_AFTER_SETUP, *modules)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr(modules)


@pytest.fixture
def restored_checks() -> Iterator[None]:
    """Django's registry of checks as it was, whatever the test registered."""
    registered = set(django_checks.registry.registry.registered_checks)
    deployment = set(django_checks.registry.registry.deployment_checks)
    yield
    django_checks.registry.registry.registered_checks = registered
    django_checks.registry.registry.deployment_checks = deployment


def test_populating_the_app_registry_again_registers_no_check_twice(
    restored_checks: None,
) -> None:
    """Each check runs once per ``run_checks``, also after the app registry was populated
    again (``override_settings(INSTALLED_APPS=...)``, ``modify_settings``, ``isolate_apps``:
    each calls ``ready()`` again)."""
    with override_settings(INSTALLED_APPS=list(django_settings.INSTALLED_APPS)):
        pass
    ours = [
        check.__name__
        for check in django_checks.registry.registry.get_checks(include_deployment_checks=True)
        if check.__module__ == apps.__name__
    ]
    assert sorted(ours) == sorted(set(ours)) and ours
    with override_settings(DJANGO_LEASES={"NOT_A_SETTING": 1}):
        said = [m.id for m in django_checks.run_checks(tags=["django_leases"])]
    assert said.count("django_leases.E015") == 1, said


@pytest.mark.parametrize(
    ("configured", "expected"),
    [
        ({}, []),
        ({"BASE_URL": "https://app.example.com"}, []),
        ({"BASE_URL": "http://app.example.com"}, ["django_leases.W034"]),
        ({"GITHUB_API_URL": "http://ghe.example.com/api/v3"}, ["django_leases.W035"]),
        ({"STRIPE_API_URL": "HTTP://stripe.example.com"}, ["django_leases.W035"]),
        ({"BASE_URL": 7}, []),  # E016's
    ],
)
def test_deploy_checks_warn_of_plain_http(configured: dict[str, Any], expected: list[str]) -> None:
    messages = checks.check_deploy_urls(configured)
    assert [m.id for m in messages] == expected
    for message in messages:
        assert "plain http" in message.msg and "https://" in str(message.hint)


def test_check_deploy_runs_them_and_plain_check_does_not(settings: Any) -> None:
    settings.DJANGO_LEASES = {"BASE_URL": "http://app.example.com"}

    def ids(deploy: bool) -> list[str]:
        return [
            m.id or ""
            for m in django_checks.run_checks(
                tags=["django_leases"], include_deployment_checks=deploy
            )
            if m.id == "django_leases.W034"
        ]

    assert ids(deploy=True) == ["django_leases.W034"]
    assert ids(deploy=False) == []


def _out(*args: str, **options: Any) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, **options)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_verbosity_0_is_quiet_and_requested_output_stays() -> None:
    key = unique_key("quiet")
    lease = Lease.objects.acquire(key, "someone", 30)
    assert lease is not None
    assert _out("leases", "release", key, verbosity=0) == ""
    assert Lease.objects.current(key) is None
    WorkflowSchedule.objects.get_or_create(
        name="conventions-quiet",
        defaults={"workflow": "tests.never", "cron": "0 3 * * *", "timezone": "UTC"},
    )
    assert _out("workflow_schedules", "pause", "conventions-quiet", verbosity=0) == ""
    assert WorkflowSchedule.objects.get(name="conventions-quiet").paused
    # At the default verbosity the same confirmation is written.
    assert "resumed" in _out("workflow_schedules", "resume", "conventions-quiet")
    # What was asked for is written whatever the verbosity.
    assert key in _out("leases", "list", verbosity=0)


@pytest.mark.parametrize(
    "command",
    [
        ["trigger_sources", "list"],
        ["leases", "list"],
        ["workflow_runs", "list"],
        ["workflow_schedules", "list"],
        ["rotate_trigger_secrets"],
        ["run_workflow_worker", "--once"],
        ["hold_lease", "conventions-key", "--", "true"],
    ],
)
def test_a_command_on_an_unmigrated_database_says_so_without_a_traceback(
    tmp_path: Path, command: list[str]
) -> None:
    done = _on_file(tmp_path / "unmigrated.sqlite3", *command)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "django-leases' tables are not on database 'default'" in done.stderr
    assert "manage.py migrate" in done.stderr

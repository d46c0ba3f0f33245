"""django-leases as a reusable app: the wheel, installed into a brand-new Django project.

Builds the wheel from this checkout, checks its file list, then in a temporary folder: a fresh
venv (no system site-packages, nothing from this checkout on its path), ``pip install`` of the
wheel, ``django-admin startproject`` and ``startapp``, the app and its URLs added, ``migrate``,
and a short journey there (:data:`JOURNEY`): a lease, a workflow run completed by
``run_workflow_worker --once``, a trigger source reconciled, enabled and sent a signed delivery
that becomes an event and a completed run, and every django-leases admin page rendered. So the
migrations, templates and static files ship in the wheel and nothing depends on
``demo_project``.

The venv gets the wheel alone — the lean base install, without the ``webhooks`` extra: the
journey's ``manual`` source keeps its secret in settings, so it needs neither cryptography nor
httpx — and the Django this suite runs on (the same release), so each cell of the matrix
(``noxfile.py``) checks the wheel on its own Python and Django.

Slow (a venv and an install): it runs once per ``make test``, in the SQLite pass (the new
project uses its own SQLite file, whatever the suite's database is), and is skipped on the
other passes with that reason; ``DL_PACKAGING_TEST=1`` runs it there too (the CI cells of the
noxfile set it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import django
import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_leases"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
        and not os.environ.get("DL_PACKAGING_TEST"),
        reason="the reusable-app test runs once per `make test`, in the SQLite pass "
        "(its new project has its own SQLite database; DL_PACKAGING_TEST=1 runs it here too)",
    ),
]

#: The trigger source the new project declares. The trigger-source API is the part most likely
#: to change: the declaration (``TRIGGERS_PY``), the settings block (``SETTINGS_TAIL``) and the
#: ``enable`` step of the journey (``JOURNEY``) are the only places that use it.
TRIGGERS_PY = """\
from django_leases.triggers import StartWorkflow, webhook_source

webhook_source(
    "shop-pushes",
    provider="manual",
    config={"signature": "github"},
    events={"push": StartWorkflow("shop.greet")},
)
"""

WORKFLOWS_PY = """\
from django_leases.workflows import step_function, workflow


@workflow("shop.greet")
def greet(run, data):
    name = data.get("name") or (data.get("pusher") or {}).get("name") or "nobody"
    hello = run.step("hello", "shop.hello", {"name": name})
    shout = run.step("shout", "shop.shout", hello)
    return {"greeting": shout}


@step_function("shop.hello")
def hello(data, ctx):
    return f"hello {data['name']} (attempt {ctx.attempt})"


@step_function("shop.shout")
def shout(data, ctx):
    return data.upper()
"""

SETTINGS_TAIL = """

# -- added by tests/test_packaging.py -------------------------------------------------------
INSTALLED_APPS += ["django_leases", "shop"]
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]
DATABASES["default"]["OPTIONS"] = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}
STATIC_ROOT = BASE_DIR / "collected-static"
DJANGO_LEASES = {"WEBHOOK_SECRETS": {"shop-pushes": "shop-signing-secret"}}
"""

URLS_PY = """\
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("leases/", include("django_leases.urls")),
]
"""

#: Run inside the new project with its venv's Python; prints one JSON line of findings.
JOURNEY = """\
import json, os, subprocess, sys, uuid

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
import django

django.setup()

from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

import django_leases
from django_leases import hold_lease
from django_leases.models import Lease, TriggerEvent, TriggerSource, WorkflowRun
from django_leases.triggers import github_signature
from django_leases.workflows import start_workflow

out = {"django_leases_file": django_leases.__file__}
import importlib.util
import django as django_module
out["django"] = django_module.__version__
out["webhooks_extra"] = [m for m in ("cryptography", "httpx") if importlib.util.find_spec(m)]

# A lease.
with hold_lease("shop:nightly", ttl=30) as held:
    out["lease_token"] = held.token
    out["lease_live_inside"] = Lease.objects.current("shop:nightly") is not None
out["lease_live_after"] = Lease.objects.current("shop:nightly") is not None


def manage(*args):
    done = subprocess.run(
        [sys.executable, "manage.py", *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"manage.py {' '.join(args)}: {done.stdout}{done.stderr}"


def work():
    manage("run_workflow_worker", "--once")


# A workflow.
run_id = start_workflow("shop.greet", {"name": "ada"})
work()
run = WorkflowRun.objects.get(pk=run_id)
out["workflow"] = {"status": run.status, "output": run.output}

# A trigger source: reconciled, enabled, sent a signed delivery.
manage("reconcile_trigger_sources", "--base-url", "https://shop.example.com")
from django_leases.triggers.lifecycle import enable

enable("shop-pushes")
source = TriggerSource.objects.get(name="shop-pushes")
out["source"] = {"declared": source.declared, "enabled": source.enabled, "status": source.status}

body = json.dumps({"ref": "refs/heads/main", "pusher": {"name": "grace"}}).encode()
delivery = str(uuid.uuid4())
client = Client()
answer = client.post(
    "/leases/hooks/shop-pushes/", body, content_type="application/json",
    headers={
        "X-GitHub-Event": "push",
        "X-GitHub-Delivery": delivery,
        "X-Hub-Signature-256": github_signature("shop-signing-secret", body),
    },
)
out["delivery_status"] = answer.status_code
unsigned = client.post(
    "/leases/hooks/shop-pushes/", body, content_type="application/json",
    headers={"X-GitHub-Event": "push", "X-GitHub-Delivery": str(uuid.uuid4())},
)
out["unsigned_status"] = unsigned.status_code
out["events"] = TriggerEvent.objects.count()
event_run = WorkflowRun.objects.exclude(pk=run_id).get()
work()
event_run.refresh_from_db()
out["event_run"] = {"status": event_run.status, "output": event_run.output}

# Every django-leases admin page renders (the app's templates and static files are found).
User.objects.create_superuser("root", "root@example.com", "pw")
client.login(username="root", password="pw")
pages = {}
for model in apps.get_app_config("django_leases").get_models():
    if model in admin.site._registry:
        meta = model._meta
        url = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        pages[meta.model_name] = client.get(url).status_code
out["admin_pages"] = pages
print("JOURNEY " + json.dumps(out, default=str))
"""


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def clean_env() -> dict[str, str]:
    """The environment without anything that would let the new project see this checkout."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV", "DATABASE_URL"}
        and not key.startswith("DJANGO_LEASES")
    }
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def tracked_package_files() -> list[str]:
    """The package's files in git (or on disk when this is not a git checkout)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "django_leases"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        listed = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*") if p.is_file()]
    return sorted(
        name
        for name in listed
        if "__pycache__" not in name and not name.endswith(".pyc") and (ROOT / name).is_file()
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reusable-app")


@pytest.fixture(scope="module")
def wheel(workdir: Path) -> Path:
    dist = workdir / "dist"
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), str(ROOT)],
        cwd=workdir,
        env=clean_env(),
    )
    (built,) = dist.glob("django_leases-*.whl")
    return built


@pytest.fixture(scope="module")
def project(workdir: Path, wheel: Path) -> Iterator[tuple[Path, Path]]:
    """A fresh venv with the wheel installed, and a new project using the app."""
    env = clean_env()
    venv = workdir / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=workdir, env=env)
    python = venv / "bin" / "python"
    run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            str(wheel),
            f"Django=={django.__version__}",
        ],
        cwd=workdir,
        env=env,
    )
    site = workdir / "site"
    site.mkdir()
    run([str(venv / "bin" / "django-admin"), "startproject", "mysite", str(site)], site, env)
    run([str(python), "manage.py", "startapp", "shop"], cwd=site, env=env)
    (site / "shop" / "workflows.py").write_text(WORKFLOWS_PY)
    (site / "shop" / "triggers.py").write_text(TRIGGERS_PY)
    settings_py = site / "mysite" / "settings.py"
    settings_py.write_text(settings_py.read_text() + SETTINGS_TAIL)
    (site / "mysite" / "urls.py").write_text(URLS_PY)
    (site / "journey.py").write_text(JOURNEY)
    yield python, site


def test_the_wheel_holds_the_package_and_only_the_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(metadata_name).decode()
    missing = [name for name in tracked_package_files() if name not in names]
    assert not missing, f"files of the package missing from the wheel: {missing}"
    assert "django_leases/migrations/0001_squashed_0043_first_release.py" in names
    assert "django_leases/py.typed" in names
    strays = sorted(
        name
        for name in names
        if not (name.startswith("django_leases/") or ".dist-info/" in name)
        or "__pycache__" in name
        or name.endswith(".pyc")
    )
    assert not strays, f"the wheel holds files it should not: {strays}"
    assert re.search(r"^Requires-Dist: django\b", metadata, re.MULTILINE | re.IGNORECASE)


def test_a_new_project_uses_leases_workflows_and_trigger_sources(
    project: tuple[Path, Path],
) -> None:
    python, site = project
    env = clean_env()
    run([str(python), "manage.py", "check"], cwd=site, env=env)
    run([str(python), "manage.py", "migrate", "--noinput"], cwd=site, env=env)
    missing = run([str(python), "manage.py", "makemigrations", "--check", "--dry-run"], site, env)
    assert "No changes detected" in missing

    stdout = run([str(python), "journey.py"], cwd=site, env=env)
    line = next(line for line in stdout.splitlines() if line.startswith("JOURNEY "))
    journey = json.loads(line.removeprefix("JOURNEY "))

    # The app came from the venv's site-packages, not from this checkout; the lean install
    # (no webhooks extra) ran all of it, on the suite's own Django.
    assert Path(journey["django_leases_file"]).is_relative_to(python.parent.parent)
    assert journey["webhooks_extra"] == []
    assert journey["django"] == django.__version__
    assert journey["lease_token"] == 1
    assert journey["lease_live_inside"] is True and journey["lease_live_after"] is False
    assert journey["workflow"] == {
        "status": "completed",
        "output": {"greeting": "HELLO ADA (ATTEMPT 1)"},
    }
    assert journey["source"] == {"declared": True, "enabled": True, "status": "manual"}
    assert journey["delivery_status"] == 202
    assert journey["unsigned_status"] == 401
    assert journey["events"] == 1
    assert journey["event_run"] == {
        "status": "completed",
        "output": {"greeting": "HELLO GRACE (ATTEMPT 1)"},
    }
    assert journey["admin_pages"], "no django-leases model is registered in the admin"
    assert set(journey["admin_pages"].values()) == {200}, journey["admin_pages"]


def test_the_apps_static_files_are_collected(project: tuple[Path, Path]) -> None:
    python, site = project
    shipped = (
        sorted(
            str(path.relative_to(PACKAGE / "static"))
            for path in (PACKAGE / "static").rglob("*")
            if path.is_file()
        )
        if (PACKAGE / "static").is_dir()
        else []
    )
    run([str(python), "manage.py", "collectstatic", "--noinput"], cwd=site, env=clean_env())
    collected = site / "collected-static"
    assert (collected / "admin").is_dir()  # collectstatic ran
    missing = [name for name in shipped if not (collected / name).is_file()]
    assert not missing, f"static files of django_leases not collected: {missing}"

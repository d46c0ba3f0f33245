"""What ``django_leases`` adds to a project's start-up: ``django.setup()`` with and without it.

Two projects, the same but for one line: the contrib apps an admin site needs (admin, auth,
contenttypes, sessions, messages, staticfiles), and that list plus ``django_leases``. Each
run is a fresh interpreter (nothing imported, bytecode already compiled by a warm-up run)
that configures the settings and times ``django.setup()`` — the imports it makes, every
app's ``ready()`` and the admin's autodiscovery. The runs alternate, plain and with, so
load that comes and goes falls on both; the figures are the best and the median of
``--runs`` of each, and their ratio (the target: with ≤ 1.10 × plain, best against best).

One more run of each under ``python -X importtime`` says where the difference goes: every
module only the project with ``django_leases`` imports, its own ("self") import time summed
per top-level package, and our modules with the largest own and cumulative times.

::

    .venv/bin/python bench/startup.py                  # 15 runs of each, JSON to bench/results/
    .venv/bin/python bench/startup.py --runs 31 --top 25
    .venv/bin/python bench/startup.py --no-write       # print only
    .venv/bin/python bench/startup.py --without prometheus_client --label lean
    .venv/bin/python bench/startup.py --floor          # and our models alone, beside

``--without PACKAGE`` (repeatable) hides a top-level package from both projects, as if it
were not installed: ``--without prometheus_client --without opentelemetry`` measures a lean
install, where the optional metrics and tracing cost nothing.

``--floor`` adds a third project: the plain one plus an app with our models alone — the
same classes, fields, indexes and constraints, generated from our models' migration state,
each registered in the admin with a default ``ModelAdmin``, and not one module of
``django_leases`` imported. What that app costs is what our tables cost Django to build,
the floor under anything we could shave off our own code.

The load average is recorded before and after (two cores shared with other work make single
figures noisy; compare best against best, and runs made at a like load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS_DIR, ROOT, load_average, machine_facts, write_report

#: The project without us: what a site with Django's admin installs.
PLAIN_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]
WITH_APPS = [*PLAIN_APPS, "django_leases"]

#: Run in each fresh interpreter: argv[1] is the JSON list of apps. Prints a JSON line with
#: the seconds ``django.setup()`` took and the modules loaded after it.
CHILD = """\
import json, sys, time
t0 = time.perf_counter()
hidden = tuple(json.loads(sys.argv[2]))
if hidden:
    import importlib.abc

    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in hidden:
                raise ModuleNotFoundError(f"No module named {name!r} (hidden)", name=name)
            return None

    sys.meta_path.insert(0, Hide())
import django
from django.apps import AppConfig
from django.conf import settings
phases = {}


def timed(method, phase):
    def wrapper(self):
        started = time.perf_counter()
        try:
            return method(self)
        finally:
            phases[f"{self.label}.{phase}"] = time.perf_counter() - started

    return wrapper


AppConfig.import_models = timed(AppConfig.import_models, "models")
create = AppConfig.create.__func__


def create_timed(cls, entry):
    config = create(cls, entry)
    config.ready = timed(type(config).ready, "ready").__get__(config)
    return config


AppConfig.create = classmethod(create_timed)
settings.configure(
    INSTALLED_APPS=json.loads(sys.argv[1]),
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    MIDDLEWARE=[
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ],
    TEMPLATES=[{
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": [
            "django.template.context_processors.request",
            "django.contrib.auth.context_processors.auth",
            "django.contrib.messages.context_processors.messages",
        ]},
    }],
    USE_TZ=True,
    SECRET_KEY="bench-startup",
    STATIC_URL="static/",
)
t1 = time.perf_counter()
django.setup()
t2 = time.perf_counter()
print(json.dumps({
    "setup": t2 - t1, "total": t2 - t0, "phases": phases, "modules": sorted(sys.modules)
}))
"""


#: Run once with our app installed: prints the source of a models module holding our models
#: alone (fields, options, indexes and constraints through the migration writer), with
#: nothing of ``django_leases`` imported by it.
FLOOR_SOURCE = """\
import json, sys
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=json.loads(sys.argv[1]),
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    USE_TZ=True,
    SECRET_KEY="bench-startup",
)
django.setup()
from django.apps import apps
from django.db.migrations.state import ModelState
from django.db.migrations.writer import MigrationWriter
imports = {"from django.db import models", "import uuid"}
classes = []
ours = list(apps.get_app_config("django_leases").get_models(include_auto_created=False))
names = {model._meta.label_lower: model.__name__ for model in ours}
for model in ours:
    state = ModelState.from_model(model)
    bases = ", ".join(
        names[base.lower()] if isinstance(base, str) else "models.Model" for base in state.bases
    )
    lines = [f"class {state.name}({bases}):"]
    for name, field in state.fields.items():
        code, found = MigrationWriter.serialize(field)
        imports |= found
        lines.append(f"    {name} = {code}")
    lines += ["", "    class Meta:", "        app_label = 'django_leases'"]
    for option, value in state.options.items():
        code, found = MigrationWriter.serialize(value)
        imports |= found
        lines.append(f"        {option} = {code}")
    classes.append("\\n".join(lines))
mine = {line for line in imports if "django_leases" in line}
source = "\\n".join(sorted(imports - mine)) + "\\n\\n\\n" + "\\n\\n\\n".join(classes) + "\\n"
# Our expressions and defaults, by Django's and the standard library's nearest.
source = source.replace("django_leases.clock.DbNow()", "models.functions.Now()")
source = source.replace("django_leases.ids.uuid7", "uuid.uuid4")
assert "django_leases." not in source.replace("'django_leases", "")
print(source)
"""

FLOOR_APPS = [*PLAIN_APPS, "leasesfloor.apps.FloorConfig"]


def write_floor_app(directory: Path) -> None:
    """Write the ``leasesfloor`` package into ``directory``: our models alone (see
    :data:`FLOOR_SOURCE`), labelled ``django_leases``, each registered in the admin."""
    done = subprocess.run(
        [sys.executable, "-c", FLOOR_SOURCE, json.dumps(WITH_APPS)],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    package = directory / "leasesfloor"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(done.stdout)
    (package / "apps.py").write_text(
        "from django.apps import AppConfig\n\n\n"
        "class FloorConfig(AppConfig):\n"
        '    name = "leasesfloor"\n'
        '    label = "django_leases"\n'
        '    default_auto_field = "django.db.models.BigAutoField"\n'
    )
    (package / "admin.py").write_text(
        "from django.apps import apps\nfrom django.contrib import admin\n\n"
        'for model in apps.get_app_config("django_leases").get_models():\n'
        "    admin.site.register(model)\n"
    )


def child_env(path: tuple[Path, ...] = ()) -> dict[str, str]:
    """A child interpreter's environment: this checkout (and ``path``) importable, no
    settings module of the caller's."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (ROOT, *path)))}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


def run_child(
    apps: list[str],
    *,
    importtime: bool = False,
    hidden: tuple[str, ...] = (),
    path: tuple[Path, ...] = (),
) -> tuple[dict[str, Any], str]:
    """One fresh interpreter's figures (and its stderr: the ``-X importtime`` table); the
    top-level packages ``hidden`` cannot be imported in it; ``path``: more import roots."""
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), "-c", CHILD]
    env = child_env(path)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.perf_counter()
    done = subprocess.run(
        [*command, json.dumps(apps), json.dumps(hidden)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the child failed ({apps[-1]}):\n{done.stderr}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["process"] = wall
    return figures, done.stderr


def parse_importtime(stderr: str) -> list[tuple[str, int, int]]:
    """``(module, self µs, cumulative µs)`` for each line of a ``-X importtime`` table."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative_us, name = line[len("import time:") :].split("|", 2)
        rows.append((name.strip(), int(self_us), int(cumulative_us)))
    return rows


def breakdown(plain_stderr: str, with_stderr: str, top: int) -> dict[str, Any]:
    """Where the project with us spends import time the plain project does not."""
    plain = {name for name, _, _ in parse_importtime(plain_stderr)}
    rows = parse_importtime(with_stderr)
    extra = [(name, own, cumulative) for name, own, cumulative in rows if name not in plain]
    by_package: dict[str, int] = defaultdict(int)
    for name, own, _ in extra:
        by_package[name.split(".")[0]] += own
    ours = [row for row in extra if row[0].split(".")[0] == "django_leases"]
    return {
        "extra_modules": len(extra),
        "extra_self_ms": round(sum(own for _, own, _ in extra) / 1000, 1),
        "self_ms_by_package": {
            package: round(own / 1000, 1)
            for package, own in sorted(by_package.items(), key=lambda item: -item[1])
        },
        "ours_by_self_ms": [
            [name, round(own / 1000, 1)] for name, own, _ in sorted(ours, key=lambda r: -r[1])
        ][:top],
        "ours_by_cumulative_ms": [
            [name, round(cumulative / 1000, 1)]
            for name, _, cumulative in sorted(ours, key=lambda r: -r[2])
        ][:top],
        "third_party_extra": sorted(
            package
            for package in by_package
            if package not in ("django_leases", "django") and not package.startswith("_")
        ),
    }


def summary(values: list[float]) -> dict[str, float]:
    return {
        "best_ms": round(min(values) * 1000, 1),
        "median_ms": round(statistics.median(values) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each project (15)")
    parser.add_argument("--top", type=int, default=15, help="our modules listed (15)")
    parser.add_argument("--label", default="", help="a word for the report's file name")
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="PACKAGE",
        help="a top-level package neither project may import, as if not installed (a lean "
        "install: --without prometheus_client --without opentelemetry); repeatable",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also a project with our models alone and nothing of our code (the floor)",
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path: tuple[Path, ...] = ()
        if args.floor:
            write_floor_app(Path(directory))
            path = (Path(directory),)
        measure_all(args, tuple(args.without), path)


def measure_all(args: argparse.Namespace, hidden: tuple[str, ...], path: tuple[Path, ...]) -> None:
    """Run, report and write the figures (``path``: where the floor's app is, if any)."""
    projects = {"plain": PLAIN_APPS, "with": WITH_APPS}
    if path:
        projects["floor"] = FLOOR_APPS
    load_before = load_average()
    # Warm-up: bytecode compiled, the file cache filled, for each.
    for apps in projects.values():
        run_child(apps, hidden=hidden, path=path)
    figures: dict[str, dict[str, list[float]]] = {key: defaultdict(list) for key in projects}
    modules: dict[str, list[str]] = {}
    phases: dict[str, dict[str, list[float]]] = {key: defaultdict(list) for key in projects}
    for _ in range(args.runs):
        for key, apps in projects.items():
            result, _ = run_child(apps, hidden=hidden, path=path)
            for measure in ("setup", "total", "process"):
                figures[key][measure].append(result[measure])
            for phase, seconds in result["phases"].items():
                phases[key][phase].append(seconds)
            modules[key] = result["modules"]
    _, plain_stderr = run_child(PLAIN_APPS, importtime=True, hidden=hidden)
    _, with_stderr = run_child(WITH_APPS, importtime=True, hidden=hidden)
    load_after = load_average()

    report: dict[str, Any] = {
        "benchmark": "startup",
        "date": datetime.now().isoformat(timespec="seconds"),
        "machine": machine_facts(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "runs": args.runs,
        "hidden_packages": list(hidden),
        "plain_apps": PLAIN_APPS,
        "with_apps": WITH_APPS,
    }
    for measure in ("setup", "total", "process"):
        plain = summary(figures["plain"][measure])
        report[measure] = {"plain": plain}
        for key, prefix in (("with", ""), ("floor", "floor_")):
            if key in projects:
                other = summary(figures[key][measure])
                report[measure] |= {
                    key: other,
                    f"{prefix}ratio_best": round(other["best_ms"] / plain["best_ms"], 3),
                    f"{prefix}ratio_median": round(other["median_ms"] / plain["median_ms"], 3),
                }
    # Each app's models import and ready(), median ms: the admin's ready() imports every
    # app's admin module (ours among them in the project with us).
    report["phases_median_ms"] = {
        key: {
            phase: round(statistics.median(values) * 1000, 1)
            for phase, values in sorted(phases[key].items())
            if statistics.median(values) >= 0.0005
        }
        for key in projects
    }
    report["modules_loaded"] = {key: len(names) for key, names in modules.items()}
    report["importtime"] = breakdown(plain_stderr, with_stderr, args.top)
    try:
        report["git_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        report["git_commit"] = None

    setup = report["setup"]
    print(
        f"django.setup(): plain {setup['plain']['best_ms']} ms (median "
        f"{setup['plain']['median_ms']}), with django_leases {setup['with']['best_ms']} ms "
        f"(median {setup['with']['median_ms']}): ×{setup['ratio_best']} best, "
        f"×{setup['ratio_median']} median; load {load_before} → {load_after}"
    )
    if path:
        print(
            f"the floor (our models alone, admin-registered): {setup['floor']['best_ms']} ms "
            f"(median {setup['floor']['median_ms']}): ×{setup['floor_ratio_best']} best, "
            f"×{setup['floor_ratio_median']} median"
        )
    process = report["process"]
    print(
        f"whole process: plain {process['plain']['best_ms']} ms, with "
        f"{process['with']['best_ms']} ms: ×{process['ratio_best']} best"
    )
    ours = {
        phase: ms
        for phase, ms in report["phases_median_ms"]["with"].items()
        if phase.startswith("django_leases.") or phase == "admin.ready"
    }
    print(
        f"phases (median ms, with us): {ours}; plain admin.ready "
        f"{report['phases_median_ms']['plain'].get('admin.ready')}"
    )
    importtime = report["importtime"]
    print(
        f"-X importtime: {importtime['extra_modules']} modules more, "
        f"{importtime['extra_self_ms']} ms own time: {importtime['self_ms_by_package']}"
    )
    for name, ms in importtime["ours_by_cumulative_ms"]:
        print(f"  {ms:8.1f} ms cumulative  {name}")
    if not args.no_write:
        stamp = datetime.now().strftime("%Y-%m-%d-%H%M")
        label = f"-{args.label}" if args.label else ""
        path = RESULTS_DIR / f"startup-{stamp}{label}.json"
        write_report(path, report)
        print(f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

"""What a release publishes: the sdist and the wheel pass ``twine check --strict``, carry the
LICENSE, and their metadata says what CI tests — the Python and Django classifiers equal the
matrix of ``noxfile.py`` — with project URLs, keywords and no development tooling among the
extras (that lives in PEP 735 dependency groups, which are never published).

Builds with ``python -m build`` (an isolated build environment from the package index), once
per ``make test``, in the SQLite pass (``DL_PACKAGING_TEST=1`` runs it on any database, as the
CI cells of the noxfile do).
"""

from __future__ import annotations

import ast
import email
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.message import Message
from pathlib import Path

import pytest
from django.conf import settings

import django_leases

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        not settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
        and not os.environ.get("DL_PACKAGING_TEST"),
        reason="the release build runs once per `make test`, in the SQLite pass "
        "(DL_PACKAGING_TEST=1 runs it here too)",
    ),
]

#: Extras a user may want; anything else (dev, test, docs, demo, bench…) is a dependency group.
USER_EXTRAS = {"webhooks", "postgres", "mysql", "prometheus", "otel", "tasks"}


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _noxfile_constant(name: str) -> object:
    """A literal assigned at the top of noxfile.py (read, not imported: nox may be absent)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f"noxfile.py has no {name}")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "DJANGO_SETTINGS_MODULE"}}
    done = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(ROOT)],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_bytes(archive.read(name))


def test_twine_check_strict_passes_on_the_sdist_and_the_wheel(dist: Path) -> None:
    built = sorted(dist.iterdir())
    assert sorted(path.suffix for path in built) == [".gz", ".whl"], built
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, built)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout


def test_both_carry_the_license_and_the_version(dist: Path) -> None:
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert license_text.startswith("MIT License")
    assert "Copyright (c) 2026 The django-leases authors" in license_text
    version = django_leases.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"not a release version: {version}"
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    assert wheel.name.startswith(f"django_leases-{version}-")
    assert sdist.name == f"django_leases-{version}.tar.gz"
    with zipfile.ZipFile(wheel) as archive:
        licenses = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert licenses and archive.read(licenses[0]).decode() == license_text
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
        assert f"django_leases-{version}/LICENSE" in names
    # Only the package and the top-level files: no lone README of bench/ or tests/.
    inside = {name.split("/", 2)[1] for name in names if name.count("/") >= 1}
    top = {"django_leases", "README.md", "CHANGELOG.md", "LICENSE", "pyproject.toml"}
    assert inside == top | {"PKG-INFO", ".gitignore"}, sorted(inside)  # the last two: hatch's
    metadata = _metadata(wheel)
    assert metadata["Version"] == version
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]


def test_the_classifiers_say_what_ci_tests(dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    classifiers = _metadata(wheel).get_all("Classifier") or []
    pythons = sorted(
        c.rsplit(" ", 1)[1] for c in classifiers if re.fullmatch(r".*Python :: 3\.\d+", c)
    )
    djangos = sorted(
        c.rsplit(" ", 1)[1] for c in classifiers if re.fullmatch(r".*Django :: \d+\.\d+", c)
    )
    assert pythons == sorted(_noxfile_constant("SUPPORTED_PYTHONS"))  # type: ignore[arg-type]
    djangos_tested = _noxfile_constant("DJANGOS")
    assert isinstance(djangos_tested, dict)
    assert djangos == sorted(djangos_tested)
    requires = _metadata(wheel)["Requires-Python"]
    assert requires == f">={min(pythons, key=lambda v: tuple(map(int, v.split('.'))))}"
    for needed in ("Development Status :: ", "Intended Audience :: ", "Operating System :: "):
        assert any(c.startswith(needed) for c in classifiers), needed


def test_the_metadata_points_users_to_the_project(dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    metadata = _metadata(wheel)
    urls = dict(line.split(", ", 1) for line in metadata.get_all("Project-URL") or [])
    for label in ("Homepage", "Documentation", "Source", "Changelog", "Issues"):
        assert urls.get(label, "").startswith("https://github.com/django-leases/"), label
    assert "lease" in (metadata["Keywords"] or "")
    assert metadata["Description-Content-Type"] == "text/markdown"


def test_extras_are_for_users_and_tooling_is_in_dependency_groups(dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    extras = set(_metadata(wheel).get_all("Provides-Extra") or [])
    assert extras == USER_EXTRAS
    groups = _pyproject()["dependency-groups"]
    assert isinstance(groups, dict)
    assert {"dev", "test", "lint", "docs", "demo", "bench"} <= set(groups)
    requires = _metadata(wheel).get_all("Requires-Dist") or []
    base = sorted(re.split(r"[<>=!~ ]", r, maxsplit=1)[0].lower() for r in requires if ";" not in r)
    assert base == ["asgiref", "cronsim", "django"], base  # the lean base (test_webhooks_extra)

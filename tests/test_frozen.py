"""``@frozen`` value classes: a frozen dataclass built at its first instance, so that
``django.setup()`` builds none of ours; the same class, once built, as
``dataclass(frozen=True)`` makes it."""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from django_leases.conf import QueueLimits
from django_leases.frozen import frozen

PACKAGE = Path(__file__).resolve().parent.parent / "django_leases"


def _point_class() -> Any:
    @frozen
    class Point:
        """A point on a grid."""

        x: int
        y: int = 0
        tags: list[str] = dataclasses.field(default_factory=list, compare=False)

    return Point


def test_the_first_instance_builds_a_frozen_dataclass() -> None:
    Point: Any = _point_class()
    built_at_first = dataclasses.is_dataclass(Point)
    point = Point(1, y=2)
    built = dataclasses.is_dataclass(Point)
    assert (built_at_first, built) == (False, True), "declared, then built by the instance"
    assert [field.name for field in dataclasses.fields(Point)] == ["x", "y", "tags"]
    assert point == Point(1, 2, ["other"]) and hash(point) == hash(Point(1, 2))
    assert point != Point(2, 2)
    assert repr(point).endswith(".Point(x=1, y=2, tags=[])")
    assert Point(3).tags is not Point(3).tags, "the default factory runs per instance"
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 3
    with pytest.raises(TypeError):
        Point()  # x is required, as the generated __init__ says
    assert dataclasses.replace(point, x=5) == Point(5, 2)
    assert copy.copy(point) == point and copy.deepcopy(point) == point
    assert Point.__doc__ == "A point on a grid."
    assert Point.__match_args__ == ("x", "y", "tags")


def test_threads_racing_the_first_instance_build_the_class_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    builds = []
    real = dataclasses.dataclass

    def counting(*args: Any, **kwargs: Any) -> Any:
        builds.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(dataclasses, "dataclass", counting)
    Point: Any = _point_class()
    threads = 8
    barrier = threading.Barrier(threads)
    made: list[Any] = []
    failures: list[BaseException] = []

    def make(index: int) -> None:
        barrier.wait()
        try:
            made.append(Point(index, index))
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)

    workers = [threading.Thread(target=make, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert failures == []
    assert builds == [{"frozen": True}]
    assert sorted(point.x for point in made) == list(range(threads))
    assert all(point == Point(point.x, point.x) for point in made)


def test_a_declaration_the_first_build_cannot_take_is_refused_at_once() -> None:
    with pytest.raises(TypeError, match="defines __new__"):

        @frozen
        class Odd:
            def __new__(cls) -> Odd:
                return super().__new__(cls)

    @dataclasses.dataclass(frozen=True)
    class Base:
        x: int

    with pytest.raises(TypeError, match="subclasses a dataclass"):

        @frozen
        class Derived(Base):
            y: int

    Lazy: Any = _point_class()
    with pytest.raises(TypeError, match="subclasses a dataclass"):

        @frozen
        class Later(Lazy):  # type: ignore[misc]
            z: int


_UNPICKLE = """
import pickle, sys, dataclasses
from django_leases.conf import QueueLimits
assert not dataclasses.is_dataclass(QueueLimits), "built before any instance"
value = pickle.loads(bytes.fromhex(sys.argv[1]))
print(value == QueueLimits(name="mail", concurrency=3), repr(value))
"""


def test_a_value_unpickled_before_any_instance_is_made_compares_as_a_dataclass() -> None:
    sent = QueueLimits(name="mail", concurrency=3)
    done = subprocess.run(
        [sys.executable, "-c", _UNPICKLE, pickle.dumps(sent).hex()],
        env={key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"True {sent!r}"


_BUILT_AT_SETUP = """
import dataclasses, sys
built = []
process = dataclasses._process_class
def counting(cls, *args, **kwargs):
    built.append(f"{cls.__module__}.{cls.__qualname__}")
    return process(cls, *args, **kwargs)
dataclasses._process_class = counting
import django
from django.conf import settings
settings.configure(
    INSTALLED_APPS=[
        "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
        "django.contrib.sessions", "django.contrib.messages", "django_leases",
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
)
django.setup()
from django_leases import frozen
print(sorted(name for name in built if name.startswith("django_leases")))
print(len(frozen._unbuilt))
"""


def test_django_setup_builds_none_of_our_value_classes() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _BUILT_AT_SETUP],
        env={key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    built, declared = done.stdout.split("\n")[:2]
    # The one our start-up makes an instance of: the app's own step function (retention).
    assert built == repr(["django_leases.workflows.registry.StepDeclaration"])
    assert int(declared) >= 30, "the models' values are declared at setup, not built"


def test_every_frozen_value_class_of_the_package_is_declared_with_frozen() -> None:
    """One way to declare a value: ``@frozen``, never ``@dataclass(frozen=True)``."""
    eager = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.match(r"\s*@(dataclasses\.)?dataclass\(.*frozen=True", line)
    ]
    assert eager == []

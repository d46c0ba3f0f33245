"""``@frozen`` value classes: a frozen dataclass built at its first instance, so that
``django.setup()`` builds none of ours; the same class, once built, as
``dataclass(frozen=True)`` makes it."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import pickle
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from django_leases import frozen as frozen_module
from django_leases.conf import QueueLimits
from django_leases.frozen import frozen
from tests.helpers import ADMIN_PROJECT_SETUP, in_fresh_interpreter

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


_BUILT_AT_SETUP = (
    """
import dataclasses
built = []
process = dataclasses._process_class
def counting(cls, *args, **kwargs):
    built.append(f"{cls.__module__}.{cls.__qualname__}")
    return process(cls, *args, **kwargs)
dataclasses._process_class = counting
"""
    + ADMIN_PROJECT_SETUP
    + """
from django_leases import frozen
print(sorted(name for name in built if name.startswith("django_leases")))
print(len(frozen.declared) - len(frozen._built))
"""
)


def test_django_setup_builds_none_of_our_value_classes() -> None:
    done = in_fresh_interpreter(_BUILT_AT_SETUP)
    assert done.returncode == 0, done.stderr
    built, declared = done.stdout.split("\n")[:2]
    # The one our start-up makes an instance of: the app's own step function (retention).
    assert built == repr(["django_leases.workflows.registry.StepDeclaration"])
    assert int(declared) >= 30, "the models' values are declared at setup, not built"


def _api_reference_names() -> set[str]:
    """The objects the API reference renders (``::: dotted.path`` in docs/reference/api)."""
    pages = (PACKAGE.parent / "docs" / "reference" / "api").glob("*.md")
    return {
        match.group(1).rsplit(".", 1)[-1]
        for page in pages
        for match in re.finditer(r"^::: (\S+)", page.read_text(), re.M)
    }


def test_the_package_values_are_frozen_and_the_documented_ones_plain_dataclasses() -> None:
    """One way to declare a value, ``@frozen``, but for the API reference's: the docs tool
    reads a dataclass's fields off ``@dataclass`` in the source."""
    documented = _api_reference_names()
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines[:-1], 1):
            eager = re.match(r"\s*@(dataclasses\.)?dataclass\(.*frozen=True", line)
            if eager or line.strip() == "@frozen":
                name = re.match(r"\s*class (\w+)", lines[number]).group(1)  # type: ignore[union-attr]
                if bool(eager) != (name in documented):
                    wrong.append(f"{path.relative_to(PACKAGE)}:{number} {name}")
    assert wrong == []


def test_every_frozen_class_of_the_package_builds() -> None:
    """A declaration ``dataclass`` would refuse (a mutable default, a required field after a
    defaulted one) fails here, not on whichever path makes the first instance."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts or path.name == "__main__.py":
            continue
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        importlib.import_module(module.removesuffix(".__init__"))
    assert len(frozen_module.declared) >= 50
    for cls in frozen_module.declared:
        frozen_module.build(cls)
        assert dataclasses.is_dataclass(cls), cls
        assert cls.__dataclass_params__.frozen, cls  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("module", "name"),
    [("django_leases.fencing", "Fence"), ("django_leases.testing.duplicates", "DuplicateStep")],
)
def test_the_api_reference_documents_its_values_as_dataclasses(module: str, name: str) -> None:
    griffe = pytest.importorskip("griffe")  # the docs group, which `make test` installs
    loaded = griffe.load(module, search_paths=[str(PACKAGE.parent)], allow_inspection=False)
    cls = loaded[name]
    assert "dataclass" in cls.labels
    parameters = [parameter.name for parameter in cls.all_members["__init__"].parameters]
    assert parameters[0] == "self" and len(parameters) >= 3, parameters


def test_the_signature_and_generated_docstring_are_the_dataclass_ones() -> None:
    @frozen
    class Lazy:
        x: int
        y: int = 0

    @dataclasses.dataclass(frozen=True)
    class Eager:
        x: int
        y: int = 0

    assert str(inspect.signature(Lazy)) == str(inspect.signature(Eager)), "read first"
    Lazy(1)
    assert str(inspect.signature(Lazy)) == str(inspect.signature(Eager))
    assert Lazy.__doc__ == (Eager.__doc__ or "").replace("Eager", "Lazy")


_UNPICKLE_OLD_PROTOCOL = """
import pickle, sys, dataclasses
from django_leases.conf import QueueLimits
first, second = (pickle.loads(bytes.fromhex(sys.argv[1])) for _ in range(2))
try:
    first.name = "changed"
except dataclasses.FrozenInstanceError:
    print(first == second, dataclasses.is_dataclass(first), repr(first))
"""


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_value_unpickled_first_is_a_frozen_dataclass_whatever_the_protocol(
    protocol: int,
) -> None:
    # Protocols 0 and 1 make the object with object.__new__, not the class's.
    sent = QueueLimits(name="mail", concurrency=3)
    done = in_fresh_interpreter(_UNPICKLE_OLD_PROTOCOL, pickle.dumps(sent, protocol=protocol).hex())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"True True {sent!r}"


_USER_SUBCLASS = """
import dataclasses
from django_leases.conf import QueueLimits

@dataclasses.dataclass(frozen=True)
class Tagged(QueueLimits):
    tag: str = ""

value = Tagged(name="mail", concurrency=3, tag="x")
print(value.name, value.concurrency, value.tag)
"""


def test_a_dataclass_subclass_declared_before_any_instance_has_the_fields() -> None:
    done = in_fresh_interpreter(_USER_SUBCLASS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "mail 3 x"


def test_the_signature_of_a_user_s_dataclass_subclass_reads_like_a_dataclass_one() -> None:
    # tests/test_frozen.py supports a user's frozen dataclass subclass of a package value
    # (QueueLimits). inspect.signature / help() on it reach the inherited _Signature, which
    # runs dataclass(frozen=True) on the subclass a second time: TypeError, and its
    # __dataclass_fields__ rewritten on the way (the default_factory lost).
    @frozen
    class Base:
        x: int

    @dataclasses.dataclass(frozen=True)
    class Tagged(Base):
        tags: list[str] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True)
    class PlainBase:
        x: int

    @dataclasses.dataclass(frozen=True)
    class PlainTagged(PlainBase):
        tags: list[str] = dataclasses.field(default_factory=list)

    Tagged(1)
    try:
        signature = str(inspect.signature(Tagged))
    finally:
        factory = {field.name: field.default_factory for field in dataclasses.fields(Tagged)}
    assert factory["tags"] is list, "the field's default_factory was lost"
    assert signature == str(inspect.signature(PlainTagged))


def test_reading_a_plain_subclass_s_signature_does_not_make_it_a_dataclass() -> None:
    @frozen
    class Base:
        x: int

    class Plain(Base):  # a plain subclass: y is a class attribute, not a field
        y: int = 0

    Plain(1)
    with pytest.raises(TypeError):
        Plain(1, 2)  # type: ignore[call-arg]
    before = dataclasses.fields(Plain)
    str(inspect.signature(Plain))  # help(Plain), a framework's introspection...
    after = dataclasses.fields(Plain)
    assert [f.name for f in after] == [f.name for f in before] == ["x"]
    made: Any = None
    with pytest.raises(TypeError):
        made = Plain(1, 2)  # type: ignore[call-arg]
    assert made is None

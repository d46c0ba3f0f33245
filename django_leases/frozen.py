"""Frozen value classes that cost nothing to declare: ``@frozen`` is
``@dataclasses.dataclass(frozen=True)``, built when the class makes its first instance.

Building a dataclass compiles its ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__`` from generated source: about 0.7 ms a class. The values
our models and QuerySets return are declared as the models import, so built at once they
would add 20–40 ms to every process's ``django.setup()`` (a web process included, which
makes few of them). ``@frozen`` defers that work to the class's first instance, made by a
call, ``copy`` or unpickling (any protocol), and its signature (``inspect.signature``,
``help``); the class is then what ``dataclass(frozen=True)`` makes of it, plus the hooks
(a ``__new__`` that makes the plain object, about 0.1 µs an instance; a ``__setstate__``
that restores the instance's attributes; the ``__signature__``; an ``__init_subclass__``
that builds it before a subclass reads its fields).

What waits for the first instance: ``dataclasses.fields(cls)`` and
``dataclasses.is_dataclass(cls)`` on the class itself (on an instance they are as ever),
``cls.__match_args__``, the generated methods read off the class, and a default given by
``field(default=...)`` read off the class (a ``Field`` until then). It is for the package's
own values, made and read by its code: the ones in the API reference are plain
``dataclass(frozen=True)`` (the documentation tool reads those from the source), and
``tests/test_frozen.py`` builds every ``@frozen`` class of the package, so a declaration
``dataclass`` refuses fails the suite, not a rare code path. Type checkers see a frozen
dataclass (``dataclass_transform``).
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from typing import Any, TypeVar, dataclass_transform

__all__ = ["build", "frozen"]

_Class = TypeVar("_Class", bound=type)

#: Serialises the first build of every ``@frozen`` class: two threads making the first
#: instance of one class at once build it once, and neither makes one before it is built.
#: Re-entrant: a build reads the class's signature (its ``__doc__``, for a class without one).
_building = threading.RLock()
#: The ``@frozen`` classes built, and the ones being built (by the thread holding the lock).
_built: set[type] = set()
_in_progress: set[type] = set()
#: Every ``@frozen`` class declared (for the test that builds them all).
declared: set[type] = set()

_HOOKS = ("__new__", "__setstate__", "__signature__", "__init_subclass__")


def build(cls: type) -> None:
    """Build ``@frozen`` class ``cls`` into its frozen dataclass, unless it is (or is being)."""
    if cls in _built:
        return
    with _building:
        if cls in _built or cls in _in_progress:
            return
        _in_progress.add(cls)
        try:
            dataclasses.dataclass(frozen=True)(cls)
        finally:
            _in_progress.discard(cls)
        _built.add(cls)


class _Signature:
    """``cls.__signature__``: the built class's constructor signature (``inspect`` reads
    it before ``__new__``, which would say ``(*args, **kwargs)``)."""

    def __get__(self, instance: object, owner: type) -> inspect.Signature:
        # Read off a subclass too (inherited): build the @frozen class it comes from, never
        # the subclass itself, and take the __init__ the subclass has.
        build(next(klass for klass in owner.__mro__ if klass in declared))
        signature = inspect.signature(getattr(owner, "__init__"))  # noqa: B009 (mypy)
        return signature.replace(parameters=list(signature.parameters.values())[1:])


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def frozen(cls: _Class) -> _Class:
    """Declare ``cls`` a frozen dataclass (``dataclasses.dataclass(frozen=True)``), built
    when its first instance is made, or its signature read.

    Returns ``cls`` itself. Raises ``TypeError`` at the declaration when the class defines
    ``__new__``, ``__setstate__``, ``__signature__`` or ``__init_subclass__`` (the hooks:
    a subclass declared builds it first), or subclasses another
    dataclass (its fields would be read before that one is built).
    """
    hooked = [name for name in _HOOKS if name in cls.__dict__]
    if hooked:
        raise TypeError(f"@frozen class {cls.__qualname__} defines {', '.join(hooked)}")
    if any(dataclasses.is_dataclass(base) or base in declared for base in cls.__mro__[1:]):
        raise TypeError(f"@frozen class {cls.__qualname__} subclasses a dataclass")

    def new(klass: type, /, *args: Any, **kwargs: Any) -> Any:
        # The arguments are the generated __init__'s. (The hook stays: a __new__ deleted
        # from a class leaves CPython calling object.__new__ with them, which refuses.)
        build(cls)
        return object.__new__(klass)

    def setstate(self: Any, state: Any) -> None:
        # Unpickling makes the object without __new__ (protocols 0 and 1), then this.
        build(cls)
        if isinstance(state, tuple):  # (__dict__, slot state): no slots here
            state = state[0]
        if state:
            self.__dict__.update(state)

    def init_subclass(klass: type, /, **kwargs: Any) -> None:
        # A subclass (a dataclass of its own) reads this one's fields as it is declared.
        build(cls)
        super(cls, klass).__init_subclass__(**kwargs)  # type: ignore[arg-type]

    new.__qualname__ = f"{cls.__qualname__}.__new__"
    setstate.__qualname__ = f"{cls.__qualname__}.__setstate__"
    cls.__new__ = staticmethod(new)  # type: ignore[method-assign]
    cls.__setstate__ = setstate  # type: ignore[attr-defined]
    cls.__signature__ = _Signature()  # type: ignore[attr-defined]
    cls.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment]
    declared.add(cls)
    return cls

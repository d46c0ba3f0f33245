"""Frozen value classes that cost nothing to declare: ``@frozen`` is
``@dataclasses.dataclass(frozen=True)``, built when the class makes its first instance.

Building a dataclass compiles its ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__`` from generated source: about half a millisecond a class.
The values our models and QuerySets return are declared as the models import, so built at
once they would add 20–40 ms to every process's ``django.setup()`` (a web process included,
which makes few of them). ``@frozen`` defers that work to the class's first instance and
then leaves the class what ``dataclass(frozen=True)`` makes of it, but for a ``__new__``
that makes the plain object (one set lookup more per instance, about 0.1 µs).

What waits for the first instance: ``dataclasses.fields(cls)`` and
``dataclasses.is_dataclass(cls)`` on the class itself (on an instance they are as ever),
``cls.__match_args__`` and the generated methods read off the class. Nothing here does that
before an instance exists. Type checkers see a frozen dataclass (``dataclass_transform``).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, TypeVar, dataclass_transform

__all__ = ["frozen"]

_Class = TypeVar("_Class", bound=type)

#: Serialises the first build of every ``@frozen`` class (two threads making the first
#: instance of one class at once build it once).
_building = threading.Lock()
#: The ``@frozen`` classes not built yet.
_unbuilt: set[type] = set()


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def frozen(cls: _Class) -> _Class:
    """Declare ``cls`` a frozen dataclass (``dataclasses.dataclass(frozen=True)``), built
    when its first instance is made, by a constructor call, ``copy`` or unpickling.

    Returns ``cls`` itself. The class must not define ``__new__`` (the first build is
    hooked there) nor subclass another dataclass (its fields would be read before that one
    is built): both raise ``TypeError`` here, at the declaration.
    """
    if "__new__" in cls.__dict__:
        raise TypeError(f"@frozen class {cls.__qualname__} defines __new__")
    if any(dataclasses.is_dataclass(base) or base in _unbuilt for base in cls.__mro__[1:]):
        raise TypeError(f"@frozen class {cls.__qualname__} subclasses a dataclass")

    def new(klass: type, /, *args: Any, **kwargs: Any) -> Any:
        # The arguments are the generated __init__'s. (The hook stays: a __new__ deleted
        # from a class leaves CPython calling object.__new__ with them, which refuses.)
        if cls in _unbuilt:
            with _building:
                if cls in _unbuilt:
                    dataclasses.dataclass(frozen=True)(cls)
                    _unbuilt.discard(cls)
        return object.__new__(klass)

    new.__qualname__ = f"{cls.__qualname__}.__new__"
    cls.__new__ = staticmethod(new)  # type: ignore[method-assign]
    _unbuilt.add(cls)
    return cls

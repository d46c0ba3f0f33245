"""Every public function, class and method of ``django_leases`` has a docstring.

Public: a name without a leading underscore, defined in a ``django_leases`` module (not
imported there; migrations excepted). A method that overrides a documented hook of a class
that is not ours (``ModelAdmin.get_queryset``, ``BaseCommand.handle``…) may rely on that
docstring; everything else, classes included, needs its own.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import django_leases


def _modules() -> list[Any]:
    names = [
        info.name
        for info in pkgutil.walk_packages(django_leases.__path__, "django_leases.")
        if ".migrations" not in info.name
    ]
    return [importlib.import_module(name) for name in ["django_leases", *names]]


def _ours(function: Any) -> bool:
    return str(getattr(function, "__module__", "")).startswith("django_leases")


def _function_of(raw: Any) -> Any:
    """The function behind a class attribute (method, static/class method, property)."""
    if isinstance(raw, staticmethod | classmethod):
        return raw.__func__
    if isinstance(raw, property):
        return raw.fget
    if inspect.isfunction(raw):
        return raw
    return None


def _documented_by_django(cls: type, name: str) -> bool:
    """Whether ``cls.name`` overrides a documented hook of a class that is not ours."""
    for base in cls.__mro__[1:]:
        if name in vars(base) and not _ours(base):
            return bool(inspect.getdoc(getattr(base, name)))
    return False


def undocumented() -> list[str]:
    """Qualified names of the public callables without a docstring."""
    missing: list[str] = []
    for module in _modules():
        for name, thing in vars(module).items():
            if name.startswith("_") or getattr(thing, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(thing) and not (thing.__doc__ or "").strip():
                missing.append(f"{module.__name__}.{name}")
            if not inspect.isclass(thing):
                continue
            if not (thing.__doc__ or "").strip():
                missing.append(f"{module.__name__}.{name}")
            for attr, raw in vars(thing).items():
                function = _function_of(raw)
                if attr.startswith("_") or function is None or not _ours(function):
                    continue
                own = (function.__doc__ or "").strip()  # getdoc() would inherit a base's
                if not own and not _documented_by_django(thing, attr):
                    missing.append(f"{module.__name__}.{name}.{attr}")
    return missing


def test_every_public_callable_has_a_docstring() -> None:
    assert undocumented() == []

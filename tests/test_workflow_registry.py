"""``@workflow`` and ``@step_function``: what a declaration refuses at import time."""

from __future__ import annotations

from typing import Any

import pytest

from django_leases.workflows import registry

KINDS = ["workflow", "step_function"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_coroutine_function_is_refused_at_declaration(kind: str) -> None:
    """Its runs would fail later ("output ... is of type coroutine") with a "never
    awaited" warning; the engine calls workflow and step functions synchronously."""
    register = getattr(registry, kind)

    async def body(*args: Any) -> Any:
        return None

    name = f"tests.registry.async-{kind}"
    with pytest.raises(TypeError, match=r"coroutine function .*body"):
        register(name)(body)
    lookup = registry.get_step_function if kind == "step_function" else registry._workflows.get
    assert lookup(name) is None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("thing", [5, "not a function", None])
def test_a_non_callable_is_refused_at_declaration(kind: str, thing: Any) -> None:
    register = getattr(registry, kind)
    name = f"tests.registry.not-callable-{kind}"
    with pytest.raises(TypeError, match=f"not {type(thing).__name__}"):
        register(name)(thing)
    lookup = registry.get_step_function if kind == "step_function" else registry._workflows.get
    assert lookup(name) is None


@pytest.mark.parametrize("kind", KINDS)
def test_a_plain_function_is_registered_and_returned_unchanged(kind: str) -> None:
    register = getattr(registry, kind)

    def body(*args: Any) -> Any:
        return None

    name = f"tests.registry.plain-{kind}"
    assert register(name)(body) is body
    lookup = registry.get_step_function if kind == "step_function" else registry.get_workflow
    assert lookup(name) is body

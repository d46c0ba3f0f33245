"""``@workflow`` and ``@step_function``: what a declaration refuses at import time."""

from __future__ import annotations

from typing import Any

import pytest

from django_leases.workflows import registry

KINDS = ["workflow", "step_function"]


def _registered(kind: str, name: str) -> Any:
    """What ``kind``'s registry holds under ``name`` (``None``: nothing)."""
    lookup = registry.get_step_function if kind == "step_function" else registry._workflows.get
    return lookup(name)


def test_a_coroutine_workflow_function_is_refused_at_declaration() -> None:
    """A workflow function only orchestrates and is replayed synchronously in passes: an
    ``async def`` one is refused, and the message says where the awaiting goes instead."""

    async def body(*args: Any) -> Any:
        return None

    name = "tests.registry.async-workflow"
    with pytest.raises(TypeError, match=r"coroutine function .*body.*only orchestrate.*step"):
        registry.workflow(name)(body)
    assert registry._workflows.get(name) is None


class _AsyncCallable:
    async def __call__(self, *args: Any) -> Any:
        return None


def test_an_object_with_an_async_call_is_a_coroutine_function_to_the_registry() -> None:
    """Refused as a workflow and as a transactional step, as ``async def`` functions are;
    as a plain step it is awaited."""
    with pytest.raises(TypeError, match="coroutine function"):
        registry.workflow("tests.registry.async-object")(_AsyncCallable())
    with pytest.raises(TypeError, match="coroutine function"):
        registry.step_function("tests.registry.async-object-tx", transactional=True)(
            _AsyncCallable()
        )
    assert registry._workflows.get("tests.registry.async-object") is None
    assert registry.get_step_function("tests.registry.async-object-tx") is None


@pytest.mark.parametrize("kind", KINDS)
def test_an_async_generator_function_is_refused_at_declaration(kind: str) -> None:
    async def body(*args: Any) -> Any:
        yield None

    register = getattr(registry, kind)
    name = f"tests.registry.async-generator-{kind}"
    with pytest.raises(TypeError, match=r"async generator function .*does not yield"):
        register(name)(body)
    assert _registered(kind, name) is None


def test_a_coroutine_step_function_is_registered() -> None:
    """Step functions may be ``async def`` (awaited on the worker thread's event loop)."""

    async def body(data: Any, ctx: Any) -> Any:
        return None

    name = "tests.registry.async-step_function"
    try:
        assert registry.step_function(name)(body) is body
        assert registry.get_step_function(name) is body
    finally:
        registry._step_functions.pop(name, None)
        registry._step_options.pop(name, None)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("thing", [5, "not a function", None])
def test_a_non_callable_is_refused_at_declaration(kind: str, thing: Any) -> None:
    register = getattr(registry, kind)
    name = f"tests.registry.not-callable-{kind}"
    with pytest.raises(TypeError, match=f"not {type(thing).__name__}"):
        register(name)(thing)
    assert _registered(kind, name) is None


@pytest.mark.parametrize("kind", KINDS)
def test_a_plain_function_is_registered_and_returned_unchanged(kind: str) -> None:
    register = getattr(registry, kind)

    def body(*args: Any) -> Any:
        return None

    name = f"tests.registry.plain-{kind}"
    assert register(name)(body) is body
    lookup = registry.get_step_function if kind == "step_function" else registry.get_workflow
    assert lookup(name) is body

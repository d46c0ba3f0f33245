"""OpenTelemetry spans for orchestration passes and step attempts, where ``opentelemetry-api``
is installed (``pip install django-leases[otel]``); otherwise :func:`span` does nothing.

Spans (tracer ``django_leases``): ``django_leases.pass`` around each replay of a run
(attributes ``workflow.run_id``, ``workflow.name``, and the pass's ``workflow.outcome``), and
``django_leases.step`` around each step function call (``workflow.run_id``,
``workflow.step``, ``workflow.function``, ``workflow.attempt``, and ``workflow.outcome``).
Configure an SDK and an exporter in your project as usual; without one the API's no-op tracer
costs next to nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

#: ``opentelemetry.trace`` once :func:`_opentelemetry` has looked: the module, or ``None``
#: where ``opentelemetry-api`` is not installed. Looked up at the first span, not as the
#: module loads: the API (and ``typing_extensions`` it pulls in) costs a project's start-up
#: several milliseconds, and only a worker running a pass ever opens a span.
_trace: ModuleType | None = None
_looked = False


def _opentelemetry() -> ModuleType | None:
    """``opentelemetry.trace``, imported on the first call, or ``None`` without the API."""
    global _trace, _looked
    if not _looked:
        try:  # pragma: no cover - the import itself is what is optional
            _trace = importlib.import_module("opentelemetry.trace")
        except ImportError:  # pragma: no cover
            _trace = None
        _looked = True
    return _trace


class _Span:
    """What :func:`span` yields: ``set(name, value)`` adds an attribute (a no-op without
    OpenTelemetry)."""

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def set(self, name: str, value: Any) -> None:
        if self._span is not None:
            self._span.set_attribute(name, value)


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[_Span]:
    """A span named ``name`` with ``attributes`` (``str`` / ``int`` / ``float`` / ``bool``
    values; others are given as text) around the block; an exception it raises is recorded
    on the span and propagates."""
    trace = _opentelemetry()
    if trace is None:
        yield _Span()
        return
    tracer = trace.get_tracer("django_leases")
    shown = {
        k: v if isinstance(v, str | int | float | bool) else str(v) for k, v in attributes.items()
    }
    with tracer.start_as_current_span(name, attributes=shown) as current:
        yield _Span(current)


__all__ = ["span"]

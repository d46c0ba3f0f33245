"""Prometheus metrics (scraped from the view, as Prometheus would) and OpenTelemetry spans."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.urls import include, path

from django_leases import metrics
from django_leases.workflows import step_function, workflow
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.worker import Worker
from tests.helpers import tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)

urlpatterns = [path("internal/", include("django_leases.metrics_urls"))]


@step_function("tests.metrics")
def step(data: Any, ctx: Any) -> Any:
    if data.get("fail"):
        raise RuntimeError("asked to")
    return data


@workflow("tests.metrics-one")
def one(run: Any, input: Any) -> Any:
    return run.step("only", "tests.metrics", input, retries=0)


def _scrape(client: Any) -> dict[str, float]:
    response = client.get("/internal/metrics/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    found = {}
    for line in response.content.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def _delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


@pytest.fixture(params=["tuned", "portable"])
def path_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    with tuned_sql(request.param == "tuned"):
        yield str(request.param)


@pytest.mark.urls("tests.test_metrics")
def test_a_scrape_counts_what_ran_and_reads_the_gauges(client: Any, path_mode: str) -> None:
    assert metrics.install()
    before = _scrape(client)
    start_workflow("tests.metrics-one", {"n": 1})
    start_workflow("tests.metrics-one", {"fail": True})
    start_workflow("tests.metrics-one", {"n": 2})
    gauges = _scrape(client)
    assert gauges['django_leases_runs{status="running"}'] >= 3
    worker = Worker(1, step_lease_ttl=30)
    while worker.work_once():  # a unit may drive several runs (a completion picks the next)
        pass
    after = _scrape(client)
    assert _delta(before, after, 'django_leases_runs_finished_total{status="completed"}') == 2
    assert _delta(before, after, 'django_leases_runs_finished_total{status="failed"}') == 1
    assert _delta(before, after, 'django_leases_step_attempts_total{event="started"}') == 3
    assert _delta(before, after, 'django_leases_step_attempts_total{event="succeeded"}') == 2
    assert _delta(before, after, 'django_leases_step_attempts_total{event="failed"}') == 1
    assert _delta(before, after, 'django_leases_leases_total{event="acquired"}') >= 3
    assert _delta(before, after, "django_leases_step_claim_wait_seconds_count") == 3
    assert after['django_leases_runs{status="running"}'] == before.get(
        'django_leases_runs{status="running"}', 0
    )
    assert "django_leases_workers" in after


urlpatterns += [path("", include("django_leases.urls"))]


@pytest.mark.urls("tests.test_metrics")
def test_deliveries_are_counted_by_source_and_outcome(client: Any, settings: Any) -> None:
    """Accepted, repeated and refused deliveries by source and outcome; a name no source
    declares is one label, however many names are tried."""
    from django_leases.models import TriggerSource
    from django_leases.triggers import registry
    from django_leases.triggers.registry import webhook_source
    from django_leases.triggers.signatures import github_signature

    assert metrics.install()
    secret = "metrics-signing-secret-0123456789"
    webhook_source("test-metrics-hooks", provider="github", events={"push": lambda d: None})
    try:
        settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {"test-metrics-hooks": secret}}
        TriggerSource.objects.sync(registry.declarations())
        TriggerSource.objects.set_enabled("test-metrics-hooks", True)
        before = _scrape(client)
        body = b'{"ref": "refs/heads/main"}'
        headers = {
            "X-GitHub-Event": "push",
            "X-GitHub-Delivery": "metrics-1",
            "X-Hub-Signature-256": github_signature(secret, body),
        }

        def post(url: str, **changed: str) -> int:
            return int(
                client.post(
                    url, body, content_type="application/json", headers={**headers, **changed}
                ).status_code
            )

        assert post("/hooks/test-metrics-hooks/") == 202
        assert post("/hooks/test-metrics-hooks/") == 200
        assert post("/hooks/test-metrics-hooks/", **{"X-Hub-Signature-256": "sha256=00"}) == 401
        for n in range(3):
            assert post(f"/hooks/scan-{n}/") == 404
        after = _scrape(client)
    finally:
        registry.unregister("test-metrics-hooks")
    name = "django_leases_deliveries_total"
    mine = 'source="test-metrics-hooks"'  # the exposition sorts labels by name
    assert _delta(before, after, f'{name}{{outcome="accepted",{mine}}}') == 1
    assert _delta(before, after, f'{name}{{outcome="duplicate",{mine}}}') == 1
    assert _delta(before, after, f'{name}{{outcome="bad_signature",{mine}}}') == 1
    unknown = f'{name}{{outcome="not_receiving",source="{metrics.UNDECLARED}"}}'
    assert _delta(before, after, unknown) == 3
    assert not any("scan-" in key for key in after)


@pytest.mark.urls("tests.test_metrics")
def test_without_prometheus_client_the_view_is_a_404(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "available", lambda: False)
    monkeypatch.setattr(metrics, "_installed", {})
    assert client.get("/internal/metrics/").status_code == 404


#: Run in a fresh interpreter: Django starts with the app, then one lease grant is signalled.
FRESH_PROCESS = """\
import sys
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_leases"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
)
django.setup()
print("imported at start:", "prometheus_client" in sys.modules)
from django_leases import signals

signals.lease_acquired.send(sender=None, key="k", token=1)
from prometheus_client import REGISTRY

print("counted:", REGISTRY.get_sample_value("django_leases_leases_total", {"event": "acquired"}))
"""


def test_the_first_count_registers_the_metrics_not_django_starting() -> None:
    """A process that never counts (a ``migrate``, a shell) does not import
    prometheus-client; the first signal counted registers the metrics and counts itself."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["imported at start: False", "counted: 1.0"]


def test_passes_and_steps_are_traced_with_opentelemetry() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous = trace._TRACER_PROVIDER  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = provider  # type: ignore[attr-defined]
    try:
        run_id = start_workflow("tests.metrics-one", {"n": 1})
        assert Worker(1, step_lease_ttl=30).work_once()
    finally:
        trace._TRACER_PROVIDER = previous  # type: ignore[attr-defined]
    spans = exporter.get_finished_spans()
    names = [s.name for s in spans]
    assert names.count("django_leases.step") == 1 and "django_leases.pass" in names, names
    step_span = next(s for s in spans if s.name == "django_leases.step")
    assert dict(step_span.attributes or {}) == {
        "workflow.run_id": str(run_id),
        "workflow.step": "only",
        "workflow.function": "tests.metrics",
        "workflow.attempt": 1,
        "workflow.outcome": "returned",
    }
    passes = [s for s in spans if s.name == "django_leases.pass"]
    assert {dict(s.attributes or {})["workflow.outcome"] for s in passes} <= {
        "waiting",
        "completed",
    }
    assert re.fullmatch(r"[0-9a-f-]{36}", str(dict(passes[0].attributes or {})["workflow.run_id"]))

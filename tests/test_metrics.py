"""Prometheus metrics (scraped from the view, as Prometheus would) and OpenTelemetry spans."""

from __future__ import annotations

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


#: The head of the scripts run in a fresh interpreter: settings with the app, not started.
FRESH_PROCESS = """\
import sys, threading
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_leases"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
)
"""


def _in_a_fresh_process(script: str) -> list[str]:
    """What ``script`` (after :data:`FRESH_PROCESS`) prints, a line each, in a fresh
    interpreter (where nothing registered the metrics yet)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS + script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_first_count_registers_the_metrics_not_django_starting() -> None:
    """A process that never counts (a ``migrate``, a shell) does not import
    prometheus-client; the first signal counted registers the metrics and counts itself."""
    assert _in_a_fresh_process(
        """\
django.setup()
print("imported at start:", "prometheus_client" in sys.modules)
from django_leases import signals

signals.lease_acquired.send(sender=None, key="k", token=1)
from prometheus_client import REGISTRY

print("counted:", REGISTRY.get_sample_value("django_leases_leases_total", {"event": "acquired"}))
"""
    ) == ["imported at start: False", "counted: 1.0"]


def test_the_first_counts_from_many_threads_and_a_racing_scrape_lose_nothing() -> None:
    """Eight threads count their first leases and renewals while a scrape registers the
    metrics: every count is there, the scrape answers."""
    assert _in_a_fresh_process(
        """\
django.setup()
from django.test import RequestFactory
from django_leases import metrics, renewal, signals

THREADS, EACH = 8, 200
barrier = threading.Barrier(THREADS + 1)
scraped = []

def count():
    barrier.wait()
    for _ in range(EACH):
        signals.lease_acquired.send(sender=None, key="k", token=1)
        renewal._observed("held")

def scrape():
    barrier.wait()
    scraped.append(metrics.metrics_view(RequestFactory().get("/metrics/")).status_code)

threads = [threading.Thread(target=count) for _ in range(THREADS)]
threads.append(threading.Thread(target=scrape))
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
from prometheus_client import REGISTRY

print(REGISTRY.get_sample_value("django_leases_leases_total", {"event": "acquired"}))
print(REGISTRY.get_sample_value("django_leases_renewals_total", {"outcome": "held"}))
print(scraped)
"""
    ) == ["1600.0", "1600.0", "[200]"]


def test_without_prometheus_client_leases_work_and_the_metrics_are_refused() -> None:
    assert _in_a_fresh_process(
        """\
sys.modules["prometheus_client"] = None  # hidden: as if not installed
django.setup()
from django.core.management import call_command
from django.test import RequestFactory
from django_leases import metrics, signals
from django_leases.models import Lease

call_command("migrate", verbosity=0)
lease = Lease.objects.acquire("k", "me", 30)
signals.lease_acquired.send(sender=None, key="k", token=1)
print(lease is not None, metrics.available(), metrics.install())
try:
    metrics.serve(0)
except ValueError:
    print("refused")
print(metrics.metrics_view(RequestFactory().get("/metrics/")).status_code)
"""
    ) == ["True False False", "refused", "404"]


def test_a_worker_serving_before_anything_counted_lists_the_counters() -> None:
    """``--metrics-port`` serves at once; a later registration is not a second one."""
    assert _in_a_fresh_process(
        """\
django.setup()
import socket, urllib.request
from django_leases import metrics

with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
metrics.serve(port)
metrics.install()
body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
print("# HELP django_leases_leases_total" in body, "# HELP django_leases_renewals_total" in body)
"""
    ) == ["True True"]


def test_without_prometheus_client_both_ways_in_name_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's ``--metrics-port`` and the metrics view, without prometheus-client, say
    to install the ``prometheus`` extra (its version bound), as every other missing extra's
    message does."""
    from django.core.management import CommandError, call_command
    from django.test import RequestFactory

    monkeypatch.setattr(metrics, "available", lambda: False)
    with pytest.raises(CommandError) as raised:
        call_command("run_workflow_worker", "--once", "--metrics-port", "9109")
    assert 'pip install "django-leases[prometheus]"' in str(raised.value)
    assert str(raised.value).count("--metrics-port") == 1
    response = metrics.metrics_view(RequestFactory().get("/internal/metrics/"))
    assert response.status_code == 404
    assert 'pip install "django-leases[prometheus]"' in response.content.decode()

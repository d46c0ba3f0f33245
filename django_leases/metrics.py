"""Prometheus metrics (optional: ``pip install django-leases[prometheus]``).

When ``prometheus-client`` is installed, the app registers its metrics in the default
registry as Django starts (:func:`install`). Two kinds:

* **counters of this process**, kept from the package's signals: leases acquired, released
  and lost; renewals by outcome; step attempts started and finished by outcome, superseded
  writes; runs finished by status; deliveries by source and outcome (accepted, duplicate, or
  the refusal's reason); and a histogram of how long due steps waited to be claimed;
* **gauges read from the database at each scrape** (cheap: only what the partial and status
  indexes answer): runs ``running`` and ``suspended``, steps waiting / running by status,
  live workflow workers.

Expose them where Prometheus can scrape, and nowhere public:

* a web process: ``path("internal/", include("django_leases.metrics_urls"))`` serves
  ``internal/metrics/`` (the text exposition format);
* a worker process: ``run_workflow_worker --metrics-port 9108`` serves its own counters (the
  steps it ran, its renewals) on that port, as ``prometheus_client.start_http_server`` does.

Without ``prometheus-client`` nothing is registered and the view answers 404.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from django.db import DatabaseError, router
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound

from django_leases import renewal, signals
from django_leases.models.worker import WorkflowWorker
from django_leases.models.workflow import WorkflowRun, WorkflowStep
from django_leases.triggers.registry import get_declaration
from django_leases.workflows.values import RunStatus, StepStatus

#: The ``source`` label of a delivery refused for a name no source declares.
UNDECLARED = "(undeclared)"

try:  # pragma: no cover - the import itself is what is optional
    import prometheus_client
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError:  # pragma: no cover
    prometheus_client = None  # type: ignore[assignment]

#: Prefix of every metric name.
PREFIX = "django_leases"

#: Buckets (seconds) of the claim-wait histogram: from a millisecond to a few minutes.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0)

_lock = threading.Lock()
_installed: dict[str, Any] = {}


def available() -> bool:
    """Whether ``prometheus-client`` is installed."""
    return prometheus_client is not None


def install() -> bool:
    """Register the metrics and their signal receivers (once per process); returns whether
    they are registered (``False`` without ``prometheus-client``)."""
    if prometheus_client is None:
        return False
    with _lock:
        if _installed:
            return True
        counter, histogram = prometheus_client.Counter, prometheus_client.Histogram
        found = {
            "leases": counter(f"{PREFIX}_leases", "Lease grants, releases and losses", ["event"]),
            "renewals": counter(f"{PREFIX}_renewals", "Lease renewals by outcome", ["outcome"]),
            "attempts": counter(
                f"{PREFIX}_step_attempts", "Step attempts started and finished", ["event"]
            ),
            "runs": counter(f"{PREFIX}_runs_finished", "Runs that reached a status", ["status"]),
            "deliveries": counter(
                f"{PREFIX}_deliveries", "Webhook deliveries by outcome", ["source", "outcome"]
            ),
            "waited": histogram(
                f"{PREFIX}_step_claim_wait_seconds",
                "Seconds a due step waited before it was claimed (database clock)",
                buckets=WAIT_BUCKETS,
            ),
        }
        prometheus_client.REGISTRY.register(_DatabaseCollector())
        _installed.update(found)
        _connect()
        renewals: Any = found["renewals"]
        renewal.observers.append(lambda outcome: renewals.labels(outcome).inc())
    return True


def _connect() -> None:
    """Count from the signals (strong references: the receivers live as long as the process)."""
    leases, attempts, runs = _installed["leases"], _installed["attempts"], _installed["runs"]

    def on(signal: Any, handler: Any) -> None:
        signal.connect(handler, weak=False, dispatch_uid=f"django_leases.metrics:{id(signal)}")

    on(signals.lease_acquired, lambda sender, **kw: leases.labels("acquired").inc())
    on(signals.lease_released, lambda sender, **kw: leases.labels("released").inc())
    on(signals.lease_lost, lambda sender, **kw: leases.labels("lost").inc())

    def started(sender: Any, waited: float | None = None, **kwargs: Any) -> None:
        attempts.labels("started").inc()
        if waited is not None:
            _installed["waited"].observe(max(0.0, waited))

    on(signals.step_attempt_started, started)
    on(
        signals.step_attempt_finished,
        lambda sender, status, **kw: attempts.labels(str(status)).inc(),
    )
    on(signals.step_attempt_superseded, lambda sender, **kw: attempts.labels("superseded").inc())
    for status, signal in signals.RUN_STATUS_SIGNALS.items():
        on(signal, lambda sender, status=status, **kw: runs.labels(status).inc())

    def accepted(sender: Any, source: str, duplicate: bool = False, **kwargs: Any) -> None:
        _installed["deliveries"].labels(source, "duplicate" if duplicate else "accepted").inc()

    def refused(sender: Any, source: str, reason: str, **kwargs: Any) -> None:
        # A name from the URL that no source declares is one label, not one per name: a
        # scan of random addresses must not grow the exposition without bound.
        shown = source if get_declaration(source) is not None else UNDECLARED
        _installed["deliveries"].labels(shown, reason).inc()

    on(signals.delivery_accepted, accepted)
    on(signals.delivery_refused, refused)


if prometheus_client is not None:

    class _DatabaseCollector(Collector):
        """Gauges read at scrape time from the database the workflow tables are written to."""

        def describe(self) -> Iterator[GaugeMetricFamily]:
            """The families without their values: registering must not query (the app
            registers them while Django starts)."""
            yield from self._families()

        def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
            return (
                GaugeMetricFamily(
                    f"{PREFIX}_runs", "Runs by status (not finished)", labels=["status"]
                ),
                GaugeMetricFamily(
                    f"{PREFIX}_steps",
                    "Steps of running runs waiting or running, by queue and status",
                    labels=["queue", "status"],
                ),
                GaugeMetricFamily(f"{PREFIX}_workers", "Live workflow worker processes"),
            )

        def collect(self) -> Iterator[GaugeMetricFamily]:
            runs = GaugeMetricFamily(
                f"{PREFIX}_runs", "Runs by status (not finished)", labels=["status"]
            )
            steps = GaugeMetricFamily(
                f"{PREFIX}_steps",
                "Steps of running runs waiting or running, by queue and status",
                labels=["queue", "status"],
            )
            workers = GaugeMetricFamily(f"{PREFIX}_workers", "Live workflow worker processes")
            alias = router.db_for_write(WorkflowRun)
            try:
                counts = dict(
                    WorkflowRun.objects.db_manager(alias)
                    .filter(status__in=[RunStatus.RUNNING, RunStatus.SUSPENDED])
                    .values_list("status")
                    .annotate(n=Count("pk"))
                    .values_list("status", "n")
                )
                for run_status in (RunStatus.RUNNING, RunStatus.SUSPENDED):
                    runs.add_metric([run_status.value], counts.get(run_status.value, 0))
                waiting = {
                    (queue, status): n
                    for queue, status, n in WorkflowStep.objects.db_manager(alias)
                    .filter(
                        run__status=RunStatus.RUNNING,
                        status__in=[StepStatus.PENDING, StepStatus.SCHEDULED, StepStatus.RUNNING],
                    )
                    .values_list("queue", "status")
                    .annotate(n=Count("pk"))
                    .values_list("queue", "status", "n")
                }
                queues = sorted({"default"} | {queue for queue, _ in waiting})
                for queue in queues:
                    for step_status in (
                        StepStatus.PENDING,
                        StepStatus.SCHEDULED,
                        StepStatus.RUNNING,
                    ):
                        steps.add_metric(
                            [queue, step_status.value], waiting.get((queue, step_status.value), 0)
                        )
                workers.add_metric([], WorkflowWorker.objects.db_manager(alias).live().count())
            except DatabaseError:  # a scrape must not fail for an unreachable database
                return
            yield runs
            yield steps
            yield workers


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The metrics in Prometheus' text exposition format (404 without ``prometheus-client``).

    Serve it only where your Prometheus can reach it and the public cannot
    (``include("django_leases.metrics_urls")`` under an internal prefix)."""
    if not install():
        return HttpResponseNotFound("prometheus-client is not installed")
    return HttpResponse(
        prometheus_client.generate_latest(prometheus_client.REGISTRY),
        content_type=prometheus_client.CONTENT_TYPE_LATEST,
    )


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Serve this process's metrics on ``addr:port`` from a thread (``ValueError`` without
    ``prometheus-client``)."""
    if not install():
        raise ValueError("--metrics-port needs prometheus-client: pip install prometheus-client")
    prometheus_client.start_http_server(port, addr=addr)


__all__ = ["available", "install", "metrics_view", "serve"]

"""Prometheus metrics (optional: ``pip install django-leases[prometheus]``).

When ``prometheus-client`` is installed, the app counts from the moment Django starts: it
connects its signal receivers then (:func:`connect`, which imports nothing), and registers
its metrics in the default registry the first time one is counted or scraped
(:func:`install`), so a process that never counts pays nothing for the import. Two kinds:

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

import functools
import importlib.util
import threading
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseNotFound

from django_leases import renewal, signals
from django_leases.triggers.registry import get_declaration

#: The ``source`` label of a delivery refused for a name no source declares.
UNDECLARED = "(undeclared)"

#: Prefix of every metric name.
PREFIX = "django_leases"

#: Buckets (seconds) of the claim-wait histogram: from a millisecond to a few minutes.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0)

_lock = threading.Lock()
_installed: dict[str, Any] = {}
_connected: list[bool] = []


@functools.cache
def available() -> bool:
    """Whether ``prometheus-client`` is installed (looked up, not imported)."""
    try:
        return importlib.util.find_spec("prometheus_client") is not None
    except ImportError:  # a finder that refuses the name: not installed, as far as we go
        return False


def connect() -> None:
    """Count from now on (the app's ``ready()`` calls it): connect the signal receivers and
    the renewal observer, which register the metrics (:func:`install`) when they first
    count. Imports nothing; a no-op without ``prometheus-client`` or when connected."""
    if not available():
        return
    with _lock:
        if _connected:
            return
        _connected.append(True)
    _connect()
    renewal.observers.append(lambda outcome: _metric("renewals").labels(outcome).inc())


def install() -> bool:
    """Register the metrics in ``prometheus_client.REGISTRY`` and connect the receivers
    (once per process); returns whether they are registered (``False`` without
    ``prometheus-client``)."""
    if not available():
        return False
    connect()
    with _lock:
        if _installed:
            return True
        client = _client()
        counter, histogram = client.Counter, client.Histogram
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
        # deferred: it imports prometheus-client at its top
        from django_leases.metrics_collector import DatabaseCollector

        client.REGISTRY.register(DatabaseCollector(PREFIX))
        _installed.update(found)
    return True


def _client() -> Any:
    """The ``prometheus_client`` module (call it only where :func:`available`)."""
    import prometheus_client  # deferred: the optional extra, imported when first used

    return prometheus_client


def _metric(name: str) -> Any:
    """The metric ``name``, registering them all first if none is (:func:`install`)."""
    if not _installed:
        install()
    return _installed[name]


def _connect() -> None:
    """Count from the signals (strong references: the receivers live as long as the process)."""

    def on(signal: Any, handler: Any) -> None:
        signal.connect(handler, weak=False, dispatch_uid=f"django_leases.metrics:{id(signal)}")

    def lease(event: str) -> Any:
        return lambda sender, **kwargs: _metric("leases").labels(event).inc()

    on(signals.lease_acquired, lease("acquired"))
    on(signals.lease_released, lease("released"))
    on(signals.lease_lost, lease("lost"))

    def started(sender: Any, waited: float | None = None, **kwargs: Any) -> None:
        _metric("attempts").labels("started").inc()
        if waited is not None:
            _metric("waited").observe(max(0.0, waited))

    on(signals.step_attempt_started, started)
    on(
        signals.step_attempt_finished,
        lambda sender, status, **kw: _metric("attempts").labels(str(status)).inc(),
    )
    on(
        signals.step_attempt_superseded,
        lambda sender, **kw: _metric("attempts").labels("superseded").inc(),
    )
    for status, signal in signals.RUN_STATUS_SIGNALS.items():
        on(signal, lambda sender, status=status, **kw: _metric("runs").labels(status).inc())

    def accepted(sender: Any, source: str, duplicate: bool = False, **kwargs: Any) -> None:
        _metric("deliveries").labels(source, "duplicate" if duplicate else "accepted").inc()

    def refused(sender: Any, source: str, reason: str, **kwargs: Any) -> None:
        # A name from the URL that no source declares is one label, not one per name: a
        # scan of random addresses must not grow the exposition without bound.
        shown = source if get_declaration(source) is not None else UNDECLARED
        _metric("deliveries").labels(shown, reason).inc()

    on(signals.delivery_accepted, accepted)
    on(signals.delivery_refused, refused)


#: How to install what the metrics need: the extra, with the version bound it carries.
INSTALL = 'pip install "django-leases[prometheus]"'


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The metrics in Prometheus' text exposition format (404 without ``prometheus-client``).

    Serve it only where your Prometheus can reach it and the public cannot
    (``include("django_leases.metrics_urls")`` under an internal prefix)."""
    if not install():
        return HttpResponseNotFound(f"prometheus-client is not installed: {INSTALL}")
    client = _client()
    return HttpResponse(
        client.generate_latest(client.REGISTRY), content_type=client.CONTENT_TYPE_LATEST
    )


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Serve this process's metrics on ``addr:port`` from a thread (``ValueError`` without
    ``prometheus-client``)."""
    if not install():
        raise ValueError(f"it needs prometheus-client: {INSTALL}")
    _client().start_http_server(port, addr=addr)


__all__ = ["available", "connect", "install", "metrics_view", "serve"]

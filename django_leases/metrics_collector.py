"""The gauges :mod:`django_leases.metrics` reads from the database at each scrape.

Its own module because it imports ``prometheus-client`` (the optional extra) at its top:
:func:`django_leases.metrics.install` imports it only when the metrics are registered.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db import DatabaseError, router
from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from django_leases.models.worker import WorkflowWorker
from django_leases.models.workflow import WorkflowRun, WorkflowStep
from django_leases.workflows.values import RunStatus, StepStatus


class DatabaseCollector(Collector):
    """Gauges read at scrape time from the database the workflow tables are written to,
    their names starting with ``prefix`` (:data:`django_leases.metrics.PREFIX`)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The families without their values: registering must not query (it happens on
        the first count or scrape, wherever that is)."""
        yield from self._families()

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                f"{self.prefix}_runs", "Runs by status (not finished)", labels=["status"]
            ),
            GaugeMetricFamily(
                f"{self.prefix}_steps",
                "Steps of running runs waiting or running, by queue and status",
                labels=["queue", "status"],
            ),
            GaugeMetricFamily(f"{self.prefix}_workers", "Live workflow worker processes"),
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The families with their values read now; none when the database cannot answer
        (a scrape must not fail for it)."""
        runs, steps, workers = self._families()
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

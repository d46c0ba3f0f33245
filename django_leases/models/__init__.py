from django_leases.models.lease import Lease, LeaseQuerySet, LeaseState
from django_leases.models.queue import WorkflowQueue
from django_leases.models.schedule import WorkflowSchedule, WorkflowScheduleBackfill
from django_leases.models.trigger import (
    OrphanTriggerSource,
    TriggerEvent,
    TriggerRefusal,
    TriggerSecret,
    TriggerSource,
    TriggerSourceDefaults,
)
from django_leases.models.wait import WorkflowWait
from django_leases.models.worker import WorkerState, WorkflowWorker
from django_leases.models.workflow import (
    AttemptStatus,
    RunStatus,
    StepStatus,
    WorkflowRun,
    WorkflowStep,
    WorkflowStepAttempt,
)

__all__ = [
    "AttemptStatus",
    "Lease",
    "LeaseQuerySet",
    "LeaseState",
    "OrphanTriggerSource",
    "RunStatus",
    "StepStatus",
    "TriggerEvent",
    "TriggerRefusal",
    "TriggerSecret",
    "TriggerSource",
    "TriggerSourceDefaults",
    "WorkerState",
    "WorkflowQueue",
    "WorkflowRun",
    "WorkflowSchedule",
    "WorkflowScheduleBackfill",
    "WorkflowStep",
    "WorkflowStepAttempt",
    "WorkflowWait",
    "WorkflowWorker",
]

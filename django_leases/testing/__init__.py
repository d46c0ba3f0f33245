"""Conformance suites you can run against your own database.

``django_leases.testing.leases.LeaseConformanceTests`` checks the lease rules L1–L18 (the
``Lease`` QuerySet, ``hold_lease`` and ``ahold_lease``). Mix it into a
``django.test.TransactionTestCase``; see that module's docstring.
``django_leases.testing.workflows.WorkflowFencingConformanceTests`` checks the claim and
fencing rules of workflow steps (C1–C14, F1–F14) the same way, and
``django_leases.testing.triggers.TriggerSourceStoreConformanceTests`` the trigger-source store
rules (T1–T13). ``django_leases.testing.providers`` has a fake webhook provider for tests.
``django_leases.testing.waits.WorkflowWaitConformanceTests`` checks the rules of waits,
fan-out, child runs, idempotent starts and step timeouts (W1–W8, P1–P2, K1–K2, H1–H3, T1),
and ``django_leases.testing.patches.WorkflowPatchConformanceTests`` those of ``run.patched``
(R1–R5). ``django_leases.testing.timing.WorkflowTimingConformanceTests`` checks delayed starts,
debounced starts and run deadlines (S1–S3, B1–B3, D1–D5).
:func:`drive` runs your workflows to the end on the calling thread, inside a ``TestCase``;
:func:`time_out` makes a wait's timeout pass now. :func:`enable_source` and :func:`deliver`
(:mod:`django_leases.testing.webhooks`) test webhook handlers there: a source switched on
without a provider call, and a delivery signed as its provider signs, posted to the receive
view.
"""

from django_leases.testing.driving import drive, time_out
from django_leases.testing.leases import LeaseConformanceTests, SimulatedOutage
from django_leases.testing.patches import WorkflowPatchConformanceTests
from django_leases.testing.timing import WorkflowTimingConformanceTests
from django_leases.testing.triggers import TriggerSourceStoreConformanceTests
from django_leases.testing.waits import WorkflowWaitConformanceTests
from django_leases.testing.webhooks import deliver, enable_source
from django_leases.testing.workflows import WorkflowFencingConformanceTests

__all__ = [
    "LeaseConformanceTests",
    "SimulatedOutage",
    "TriggerSourceStoreConformanceTests",
    "WorkflowFencingConformanceTests",
    "WorkflowPatchConformanceTests",
    "WorkflowTimingConformanceTests",
    "WorkflowWaitConformanceTests",
    "deliver",
    "drive",
    "enable_source",
    "time_out",
]

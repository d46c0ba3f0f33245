"""Conformance suites you can run against your own database.

``django_leases.testing.leases.LeaseConformanceTests`` checks the lease rules L1–L18 (the
``Lease`` QuerySet, ``hold_lease`` and ``ahold_lease``). Mix it into a
``django.test.TransactionTestCase``; see that module's docstring.
"""

from django_leases.testing.leases import LeaseConformanceTests, SimulatedOutage

__all__ = ["LeaseConformanceTests", "SimulatedOutage"]

"""Signals sent by the lease primitives.

- ``lease_acquired(sender=Lease, lease=Lease)``: ``Lease.objects.acquire`` granted a lease.
- ``lease_released(sender=Lease, lease=Lease)``: a holder released its lease (not sent for a
  stale release, which is a no-op).
- ``lease_lost(sender=Lease, key=str, lease=Lease)``: ``hold_lease`` saw its lease lapse or pass
  to another holder. Sent from the renewal thread; receivers must not block.

They are sent with ``send_robust``: a receiver's exception is logged (``django.dispatch``)
and never turns a granted, released or lost lease into an error of the lease operation.
"""

from django.dispatch import Signal

lease_acquired = Signal()
lease_released = Signal()
lease_lost = Signal()

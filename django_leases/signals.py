"""Signals sent by django-leases (Django's ``django.dispatch``).

Leases (``sender=Lease``; ``lease_acquired`` and ``lease_released`` are sent once the
transaction that made them true commits — at once outside one, never if it rolls back):

- ``lease_acquired(lease)``: ``Lease.objects.acquire`` granted a lease (also a grant made
  with a larger statement, such as the worker's pick of a run with its run lease).
- ``lease_released(lease)``: a holder released its lease (not sent for a stale release,
  which is a no-op).
- ``lease_lost(key, lease)``: a hold saw its lease lapse or pass to another holder. Sent from
  the renewal thread; receivers must not block.

Workflow runs (``sender=WorkflowRun``; ``run_id`` a ``uuid.UUID``, ``using`` the alias):

- ``run_started(run_id, workflow, using)``: a run was created (once its transaction commits);
- ``run_completed(run_id, output, using)``, ``run_failed(run_id, error, using)``,
  ``run_suspended(run_id, error, using)``, ``run_cancelled(run_id, using)``: a running (or,
  for a cancel, suspended) run reached that status. ``run_completed`` also carries
  ``finished_at`` (an aware ``datetime``, the database clock) when the write that completed
  the run read it back (a worker's result completing the run, on PostgreSQL).

Steps (``sender=WorkflowStep``; ``step_id`` an ``int``, ``attempt`` the fencing number):

- ``step_attempt_started(step_id, run_id, step_name, attempt, using)``: a claim started an
  attempt (once the claim commits);
- ``step_attempt_finished(step_id, run_id, attempt, status, using)``: the attempt's outcome
  was written (``status`` ``"succeeded"`` or ``"failed"``);
- ``step_attempt_superseded(step_id, attempt, current_attempt, using)``: a write of an
  attempt was refused by the fence (a newer claim, or a cancel of its run).

Deliveries (``sender=TriggerEvent``):

- ``delivery_accepted(source, event, delivery_id, run_id, duplicate)``: a verified delivery
  was recorded (``duplicate`` for a repeated delivery id, processed once);
- ``delivery_refused(source, reason, status)``: a delivery was refused (``reason`` one of the
  receiver's reasons, ``status`` the HTTP answer); nothing of it was kept.

Every signal is sent with ``send_robust``: a receiver's exception is logged
(``django.dispatch``) and never turns the operation into an error. Most are sent on hot paths
(every pass, every step): keep receivers cheap.
"""

from django.dispatch import Signal

lease_acquired = Signal()
lease_released = Signal()
lease_lost = Signal()

run_started = Signal()
run_completed = Signal()
run_failed = Signal()
run_suspended = Signal()
run_cancelled = Signal()

step_attempt_started = Signal()
step_attempt_finished = Signal()
step_attempt_superseded = Signal()

delivery_accepted = Signal()
delivery_refused = Signal()

#: The signal sent when a run reaches each final (or waiting) status.
RUN_STATUS_SIGNALS = {
    "completed": run_completed,
    "failed": run_failed,
    "suspended": run_suspended,
    "cancelled": run_cancelled,
}

"""``manage.py demo_digest [--every SECONDS]``: the demo's singleton job.

Meant to run under ``manage.py hold_lease demo-digest -- python manage.py demo_digest``: every
``--every`` seconds (default 1) it counts the workflow runs and writes the ``Digest`` row,
fenced by the lease's token (``DJANGO_LEASES_TOKEN``, which ``hold_lease`` hands its child) so
a holder that lost the lease to a newer one can never overwrite the newer one's digest. It
runs until SIGTERM (which ``hold_lease`` forwards), and exits 76 when its write is refused (a
newer holder exists).
"""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from demo_project.journal.models import Digest, worker_name
from django_leases.models import RunStatus, WorkflowRun
from django_leases.process import Doorbell, on_stop

NAME = "workflow-runs"


class Command(BaseCommand):
    help = "Keep the demo's digest of workflow runs up to date, fenced by the lease token."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--every", type=float, default=1.0, help="Seconds between writes.")

    def handle(self, *args: Any, **options: Any) -> None:
        token_text = os.environ.get("DJANGO_LEASES_TOKEN", "")
        if not token_text.isdigit():
            raise CommandError(
                "Run me under `manage.py hold_lease KEY -- …` (no DJANGO_LEASES_TOKEN)"
            )
        token, holder = int(token_text), worker_name()
        # The signal only records itself and rings the doorbell: setting a threading.Event
        # from a handler can deadlock the main thread waiting on that same event.
        stopped: list[int] = []
        doorbell = Doorbell()

        def stop(signum: int) -> None:
            stopped.append(signum)
            doorbell.ring()

        self.stdout.write(f"digest job: writing as {holder} with fencing token {token}")
        with on_stop(stop):
            while not stopped:
                counts = {
                    "runs_completed": WorkflowRun.objects.filter(
                        status=RunStatus.COMPLETED
                    ).count(),
                    "runs_running": WorkflowRun.objects.filter(status=RunStatus.RUNNING).count(),
                }
                if not Digest.objects.write(NAME, token, holder, **counts):
                    raise CommandError(
                        "a newer lease holder wrote the digest: stopping", returncode=76
                    )
                doorbell.wait(options["every"])

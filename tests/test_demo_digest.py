"""The demo's singleton job: its digest is fenced by the lease's token."""

from __future__ import annotations

import os
import signal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from demo_project.journal.models import Digest
from django_leases.models import Lease
from tests.helpers import MANAGE_PY, start_process, wait_until


@pytest.mark.django_db
def test_a_lower_token_never_overwrites_a_higher_ones_digest() -> None:
    assert Digest.objects.write("d", 2, "b", runs_completed=5) is True
    assert Digest.objects.write("d", 1, "a", runs_completed=99) is False
    assert Digest.objects.write("d", 2, "b", runs_completed=6) is True
    assert Digest.objects.write("d", 3, "c", runs_completed=7) is True
    row = Digest.objects.get(name="d")
    assert (row.token, row.holder, row.runs_completed) == (3, "c", 7)


@pytest.mark.django_db
def test_the_job_refuses_to_run_without_a_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DJANGO_LEASES_TOKEN", raising=False)
    with pytest.raises(CommandError, match="hold_lease"):
        call_command("demo_digest", stdout=StringIO())


def test_under_hold_lease_it_writes_with_the_lease_token(subprocess_env: dict[str, str]) -> None:
    job = [*MANAGE_PY, "demo_digest", "--every", "0.2"]
    proc = start_process(
        [*MANAGE_PY, "hold_lease", "demo-digest-test", "--ttl", "5", "--", *job],
        env=subprocess_env,
    )

    def written() -> bool:
        assert proc.poll() is None, proc.communicate()
        return Digest.objects.filter(name="workflow-runs").exists()

    try:
        wait_until(written, 60, what="a digest written")
        lease = Lease.objects.current("demo-digest-test")
        assert lease is not None
        assert Digest.objects.get(name="workflow-runs").token == lease.token
        # A newer holder wrote it: the job stops with 76 and hold_lease passes that on.
        Digest.objects.filter(name="workflow-runs").update(token=lease.token + 10)
        assert proc.wait(timeout=60) == 76
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    assert Lease.objects.current("demo-digest-test") is None

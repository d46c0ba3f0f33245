"""``make demo``: a guided tour of django-leases on real input.

Stages (each checks that it did what it says; any failure makes the tour exit 1):

1. migrate the demo database (SQLite ``demo.sqlite3`` unless ``DATABASE_URL`` says otherwise)
   and create an admin user;
2. sync the trigger-source declarations (``reconcile_trigger_sources``);
3. start the demo server and a workflow worker (``run_workflow_worker``);
4. enable the ``github-pushes`` source, as an operator would in the admin;
5. deliver GitHub push payloads signed as GitHub signs them — the files in
   ``../shared/fixtures/github/push/`` when that folder exists, else the demo's own samples —
   and wait for the workflow runs they start to complete, showing each step's attempts;
6. disable the source and show that a delivery is now answered 404;
7. start two ``hold_lease`` holder processes on one key, SIGKILL the holder and watch the
   other take over with a higher fencing token;
8. print a summary, then serve the admin on http://127.0.0.1:8000/admin/ until Ctrl-C
   (skipped with ``DEMO_NO_SERVE=1``, which CI uses).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
SHARED_PUSHES = BASE_DIR.parent / "shared" / "fixtures" / "github" / "push"
SAMPLE_PUSHES = Path(__file__).resolve().parent / "previews" / "samples"
SOURCE = "github-pushes"
ADMIN_USER = os.environ.get("DEMO_ADMIN_USER", "admin")
ADMIN_PASSWORD = os.environ.get("DEMO_ADMIN_PASSWORD", "admin")


class StageFailed(Exception):
    """A stage did not do what it says."""


def say(text: str = "") -> None:
    print(text, flush=True)


def wait_for(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    """Poll ``check`` until it returns something truthy; raise StageFailed after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise StageFailed(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def manage(*args: str, **kwargs: Any) -> subprocess.Popen[str]:
    """Start ``manage.py ARGS`` as a child process in the demo's environment."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
    return subprocess.Popen(
        [sys.executable, str(BASE_DIR / "manage.py"), *args],
        cwd=BASE_DIR,
        env=env,
        text=True,
        **kwargs,
    )


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


class Tour:
    """Runs the stages in order and keeps the child processes it started."""

    def __init__(self, serve: bool) -> None:
        self.serve = serve
        self.port = 8000 if serve else free_port()
        self.children: list[subprocess.Popen[str]] = []
        self.summary: dict[str, Any] = {}

    # -- plumbing -----------------------------------------------------------------------------

    @property
    def hook_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/{SOURCE}/"

    def start(self, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
        child = manage(*args, **kwargs)
        self.children.append(child)
        return child

    def stop_all(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    def run(self) -> int:
        stages = [
            ("Set up the database and an admin user", self.setup),
            ("Sync the trigger-source declarations", self.reconcile),
            ("Start the demo server and a workflow worker", self.start_processes),
            (f"Enable the {SOURCE!r} source", self.enable_source),
            ("Deliver signed GitHub pushes and run their workflows", self.deliver),
            (f"Disable {SOURCE!r}: deliveries are refused", self.disable_source),
            ("Two lease holders on one key: the holder dies, the other takes over", self.takeover),
        ]
        failed = False
        try:
            for number, (title, stage) in enumerate(stages, start=1):
                say(f"\n== {number}. {title}")
                try:
                    stage()
                except StageFailed as problem:
                    say(f"   FAILED: {problem}")
                    failed = True
                    break
                say("   ok")
            self.print_summary(failed)
            if not failed and self.serve:
                self.serve_forever()
        finally:
            self.stop_all()
        return 1 if failed else 0

    # -- stages -------------------------------------------------------------------------------

    def setup(self) -> None:
        from django.contrib.auth import get_user_model
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        users = get_user_model()._default_manager
        if not users.filter(username=ADMIN_USER).exists():
            users.create_superuser(ADMIN_USER, "admin@example.com", ADMIN_PASSWORD)
        say(f"   admin user: {ADMIN_USER} / {ADMIN_PASSWORD}")

    def reconcile(self) -> None:
        from django.core.management import call_command

        from django_leases.models import TriggerSource

        call_command(
            "reconcile_trigger_sources",
            base_url=f"http://127.0.0.1:{self.port}",
            label_prefix="demo",
            verbosity=0,
        )
        source = TriggerSource.objects.filter(name=SOURCE, declared=True).first()
        if source is None:
            raise StageFailed(f"the declaration {SOURCE!r} did not become a row")
        if source.enabled:
            TriggerSource.objects.set_enabled(SOURCE, False)  # a fresh tour starts switched off
        say(f"   {SOURCE}: declared, provider {source.provider}, off until enabled")

    def start_processes(self) -> None:
        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", self.port))
        except OSError:
            raise StageFailed(
                f"port {self.port} is in use: stop whatever listens there (an earlier "
                "`make demo`?) and run the tour again"
            ) from None
        server = self.start(
            "runserver",
            f"127.0.0.1:{self.port}",
            "--noreload",
            stdout=subprocess.DEVNULL,
        )

        def server_up() -> bool:
            if server.poll() is not None:
                raise StageFailed(f"the server exited with {server.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return True
            except OSError:
                return False

        wait_for("the demo server", server_up, timeout=60)
        worker = self.start("run_workflow_worker", "--concurrency", "2")
        time.sleep(0.5)
        if worker.poll() is not None:
            raise StageFailed(f"the worker exited with {worker.returncode}")
        say(f"   server on http://127.0.0.1:{self.port}/ , worker pid {worker.pid}")

    def enable_source(self) -> None:
        from django_leases.models import TriggerSource

        TriggerSource.objects.set_enabled(SOURCE, True)
        if not TriggerSource.objects.get(name=SOURCE).enabled:
            raise StageFailed("the source did not switch on")

    def payloads(self) -> list[Path]:
        if SHARED_PUSHES.is_dir():
            say(f"   payloads: the real GitHub push payloads in {SHARED_PUSHES}")
            return sorted(SHARED_PUSHES.glob("*.json"))
        say(f"   payloads: the demo's own samples in {SAMPLE_PUSHES}")
        return sorted(SAMPLE_PUSHES.glob("push-*.json"))

    def signed_push(self, body: bytes) -> dict[str, str]:
        from django_leases.conf import leases_settings
        from django_leases.triggers import github_signature

        secret = leases_settings.WEBHOOK_SECRETS[SOURCE]
        return {
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/demo",
            "X-GitHub-Event": "push",
            "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-Hub-Signature-256": github_signature(secret, body),
        }

    def deliver(self) -> None:
        from django_leases.models import RunStatus, WorkflowRun

        run_ids = []
        for path in self.payloads():
            body = path.read_bytes()
            status, text = post(self.hook_url, body, self.signed_push(body))
            if status != 202:
                raise StageFailed(f"{path.name}: expected 202, got {status}: {text[:200]}")
            run_id = json.loads(text).get("run_id")
            if not run_id:
                raise StageFailed(f"{path.name}: the delivery started no workflow run")
            run_ids.append(run_id)
            say(f"   {path.name}: 202, run {run_id}")

        def all_finished() -> bool:
            finished = WorkflowRun.objects.filter(id__in=run_ids).exclude(status=RunStatus.RUNNING)
            return finished.count() == len(run_ids)

        wait_for("the workflow runs to finish", all_finished, timeout=120)
        attempts = 0
        for run in WorkflowRun.objects.filter(id__in=run_ids).order_by("created_at"):
            say(f"   run {run.id}: {run.status}")
            for step in run.steps.order_by("created_at", "id"):
                tried = ", ".join(
                    f"#{a.attempt} {a.status}" for a in step.attempts.order_by("attempt")
                )
                attempts += step.attempts.count()
                say(f"      {step.step_name:<10} {step.status:<10} attempts: {tried}")
            if run.status != RunStatus.COMPLETED:
                raise StageFailed(f"run {run.id} ended {run.status}: {run.error}")
        self.summary["runs completed"] = len(run_ids)
        self.summary["step attempts"] = attempts

    def disable_source(self) -> None:
        from django_leases.models import TriggerEvent, TriggerSource

        TriggerSource.objects.set_enabled(SOURCE, False)
        before = TriggerEvent.objects.count()
        body = next(iter(self.payloads())).read_bytes()
        status, _ = post(self.hook_url, body, self.signed_push(body))
        if status != 404:
            raise StageFailed(f"a delivery to the disabled source got {status}, not 404")
        if TriggerEvent.objects.count() != before:
            raise StageFailed("a delivery to the disabled source was recorded")
        say("   delivery to the disabled source: 404, nothing recorded")
        self.summary["deliveries refused (disabled)"] = 1

    def takeover(self) -> None:
        from django_leases.models import Lease

        key = f"demo-singleton-{uuid.uuid4().hex[:6]}"
        ttl = "3"
        child = 'echo "holding $DJANGO_LEASES_KEY with token $DJANGO_LEASES_TOKEN"; exec sleep 300'
        first = self.start("hold_lease", key, "--ttl", ttl, "--", "sh", "-c", child)
        held = wait_for("the first holder", lambda: Lease.objects.current(key), timeout=30)
        say(f"   holder A (pid {first.pid}) holds {key!r} with token {held.token}")
        second = self.start("hold_lease", key, "--ttl", ttl, "--wait", "--", "sh", "-c", child)
        time.sleep(1.5)
        if second.poll() is not None:
            raise StageFailed(f"holder B exited early with {second.returncode}")
        say(f"   holder B (pid {second.pid}) waits for the key")
        first.send_signal(signal.SIGKILL)
        first.wait()
        say("   SIGKILL to holder A")

        def taken_over() -> Lease | None:
            lease = Lease.objects.current(key)
            return lease if lease is not None and lease.token > held.token else None

        new = wait_for("holder B to take over", taken_over, timeout=30)
        say(f"   holder B took over with token {new.token} (was {held.token})")
        second.send_signal(signal.SIGTERM)
        code = second.wait(timeout=30)
        if Lease.objects.current(key) is not None:
            raise StageFailed("holder B did not release the lease when told to stop")
        say(f"   SIGTERM to holder B: child stopped, lease released (exit {code})")
        self.summary["lease takeovers"] = 1
        self.summary["takeover tokens"] = f"{held.token} -> {new.token}"

    # -- the end ------------------------------------------------------------------------------

    def print_summary(self, failed: bool) -> None:
        say("\n== Summary")
        for name, value in self.summary.items():
            say(f"   {name}: {value}")
        say("   the tour FAILED" if failed else "   every stage did what it said")

    def serve_forever(self) -> None:
        say(
            f"\nThe admin is at http://127.0.0.1:{self.port}/admin/ "
            f"(log in as {ADMIN_USER} / {ADMIN_PASSWORD}). Ctrl-C stops the demo."
        )
        try:
            while all(child.poll() is None for child in self.children[:2]):
                time.sleep(1)
        except KeyboardInterrupt:
            say("\nStopping.")


def _stop_on_sigterm(signum: int, frame: object) -> None:
    # `kill <tour>` stops the demo like Ctrl-C does: children are stopped in `finally`.
    raise KeyboardInterrupt


def main() -> int:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    os.chdir(BASE_DIR)
    sys.path.insert(0, str(BASE_DIR))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
    import django

    django.setup()
    serve = os.environ.get("DEMO_NO_SERVE", "") in ("", "0")
    try:
        return Tour(serve=serve).run()
    except KeyboardInterrupt:
        say("\nInterrupted; the demo's processes were stopped.")
        return 130


if __name__ == "__main__":
    sys.exit(main())

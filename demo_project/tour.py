"""``make demo``: a guided tour of django-leases on real input.

Stages (each checks what it claims from the database, the HTTP answers and the processes'
logs; any failure makes the tour exit 1):

1. migrate the demo database (SQLite ``demo.sqlite3`` unless ``DATABASE_URL`` says otherwise),
   create an admin user and pause the per-second schedule ``demo-tick`` (before any worker
   starts, so it fires in stage 10 only);
2. start a local fake of GitHub's webhook API and reconcile the trigger-source declarations
   (``github-pushes`` and ``github-pull-requests``, provider ``github``; ``stripe-orders``,
   provider ``manual``) and store ``stripe-orders``' signing secret (``trigger_sources
   set-secret``);
3. start the demo server, two workflow workers (``run_workflow_worker``) and a singleton job
   under ``manage.py hold_lease`` (with a standby copy waiting for the lease);
4. enable the sources: each GitHub source registers a hook at the fake GitHub (which pings
   it), ``stripe-orders`` answers with manual instructions (the signing secret Stripe would
   show was stored at stage 2, before the processes started, so their checks find it);
5. deliver payloads signed as GitHub and Stripe sign them (``manage.py send_deliveries``) —
   the files under ``../shared/fixtures/`` when that folder exists, else the demo's own
   samples —, check that each is recorded with the run it started, and wait for those runs
   to complete;
6. open a pull request: a signed ``pull_request`` delivery (action ``opened``, the demo's
   own sample) starts a ``review-pull-request`` run keyed by the pull request; its checks
   fan out (``run.parallel``) over the workers, it sleeps (``run.sleep``, its end recorded
   on the database clock, no worker holding the run) and waits
   (``run.wait_for_event("approved")``); two ``pull_request_review`` deliveries that are not
   approvals (``commented``, ``changes_requested``) are recorded with that outcome and leave
   it waiting; the approving one is sent to the run as event ``approved`` (``SendEvent``,
   in the delivery's transaction) and the run finishes. A later tour on the same database
   opens the next pull request (the samples renumbered), as the first one has its run;
7. push a ``[slow build]`` commit, SIGSTOP the worker running its build step (attempt 1)
   past the step lease, watch the other worker finish the step as attempt 2, SIGCONT the
   first one and read its refused stale write from the database and its log, then SIGKILL it
   and start a replacement worker (``worker-3``), so two workers run again;
8. disable both GitHub sources: their hooks are deleted at the fake GitHub, deliveries get 404;
9. SIGKILL the singleton job's holder: the standby takes over with a higher fencing token;
10. queues, tasks and schedules: start two more workers of four threads each, enqueue the
    shop's Django ``@task`` e-mail receipts (``demo_project.shop.tasks``, queue ``mail``,
    ``concurrency`` 1, through ``django_leases.tasks.TaskBackend``) and read each result back
    with ``get_result()``; the receipts' own journal entries and their results' start and
    finish show they ran one at a time. Then resume the per-second schedule ``demo-tick``
    (paused since stage 1, so it fires in no other stage) for three ticks and pause it again:
    each tick started exactly one run (keyed ``schedule:demo-tick:<tick>``), fired by one of
    the four workers, as their logs show;
11. print a summary, then serve the admin on http://127.0.0.1:8000/admin/ until Ctrl-C
    (skipped with ``DEMO_NO_SERVE=1``, which CI uses: the exit status says whether every
    stage did what it said).

The workers run with a 6-second step lease (``DEMO_STEP_LEASE_TTL``) so a paused worker's
step is taken over within seconds (shorter ones lapsed under CI's load: a renewal on SQLite can
wait seconds for the write lock while ten worker threads poll). Each child process logs to a
file in a temporary folder (printed at the start).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
GITHUB = "github-pushes"
PULLS = "github-pull-requests"
STRIPE = "stripe-orders"
REPOSITORY = "octo-org/octo-repo"
SLOW_PUSH = (
    Path(__file__).resolve().parent / "previews" / "samples" / "slow" / "push-slow-build.json"
)
SINGLETON_KEY = "demo-digest"
#: The singleton job's lease TTL, seconds: short enough that the takeover is quick to watch,
#: long enough that renewals every TTL/3 survive a busy SQLite database on a loaded machine.
SINGLETON_TTL = 6
ADMIN_USER = os.environ.get("DEMO_ADMIN_USER", "admin")
ADMIN_PASSWORD = os.environ.get("DEMO_ADMIN_PASSWORD", "admin")
GITHUB_TOKEN = "demo-github-token"
STEP_LEASE_TTL = 6.0
#: How long the ``[slow build]`` build step takes, seconds (long enough to be paused mid-way).
SLOW_BUILD_SECONDS = 5.0
#: How long each pull-request check takes, seconds, and the review run's ``settle`` sleep.
CHECK_SECONDS = 1.5
SETTLE_SECONDS = 4.0
#: The summary's lines for what came of the tour's accepted deliveries.
STARTED = "deliveries that started a run (202)"
EVENT_SENT = "deliveries that sent an event to a waiting run (202)"
NOT_APPROVAL = "deliveries recorded without sending an event (reviews that are not approvals, 202)"
#: The last stage: how many @task receipts it enqueues on the ``mail`` queue, how many ticks
#: of the per-second schedule it watches, and the threads of each of its two extra workers.
RECEIPTS = 5
TICKS = 3
THREADED_WORKER_THREADS = 4


class StageFailed(Exception):
    """A stage did not do what it says."""


def say(text: str = "") -> None:
    print(text, flush=True)


def wait_for(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    """Poll ``check`` until it returns something truthy; raise StageFailed after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise StageFailed(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def failure_text(output: str, limit: int = 2000) -> str:
    """What a failed command printed, for a stage's failure: its end (where a traceback says
    what went wrong), at most ``limit`` characters."""
    text = output.strip()
    return text if len(text) <= limit else "…" + text[-limit:]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_the_tour_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGTERM the child when the tour dies, however the
    tour dies (SIGKILL included), so no server or worker outlives it; ``None`` elsewhere.

    libc is loaded here, in the tour: the hook runs between fork and exec, where it must not
    import or allocate (the tour has threads)."""
    if sys.platform != "linux":
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig, sigterm = 1, int(signal.SIGTERM)

    def hook() -> None:
        prctl(pr_set_pdeathsig, sigterm)

    return hook


class Child:
    """A ``manage.py`` child process whose output goes to a log file."""

    def __init__(self, name: str, args: list[str], logs: Path) -> None:
        self.name = name
        self.log_path = logs / f"{name}.log"
        self._log = self.log_path.open("w")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, str(BASE_DIR / "manage.py"), *args],
            cwd=BASE_DIR,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_die_with_the_tour_hook(),
        )
        self.pid = self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.alive():
            try:
                os.kill(self.pid, signal.SIGCONT)  # a paused child cannot act on SIGTERM
                self.process.send_signal(signal.SIGTERM)
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            except ProcessLookupError:
                pass
        self._log.close()


def one_at_a_time(clock: str, spans: list[tuple[Any, Any, Any]]) -> None:
    """Raise StageFailed unless the ``(id, started, finished)`` spans (datetimes, by the
    ``clock`` named in the message) never overlap: sorted by start, each began at or after
    the end of the one before it. A span without an end fails too."""
    for name, started, finished in spans:
        if started is None or finished is None:
            raise StageFailed(f"by the {clock}, {name} has no start or no end")
    ordered = sorted(spans, key=lambda span: span[1])
    for before, after in pairwise(ordered):
        if after[1] < before[2]:
            raise StageFailed(f"by the {clock}, {after[0]} started before {before[0]} finished")


def one_run_per_tick(schedule: str, keys: list[str]) -> list[datetime]:
    """The ticks of the runs keyed ``keys`` (``schedule:<schedule>:<tick>``), sorted. Raises
    StageFailed unless every key is of that form, no tick has two runs and the ticks are
    consecutive seconds (the per-second schedule skipped none)."""
    prefix = f"schedule:{schedule}:"
    if not keys or not all(key.startswith(prefix) for key in keys):
        raise StageFailed(f"runs not keyed {prefix}<tick>: {keys}")
    ticks = sorted(datetime.fromisoformat(key.removeprefix(prefix)) for key in keys)
    if len(set(ticks)) != len(ticks):
        raise StageFailed(f"{len(ticks)} runs for {len(set(ticks))} ticks")
    if any((b - a).total_seconds() != 1 for a, b in pairwise(ticks)):
        raise StageFailed(f"the ticks are not one second apart: {[t.isoformat() for t in ticks]}")
    return ticks


def fired_by(schedule: str, logs: dict[str, str], run_ids: list[Any]) -> dict[str, str]:
    """Which worker fired each run of ``schedule``, from the workers' ``logs`` (text by worker
    name): ``{run id: worker name}``. Raises StageFailed unless exactly one log line reports
    each run started (none: nobody claimed it; two: the tick fired twice)."""
    line = re.compile(rf"Schedule '{re.escape(schedule)}': tick \S+ started run ([0-9a-f-]{{36}})")
    by: dict[str, list[str]] = {}
    for name, text in logs.items():
        for match in line.finditer(text):
            by.setdefault(match[1], []).append(name)
    firers: dict[str, str] = {}
    for run_id in map(str, run_ids):
        names = by.get(run_id, [])
        if len(names) != 1:
            raise StageFailed(f"run {run_id} was reported fired by {names or 'no worker'}")
        firers[run_id] = names[0]
    return firers


class Tour:
    """Runs the stages in order and keeps the child processes it started."""

    def __init__(self, serve: bool, logs: Path, fake_github: Any) -> None:
        self.serve = serve
        self.logs = logs
        self.fake = fake_github
        self.port = 8000 if serve else free_port()
        self.children: dict[str, Child] = {}
        self.workers: list[Child] = []
        #: ``--concurrency`` of each worker started with more than one thread, by name.
        self.threads: dict[str, int] = {}
        self.run_ids: list[str] = []
        self.summary: dict[str, Any] = {}
        self.stripe_secret = ""

    # -- plumbing -----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hook_url(self, name: str) -> str:
        return f"{self.base_url}/hooks/{name}/"

    def start(self, name: str, *args: str) -> Child:
        child = Child(name, list(args), self.logs)
        self.children[name] = child
        return child

    def manage(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``manage.py ARGS`` to completion, as an operator would."""
        return subprocess.run(
            [sys.executable, str(BASE_DIR / "manage.py"), *args],
            cwd=BASE_DIR,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            input=stdin if stdin is not None else "",
            capture_output=True,
            preexec_fn=_die_with_the_tour_hook(),
            text=True,
            timeout=120,
        )

    def stop_all(self) -> None:
        for child in reversed(list(self.children.values())):
            child.stop()

    def run(self) -> int:
        stages = [
            ("Migrate the demo database and create an admin user", self.setup),
            (
                "Start a fake GitHub API; reconcile the trigger sources; store Stripe's secret",
                self.reconcile,
            ),
            (
                "Start the demo server, two workflow workers and a hold_lease singleton job",
                self.start_processes,
            ),
            ("Enable the sources (an operator's switch)", self.enable_sources),
            ("Deliver signed GitHub and Stripe payloads; their runs complete", self.deliver),
            (
                "Open a pull request: checks fan out, a durable sleep, the run waits for an "
                "approving review",
                self.pull_request,
            ),
            (
                "Pause a worker mid-step: another finishes it as attempt 2, the stale write "
                "is refused",
                self.stale_worker,
            ),
            (
                "Disable the GitHub sources: their hooks are removed, deliveries get 404",
                self.disable_source,
            ),
            ("Kill the singleton's holder: the standby takes over", self.takeover),
            (
                "Django @task receipts run one at a time on the 'mail' queue; a per-second "
                "schedule fires once per tick across four workers",
                self.tasks_and_schedule,
            ),
        ]
        failed = False
        say(f"Logs of the demo's processes: {self.logs}")
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

    # -- operators' actions -------------------------------------------------------------------

    def operate(self, *args: str, stdin: str | None = None) -> list[str]:
        """Run ``manage.py trigger_sources ARGS`` as an operator would; print and return its
        output lines. Raises StageFailed when it exits non-zero."""
        done = self.manage("trigger_sources", *args, stdin=stdin)
        if done.returncode != 0:
            raise StageFailed(
                f"trigger_sources {' '.join(args)} exited {done.returncode}: "
                f"{failure_text(done.stderr or done.stdout)}"
            )
        say(f"   $ manage.py trigger_sources {' '.join(args)}")
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        for line in lines:
            say(f"     {line}")
        return lines

    # -- stages -------------------------------------------------------------------------------

    def setup(self) -> None:
        from django.contrib.auth import get_user_model
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        users = get_user_model()._default_manager
        if not users.filter(username=ADMIN_USER).exists():
            users.create_superuser(ADMIN_USER, "admin@example.com", ADMIN_PASSWORD)
        if not users.get(username=ADMIN_USER).check_password(ADMIN_PASSWORD):
            raise StageFailed(f"the admin user {ADMIN_USER!r} exists with another password")
        say(f"   database migrated; admin user: {ADMIN_USER} / {ADMIN_PASSWORD}")
        self.pause_tick_schedule()

    def pause_tick_schedule(self) -> None:
        """Sync the declared schedules to their rows and pause ``demo-tick`` (as
        ``manage.py workflow_schedules pause`` does) before any worker starts: the per-second
        schedule starts runs only while the tasks-and-schedule stage resumes it."""
        from demo_project.journal.workflows import TICK_SCHEDULE
        from django_leases.models import WorkflowSchedule
        from django_leases.workflows.registry import declared_schedules

        WorkflowSchedule.objects.sync(declared_schedules())
        WorkflowSchedule.objects.set_paused(TICK_SCHEDULE, True)
        if not WorkflowSchedule.objects.get(name=TICK_SCHEDULE).paused:
            raise StageFailed(f"schedule {TICK_SCHEDULE!r} could not be paused")
        say(f"   schedule {TICK_SCHEDULE!r} (every second) paused until the last stage")

    def reconcile(self) -> None:
        from django_leases.models import TriggerSource

        say(f"   fake GitHub API on {self.fake.url} (token {GITHUB_TOKEN!r})")
        args = ["reconcile_trigger_sources", "--base-url", self.base_url, "--label-prefix", "demo-"]
        done = self.manage(*args)
        if done.returncode != 0:
            raise StageFailed(
                f"reconcile_trigger_sources exited {done.returncode}: {failure_text(done.stderr)}"
            )
        say(f"   $ manage.py {' '.join(args)}")
        for line in done.stdout.splitlines():
            say(f"     {line}")
        for name in (GITHUB, PULLS, STRIPE):
            source = TriggerSource.objects.filter(name=name, declared=True).first()
            if source is None:
                raise StageFailed(f"the declaration {name!r} did not become a row")
            if source.base_url != self.base_url:
                raise StageFailed(f"{name}: address {source.base_url!r}, not {self.base_url!r}")
            if source.enabled:  # left on by an earlier tour: a fresh tour starts switched off
                self.operate("disable", name)
            say(f"   {name}: declared, provider {source.provider}, off until enabled")
        # The operator registers the URL in Stripe's dashboard, which shows a signing secret
        # once; they store it (read from stdin, encrypted in the credential store). Stored
        # now, before the processes start, so their system checks find it (no W008).
        self.stripe_secret = f"whsec_demo{uuid.uuid4().hex}"
        self.operate("set-secret", STRIPE, stdin=self.stripe_secret + "\n")

    def start_processes(self) -> None:
        from django_leases.models import Lease

        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", self.port))
        except OSError:
            raise StageFailed(
                f"port {self.port} is in use: stop whatever listens there (an earlier "
                "`make demo`?) and run the tour again"
            ) from None
        # --insecure: the demo runs with DEBUG off, so runserver serves the admin's static files
        # only when asked to (a development server; production serves them otherwise).
        server = self.start(
            "server", "runserver", f"127.0.0.1:{self.port}", "--noreload", "--insecure"
        )

        def server_up() -> bool:
            if not server.alive():
                raise StageFailed(f"the server exited: see {server.log_path}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return True
            except OSError:
                return False

        wait_for("the demo server", server_up, timeout=60)
        for number in (1, 2):
            self.workers.append(
                self.start(f"worker-{number}", "run_workflow_worker", "--concurrency", "1")
            )
        job = [sys.executable, str(BASE_DIR / "manage.py"), "demo_digest", "--every", "0.5"]
        holder = self.start(
            "singleton-1", "hold_lease", SINGLETON_KEY, "--ttl", str(SINGLETON_TTL), "--", *job
        )
        lease = wait_for(
            "the singleton job's lease", lambda: Lease.objects.current(SINGLETON_KEY), timeout=30
        )
        self.start(
            "singleton-2",
            "hold_lease",
            SINGLETON_KEY,
            "--ttl",
            str(SINGLETON_TTL),
            "--wait",
            "--",
            *job,
        )
        digest = wait_for(
            "the singleton job's first digest", lambda: self.digest(min_token=lease.token), 30
        )
        time.sleep(0.5)
        for child in self.children.values():
            if not child.alive():
                raise StageFailed(f"{child.name} exited: see {child.log_path}")
        say(f"   server on {self.base_url}/ (pid {server.pid})")
        say(f"   workers: pids {', '.join(str(w.pid) for w in self.workers)}")
        say(
            f"   singleton job: hold_lease {SINGLETON_KEY!r} (pid {holder.pid}) holds token "
            f"{lease.token}; its child wrote the digest ({digest.runs_completed} runs "
            "completed so far); a standby copy waits for the lease"
        )
        self.summary["singleton token"] = lease.token

    def digest(self, min_token: int) -> Any:
        from demo_project.journal.models import Digest

        return Digest.objects.filter(name="workflow-runs", token__gte=min_token).first()

    def enable_sources(self) -> None:
        from django_leases.models import TriggerEvent, TriggerSource
        from django_leases.triggers.credentials import signing_secret

        for name in (GITHUB, PULLS):
            pings_before = TriggerEvent.objects.filter(source_name=name, event="ping").count()
            self.operate("enable", name)
            source = TriggerSource.objects.get(name=name)
            if not source.enabled or source.status != "registered":
                raise StageFailed(f"{name}: enabled={source.enabled}, status {source.status!r}")
            hook_id = (source.state or {}).get("hook_id")
            mine = [h for h in self.fake.hooks(REPOSITORY) if h["id"] == hook_id]
            if len(mine) != 1 or mine[0]["config"]["url"] != self.hook_url(name):
                raise StageFailed(f"the fake GitHub does not have the hook {hook_id} of {name}")
            say(
                f"   the fake GitHub has hook {hook_id} on {REPOSITORY}: posts to "
                f"{mine[0]['config']['url']} for {', '.join(mine[0]['events'])}"
            )
            wait_for(
                f"GitHub's ping of the new hook of {name} to be received",
                lambda name=name, before=pings_before: (
                    TriggerEvent.objects.filter(source_name=name, event="ping").count() > before
                ),
                timeout=30,
            )
            say(f"   the fake GitHub pinged the hook of {name}; the ping was verified and recorded")
        hooks = self.fake.hooks(REPOSITORY)
        if len(hooks) != 2:
            raise StageFailed(f"the fake GitHub should have one hook per source: {hooks}")
        self.summary["hooks registered at the fake GitHub"] = len(hooks)

        self.operate("enable", STRIPE)
        stripe = TriggerSource.objects.get(name=STRIPE)
        if not stripe.enabled or stripe.status != "manual":
            raise StageFailed(f"{STRIPE}: enabled={stripe.enabled}, status {stripe.status!r}")
        if signing_secret(STRIPE) != self.stripe_secret:
            raise StageFailed(f"{STRIPE}: the stored signing secret is not the one given")
        say(f"   the signing secret of {STRIPE}, stored at stage 2, is still the one given")

    def send(self, source: str, *extra: str, expect: tuple[int, ...] = (202,)) -> list[dict]:
        """Deliver with ``manage.py send_deliveries`` (a separate process, as a provider is)."""
        args = ["send_deliveries", source, *extra, "--base-url", self.base_url, "--json"]
        args += ["--expect", *map(str, expect)]
        done = self.manage(*args)
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        for line in lines:
            answer = line["answer"]
            run = answer.get("run_id") if isinstance(answer, dict) else None
            note = f", run {run}" if run else ""
            say(f"   {line['file']} ({line['event']}): {line['status']}{note}")
        if done.returncode != 0:
            raise StageFailed(
                f"send_deliveries {source} exited {done.returncode}: {failure_text(done.stderr)}"
            )
        return lines

    def recorded(self, source: str, line: dict) -> Any:
        """The ``TriggerEvent`` row of a delivery sent by :meth:`send` (StageFailed if none)."""
        from django_leases.models import TriggerEvent

        event = TriggerEvent.objects.filter(
            source_name=source, delivery_id=line["delivery_id"]
        ).first()
        if event is None:
            raise StageFailed(f"{line['file']}: answered {line['status']}, but not recorded")
        return event

    def count(self, label: str, number: int = 1) -> None:
        self.summary[label] = self.summary.get(label, 0) + number

    def wait_for_runs(self, run_ids: list[str], timeout: float = 120) -> None:
        from django_leases.models import RunStatus, WorkflowRun

        def all_finished() -> bool:
            finished = WorkflowRun.objects.filter(id__in=run_ids).exclude(status=RunStatus.RUNNING)
            return finished.count() == len(run_ids)

        wait_for("the workflow runs to finish", all_finished, timeout=timeout)
        for run in WorkflowRun.objects.filter(id__in=run_ids).order_by("created_at"):
            say(f"   run {run.id} ({run.workflow}): {run.status}")
            for step in run.steps.order_by("created_at", "id"):
                tried = ", ".join(
                    f"#{a.attempt} {a.status}" for a in step.attempts.order_by("attempt")
                )
                say(f"      {step.step_name:<14} {step.status:<10} attempts: {tried}")
            if run.status != RunStatus.COMPLETED:
                raise StageFailed(f"run {run.id} ended {run.status}: {run.error}")

    def deliver(self) -> None:
        from demo_project.previews.models import PreviewBuild
        from demo_project.shop.models import Receipt
        from django_leases.models import TriggerEvent

        pushes = self.send(GITHUB)
        push_runs = [line["answer"]["run_id"] for line in pushes]
        if not pushes or not all(push_runs):
            raise StageFailed("a push delivery started no workflow run")
        for line in pushes:
            self.started_by(GITHUB, line)
        payments = self.send(STRIPE, expect=(202, 200))
        stripe_runs: list[str] = []
        earlier_runs: list[str] = []
        for line in payments:
            if line["status"] == 202:
                stripe_runs.append(self.started_by(STRIPE, line))
            else:  # the same Stripe event id, delivered by an earlier tour on this database
                event = TriggerEvent.objects.filter(
                    source_name=STRIPE, delivery_id=line["delivery_id"]
                ).first()
                if event is None or event.run_id is None:
                    raise StageFailed(f"{line['file']}: 200, but no earlier run is recorded")
                say(
                    f"      {line['delivery_id']} was already received by an earlier tour: "
                    "200, not processed again"
                )
                earlier_runs.append(str(event.run_id))
        self.wait_for_runs(push_runs + stripe_runs + earlier_runs)
        self.run_ids += push_runs + stripe_runs
        builds = PreviewBuild.objects.filter(run_id__in=push_runs)
        receipts = Receipt.objects.filter(
            order__payment__in=[self.payment_of(line) for line in payments]
        )
        if receipts.count() != len(payments):
            raise StageFailed(f"{receipts.count()} receipts for {len(payments)} paid orders")
        say(
            f"   {builds.count()} preview builds and {receipts.count()} receipts recorded "
            "(pushes that delete a ref build nothing)"
        )
        started = len(push_runs) + len(stripe_runs)
        say(f"   each of the {started} accepted deliveries is recorded with the run it started")
        self.count(STARTED, started)
        if earlier_runs:
            self.summary["deliveries already received by an earlier tour (200)"] = len(earlier_runs)

    def started_by(self, source: str, line: dict) -> str:
        """The id of the run a delivery answered 202 started; StageFailed unless its
        ``TriggerEvent`` row is linked to that run (recorded in one transaction)."""
        from django_leases.models import WorkflowRun

        run_id = line["answer"].get("run_id")
        event = self.recorded(source, line)
        run = WorkflowRun.objects.filter(pk=run_id).first() if run_id else None
        if run is None or event.run_id != run.pk:
            raise StageFailed(f"{line['file']}: the delivery is not recorded with a run it started")
        return str(run_id)

    @staticmethod
    def payment_of(line: dict) -> str:
        from demo_project.shop.workflows import paid_order

        path = Path(line["path"])
        event = json.loads(path.read_bytes())
        return paid_order(event["type"], event)["payment"]

    def stale_worker(self) -> None:
        from demo_project.journal.models import Outcome, StepExecution
        from demo_project.previews.models import PreviewBuild
        from django_leases.models import WorkflowStep

        [line] = self.send(GITHUB, str(SLOW_PUSH))
        run_id = line["answer"]["run_id"]
        self.run_ids.append(run_id)
        self.started_by(GITHUB, line)
        self.count(STARTED)
        first = wait_for(
            "the build step's attempt 1 to start",
            lambda: (
                StepExecution.objects.filter(run_id=run_id, step_name="build", attempt=1)
                .exclude(outcome=Outcome.FAILED)
                .first()
            ),
            timeout=60,
            interval=0.05,
        )
        a = next((w for w in self.workers if w.pid == first.pid), None)
        if a is None:
            raise StageFailed(f"attempt 1 runs in pid {first.pid}, which is not a tour worker")
        b = next(w for w in self.workers if w is not a)
        say(f"   build step of run {run_id}: attempt 1 running on {a.name} (pid {a.pid})")
        self.pause_quietly(a)
        say(
            f"   SIGSTOP to {a.name}: its step lease ({STEP_LEASE_TTL:.0f} s) lapses on the "
            "database clock"
        )
        second = wait_for(
            f"{b.name} to claim the step as attempt 2",
            lambda: StepExecution.objects.filter(
                run_id=run_id, step_name="build", attempt=2
            ).first(),
            timeout=60,
        )
        if second.pid != b.pid:
            raise StageFailed(f"attempt 2 ran in pid {second.pid}, not {b.name} ({b.pid})")
        say(f"   {b.name} (pid {b.pid}) claimed the step as attempt 2")
        step = wait_for(
            "attempt 2 to finish the step",
            lambda: WorkflowStep.objects.filter(
                run_id=run_id, step_name="build", status="succeeded"
            ).first(),
            timeout=60,
        )
        if step.attempt != 2:
            raise StageFailed(f"the step succeeded at attempt {step.attempt}, not 2")
        build = PreviewBuild.objects.get(run_id=run_id)
        say(f"   step succeeded at attempt 2; PreviewBuild written by attempt {build.attempt}")

        os.kill(a.pid, signal.SIGCONT)
        say(f"   SIGCONT to {a.name}: it wakes up with attempt 1's work done")
        pattern = re.compile(
            rf"Step 'build' of run {run_id}: attempt 1 was superseded \(current attempt 2\)"
        )
        log_line = wait_for(
            f"{a.name}'s log to report its refused write",
            lambda: next((ln for ln in a.log().splitlines() if pattern.search(ln)), None),
            timeout=60,
        )
        mine = StepExecution.objects.get(run_id=run_id, step_name="build", attempt=1)
        wait_for(
            "attempt 1's journal entry to end",
            lambda: StepExecution.objects.get(pk=mine.pk).outcome != Outcome.RUNNING,
            timeout=30,
        )
        mine.refresh_from_db()
        if mine.outcome not in (Outcome.REFUSED, Outcome.STOPPED):
            raise StageFailed(f"attempt 1's own write ended {mine.outcome!r}")
        say(f"   {a.name}'s log: {log_line.strip()}")
        say(f"   attempt 1's own PreviewBuild write: {mine.get_outcome_display()}")
        os.kill(a.pid, signal.SIGKILL)
        a.process.wait()
        say(f"   SIGKILL to {a.name}")

        build.refresh_from_db()
        step.refresh_from_db()
        history = [
            (h.attempt, h.status)
            for h in WorkflowStep.objects.history(run_id)
            if h.step_id == step.pk
        ]
        if history != [(1, "running"), (2, "succeeded")]:
            raise StageFailed(f"the build step's attempt history is {history}")
        if build.attempt != 2 or step.result["build_id"] != build.build_id:
            raise StageFailed("the stored build does not come from attempt 2")
        say("   attempt history: #1 running (superseded, nothing of it landed), #2 succeeded")
        self.wait_for_runs([run_id])
        replacement = self.start("worker-3", "run_workflow_worker", "--concurrency", "1")
        self.workers = [b, replacement]
        say(f"   {replacement.name} (pid {replacement.pid}) started to replace {a.name}")
        self.summary["worker paused and killed mid-step"] = (
            f"{a.name}; {replacement.name} replaced it, so two workers run again"
        )

    def pause_quietly(self, child: Child) -> None:
        """SIGSTOP ``child`` at a moment it holds no database transaction open (a paused
        transaction would block the other processes, not just the paused one)."""
        for _ in range(50):
            os.kill(child.pid, signal.SIGSTOP)
            if self.database_quiet():
                return
            os.kill(child.pid, signal.SIGCONT)
            time.sleep(0.05)
        raise StageFailed(f"could not pause {child.name} outside a transaction")

    @staticmethod
    def database_quiet() -> bool:
        from django.db import connection

        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid()"
                )
                return cursor.fetchone()[0] == 0
        if connection.vendor == "mysql":
            # A session idle in a transaction: an InnoDB transaction whose connection sleeps.
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT COUNT(*) FROM information_schema.INNODB_TRX t "
                    "JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
                    "WHERE p.DB = DATABASE() AND p.ID <> CONNECTION_ID() AND p.COMMAND = 'Sleep'"
                )
                return cursor.fetchone()[0] == 0
        import sqlite3

        probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=0.5)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            probe.close()

    def disable_source(self) -> None:
        from demo_project.reviews.payloads import OPENED
        from django_leases.models import TriggerEvent, TriggerSource

        for name in (GITHUB, PULLS):
            self.operate("disable", name)
            source = TriggerSource.objects.get(name=name)
            if source.enabled or source.state:
                raise StageFailed(f"{name}: enabled={source.enabled}, state {source.state!r}")
        if self.fake.hooks(REPOSITORY):
            raise StageFailed(f"the fake GitHub still has hooks: {self.fake.hooks()}")
        say(f"   the fake GitHub has no hook left on {REPOSITORY}")
        self.summary["hooks deleted at the fake GitHub"] = 2
        before = TriggerEvent.objects.count()
        self.send(GITHUB, str(SLOW_PUSH), expect=(404,))
        self.send(PULLS, str(OPENED), expect=(404,))
        if TriggerEvent.objects.count() != before:
            raise StageFailed("a delivery to a disabled source was recorded")
        say("   deliveries to the disabled sources: 404, nothing recorded")
        self.summary["deliveries refused (source disabled)"] = 2

    def pull_request(self) -> None:
        from demo_project.journal.models import StepExecution
        from demo_project.reviews import payloads
        from demo_project.reviews.workflows import APPROVED, CHECKS, SETTLE, WORKFLOW
        from django_leases.models import RunStatus, WorkflowRun, WorkflowStep, WorkflowWait
        from django_leases.workflows.display import describe_wait, waiting_on

        number = self.free_pull_request_number()
        folder = self.logs / "payloads"
        opened = payloads.renumbered(payloads.OPENED, number, folder)
        reviews = {
            state: payloads.renumbered(path, number, folder)
            for state, path in payloads.REVIEWS.items()
        }
        key = f"{REPOSITORY}#{number}"
        if number != payloads.SAMPLE_NUMBER:
            say(
                f"   earlier tours on this database reviewed pull requests up to #{number - 1}: "
                f"this one opens #{number} (the samples, renumbered)"
            )

        # GitHub's `pull_request` delivery, action `opened`: it starts the run, keyed.
        [line] = self.send(PULLS, str(opened))
        run_id = self.started_by(PULLS, line)
        self.count(STARTED)
        self.run_ids.append(run_id)
        run = WorkflowRun.objects.get(pk=run_id)
        if run.workflow != WORKFLOW or run.key != key:
            raise StageFailed(f"run {run_id} is {run.workflow!r} keyed {run.key!r}, not {key!r}")
        say(f"   pull request #{number} opened: run {run_id} ({WORKFLOW}), key {key!r}")

        # run.parallel: the checks, scheduled by one pass, run by the workers.
        names = [f"check-{check}" for check in CHECKS]

        def checks_finished() -> list[Any] | None:
            steps = list(WorkflowStep.objects.filter(run_id=run_id, step_name__in=names))
            for step in steps:
                if step.status == "failed" and step.attempt >= step.max_attempts:
                    raise StageFailed(f"{step.step_name} failed: {step.error}")
            done = len(steps) == len(names) and all(s.status == "succeeded" for s in steps)
            return steps if done else None

        steps = wait_for("the checks to finish", checks_finished, timeout=120)
        steps.sort(key=lambda step: names.index(step.step_name))
        workers = {worker.pid: worker.name for worker in self.workers}
        entries = []
        for step in steps:
            entry = StepExecution.objects.get(
                run_id=run_id, step_name=step.step_name, attempt=step.attempt
            )
            if entry.pid not in workers or entry.finished_at is None:
                raise StageFailed(f"{step.step_name} ran in pid {entry.pid}, not a tour worker")
            entries.append(entry)
            say(
                f"      {step.step_name:<14} {step.result['conclusion']:<8} on "
                f"{workers[entry.pid]} (pid {entry.pid}), attempt {step.attempt}"
            )
        first_done = min(entry.finished_at for entry in entries)
        if max(step.created_at for step in steps) >= first_done:
            raise StageFailed("a check was scheduled only after another had finished")
        together = any(
            a.pid != b.pid and a.started_at < b.finished_at and b.started_at < a.finished_at
            for a in entries
            for b in entries
        )
        say(
            f"   run.parallel: the {len(steps)} checks were scheduled by one pass, before the "
            "first finished; "
            + (
                "two workers ran checks at the same time"
                if together
                else "the workers took them as they became free"
            )
        )

        # run.sleep: a row with its end on the database clock; nothing holds the run meanwhile.
        sleep = wait_for(
            f"the run to reach its sleep {SETTLE!r}",
            lambda: WorkflowWait.objects.filter(run_id=run_id, name=SETTLE).first(),
            timeout=60,
        )
        if sleep.kind != "sleep" or sleep.due_at is None or sleep.reached_at is None:
            raise StageFailed(f"wait {SETTLE!r} is not a sleep with an end: {sleep}")
        seconds = (sleep.due_at - sleep.reached_at).total_seconds()
        say(
            f"   run.sleep({SETTLE!r}, {SETTLE_SECONDS:g}): recorded when the pass reached it; "
            f"ends at {sleep.due_at:%H:%M:%S} on the database clock ({seconds:.1f} s later)"
        )

        def parked() -> str | None:
            current = WorkflowRun.objects.get(pk=run_id)
            wait = WorkflowWait.objects.get(pk=sleep.pk)
            if wait.status != "waiting":
                return "over"
            busy = WorkflowStep.objects.filter(run_id=run_id).exclude(status="succeeded")
            if current.pass_due_at == wait.due_at and not busy.exists():
                return "parked"
            return None

        if wait_for("the run to sleep", parked, timeout=SETTLE_SECONDS + 60) == "parked":
            say(
                "   while it sleeps no worker holds the run: no step is due, its next pass is "
                "due at the sleep's end"
            )
        reached = wait_for(
            f"the run to reach its wait for {APPROVED!r}",
            lambda: WorkflowWait.objects.filter(
                run_id=run_id, name=APPROVED, reached_at__isnull=False
            ).first(),
            timeout=SETTLE_SECONDS + 60,
        )
        sleep.refresh_from_db()
        if sleep.status != "done" or sleep.done_at is None or sleep.done_at < sleep.due_at:
            raise StageFailed(f"the sleep ended {sleep.status} at {sleep.done_at}")
        if reached.reached_at < sleep.due_at:
            raise StageFailed("the run went past its sleep before the sleep's end")
        say(
            f"   the sleep ended; the next pass came at {reached.reached_at:%H:%M:%S}, after "
            f"its end, and reached run.wait_for_event({APPROVED!r})"
        )

        # run.wait_for_event: the run waits; nothing is due for it until the event comes.
        def waiting() -> Any:
            current = WorkflowRun.objects.get(pk=run_id)
            waits_on = waiting_on(current)
            if current.pass_due_at is None and waits_on == [f"waiting for event {APPROVED!r}"]:
                return current
            return None

        wait_for(f"the run to wait for {APPROVED!r}", waiting, timeout=60)
        show = self.manage("workflow_runs", "show", run_id)
        if show.returncode != 0:
            raise StageFailed(f"workflow_runs show exited {show.returncode}: {show.stderr}")
        say(f"   the run waits; what an operator sees ($ manage.py workflow_runs show {run_id}):")
        for text in show.stdout.splitlines():
            if text.strip():
                say(f"     {text}")

        # Reviews that are not approvals: recorded, linked to the run, no event sent.
        for state in ("commented", "changes_requested"):
            [line] = self.send(PULLS, str(reviews[state]))
            event = self.recorded(PULLS, line)
            if str(event.run_id) != run_id or "not an approval" not in event.outcome:
                raise StageFailed(f"the {state} review came to {event.outcome!r}")
            say(f"      recorded: {event.outcome}")
            self.count(NOT_APPROVAL)
        current = WorkflowRun.objects.get(pk=run_id)
        wait = WorkflowWait.objects.get(run_id=run_id, name=APPROVED)
        if current.status != RunStatus.RUNNING or current.pass_due_at or wait.status != "waiting":
            raise StageFailed(f"after the reviews the run is {current.status}, wait {wait}")
        say(f"   the run still waits for {APPROVED!r}: no event sent, no pass asked for")

        # The approving review: SendEvent("approved", run=<the run of PR key>) finishes it.
        [line] = self.send(PULLS, str(reviews["approved"]))
        event = self.recorded(PULLS, line)
        sent = f"event {APPROVED!r} sent to run {run_id}"
        if str(event.run_id) != run_id or event.outcome != sent:
            raise StageFailed(f"the approving review came to {event.outcome!r}")
        say(f"      recorded: {event.outcome} (in the delivery's transaction)")
        self.count(EVENT_SENT)
        self.wait_for_runs([run_id])
        run = WorkflowRun.objects.get(pk=run_id)
        approval = json.loads(reviews["approved"].read_bytes())
        reviewer = approval["review"]["user"]["login"]
        wait = WorkflowWait.objects.get(run_id=run_id, name=APPROVED)
        if wait.status != "done" or (wait.payload or {}).get("review") != approval["review"]:
            raise StageFailed(f"wait {APPROVED!r} ended {wait.status} with another payload")
        if run.output.get("approved_by") != reviewer or run.finished_at < wait.done_at:
            raise StageFailed(f"the run's output is {run.output}")
        for each in WorkflowWait.objects.filter(run_id=run_id).order_by("id"):
            say(f"      {each.name:<14} {each.kind:<6} {describe_wait(each)}")
        say(f"   approved by {reviewer}; the run finished: {run.output['comment']}")
        self.summary[f"pull request #{number}"] = (
            f"{len(steps)} checks in parallel, slept {SETTLE_SECONDS:g} s, waited for its "
            f"approval ({len(reviews) - 1} other reviews did not finish it)"
        )

    def free_pull_request_number(self) -> int:
        """The samples' pull-request number, or the next one above those earlier tours on
        this database opened (a review run is keyed by its pull request)."""
        from demo_project.reviews.payloads import SAMPLE_NUMBER
        from demo_project.reviews.workflows import WORKFLOW
        from django_leases.models import WorkflowRun

        prefix = f"{REPOSITORY}#"
        keys = WorkflowRun.objects.filter(workflow=WORKFLOW, key__startswith=prefix)
        used = [
            int(key.removeprefix(prefix))
            for key in keys.values_list("key", flat=True)
            if key and key.removeprefix(prefix).isdigit()
        ]
        return max([SAMPLE_NUMBER - 1, *used]) + 1

    def takeover(self) -> None:
        from django_leases.models import Lease

        holder, standby = self.children["singleton-1"], self.children["singleton-2"]
        held = Lease.objects.current(SINGLETON_KEY)
        if held is None:
            raise StageFailed("nobody holds the singleton lease")
        os.kill(holder.pid, signal.SIGKILL)
        holder.process.wait()
        say(f"   SIGKILL to the holder (pid {holder.pid}, token {held.token})")

        def taken_over() -> Lease | None:
            lease = Lease.objects.current(SINGLETON_KEY)
            return lease if lease is not None and lease.token > held.token else None

        new = wait_for("the standby to take over", taken_over, timeout=30)
        digest = wait_for(
            "the new holder's digest", lambda: self.digest(min_token=new.token), timeout=30
        )
        if not standby.alive():
            raise StageFailed("the standby exited")
        say(
            f"   the standby (pid {standby.pid}) took over with token {new.token}; its job "
            f"writes the digest now ({digest.runs_completed} runs completed)"
        )
        self.summary["singleton token"] = f"{held.token} -> {new.token}"

    def tasks_and_schedule(self) -> None:
        self.start_threaded_workers()
        self.mail_receipts()
        self.tick_schedule()

    def start_threaded_workers(self) -> None:
        """Start two more workers of :data:`THREADED_WORKER_THREADS` threads each and wait
        for their heartbeats, so the receipts could run side by side were it not for the
        ``mail`` queue's limit."""
        from django_leases.models import Lease

        first = 1 + sum(name.startswith("worker-") for name in self.children)
        new = [
            self.start(
                f"worker-{number}",
                "run_workflow_worker",
                "--concurrency",
                str(THREADED_WORKER_THREADS),
            )
            for number in (first, first + 1)
        ]
        for child in new:
            self.threads[child.name] = THREADED_WORKER_THREADS

        def beating() -> bool:
            for child in new:
                if not child.alive():
                    raise StageFailed(f"{child.name} exited: see {child.log_path}")
            return all(
                Lease.objects.filter(
                    key__startswith="workflow-worker:",
                    key__contains=f":{child.pid}:",
                    released_at__isnull=True,
                ).exists()
                for child in new
            )

        wait_for("the new workers' heartbeats", beating, timeout=60)
        self.workers += new
        say(
            f"   two more workers, {THREADED_WORKER_THREADS} threads each (pids "
            f"{', '.join(str(w.pid) for w in new)}): {len(self.workers)} workers, "
            f"{self.worker_threads()} threads in all"
        )

    def worker_threads(self) -> int:
        """The worker threads of the tour's live workers (``--concurrency`` of each)."""
        return sum(self.threads.get(worker.name, 1) for worker in self.workers)

    def mail_receipts(self) -> None:
        from demo_project.journal.models import Outcome, StepExecution
        from demo_project.shop.tasks import JOURNAL_STEP, MAIL_QUEUE, send_receipt_email
        from django_leases.conf import queue_limits
        from django_leases.tasks_api import TaskResultStatus

        limit = queue_limits()[MAIL_QUEUE].concurrency
        if limit != 1:
            raise StageFailed(f"queue {MAIL_QUEUE!r} has concurrency {limit}, not 1")
        say(f'   DJANGO_LEASES["QUEUES"]: {MAIL_QUEUE!r} runs at most {limit} task at a time')
        stamp = uuid.uuid4().hex[:6]
        orders = [f"order-{stamp}-{n}" for n in range(1, RECEIPTS + 1)]
        enqueued = [
            send_receipt_email.enqueue(order=order, email=f"customer{n}@example.com")
            for n, order in enumerate(orders, start=1)
        ]
        say(
            f"   enqueued {len(enqueued)} send_receipt_email tasks (queue "
            f"{send_receipt_email.queue_name!r}), status {enqueued[0].status}"
        )
        ids = [str(result.id) for result in enqueued]
        finished = (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)

        def all_done() -> list[Any] | None:
            results = [send_receipt_email.get_result(result_id) for result_id in ids]
            return results if all(r.status in finished for r in results) else None

        results = wait_for("the receipts to be sent", all_done, timeout=120)
        self.run_ids += ids
        workers = {worker.pid: worker.name for worker in self.workers}
        entries = []
        for order, result in zip(orders, results, strict=True):
            value = result.return_value if result.status == TaskResultStatus.SUCCESSFUL else None
            if value is None or value.get("order") != order:
                raise StageFailed(f"task {result.id}: {result.status}, errors {result.errors}")
            entry = StepExecution.objects.filter(
                run_id=result.id, step_name=JOURNAL_STEP, attempt=value["attempt"]
            ).first()
            if entry is None or entry.outcome != Outcome.DONE or entry.finished_at is None:
                raise StageFailed(f"task {result.id} has no finished journal entry: {entry}")
            if entry.pid not in workers or str(entry.pid) != result.worker_ids[-1].split(":")[-2]:
                raise StageFailed(f"task {result.id} ran in pid {entry.pid}, not a tour worker")
            entries.append((entry, result))
            say(
                f"      {result.id} {result.status}: sent to {value['to']} by "
                f"{workers[entry.pid]} (worker id {result.worker_ids[-1]}), attempt "
                f"{result.attempts}, {entry.started_at:%H:%M:%S.%f}"[:-3]
                + f"-{entry.finished_at:%H:%M:%S.%f}"[:-3]
            )
        # One at a time, by the tasks' own journal (each worker's clock) and by the results'
        # started_at / finished_at (the database clock).
        one_at_a_time("journal", [(r.id, e.started_at, e.finished_at) for e, r in entries])
        one_at_a_time("results", [(r.id, r.started_at, r.finished_at) for e, r in entries])
        threads = {result.worker_ids[-1] for result in results}
        pids = {entry.pid for entry, _ in entries}
        say(
            f"   one at a time: each receipt started after the one before it finished (their "
            f"journal entries and their results' started_at/finished_at), on {len(threads)} "
            f"worker threads of {len(pids)} workers, although {self.worker_threads()} threads "
            "could take them"
        )
        self.summary[f"@task receipts on queue {MAIL_QUEUE!r} (concurrency 1)"] = (
            f"{len(results)} sent, one at a time, on {len(threads)} threads of {len(pids)} workers"
        )

    def tick_schedule(self) -> None:
        from demo_project.journal.workflows import TICK_SCHEDULE, TICK_WORKFLOW
        from django_leases.models import WorkflowRun, WorkflowSchedule

        runs = WorkflowRun.objects.filter(
            workflow=TICK_WORKFLOW, key__startswith=f"schedule:{TICK_SCHEDULE}:"
        )
        earlier = set(runs.values_list("id", flat=True))
        schedule = WorkflowSchedule.objects.get(name=TICK_SCHEDULE)
        if not schedule.paused:
            raise StageFailed(f"schedule {TICK_SCHEDULE!r} was not paused during the tour")
        if runs.exclude(id__in=earlier).exists():
            raise StageFailed(f"schedule {TICK_SCHEDULE!r} started runs while paused")
        self.schedule_command("resume", TICK_SCHEDULE)
        try:
            wait_for(
                f"{TICKS} ticks of {TICK_SCHEDULE!r}",
                lambda: runs.exclude(id__in=earlier).count() >= TICKS,
                timeout=60,
            )
        finally:
            self.schedule_command("pause", TICK_SCHEDULE)
        new = list(runs.exclude(id__in=earlier))
        self.run_ids += [str(run.id) for run in new]
        self.wait_for_runs([str(run.id) for run in new])
        one_run_per_tick(TICK_SCHEDULE, [run.key or "" for run in new])
        # Who fired each tick, from the workers' own logs: exactly one worker per run.
        by = fired_by(TICK_SCHEDULE, {w.name: w.log() for w in self.workers}, [r.id for r in new])
        workers = {worker.pid: worker.name for worker in self.workers}
        for run in sorted(new, key=lambda run: run.key or ""):
            ran = workers.get(int((run.output or {}).get("pid") or 0), "?")
            say(f"      {run.key}: run {run.id}, fired by {by[str(run.id)]}, its step ran on {ran}")
        say(
            f"   {len(new)} ticks, one run each, although {len(self.workers)} workers look for "
            f"due ticks every second; fired by {len(set(by.values()))} of them; "
            f"the schedule is paused again"
        )
        self.summary[f"schedule {TICK_SCHEDULE!r} (every second)"] = (
            f"{len(new)} consecutive ticks, exactly one run each, across "
            f"{len(self.workers)} workers"
        )

    def schedule_command(self, action: str, name: str) -> None:
        done = self.manage("workflow_schedules", action, name)
        if done.returncode != 0:
            raise StageFailed(f"workflow_schedules {action} {name} exited {done.returncode}")
        say(f"   $ manage.py workflow_schedules {action} {name}: {done.stdout.strip()}")

    # -- the end ------------------------------------------------------------------------------

    def print_summary(self, failed: bool) -> None:
        from django.db.models import Count, Max

        from django_leases.models import RunStatus, WorkflowRun, WorkflowStepAttempt

        runs = WorkflowRun.objects.filter(id__in=self.run_ids)
        attempts = WorkflowStepAttempt.objects.filter(step__run__in=runs)
        steps = attempts.values("step").annotate(n=Count("id"), last=Max("attempt"))
        superseded = attempts.filter(status="running").exclude(step__status="running").count()
        refusals = sum(len(re.findall(r"was superseded", w.log())) for w in self.children.values())
        say("\n== Summary")
        completed = runs.filter(status=RunStatus.COMPLETED).count()
        say(f"   runs completed: {completed} of {runs.count()}")
        say(f"   step attempts: {attempts.count()} for {steps.count()} steps")
        say(f"   superseded attempts (stale writes refused): {superseded}")
        say(f"   refusals reported in the workers' logs: {refusals}")
        for name, value in self.summary.items():
            say(f"   {name}: {value}")
        say("   the tour FAILED" if failed else "   every stage did what it said")

    def serve_forever(self) -> None:
        say(
            f"\nThe admin is at {self.base_url}/admin/ (log in as {ADMIN_USER} / "
            f"{ADMIN_PASSWORD}); the fake GitHub API at {self.fake.url}. Ctrl-C stops the demo."
        )
        server = self.children["server"]
        try:
            while server.alive():
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
    from demo_project.fake_github import FakeGitHub

    fake = FakeGitHub(token=GITHUB_TOKEN).start()
    # Settings for this process and every child: the fake GitHub, a short step lease.
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
    os.environ["DEMO_GITHUB_API_URL"] = fake.url
    os.environ["DJANGO_LEASES_GITHUB_TOKEN"] = GITHUB_TOKEN
    os.environ["DEMO_STEP_LEASE_TTL"] = str(STEP_LEASE_TTL)
    os.environ["DEMO_SLOW_BUILD_SECONDS"] = str(SLOW_BUILD_SECONDS)
    os.environ["DEMO_CHECK_SECONDS"] = str(CHECK_SECONDS)
    os.environ["DEMO_REVIEW_SETTLE_SECONDS"] = str(SETTLE_SECONDS)
    import django

    django.setup()
    # The tour prints what each stage did; the library's own INFO lines go to the children's logs.
    logging.getLogger("django_leases").setLevel(logging.WARNING)
    serve = os.environ.get("DEMO_NO_SERVE", "") in ("", "0")
    logs = Path(tempfile.mkdtemp(prefix="django-leases-demo-"))
    try:
        return Tour(serve=serve, logs=logs, fake_github=fake).run()
    except KeyboardInterrupt:
        say("\nInterrupted; the demo's processes were stopped.")
        return 130
    finally:
        fake.stop()


if __name__ == "__main__":
    sys.exit(main())

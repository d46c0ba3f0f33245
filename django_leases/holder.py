"""Run a program as a child process while holding a lease (``manage.py hold_lease``).

:class:`LeaseHolder` is the loop behind the command: a distributed cron singleton or leader.
It acquires the lease (``Lease.objects.acquire`` with a fresh holder name), starts the child
with the lease in its environment, keeps the lease alive with the process's
:class:`~django_leases.renewal.Renewer` (every TTL/3), and releases it when the child has
ended — always, in a ``finally``.

Exit codes: :meth:`LeaseHolder.run` returns the child's code, or :data:`EXIT_TAKEN`,
:data:`EXIT_LOST`, :data:`EXIT_CANNOT_EXECUTE`, :data:`EXIT_NOT_FOUND`, or 128 + N for a
signal N received before the child was started; the command exits with it. What each means
is written once, in ``EXIT_CODES["hold_lease"]`` (:mod:`django_leases.management.base`),
which renders ``hold_lease --help`` and the documentation.

A child that itself exits with 75 or 76 is indistinguishable from those outcomes; pick
other codes in programs run under ``hold_lease``.

Signals and processes:

* The child gets ``DJANGO_LEASES_KEY``, ``DJANGO_LEASES_TOKEN`` (the fencing token) and
  ``DJANGO_LEASES_HOLDER`` in its environment, so it can fence its own writes.
* The child runs in its **own process group**: SIGTERM, SIGINT and SIGHUP sent to the holder
  are forwarded to that whole group (so ``sh -c 'a; b'`` stops ``b`` too), and a terminal's
  Ctrl-C reaches the child once, through the holder. The holder keeps renewing until the child
  has ended — and the processes it left in its group too: they get SIGTERM once the child has
  exited, SIGKILL after the grace period — then releases the lease and exits with the child's
  code. Being outside the terminal's foreground group, the child cannot read from the
  terminal.
* When the lease is lost, the group gets SIGTERM, and SIGKILL after the grace period
  (``--grace``, default ``DJANGO_LEASES["HOLD_LEASE_KILL_GRACE"]``) if anything in it is still
  running.
* If the holder itself dies (even by SIGKILL), Linux sends the child SIGTERM
  (``prctl(PR_SET_PDEATHSIG)``, set in the child before it execs the program), so a child that
  stops on SIGTERM does not keep running unfenced. Only the direct child gets this signal: a
  shell script should ``exec`` its long-running program or pass SIGTERM on; a child that
  ignores SIGTERM runs on. Elsewhere than Linux there is no such guarantee. Either way the
  lease lapses after its TTL while the orphaned child may still run, which is what the fencing
  token is for.

POSIX only (Linux, macOS, the BSDs): process groups, ``os.killpg``, SIGHUP and SIGKILL do not
exist on Windows. The module imports there (:data:`POSIX` is then ``False``), and
:class:`LeaseHolder` refuses to be built with a :class:`~django_leases.exceptions.MisuseError`
saying so; in code, :func:`~django_leases.hold_lease` works everywhere.

The child is started from the calling thread before the renewal threads exist (forking a
process with several threads and running Python code before ``exec`` is unsafe), so call
:meth:`LeaseHolder.run` from the main thread: signal handlers can only be installed there, and
``PR_SET_PDEATHSIG`` fires when the *thread* that started the child ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections, router

from django_leases.conf import leases_settings
from django_leases.exceptions import LeaseLostError, LeaseTakenError, MisuseError
from django_leases.leases import HeldLease
from django_leases.models.lease import Lease
from django_leases.process import Doorbell, on_stop, signal_name
from django_leases.validation import check_lease_name, renewable_ttl_seconds, seconds

logger = logging.getLogger("django_leases.holder")

#: The key is held by another holder (or ``--wait-timeout`` passed): ``os.EX_TEMPFAIL``.
EXIT_TAKEN = 75
#: The lease was lost while the child ran; the child was terminated.
EXIT_LOST = 76
#: The program was found but could not be executed (as shells report it).
EXIT_CANNOT_EXECUTE = 126
#: The program was not found (as shells report it).
EXIT_NOT_FOUND = 127

#: Whether this system has what the holder needs: process groups (``os.killpg``) and the
#: signals SIGHUP and SIGKILL. ``False`` on Windows, where :class:`LeaseHolder` refuses to run.
POSIX = hasattr(os, "killpg") and hasattr(signal, "SIGHUP") and hasattr(signal, "SIGKILL")

#: Why :class:`LeaseHolder` (``manage.py hold_lease``) cannot run where :data:`POSIX` is false.
NOT_POSIX = (
    "manage.py hold_lease needs a POSIX system (Linux, macOS, BSD): it runs the command in a "
    "process group of its own and forwards SIGTERM, SIGINT and SIGHUP to it, which this system "
    "({platform}) does not have. In Python code, hold_lease() works everywhere."
)

#: Signals the holder forwards to the child's process group (those this system has).
FORWARDED_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)
)

#: Longest the supervision loop sleeps without looking around, seconds (a safety net; it is
#: woken at once by the child's exit, a signal or the loss of the lease).
_TICK = 1.0

_PR_SET_PDEATHSIG = 1

Report = Callable[[int, str], None]


def _load_prctl() -> Callable[..., int] | None:
    """``prctl`` from the C library on Linux, else ``None``. Loaded before any fork."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        return None


def _exit_status(returncode: int) -> int:
    """A ``Popen.returncode`` as a shell reports it: killed by signal N → 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class LeaseHolder:
    """Runs ``command`` as a child process while holding the lease ``key``.

    Args:
        key: the lease key (``str``, 1–255 characters).
        command: the program and its arguments (a non-empty sequence of ``str``).
        ttl: the lease TTL in seconds (``float`` > 0); renewed every ``ttl / 3``.
        wait: when the key is taken, poll until it is acquired instead of giving up.
        wait_timeout: with ``wait``, give up after this many seconds (``None``: never).
        grace: seconds between SIGTERM and SIGKILL when the lease is lost; defaults to
            ``DJANGO_LEASES["HOLD_LEASE_KILL_GRACE"]``.
        using: the database alias; defaults to the router's choice for ``Lease``.
        report: ``report(level, message)`` for progress messages; ``level`` 1 is normal, 2
            verbose (the command maps it to ``--verbosity``). Defaults to the logger.

    Raises ``ValueError`` for a bad key, TTL, grace or wait timeout, or an empty command,
    before anything is written, and :class:`~django_leases.exceptions.MisuseError` on a
    system without process groups (Windows: :data:`POSIX` is false). :meth:`run` does the
    work.
    """

    def __init__(
        self,
        key: str,
        command: Sequence[str],
        *,
        ttl: float,
        wait: bool = False,
        wait_timeout: float | None = None,
        grace: float | None = None,
        using: str | None = None,
        report: Report | None = None,
    ) -> None:
        if not POSIX:
            raise MisuseError(NOT_POSIX.format(platform=sys.platform))
        self.key = check_lease_name(key, "key")
        self.command = list(command)
        if not self.command or not all(isinstance(part, str) for part in self.command):
            raise ValueError("The command to run must be a non-empty list of strings")
        if any("\0" in part for part in self.command):
            raise ValueError("The command to run must not contain a NUL character")
        self.ttl = renewable_ttl_seconds(ttl)
        self.wait = wait
        self.wait_timeout = None if wait_timeout is None else seconds(wait_timeout, "wait timeout")
        self.grace = seconds(
            leases_settings.HOLD_LEASE_KILL_GRACE if grace is None else grace, "grace"
        )

        self.using = using or router.db_for_write(Lease)
        if self.using not in connections:
            raise ValueError(f"Unknown database alias {self.using!r}")
        self.held = HeldLease(self.key, self.ttl, using=self.using, on_lost=self._on_lost)
        self.holder = self.held.holder
        self._report = report
        self._wake = Doorbell()
        self._received: list[int] = []
        self._forwarded = 0
        self._previous_handlers: dict[int, Any] = {}

    # -- public --------------------------------------------------------------------------

    def run(self) -> int:
        """Acquire, run the child, release; returns the exit code (see the module docstring).

        Must be called from the main thread. Database errors while acquiring without
        ``wait`` propagate (as ``django.db.DatabaseError``); under ``wait`` they are logged
        and retried.
        """
        if threading.current_thread() is not threading.main_thread():
            raise MisuseError("LeaseHolder.run() must be called from the main thread")
        with on_stop(self._on_signal, FORWARDED_SIGNALS) as previous:
            self._previous_handlers = previous
            if not self._acquire():
                if self._received:
                    return 128 + self._received[0]
                return EXIT_TAKEN
            try:
                return self._run_child()
            finally:
                self.held.finish(vouch=False)  # a no-op once the child's end was vouched for
                if self.held.released:
                    self._say(2, f"Released lease {self.key!r} (token {self.held.token}).")
                else:
                    self._say(1, f"Could not release lease {self.key!r}; it lapses after its TTL.")
                connections[self.using].close()

    # -- acquisition ---------------------------------------------------------------------

    def _acquire(self) -> bool:
        """Acquire the lease (renewals not started yet); ``False`` when not acquired."""
        announced = False

        def observe(event: str, error: BaseException | None) -> None:
            nonlocal announced
            if event == "unreachable":
                self._say(1, f"Could not reach the database to acquire {self.key!r}: {error}")
            elif self.wait and not announced:
                self._say(1, f"Lease {self.key!r} is held by another holder; waiting for it.")
                announced = True

        if self._received:
            self._say(1, f"Stopped by {signal_name(self._received[0])} before running the command.")
            return False
        wait = None
        if self.wait:
            wait = float("inf") if self.wait_timeout is None else self.wait_timeout
        try:
            self.held.acquire(
                wait=wait, stop=lambda: bool(self._received), observe=observe, renew=False
            )
        except LeaseTakenError:
            if self._received:
                self._say(
                    1, f"Stopped by {signal_name(self._received[0])} before running the command."
                )
            elif self.wait:
                self._say(1, f"Gave up waiting for lease {self.key!r}; not running.")
            else:
                self._say(1, f"Lease {self.key!r} is held by another holder; not running.")
            return False
        self._say(2, f"Acquired lease {self.key!r} with token {self.held.lease.token}.")
        # The child may run for hours: do not keep an idle connection open meanwhile.
        connections[self.using].close()
        return True

    # -- the child -----------------------------------------------------------------------

    def _run_child(self) -> int:
        if self._received:
            self._say(1, f"Stopped by {signal_name(self._received[0])} before running the command.")
            return 128 + self._received[0]
        try:
            child = self._start_child()
        except FileNotFoundError as exc:
            self._say(1, f"Cannot run {self.command[0]!r}: {exc.strerror}.")
            return EXIT_NOT_FOUND
        except OSError as exc:
            self._say(1, f"Cannot run {self.command[0]!r}: {exc.strerror or exc}.")
            return EXIT_CANNOT_EXECUTE
        self._say(2, f"Started {self.command[0]!r} (pid {child.pid}) under lease {self.key!r}.")
        waiter = threading.Thread(
            target=self._wait_for_child, args=(child,), name=f"hold-lease-child:{child.pid}"
        )
        waiter.daemon = True
        waiter.start()
        try:
            self.held.start_renewing()
            lost = self._supervise(child)
        finally:
            if child.poll() is None:  # only after an unexpected error: never leave it unfenced
                self._terminate(child)
        status = _exit_status(child.returncode)
        if lost or self.held.lost.is_set():
            self._say(1, f"Lease {self.key!r} was lost while the command ran (exit {EXIT_LOST}).")
            return EXIT_LOST
        try:
            self.held.finish(vouch=True)
        except LeaseLostError:
            self._say(
                1,
                f"Lease {self.key!r} could not be confirmed after the command ended "
                f"(its exit status was {status}); reporting it as lost.",
            )
            return EXIT_LOST
        self._say(2, f"The command exited with status {status}.")
        return status

    def _start_child(self) -> subprocess.Popen[bytes]:
        lease = self.held.lease
        env = dict(os.environ)
        env["DJANGO_LEASES_KEY"] = lease.key
        env["DJANGO_LEASES_TOKEN"] = str(lease.token)
        env["DJANGO_LEASES_HOLDER"] = lease.holder
        return subprocess.Popen(
            self.command,
            env=env,
            process_group=0,
            preexec_fn=_child_setup(os.getpid(), _load_prctl(), self._previous_handlers),
        )

    def _wait_for_child(self, child: subprocess.Popen[bytes]) -> None:
        child.wait()
        self._wake.ring()

    def _supervise(self, child: subprocess.Popen[bytes]) -> bool:
        """Wait for the child's whole process group to end, forwarding signals; returns
        whether the lease was lost. The lease is held (and renewed) until then: processes
        the child left behind get SIGTERM once it has exited, SIGKILL after the grace
        period, before the lease is given up — no part of the job runs unfenced."""
        kill_at: float | None = None
        lost = False
        while True:
            timeout = _TICK if kill_at is None else max(0.0, min(_TICK, kill_at - time.monotonic()))
            self._wake.wait(timeout)
            self._forward_signals(child)
            if not lost and self.held.lost.is_set():
                lost = True
                self._say(
                    1,
                    f"Lease {self.key!r} was lost: sending SIGTERM to the command "
                    f"(SIGKILL in {self.grace:g} s).",
                )
                self._signal_group(child, signal.SIGTERM)
                kill_at = time.monotonic() + self.grace
            if kill_at is None:
                if child.poll() is None:
                    continue
                if not self._group_alive(child):
                    return False
                self._say(
                    1,
                    "The command exited, leaving processes of its group running: sending them "
                    f"SIGTERM (SIGKILL in {self.grace:g} s) before the lease is released.",
                )
                self._signal_group(child, signal.SIGTERM)
                kill_at = time.monotonic() + self.grace
            # Wait until the whole group has ended, or the grace period is over.
            if child.poll() is not None and not self._group_alive(child):
                return lost
            if time.monotonic() >= kill_at:
                self._say(1, f"The command outlived the {self.grace:g} s grace: SIGKILL.")
                self._signal_group(child, signal.SIGKILL)
                child.wait()
                return lost

    def _terminate(self, child: subprocess.Popen[bytes]) -> None:
        """SIGTERM the child's group, SIGKILL after the grace period; waits for the child."""
        self._signal_group(child, signal.SIGTERM)
        try:
            child.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            self._signal_group(child, signal.SIGKILL)
            child.wait()

    @staticmethod
    def _signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
        """Send ``signum`` to the child's process group, then SIGCONT (as systemd and a shell's
        ``kill %job`` do): a stopped process acts on the signal rather than keeping it pending
        while the lease is renewed on its behalf."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)
            if signum not in (signal.SIGKILL, signal.SIGCONT):
                os.killpg(child.pid, signal.SIGCONT)

    @staticmethod
    def _group_alive(child: subprocess.Popen[bytes]) -> bool:
        try:
            os.killpg(child.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def _on_lost(self) -> None:
        # Wake the supervisor: the child is stopped from there.
        self._wake.ring()

    # -- signals ---------------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        # Runs on the main thread between bytecodes, wherever it is (inside the supervision
        # loop's own wait, too): only record and ring, which takes no lock.
        self._received.append(signum)
        self._wake.ring()

    def _forward_signals(self, child: subprocess.Popen[bytes]) -> None:
        while self._forwarded < len(self._received):
            signum = self._received[self._forwarded]
            self._forwarded += 1
            if child.poll() is None:
                self._say(1, f"Forwarding {signal_name(signum)} to the command.")
                self._signal_group(child, signum)

    def _say(self, level: int, message: str) -> None:
        """Report ``message``; a report that cannot be written (stderr a closed pipe, a hung-up
        terminal) is dropped: it must never cost the child a signal, the lease its release or
        the command its exit status."""
        try:
            if self._report is not None:
                self._report(level, message)
            else:
                logger.log(logging.INFO if level <= 1 else logging.DEBUG, message)
        except (OSError, ValueError):
            pass


def _child_setup(
    parent_pid: int, prctl: Callable[..., int] | None, handled: dict[int, Any]
) -> Callable[[], None]:
    """The function the child runs between ``fork`` and ``exec``.

    It gives the forwarded signals their default action back (a signal arriving before
    ``exec`` must not be swallowed by the holder's Python handler), asks Linux to send SIGTERM
    when the holder dies, and checks the holder did not die before that request was made.
    """
    handled_signals = tuple(handled)

    def setup() -> None:
        for signum in handled_signals:
            signal.signal(signum, signal.SIG_DFL)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent_pid:  # the holder died before prctl took effect
                os.kill(os.getpid(), signal.SIGTERM)

    return setup


__all__ = [
    "EXIT_CANNOT_EXECUTE",
    "EXIT_LOST",
    "EXIT_NOT_FOUND",
    "EXIT_TAKEN",
    "FORWARDED_SIGNALS",
    "POSIX",
    "LeaseHolder",
]

"""``manage.py hold_lease`` driven as a real subprocess, on SQLite and PostgreSQL.

Each test starts ``python manage.py hold_lease …`` with the test database in its environment
(``subprocess_env``) and a small child program (``CHILD`` below) that records what it saw —
its pid, the lease variables and any signal it got — in files under ``tmp_path``. Waits are
generous (3 s TTLs, waits of a minute, polled) and nothing asserts how fast something was,
except the takeover bound the feature promises (TTL + TTL/3, plus slack for process start-up).
A lease that must lapse (a stopped holder's) is lapsed on the database clock.
"""

from __future__ import annotations

import signal
import sys

import pytest

from django_leases.holder import EXIT_LOST, EXIT_NOT_FOUND, EXIT_TAKEN
from django_leases.management.base import EXIT_CODES, USAGE_ERROR
from django_leases.models import Lease, LeaseState
from tests.helpers import lapse_lease, manage, wait_until
from tests.hold_command import PATIENCE, TTL, Holders, lease_row, pid_alive

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics"),
]


# -- one at a time ---------------------------------------------------------------------------


def test_two_at_once_one_runs_the_other_exits_75(holders: Holders) -> None:
    key = "cron:two-at-once"
    procs = {
        name: holders.start(key, "--ttl", str(TTL), "--", *holders.child(name, "--hold"))
        for name in ("first", "second")
    }
    wait_until(
        lambda: any(p.poll() is not None for p in procs.values()),
        PATIENCE,
        what="one holder to give up",
    )
    loser = next(name for name, p in procs.items() if p.poll() is not None)
    winner = next(name for name in procs if name != loser)
    assert procs[loser].returncode == EXIT_TAKEN, holders.log(procs[loser])
    assert "held by another holder" in holders.log(procs[loser])
    info = holders.info(winner)
    assert procs[winner].poll() is None
    holders.finish(winner)
    assert procs[winner].wait(timeout=PATIENCE) == 0, holders.log(procs[winner])
    assert not holders.marker(loser).exists()
    assert sorted(p.name for p in holders.dir.glob("*.json")) == [f"{winner}.json"]
    row = lease_row(key)
    assert row.state == LeaseState.RELEASED
    assert str(row.token) == info["token"]


def test_taken_key_with_wait_timeout_exits_75_without_running(holders: Holders) -> None:
    key = "cron:wait-timeout"
    other = Lease.objects.acquire(key, "someone-else", ttl=120)
    assert other is not None
    code, output = holders.run(
        key, "--ttl", str(TTL), "--wait-timeout", "2", "--", *holders.child("never")
    )
    assert code == EXIT_TAKEN, output
    assert "waiting" in output
    assert not holders.marker("never").exists()
    current = Lease.objects.current(key)
    assert current is not None and current.holder == "someone-else"


def test_verbosity_0_is_quiet_when_taken(holders: Holders) -> None:
    key = "cron:quiet"
    assert Lease.objects.acquire(key, "someone-else", ttl=120) is not None
    code, output = holders.run(key, "-v", "0", "--", *holders.child("never"))
    assert code == EXIT_TAKEN
    # (System-check warnings are Django's and not governed by --verbosity.)
    assert "held by another holder" not in output
    loud_code, loud = holders.run(key, "--", *holders.child("never"))
    assert loud_code == EXIT_TAKEN
    assert "held by another holder" in loud


# -- takeover after the holder dies ----------------------------------------------------------


def test_sigkilled_holder_is_taken_over_by_a_waiting_holder_and_its_child_stops(
    holders: Holders,
) -> None:
    key = "leader:sigkill"
    first = holders.start(key, "--ttl", str(TTL), "--", *holders.child("a", "--hold"))
    a = holders.info("a")
    second = holders.start(key, "--ttl", str(TTL), "--wait", "--", *holders.child("b"))
    wait_until(lambda: "waiting" in holders.log(second), PATIENCE, what="the second holder to wait")
    assert not holders.marker("b").exists()

    first.send_signal(signal.SIGKILL)
    first.wait(timeout=PATIENCE)
    b = holders.info("b")  # the waiting holder takes over once the lease lapses
    assert int(b["token"]) > int(a["token"])
    assert b["key"] == a["key"] == key
    assert second.wait(timeout=PATIENCE) == 0, holders.log(second)

    # PR_SET_PDEATHSIG: the dead holder's child got SIGTERM and is gone.
    wait_until(lambda: not pid_alive(a["pid"]), PATIENCE, what="the orphaned child to stop")
    # Linux sends the death signal each time the child's parent *thread* ends: a holder killed
    # with its renewal thread alive can deliver it twice. What matters: SIGTERM, and only it.
    received = holders.signals("a")
    assert received and set(received) == {signal.SIGTERM}, received


# -- the lease is lost while the child runs ----------------------------------------------------


def test_sigstopped_holder_past_its_ttl_loses_the_lease_and_stops_its_child(
    holders: Holders,
) -> None:
    key = "leader:sigstop"
    holder = holders.start(
        key, "--ttl", str(TTL), "--grace", "5", "--", *holders.child("a", "--hold")
    )
    a = holders.info("a")
    holder.send_signal(signal.SIGSTOP)
    try:
        lapse_lease(key)  # the stopped holder outlives its lease, on the database clock
        assert Lease.objects.current(key) is None
        intruder = Lease.objects.acquire(key, "intruder", ttl=120)
        assert intruder is not None and intruder.token > int(a["token"])
        assert pid_alive(a["pid"])  # the child ran on while its holder was stopped
    finally:
        holder.send_signal(signal.SIGCONT)
    assert holder.wait(timeout=PATIENCE) == EXIT_LOST, holders.log(holder)
    assert "lost" in holders.log(holder)
    wait_until(lambda: not pid_alive(a["pid"]), PATIENCE, what="the old child to stop")
    assert holders.signals("a") == [signal.SIGTERM]
    # The old holder's release was a no-op: the intruder still holds the key.
    current = Lease.objects.current(key)
    assert current is not None
    assert (current.holder, current.token) == ("intruder", intruder.token)


def test_force_released_lease_stops_a_child_that_ignores_sigterm_with_sigkill(
    holders: Holders,
) -> None:
    key = "leader:stubborn"
    holder = holders.start(
        key, "--ttl", str(TTL), "--grace", "1", "--", *holders.child("a", "--hold", "--ignore-term")
    )
    a = holders.info("a")
    released = manage("leases", "release", key, env=holders.env, timeout=PATIENCE)
    assert released.returncode == 0, released.stderr
    assert holder.wait(timeout=PATIENCE) == EXIT_LOST, holders.log(holder)
    assert holders.signals("a") == [signal.SIGTERM]  # it got SIGTERM, ignored it …
    wait_until(lambda: not pid_alive(a["pid"]), PATIENCE, what="the child to be SIGKILLed")
    assert "SIGKILL" in holders.log(holder)
    row = lease_row(key)
    assert row.state == LeaseState.RELEASED
    assert row.token == int(a["token"])


# -- signals to the holder -------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_the_holder_is_forwarded_and_the_lease_released_after_the_child_ends(
    holders: Holders, signum: signal.Signals
) -> None:
    key = f"leader:{signum.name.lower()}"
    holder = holders.start(key, "--ttl", str(TTL), "--", *holders.child("a", "--hold"))
    a = holders.info("a")
    assert Lease.objects.current(key) is not None
    holder.send_signal(signum)
    # The child got the signal and exited 42; the holder passes that code on.
    assert holder.wait(timeout=PATIENCE) == 42, holders.log(holder)
    assert holders.signals("a") == [signum]
    assert not pid_alive(a["pid"])
    assert Lease.objects.current(key) is None
    row = lease_row(key)
    assert row.state == LeaseState.RELEASED
    assert row.released_at is not None
    assert row.token == int(a["token"])


def test_sigterm_while_waiting_exits_without_running(holders: Holders) -> None:
    key = "leader:term-while-waiting"
    assert Lease.objects.acquire(key, "someone-else", ttl=120) is not None
    holder = holders.start(key, "--ttl", str(TTL), "--wait", "--", *holders.child("never"))
    wait_until(lambda: "waiting" in holders.log(holder), PATIENCE, what="the holder to wait")
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(timeout=PATIENCE) == 128 + signal.SIGTERM
    assert not holders.marker("never").exists()
    current = Lease.objects.current(key)
    assert current is not None and current.holder == "someone-else"


# -- the child's exit code and environment -----------------------------------------------------


@pytest.mark.parametrize(
    ("script", "expected"),
    [("exit 0", 0), ("exit 3", 3), ("kill -KILL $$", 128 + signal.SIGKILL)],
)
def test_exit_code_of_the_child_is_passed_through(
    holders: Holders, script: str, expected: int
) -> None:
    key = "cron:exit-code"
    code, output = holders.run(key, "--ttl", str(TTL), "--", "sh", "-c", script)
    assert code == expected, output
    assert lease_row(key).state == LeaseState.RELEASED


def test_child_environment_carries_the_lease_and_arguments_pass_untouched(
    holders: Holders,
) -> None:
    key = "cron:environment ✓"
    code, output = holders.run(key, "--ttl", str(TTL), "-v", "2", "--", *holders.child("a"))
    assert code == 0, output
    a = holders.info("a")
    row = lease_row(key)
    assert a["key"] == key
    assert a["token"] == str(row.token)
    assert a["holder"] == row.holder
    assert a["pgid"] == a["pid"]  # its own process group, so signals reach all it starts
    assert row.state == LeaseState.RELEASED
    assert "Acquired" in output and "Released" in output

    argv_file = holders.dir / "argv.txt"
    script = 'printf "%s\\n" "$@" > "$0"'
    code, output = holders.run(
        key, "--", "sh", "-c", script, str(argv_file), "--", "-x", "--ttl", "9", "a b"
    )
    assert code == 0, output
    assert argv_file.read_text().splitlines() == ["--", "-x", "--ttl", "9", "a b"]


def test_program_not_found_exits_127_and_releases(holders: Holders) -> None:
    key = "cron:not-found"
    code, output = holders.run(key, "--", "/nonexistent/program-that-is-not-there")
    assert code == EXIT_NOT_FOUND, output
    assert lease_row(key).state == LeaseState.RELEASED


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("tail", [[], ["--"]], ids=["no-dashes", "nothing-after-dashes"])
def test_missing_command_is_a_clear_error(holders: Holders, tail: list[str]) -> None:
    code, output = holders.run("cron:no-command", *tail)
    assert code == 1
    assert "command to run" in output
    assert "Traceback" not in output
    assert not Lease.objects.exists()


@pytest.mark.parametrize("ttl", ["abc", "0", "-1", "nan", "inf", "1e12", ""])
def test_bad_ttl_is_a_clear_error_and_writes_nothing(holders: Holders, ttl: str) -> None:
    code, output = holders.run("cron:bad-ttl", "--ttl", ttl, "--", *holders.child("never"))
    assert code == 1, output
    assert "ttl" in output.lower()
    assert "Traceback" not in output
    assert not holders.marker("never").exists()
    assert not Lease.objects.exists()


@pytest.mark.parametrize("key", ["", "k" * 256], ids=["empty", "too-long"])
def test_bad_key_is_a_clear_error_and_writes_nothing(holders: Holders, key: str) -> None:
    code, output = holders.run(key, "--", *holders.child("never"))
    assert code == 1, output
    assert "key" in output.lower()
    assert "Traceback" not in output
    assert not holders.marker("never").exists()
    assert not Lease.objects.exists()


def test_bad_grace_and_wait_timeout_are_clear_errors(holders: Holders) -> None:
    for option in ("--grace", "--wait-timeout"):
        code, output = holders.run("cron:bad", option, "-5", "--", *holders.child("never"))
        assert code == 1, output
        assert "Traceback" not in output
    assert not holders.marker("never").exists()
    assert not Lease.objects.exists()


def test_help_documents_the_exit_codes(holders: Holders) -> None:
    code, output = holders.run("--help")
    assert code == 0
    for text in ("-- CMD", "75", "76", "DJANGO_LEASES_TOKEN", "PR_SET_PDEATHSIG"):
        assert text in output
    epilog = output.split("exit codes:\n", 1)[1]
    rows = [line[2:].split("  ")[0] for line in epilog.splitlines() if line[2:3].strip()]
    assert rows == [row.shown for row in EXIT_CODES["hold_lease"].rows]
    assert rows == ["the child's", "75", "76", "126 / 127", "128 + N", "1", "2", "4"]


def test_an_unknown_database_is_bad_usage_and_runs_nothing(holders: Holders) -> None:
    code, output = holders.run("cron:db", "--database", "typo", "--", *holders.child("never"))
    assert code == USAGE_ERROR, output
    assert "Unknown database alias 'typo'" in output and "Traceback" not in output
    assert not holders.marker("never").exists()
    assert not Lease.objects.exists()

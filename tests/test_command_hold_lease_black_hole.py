"""``manage.py hold_lease`` whose database stops answering mid-hold: a TCP proxy
in front of PostgreSQL stops forwarding (a black hole; connections stay open).

Rule (cron-singleton how-to): "The database is unreachable for longer than the TTL: the lease
counts as lost; the program's process group gets SIGTERM, then SIGKILL after --grace; the
holder exits 76" — and it does not hang (statements are bounded; new connections by
``connect_timeout``, which the docs say to set)."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_leases.holder import EXIT_LOST
from django_leases.models import Lease
from tests.helpers import wait_until
from tests.hold_command import PATIENCE, TTL, Holders, pid_alive
from tests.test_lease_timeouts import FreezableProxy

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics"),
]


@pytest.fixture
def proxied(
    subprocess_env: dict[str, str], tmp_path: Path
) -> Iterator[tuple[Holders, FreezableProxy]]:
    if connection.vendor == "sqlite":
        pytest.skip("no network to black-hole")
    settings = connection.settings_dict
    mysql = connection.vendor == "mysql"
    port = int(settings.get("PORT") or (3306 if mysql else 5432))
    proxy = FreezableProxy((settings.get("HOST") or "127.0.0.1", port))
    env = dict(subprocess_env)
    user = settings.get("USER") or ("root" if mysql else "postgres")
    scheme = "mysql" if mysql else "postgres"
    # connect_timeout, as the docs (operations/poolers.md) say to set.
    env["DATABASE_URL"] = (
        f"{scheme}://{user}@127.0.0.1:{proxy.port}/{settings['NAME']}?connect_timeout=5"
    )
    helper = Holders(env, tmp_path)
    try:
        yield helper, proxy
    finally:
        helper.cleanup()
        proxy.close()


def test_black_holed_database_stops_the_program_and_the_holder_exits_76(
    proxied: tuple[Holders, FreezableProxy],
) -> None:
    """The holder signals the child once its local deadline passes and exits 76 without
    hanging on the dead connection."""
    holders, proxy = proxied
    key = "hold-cmd:black-hole"
    holder = holders.start(
        key, "--ttl", str(TTL), "--grace", "2", "-v", "2", "--", *holders.child("a", "--hold")
    )
    a = holders.info("a")
    wait_until(lambda: "Started" in holders.log(holder), PATIENCE, what="the holder's start")
    proxy.freeze()
    frozen = time.monotonic()
    wait_until(lambda: holders.signals("a"), PATIENCE, what="the child to get SIGTERM")
    signalled = time.monotonic() - frozen
    assert holders.signals("a") == [signal.SIGTERM]
    code = holder.wait(timeout=PATIENCE * 2)
    exited = time.monotonic() - frozen
    print(f"signalled after {signalled:.2f} s, exited after {exited:.2f} s")
    assert code == EXIT_LOST, holders.log(holder)
    assert not pid_alive(a["pid"])
    # The lease was not released (the database did not answer): it lapses on its own.
    assert Lease.objects.filter(key=key).exists()


#: psycopg's default wait for a new connection, which operations/poolers.md documents.
PSYCOPG_CONNECT_DEFAULT = 130.0


def test_black_holed_database_without_connect_timeout_the_holder_still_exits(
    proxied: tuple[Holders, FreezableProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same black hole with the database settings as the docs show them for MariaDB (no
    ``connect_timeout``) and PostgreSQL's default: the child is stopped at the deadline, and
    the holder exits 76 soon after, without waiting on the database to release a lease that
    has lapsed (a release would open a new connection into the black hole: two 130 s
    connects on PostgreSQL, none bounded on MariaDB)."""
    holders, proxy = proxied
    holders.env["DATABASE_URL"] = holders.env["DATABASE_URL"].replace("?connect_timeout=5", "")
    key = "hold-cmd:black-hole-default"
    holder = holders.start(
        key, "--ttl", str(TTL), "--grace", "2", "-v", "2", "--", *holders.child("a", "--hold")
    )
    a = holders.info("a")
    wait_until(lambda: "Started" in holders.log(holder), PATIENCE, what="the holder's start")
    proxy.freeze()
    wait_until(lambda: holders.signals("a"), PATIENCE, what="the child to get SIGTERM")
    wait_until(lambda: not pid_alive(a["pid"]), PATIENCE, what="the child to end")
    bound = 2 + 10 + PSYCOPG_CONNECT_DEFAULT + 18  # grace + RELEASE_TIMEOUT + one connect
    try:
        code = holder.wait(timeout=bound)
    except Exception:
        pytest.fail(
            f"the holder stopped its child but has not exited {bound:g} s later; log:\n"
            + holders.log(holder)
        )
    assert code == EXIT_LOST, holders.log(holder)

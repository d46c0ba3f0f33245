"""``manage.py hold_lease`` command lines: everything after ``--`` belongs to the
program and must not change the holder (Django pre-parses ``--settings`` and
``--pythonpath`` from the whole command line)."""

from __future__ import annotations

import sys

import pytest

from django_leases.models import Lease, LeaseState
from tests.hold_command import (
    TTL,
    Holders,
    lease_row,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics"),
]


@pytest.mark.parametrize(
    "extra",
    [
        ["--settings=no.such.settings"],
        ["--settings", "no.such.settings"],
        ["--pythonpath=/nonexistent"],
        ["--database", "typo"],
        ["--help"],
        ["--version"],
    ],
    ids=["settings=", "settings", "pythonpath", "database", "help", "version"],
)
def test_django_options_after_the_dashes_belong_to_the_program(
    holders: Holders,
    extra: list[str],
) -> None:
    """``-- sh -c ... --settings=x`` (as ``-- python manage.py other --settings=x``
    would): the holder uses its own settings and passes the options on untouched."""
    key = "hold-cmd:argv"
    argv_file = holders.dir / "argv.txt"
    script = 'printf "%s\\n" "$@" > "$0"'
    code, output = holders.run(
        key, "--ttl", str(TTL), "--", "sh", "-c", script, str(argv_file), *extra
    )
    assert code == 0, output
    assert argv_file.read_text().splitlines() == extra
    assert lease_row(key).state == LeaseState.RELEASED
    assert Lease.objects.count() == 1


@pytest.mark.parametrize(
    "key",
    ["\U0001f512" * 255, "job ", "Job", " ", "a\nb", "-"],
    ids=["255-emoji", "trailing-space", "case", "space", "newline", "dash"],
)
def test_unusual_keys_are_held_exactly(holders: Holders, key: str) -> None:
    """Any 1-255 character key (four-byte characters, spaces, a newline; "job " is
    not "job") is held and released under exactly that key."""
    neighbour = {"job ": "job", "Job": "job", " ": "  ", "a\nb": "a b"}.get(key)
    if neighbour is not None:  # a nearly equal key, held by someone else
        assert Lease.objects.acquire(neighbour, "other", ttl=120) is not None
    code, output = holders.run(key, "--ttl", str(TTL), "--", "true")
    assert code == 0, output
    assert lease_row(key).state == LeaseState.RELEASED

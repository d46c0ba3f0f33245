"""``manage.py reconcile_trigger_sources`` and ``manage.py trigger_sources``: thin shells over
the lifecycle, with its semantics, exit statuses and messages on stderr."""

from __future__ import annotations

import io
import json
import logging
import subprocess
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from django_leases.management.base import (
    EXIT_BUSY,
    EXIT_CODES,
    EXIT_PROVIDER_FAILED,
    EXIT_SETUP_FAILED,
    USAGE_ERROR,
)
from django_leases.models import TriggerRefusal, TriggerSource
from django_leases.testing.providers import FakeProvider
from django_leases.triggers import credentials, lifecycle, registry
from django_leases.triggers.registry import StartWorkflow, TriggerDeclaration, webhook_source
from tests.helpers import fake_sources, manage

SOURCE = "cmd-hooks"
BASE = "https://ci.example.com"

pytestmark = pytest.mark.django_db(transaction=True)


def _run(command: str, *args: str, **options: object) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out, stderr=StringIO(), **options)
    return out.getvalue()


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with fake_sources(SOURCE) as provider:
        yield provider


def _row(name: str = SOURCE) -> TriggerSource:
    return TriggerSource.objects.get(name=name)


# -- reconcile_trigger_sources -----------------------------------------------------------------


def test_reconcile_syncs_the_declarations_and_lists_them() -> None:
    old = TriggerDeclaration(name="removed", provider="github", events={"push": StartWorkflow("w")})
    TriggerSource.objects.sync([old])
    TriggerSource.objects.set_enabled("removed", True)

    output = _run(
        "reconcile_trigger_sources", "--base-url", "https://ci.example.com/", "--label-prefix", "ci"
    )

    # A header, then one line per row, sorted by name: the demo's declarations, the orphan.
    header, *rows = output.splitlines()
    assert header.split() == ["NAME", "PROVIDER", "DECLARED", "ENABLED", "STATUS", "BASE", "URL"]
    lines = {line.split()[0]: line.split() for line in rows}
    assert list(lines) == sorted(lines)
    assert set(lines) == {d.name for d in registry.declarations()} | {"removed"}
    assert lines["github-pushes"] == [
        "github-pushes",
        "github",
        "declared",
        "disabled",
        "off",
        "https://ci.example.com",
    ]
    assert lines["removed"] == ["removed", "github", "orphan", "enabled", "off", "-"]
    row = TriggerSource.objects.get(name="github-pushes")
    assert (row.base_url, row.label_prefix, row.enabled) == ("https://ci.example.com", "ci", False)
    assert TriggerSource.objects.get(name="removed").declared is False


def test_reconcile_as_json_has_typed_fields_and_each_setup(fake: FakeProvider) -> None:
    _run("reconcile_trigger_sources", "--base-url", BASE)
    lifecycle.enable(SOURCE)
    rows = {
        row["name"]: row
        for row in json.loads(_run("reconcile_trigger_sources", "--format", "json"))
    }
    for row in rows.values():
        assert list(row) == [
            "name",
            "provider",
            "declared",
            "enabled",
            "status",
            "base_url",
            "setup",
        ]
    assert rows[SOURCE] == {
        "name": SOURCE,
        "provider": "fake",
        "declared": True,
        "enabled": True,
        "status": "registered",
        "base_url": BASE,
        "setup": {"ok": True, "detail": f"Hook 1 updated to post to {BASE}/hooks/{SOURCE}/."},
    }
    pushes = rows["github-pushes"]
    assert (pushes["enabled"], pushes["status"], pushes["setup"]) == (False, "off", None)

    fake.fail_setup = "API down"
    out = StringIO()
    with pytest.raises(CommandError, match="setup failed: cmd-hooks") as caught:
        call_command("reconcile_trigger_sources", "--format", "json", stdout=out)
    assert caught.value.returncode == EXIT_SETUP_FAILED == 3
    failed = {row["name"]: row for row in json.loads(out.getvalue())}[SOURCE]["setup"]
    assert failed["ok"] is False and "API down" in failed["detail"]


def test_reconcile_with_nothing_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "declarations", lambda: [])
    assert _run("reconcile_trigger_sources").strip() == "No trigger sources are declared."
    assert json.loads(_run("reconcile_trigger_sources", "--format", "json")) == []


def test_reconcile_without_address_keeps_the_known_one() -> None:
    _run("reconcile_trigger_sources", "--base-url", "https://kept.example.com")
    _run("reconcile_trigger_sources")
    assert TriggerSource.objects.get(name="github-pushes").base_url == "https://kept.example.com"


LATER = "cmd-hooks-later"


def _hook_urls(fake: FakeProvider) -> dict[str, str]:
    return {hook["source"]: hook["url"] for hook in fake.hooks.values()}


def test_a_source_added_in_a_later_deploy_gets_the_known_address(fake: FakeProvider) -> None:
    # Deploy 1: the address is given; an operator enables the source.
    _run("reconcile_trigger_sources", "--base-url", BASE, "--label-prefix", "ci ")
    _run("trigger_sources", "enable", SOURCE)
    # Deploy 2 declares another source and, as the docs allow, omits --base-url.
    webhook_source(LATER, provider="fake", events={})
    try:
        _run("reconcile_trigger_sources")
        later = _row(LATER)
        assert (later.base_url, later.label_prefix, later.enabled) == (BASE, "ci ", False)
        _run("trigger_sources", "enable", LATER)
        assert _row(LATER).status == "registered"
        assert _hook_urls(fake) == {
            SOURCE: f"{BASE}/hooks/{SOURCE}/",
            LATER: f"{BASE}/hooks/{LATER}/",
        }
    finally:
        registry.unregister(LATER)


def test_the_base_url_setting_is_the_address_unless_the_command_names_one(
    fake: FakeProvider, settings: Any
) -> None:
    settings.DJANGO_LEASES = {"BASE_URL": "https://configured.example.com/"}
    _run("reconcile_trigger_sources")
    assert _row().base_url == "https://configured.example.com"
    _run("trigger_sources", "enable", SOURCE)
    assert _hook_urls(fake) == {SOURCE: f"https://configured.example.com/hooks/{SOURCE}/"}
    # --base-url wins for its run, and is what a reconcile without either keeps.
    _run("reconcile_trigger_sources", "--base-url", BASE)
    assert _row().base_url == BASE
    assert _hook_urls(fake) == {SOURCE: f"{BASE}/hooks/{SOURCE}/"}
    settings.DJANGO_LEASES = {}
    webhook_source(LATER, provider="fake", events={})
    try:
        _run("reconcile_trigger_sources")
        assert (_row().base_url, _row(LATER).base_url) == (BASE, BASE)
    finally:
        registry.unregister(LATER)


def test_a_bad_base_url_is_a_command_error_and_writes_nothing() -> None:
    with pytest.raises(CommandError, match="not an http") as caught:
        _run("reconcile_trigger_sources", "--base-url", "nowhere")
    assert caught.value.returncode == 1
    assert not TriggerSource.objects.exists()


def test_reconcile_sets_up_enabled_sources_and_reports_failures(fake: FakeProvider) -> None:
    _run("reconcile_trigger_sources", "--base-url", BASE)
    assert fake.calls == []
    lifecycle.enable(SOURCE)
    output = _run("reconcile_trigger_sources")
    assert f"set up {SOURCE}: Hook 1 updated to post to {BASE}/hooks/{SOURCE}/." in output
    fake.fail_setup = "API down"
    with pytest.raises(CommandError, match="setup failed: cmd-hooks: Setup at fake failed: API"):
        _run("reconcile_trigger_sources")
    assert _row().status == "failed"


# -- trigger_sources ---------------------------------------------------------------------------


def test_list_shows_status_url_and_detail_never_a_secret(fake: FakeProvider) -> None:
    assert "No trigger sources" in _run("trigger_sources", "list")
    assert json.loads(_run("trigger_sources", "list", "--format", "json")) == []
    lifecycle.reconcile(base_url=BASE)
    lifecycle.enable(SOURCE)
    secret = credentials.get_secret(SOURCE)
    assert secret
    output = _run("trigger_sources", "list")
    lines = output.splitlines()
    assert lines[0].split() == [
        "NAME",
        "PROVIDER",
        "DECLARED",
        "ENABLED",
        "STATUS",
        "URL",
        "REFUSED",
        "DETAIL",
    ]
    [line] = [line for line in lines if line.startswith(SOURCE)]
    assert line.split()[:7] == [
        SOURCE,
        "fake",
        "declared",
        "on",
        "registered",
        f"{BASE}/hooks/{SOURCE}/",
        "-",
    ]
    assert "Hook 1 registered" in line
    assert secret not in output

    assert _run("trigger_sources", "list", "--format", "table") == output
    listed = json.loads(_run("trigger_sources", "list", "--format", "json"))
    assert json.loads(_run("trigger_sources", "list", "--json")) == listed  # the old spelling
    mine = next(item for item in listed if item["name"] == SOURCE)
    assert mine == {
        "name": SOURCE,
        "provider": "fake",
        "declared": True,
        "enabled": True,
        "status": "registered",
        "url": f"{BASE}/hooks/{SOURCE}/",
        "url_missing": None,
        "refused": {},
        "state": {"hook_id": 1},
        "detail": f"Hook 1 registered to post to {BASE}/hooks/{SOURCE}/.",
    }
    other = next(item for item in listed if item["name"] == "github-pushes")
    assert (other["status"], other["enabled"]) == ("off", False)

    # Refused deliveries show by reason; a name without a source row adds nothing.
    for _ in range(2):
        TriggerRefusal.objects.tally(SOURCE, "bad_signature", 401)
    TriggerRefusal.objects.tally(SOURCE, "not_receiving", 404)
    TriggerRefusal.objects.tally("no-such-source", "not_receiving", 404)
    [line] = [
        line for line in _run("trigger_sources", "list").splitlines() if line.startswith(SOURCE)
    ]
    assert "bad_signature 2, not_receiving 1" in line
    listed = json.loads(_run("trigger_sources", "list", "--format", "json"))
    mine = next(item for item in listed if item["name"] == SOURCE)
    assert mine["refused"] == {"bad_signature": 2, "not_receiving": 1}
    assert all(item["refused"] == {} for item in listed if item["name"] != SOURCE)


def test_enable_disable_teardown_through_the_command(fake: FakeProvider) -> None:
    lifecycle.reconcile(base_url=BASE)
    assert "registered" in _run("trigger_sources", "enable", SOURCE)
    assert (_row().enabled, _row().status) == (True, "registered")
    assert "Disabled" in _run("trigger_sources", "disable", SOURCE)
    assert (_row().enabled, _row().status, _row().state) == (False, "off", None)
    _run("trigger_sources", "enable", SOURCE)
    assert "deleted" in _run("trigger_sources", "teardown", SOURCE)
    assert not TriggerSource.objects.filter(name=SOURCE).exists()
    assert fake.hooks == {} and fake.created == 2


def test_refusals_exit_1_and_change_nothing(fake: FakeProvider) -> None:
    lifecycle.reconcile()  # no address known
    with pytest.raises(CommandError, match="no address") as caught:
        _run("trigger_sources", "enable", SOURCE)
    assert caught.value.returncode == 1
    assert _row().enabled is False
    with pytest.raises(CommandError, match="Unknown trigger source: 'nope'"):
        _run("trigger_sources", "disable", "nope")
    with pytest.raises(CommandError, match="still declared"):
        _run("trigger_sources", "forget", SOURCE)
    for args in (["list"], ["disable", SOURCE], ["set-secret", SOURCE]):
        with pytest.raises(CommandError, match="Unknown database alias 'elsewhere'") as caught:
            _run("trigger_sources", *args, "--database", "elsewhere")
        assert caught.value.returncode == USAGE_ERROR
    with pytest.raises(CommandError, match="Unknown database alias 'elsewhere'") as caught:
        _run("reconcile_trigger_sources", "--database", "elsewhere")
    assert caught.value.returncode == USAGE_ERROR
    assert _row().enabled is False
    assert fake.calls == []


@pytest.mark.parametrize("action", ["enable", "disable", "teardown", "forget"])
def test_an_over_long_source_name_is_refused_as_a_source_name(action: str) -> None:
    """The operator typed a source name: the refusal names it and its limit (200), not the
    lease key it would have become."""
    with pytest.raises(
        CommandError, match="trigger source name is 315 characters long; the limit is 200"
    ) as caught:
        _run("trigger_sources", action, "x" * 315)
    assert "Lease key" not in str(caught.value)
    assert caught.value.returncode == 1
    assert not TriggerSource.objects.exists()


def test_a_failed_provider_step_exits_3(fake: FakeProvider) -> None:
    lifecycle.reconcile(base_url=BASE)
    fake.fail_setup = "GitHub answered 401"
    with pytest.raises(CommandError, match="Setup at fake failed: GitHub answered 401") as caught:
        _run("trigger_sources", "enable", SOURCE)
    assert caught.value.returncode == EXIT_PROVIDER_FAILED == 3
    assert (_row().enabled, _row().status) == (True, "failed")


def test_the_outcome_is_reported_once_with_switch_and_status(
    fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    lifecycle.reconcile(base_url=BASE)
    caplog.set_level(logging.INFO, logger="django_leases")
    fake.fail_setup = "GitHub answered 401"
    with pytest.raises(CommandError) as caught:
        _run("trigger_sources", "enable", SOURCE)
    assert str(caught.value).startswith(f"{SOURCE} (on, status failed): Setup at fake failed")
    fake.fail_setup = None
    output = _run("trigger_sources", "enable", SOURCE)
    assert output.startswith(f"{SOURCE} (on, status registered): Hook ")
    assert _run("trigger_sources", "disable", SOURCE).startswith(f"{SOURCE} (off): Disabled")
    # The command printed each outcome; the lifecycle's own record of it was not echoed too.
    assert not [r for r in caplog.records if SOURCE in r.getMessage()]
    # Outside the command the lifecycle still logs its outcomes.
    lifecycle.enable(SOURCE)
    assert [r for r in caplog.records if f"{SOURCE!r} set up" in r.getMessage()]


def test_forget_an_orphan(fake: FakeProvider) -> None:
    lifecycle.reconcile(base_url=BASE)
    registry.unregister(SOURCE)
    lifecycle.reconcile()
    assert "Forgotten." in _run("trigger_sources", "forget", SOURCE)
    assert not TriggerSource.objects.filter(name=SOURCE).exists()


def test_set_secret_reads_stdin_and_never_echoes(fake: FakeProvider) -> None:
    lifecycle.reconcile(base_url=BASE)
    output = _run("trigger_sources", "set-secret", SOURCE, stdin=io.StringIO("s3cret-value\n"))
    assert "Stored the signing secret" in output and "s3cret" not in output
    assert credentials.get_secret(SOURCE) == "s3cret-value"
    with pytest.raises(CommandError, match="No secret"):
        _run("trigger_sources", "set-secret", SOURCE, stdin=io.StringIO("\n"))
    with pytest.raises(CommandError, match="Unknown trigger source"):
        _run("trigger_sources", "set-secret", "nope", stdin=io.StringIO("x\n"))
    assert credentials.get_secret(SOURCE) == "s3cret-value"
    assert credentials.get_secret("nope") is None


@pytest.mark.slow
def test_the_real_command_exit_statuses_and_stderr(subprocess_env: dict[str, str]) -> None:
    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return manage(*args, env=subprocess_env, stdin=stdin)

    done = run("reconcile_trigger_sources")
    assert done.returncode == 0, done.stderr
    missing = run("trigger_sources", "enable", "github-pushes")
    assert missing.returncode == 1
    assert "no address" in missing.stderr and missing.stdout == ""
    unknown = run("trigger_sources", "disable", "nope")
    assert unknown.returncode == 1 and "Unknown trigger source" in unknown.stderr
    stored = run("trigger_sources", "set-secret", "github-pushes", stdin="from-stdin\n")
    assert stored.returncode == 0, stored.stderr
    assert "from-stdin" not in stored.stdout + stored.stderr
    assert credentials.get_secret("github-pushes") == "from-stdin"
    listed = run("trigger_sources", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    names = [item["name"] for item in json.loads(listed.stdout)]
    assert "github-pushes" in names and names == sorted(names)
    helped = run("trigger_sources", "--help")
    assert helped.returncode == 0 and "set-secret" in helped.stdout
    unknown_db = run("trigger_sources", "list", "--database", "elsewhere")
    assert unknown_db.returncode == USAGE_ERROR
    assert "Unknown database alias 'elsewhere'" in unknown_db.stderr
    rotated = run("rotate_trigger_secrets", "--database", "elsewhere")
    assert rotated.returncode == USAGE_ERROR and "Traceback" not in rotated.stderr
    assert "Unknown database alias 'elsewhere'" in rotated.stderr
    for command in ("trigger_sources", "reconcile_trigger_sources", "rotate_trigger_secrets"):
        helped = run(command, "--help")
        epilog = helped.stdout.split("exit codes:\n", 1)[1]
        shown = [line.split()[0] for line in epilog.splitlines() if line[2:3].strip()]
        assert shown == [row.shown for row in EXIT_CODES[command].rows], command
        if command == "trigger_sources":
            assert str(EXIT_BUSY) in shown


@pytest.mark.parametrize("command", ["reconcile_trigger_sources", "trigger_sources"])
@pytest.mark.parametrize("wait", ["nan", "-1", "inf", "3601"])
def test_the_trigger_commands_refuse_a_bad_wait(command: str, wait: str) -> None:
    import importlib

    module = importlib.import_module(f"django_leases.management.commands.{command}")
    parser = module.Command().create_parser("manage.py", command)
    args = ["enable", SOURCE] if command == "trigger_sources" else []
    with pytest.raises(CommandError, match="--wait"):  # parsed only: nothing is done
        parser.parse_args([*args, "--wait", wait])


def test_list_says_why_a_source_has_no_url(settings: Any) -> None:
    """URL ``-`` alone told nobody why: the table says it (with the fix on stderr), the
    JSON names it in ``url_missing``."""
    lifecycle.reconcile()  # no address known
    err = StringIO()
    out = StringIO()
    call_command("trigger_sources", "list", stdout=out, stderr=err)
    [line] = [line for line in out.getvalue().splitlines() if line.startswith("github-pushes")]
    assert "- (no address)" in line
    assert "reconcile_trigger_sources --base-url" in err.getvalue()
    listed = json.loads(_run("trigger_sources", "list", "--format", "json"))
    assert {item["url_missing"] for item in listed} == {"no_address"}

    lifecycle.reconcile(base_url=BASE)
    settings.ROOT_URLCONF = "tests.urls_without_leases"
    err = StringIO()
    out = StringIO()
    call_command("trigger_sources", "list", stdout=out, stderr=err)
    [line] = [line for line in out.getvalue().splitlines() if line.startswith("github-pushes")]
    assert "- (no route)" in line
    assert "include('django_leases.urls')" in err.getvalue()
    listed = json.loads(_run("trigger_sources", "list", "--format", "json"))
    assert {item["url_missing"] for item in listed} == {"no_route"}
    assert {item["url"] for item in listed} == {None}


def test_set_secret_updates_an_enabled_manual_source_s_instructions() -> None:
    webhook_source("cmd-by-hand", provider="manual", events={})
    try:
        lifecycle.reconcile(base_url=BASE)
        lifecycle.enable("cmd-by-hand")
        assert (
            "Then store its signing secret" in TriggerSource.objects.get(name="cmd-by-hand").detail
        )
        _run("trigger_sources", "set-secret", "cmd-by-hand", stdin=io.StringIO("by-command-1\n"))
        detail = TriggerSource.objects.get(name="cmd-by-hand").detail
        assert "signing secret stored for source 'cmd-by-hand'" in detail
    finally:
        registry.unregister("cmd-by-hand")

"""System checks: each one fires on the setting that breaks leases and stays quiet otherwise."""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

import pytest
from django.core import checks as django_checks
from django.db import connection
from django.test import override_settings

from django_leases import checks
from django_leases.conf import DEFAULTS, leases_settings
from django_leases.triggers import registry
from django_leases.triggers.registry import StartWorkflow, TriggerDeclaration, webhook_source
from django_leases.validation import TTL_CEILING
from django_leases.workflows import workflow

GOOD_SQLITE: dict[str, Any] = {
    "NAME": "/tmp/leases.sqlite3",
    "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
}


def _ids(messages: list[django_checks.CheckMessage]) -> list[str]:
    return sorted(message.id or "" for message in messages)


def _sqlite(**changes: Any) -> dict[str, Any]:
    settings_dict = {"NAME": GOOD_SQLITE["NAME"], "OPTIONS": dict(GOOD_SQLITE["OPTIONS"])}
    options = changes.pop("OPTIONS", None)
    if options is not None:
        settings_dict["OPTIONS"] = options
    settings_dict.update(changes)
    return settings_dict


def _registered(databases: list[str] | None = None) -> list[django_checks.CheckMessage]:
    """Our checks, as ``check`` runs them; with ``databases``, as ``check --database`` does
    (the database-tagged ones too, on those databases)."""
    # Only our tag: Django 6's model checks would query the database here.
    tags = ["django_leases"] if databases is None else ["django_leases", "database"]
    return [
        message
        for message in django_checks.run_checks(tags=tags, databases=databases)
        if (message.id or "").startswith("django_leases.")
    ]


def _database_ids(messages: list[django_checks.CheckMessage]) -> list[str]:
    # The trigger checks (W008/W009/W014) depend on the demo's sources, and W036 on the
    # suite's transactional step functions (tests/workapp) on SQLite; leave them out.
    left_out = ("django_leases.W008", "django_leases.W009", "django_leases.W014")
    return [id_ for id_ in _ids(messages) if id_ not in (*left_out, "django_leases.W036")]


def _driver_ids() -> list[str]:
    """What the registered check says of the PostgreSQL driver on this pass: I032 on the
    psycopg2 pass alone (Django takes psycopg 3 whenever it is importable)."""
    on_psycopg2 = connection.vendor == "postgresql" and find_spec("psycopg") is None
    return ["django_leases.I032"] if on_psycopg2 else []


# -- SQLite ------------------------------------------------------------------------------------


def test_good_sqlite_settings_are_quiet() -> None:
    assert checks.check_database_settings("default", "sqlite", _sqlite()) == []
    exclusive = _sqlite(OPTIONS={"transaction_mode": "exclusive", "timeout": 5})
    assert checks.check_database_settings("default", "sqlite", exclusive) == []


@pytest.mark.parametrize(
    "options",
    [{"timeout": 20}, {"transaction_mode": "DEFERRED", "timeout": 20}, {"timeout": 20, "x": 1}],
)
def test_w001_sqlite_without_immediate(options: dict[str, Any]) -> None:
    messages = checks.check_database_settings("default", "sqlite", _sqlite(OPTIONS=options))
    assert _ids(messages) == ["django_leases.W001"]
    assert messages[0].hint and "IMMEDIATE" in messages[0].hint
    assert isinstance(messages[0], django_checks.Warning)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        # No timeout: Python's sqlite3 default of 5 s, which is what the check asks for.
        ({"transaction_mode": "IMMEDIATE"}, None),
        ({"transaction_mode": "IMMEDIATE", "timeout": 0}, "fails at once"),
        ({"transaction_mode": "IMMEDIATE", "timeout": 1}, "waits at most 1 s, then fails"),
        ({"transaction_mode": "IMMEDIATE", "timeout": 4.5}, "waits at most 4.5 s"),
        ({"transaction_mode": "IMMEDIATE", "timeout": "soon"}, "refuses to connect"),
        ({"transaction_mode": "IMMEDIATE", "timeout": "20"}, "refuses to connect"),
        ({"transaction_mode": "IMMEDIATE", "timeout": 5}, None),
        ({"transaction_mode": "IMMEDIATE", "init_command": "PRAGMA busy_timeout = 20000;"}, None),
        (
            {"transaction_mode": "IMMEDIATE", "init_command": "PRAGMA busy_timeout=100"},
            "waits at most 0.1 s",
        ),
        # The PRAGMA runs after connecting, so it wins over the timeout.
        (
            {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA busy_timeout=0",
            },
            "fails at once",
        ),
    ],
)
def test_w002_sqlite_with_a_short_busy_timeout(options: dict[str, Any], said: str | None) -> None:
    messages = checks.check_database_settings("default", "sqlite", _sqlite(OPTIONS=options))
    assert _ids(messages) == (["django_leases.W002"] if said else [])
    if said:
        assert said in messages[0].msg
        assert "no busy timeout" not in messages[0].msg


def test_w002_default_is_what_a_connection_without_timeout_gets(tmp_path: Any) -> None:
    # The check's premise, measured on a real connection through Django's backend.
    from django.db.backends.sqlite3.base import DatabaseWrapper

    settings_dict = dict(connection.settings_dict)
    settings_dict.update(
        ENGINE="django.db.backends.sqlite3",
        NAME=str(tmp_path / "w002.sqlite3"),
        OPTIONS={"transaction_mode": "IMMEDIATE"},
    )
    wrapper = DatabaseWrapper(settings_dict, alias="w002")
    # The DB-API connection Django's backend opens (below pytest-django's access guard).
    raw = wrapper.get_new_connection(wrapper.get_connection_params())
    try:
        (milliseconds,) = raw.execute("PRAGMA busy_timeout").fetchone()
    finally:
        raw.close()
    assert milliseconds / 1000 == checks.SQLITE_DEFAULT_TIMEOUT == checks.MIN_BUSY_TIMEOUT


def test_e003_sqlite_without_returning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "sqlite_version", lambda: (3, 34, 1))
    messages = checks.check_database_settings("default", "sqlite", _sqlite())
    assert _ids(messages) == ["django_leases.E003"]
    assert isinstance(messages[0], django_checks.Error)
    assert "3.34.1" in messages[0].msg
    monkeypatch.setattr(checks, "sqlite_version", lambda: (3, 35, 0))
    assert checks.check_database_settings("default", "sqlite", _sqlite()) == []


@pytest.mark.parametrize(
    ("name", "fires"),
    [
        (":memory:", True),
        ("", True),
        ("file:leases?mode=memory", True),
        ("file:leases?mode=memory&cache=shared", False),
        ("/var/lib/app/db.sqlite3", False),
    ],
)
def test_w006_private_in_memory_sqlite(name: str, fires: bool) -> None:
    messages = checks.check_database_settings("default", "sqlite", _sqlite(NAME=name))
    assert _ids(messages) == (["django_leases.W006"] if fires else [])


def test_sqlite_checks_leave_postgresql_alone() -> None:
    settings_dict = {"NAME": "app", "OPTIONS": {}}
    assert checks.check_database_settings("default", "postgresql", settings_dict) == []


# -- any database ------------------------------------------------------------------------------


@pytest.mark.parametrize("vendor", ["sqlite", "postgresql", "mysql"])
def test_w004_atomic_requests(vendor: str) -> None:
    settings_dict = _sqlite(ATOMIC_REQUESTS=True)
    messages = checks.check_database_settings("default", vendor, settings_dict)
    assert _ids(messages) == ["django_leases.W004"]
    assert "renewal" in messages[0].msg
    assert checks.check_database_settings("default", vendor, _sqlite(ATOMIC_REQUESTS=False)) == []


@pytest.mark.parametrize("vendor", ["sqlite", "postgresql", "mysql"])
def test_e007_autocommit_off(vendor: str) -> None:
    messages = checks.check_database_settings("default", vendor, _sqlite(AUTOCOMMIT=False))
    assert _ids(messages) == ["django_leases.E007"]
    assert checks.check_database_settings("default", vendor, _sqlite(AUTOCOMMIT=True)) == []


def test_w012_postgresql_isolation_above_read_committed() -> None:
    # Django's levels come from the PostgreSQL driver: a SQLite or MariaDB cell of the matrix
    # (noxfile.py) has none; make test's passes all do.
    psycopg_any = pytest.importorskip(
        "django.db.backends.postgresql.psycopg_any",
        reason="no PostgreSQL driver in this venv",
        exc_type=ImportError,
    )
    IsolationLevel = psycopg_any.IsolationLevel

    for level, fires in [
        (IsolationLevel.SERIALIZABLE, True),
        (IsolationLevel.REPEATABLE_READ, True),
        (IsolationLevel.READ_COMMITTED, False),
    ]:
        settings_dict = {"NAME": "app", "OPTIONS": {"isolation_level": level}}
        messages = checks.check_database_settings("default", "postgresql", settings_dict)
        assert _ids(messages) == (["django_leases.W012"] if fires else []), level


# -- MariaDB / MySQL settings (the database's own answers: tests/test_mysql_backend.py) ------


@pytest.mark.parametrize(
    ("level", "fires"),
    [
        ("read committed", False),
        ("READ COMMITTED", False),
        ("repeatable read", True),
        ("serializable", True),
        ("read uncommitted", True),
    ],
)
def test_e017_mysql_isolation_level_setting(level: str, fires: bool) -> None:
    messages = checks.check_mysql_settings("default", {"OPTIONS": {"isolation_level": level}})
    assert [m.id for m in messages] == (["django_leases.E017"] if fires else [])


def test_e018_mysql_client_flag_without_found_rows() -> None:
    assert _ids(checks.check_mysql_settings("default", {"OPTIONS": {"client_flag": 0}})) == [
        "django_leases.E018"
    ]
    found_rows = {"OPTIONS": {"client_flag": checks.MYSQL_FOUND_ROWS | 1}}
    assert checks.check_mysql_settings("default", found_rows) == []
    assert checks.check_mysql_settings("default", {"OPTIONS": {}}) == []


# -- routing -----------------------------------------------------------------------------------


class MissingAliasRouter:
    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return "elsewhere" if model._meta.app_label == "django_leases" else None


class ReplicaReadsRouter:
    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return "replica" if model._meta.app_label == "django_leases" else None


@override_settings(DATABASE_ROUTERS=["tests.test_checks.MissingAliasRouter"])
def test_e005_router_sends_writes_to_a_missing_database() -> None:
    messages = [m for m in _registered() if m.id == "django_leases.E005"]
    assert messages
    assert "'elsewhere'" in messages[0].msg
    assert isinstance(messages[0], django_checks.Error)


@override_settings(DATABASE_ROUTERS=["tests.test_checks.ReplicaReadsRouter"])
def test_w011_reads_routed_away_from_writes() -> None:
    messages = [m for m in _registered() if m.id == "django_leases.W011"]
    assert messages and "'replica'" in messages[0].msg


def test_routing_is_quiet_without_a_router() -> None:
    assert not [m for m in _registered() if m.id in ("django_leases.E005", "django_leases.W011")]


# -- the registered check against the running settings -----------------------------------------


def test_the_suites_own_settings_are_quiet() -> None:
    assert _database_ids(_registered()) == _driver_ids()


def test_registered_check_sees_atomic_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    assert _database_ids(_registered()) == sorted(["django_leases.W004", *_driver_ids()])


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite settings")
def test_registered_check_sees_deferred_sqlite(monkeypatch: pytest.MonkeyPatch) -> None:
    options = {
        key: value
        for key, value in connection.settings_dict["OPTIONS"].items()
        if key != "transaction_mode"
    }
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    assert _database_ids(_registered()) == ["django_leases.W001"]


# -- webhooks ----------------------------------------------------------------------------------


def _declaration(name: str = "hooks", workflow: str = "known") -> TriggerDeclaration:
    return TriggerDeclaration(
        name=name, provider="github", events={"push": StartWorkflow(workflow)}
    )


def _known(name: str) -> bool:
    return name == "known"


def test_webhook_settings_quiet_when_complete() -> None:
    messages = checks.check_webhook_settings([_declaration()], {"hooks": "s"}, 1024, _known)
    assert messages == []


def test_w008_source_without_secret() -> None:
    for secrets in ({}, {"hooks": ""}, {"other": "s"}):
        messages = checks.check_webhook_settings(
            [_declaration()], secrets, 1024, _known, stored=set(), enabled={"hooks"}
        )
        assert _ids(messages) == ["django_leases.W008"]
        assert "'hooks'" in messages[0].msg


def test_w009_source_starting_an_unregistered_workflow() -> None:
    messages = checks.check_webhook_settings(
        [_declaration(workflow="missing")], {"hooks": "s"}, 1024, _known
    )
    assert _ids(messages) == ["django_leases.W009"]
    assert "'missing'" in messages[0].msg


@pytest.mark.parametrize(
    ("secrets", "max_body"),
    [({}, 0), ({}, -1), ({}, "1MB"), ({}, True), ({}, 1.5), ("s3cr3t", 1024), ({"a": 1}, 1024)],
)
def test_e010_unusable_webhook_settings(secrets: Any, max_body: Any) -> None:
    messages = checks.check_webhook_settings([], secrets, max_body, _known)
    assert _ids(messages) == ["django_leases.E010"]


# -- W014: the credential store cannot be read -------------------------------------------------

STORE_ALIAS = "checks_store"


class StoreReadsRouter:
    """Reads of trigger sources and secrets go to :data:`STORE_ALIAS`."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        if model._meta.label in ("django_leases.TriggerSecret", "django_leases.TriggerSource"):
            return STORE_ALIAS
        return None


@pytest.fixture
def store_alias(settings: Any, django_db_blocker: Any) -> Any:
    """Add :data:`STORE_ALIAS` (a SQLite file named by the test) and route store reads there.

    The test takes no ``django_db``: the check must meet the alias's real error, not Django's
    test-case guard, and nothing it reads is routed to ``default``.
    """
    from django.db import connections

    def use(name: str) -> None:
        config = dict(connections.settings["default"])
        config.update(ENGINE="django.db.backends.sqlite3", NAME=name, OPTIONS={}, TEST={})
        connections.settings[STORE_ALIAS] = config
        settings.DATABASE_ROUTERS = [f"{__name__}.StoreReadsRouter"]

    with django_db_blocker.unblock():
        yield use
    try:
        connections[STORE_ALIAS].close()
        del connections[STORE_ALIAS]
    except Exception:
        pass
    connections.settings.pop(STORE_ALIAS, None)


def _secret_messages(*names: str, database: str = "default") -> list[django_checks.CheckMessage]:
    """W008 / W014 for ``names``: a database check, run as ``check --database`` runs it."""
    return [
        m
        for m in _registered(databases=[database])
        if m.id in ("django_leases.W008", "django_leases.W014")
        and any(f"{name!r}" in m.msg for name in names)
    ]


@pytest.fixture
def two_sources() -> Any:
    webhook_source("checks-manual-src", provider="manual", events={})
    webhook_source("checks-github-src", provider="github", events={}, config={"repository": "o/r"})
    yield ("checks-manual-src", "checks-github-src")
    registry.unregister("checks-manual-src")
    registry.unregister("checks-github-src")


def _assert_could_not_check(messages: list[django_checks.CheckMessage], why: str) -> None:
    assert _ids(messages) == ["django_leases.W014", "django_leases.W014"]
    for message in messages:
        assert message.msg.startswith("Could not check whether trigger source ")
        assert f"the credential store on database {STORE_ALIAS!r} could not be read" in message.msg
        assert why in message.msg
        assert "Disable and enable" not in (message.hint or "")
        assert "migrate" in (message.hint or "")


def test_w014_when_the_store_database_is_unreachable(store_alias: Any, two_sources: Any) -> None:
    store_alias("/nonexistent-django-leases-dir/store.sqlite3")
    messages = _secret_messages(*two_sources, database=STORE_ALIAS)
    _assert_could_not_check(messages, "unable to open database file")


def test_the_store_is_not_asked_before_migrate_nor_without_database(
    store_alias: Any, two_sources: Any, tmp_path: Any
) -> None:
    # migrate runs the database checks before it migrates: on a fresh database they must not
    # tell the user to run migrate (migrate creates the store; check --database after it).
    store_alias(str(tmp_path / "unmigrated.sqlite3"))
    assert _secret_messages(*two_sources, database=STORE_ALIAS) == []
    # Plain `check` (no --database) asks no database at all.
    assert [m for m in _registered() if m.id in ("django_leases.W008", "django_leases.W014")] == []


@pytest.mark.django_db
def test_w008_when_the_store_is_read_and_holds_no_secret(two_sources: Any) -> None:
    manual, _github = two_sources
    messages = _secret_messages(*two_sources)
    # The manual source needs one; the GitHub one is off, so its setup has not run yet.
    assert [(m.id, f"{manual!r}" in m.msg) for m in messages] == [("django_leases.W008", True)]
    assert "has no signing secret" in messages[0].msg


@workflow("checks-known-workflow")
def _known_workflow(run: Any, input: Any) -> None:
    return None


def test_registered_check_sees_declarations(settings: Any) -> None:
    webhook_source(
        "checks-source",
        provider="github",
        events={"push": StartWorkflow("checks-known-workflow"), "x": StartWorkflow("nope")},
    )
    try:
        settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {}}
        # The settings checks ask no database (the store is the database checks').
        messages = [m for m in _registered() if "'checks-source'" in m.msg]
        assert _ids(messages) == ["django_leases.W009"]
        assert "'nope'" in messages[0].msg
        # No database access in this test: the store check cannot read the store.
        stored = checks.stored_secrets_check(databases=["default"])
        assert _ids([m for m in stored if "'checks-source'" in m.msg]) == ["django_leases.W014"]
        settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {"checks-source": "s"}}
        messages = [m for m in _registered() if "'checks-source'" in m.msg]
        assert _ids(messages) == ["django_leases.W009"]
    finally:
        registry.unregister("checks-source")


# -- DJANGO_LEASES: unknown keys (E015) and unusable values (E016) -----------------------------


def test_every_setting_has_a_rule_and_its_default_follows_it() -> None:
    from django_leases.conf import DEFAULTS

    webhook_keys = {"WEBHOOK_MAX_BODY", "WEBHOOK_SECRETS"}  # E010's
    assert set(checks.SETTING_RULES) | webhook_keys == set(DEFAULTS)
    assert checks.check_leases_settings(dict(DEFAULTS)) == []
    assert checks.check_leases_settings(None) == []
    assert checks.check_leases_settings({}) == []


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("DEFAULT_TLL", "DEFAULT_TTL"),
        ("default_ttl", "DEFAULT_TTL"),
        ("STEP_LEASE_TIMEOUT", "STEP_LEASE_TTL"),
        ("WEBHOOK_SECRET", "WEBHOOK_SECRETS"),
        ("PREPARED_STATEMENT", "PREPARED_STATEMENTS"),
        ("WORKER-WAKEUP", "WORKER_WAKEUP"),
        ("NOTHING_LIKE_IT", None),
        (42, None),
    ],
)
def test_e015_names_an_unknown_key_and_the_key_meant(key: Any, meant: str | None) -> None:
    (message,) = checks.check_leases_settings({key: 1, "DEFAULT_TTL": 30})
    assert message.id == "django_leases.E015"
    assert isinstance(message, django_checks.Error)
    assert f"unknown key {key!r}" in message.msg
    if meant:
        assert message.hint == f"Did you mean {meant!r}?"
    else:
        assert "DEFAULT_TTL" in (message.hint or "") and "Did you mean" not in (message.hint or "")


def test_e015_django_leases_that_is_not_a_dict() -> None:
    (message,) = checks.check_leases_settings([("DEFAULT_TTL", 30)])
    assert message.id == "django_leases.E015"
    assert "must be a dict, not list" in message.msg


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("DEFAULT_TTL", 0, "greater than 0"),
        ("DEFAULT_TTL", "30", "not str"),
        ("DEFAULT_TTL", 0.1, "at least 0.15"),  # shorter than three renewals
        ("RENEWAL_FLOOR", 0, "greater than 0"),
        ("RENEWAL_FLOOR", -1.0, "greater than 0"),
        ("MAX_TTL", 0, "greater than 0"),
        ("MAX_TTL", 1e12, "longer than the limit of 3162240000.0 s"),
        ("MAX_TTL", TTL_CEILING + 1, "longer than the limit"),
        ("STEP_LEASE_TTL", -5, "greater than 0"),
        ("STEP_LEASE_TTL", True, "not bool"),
        ("WORKER_POLL_INTERVAL", 0, "greater than 0"),
        ("WORKER_POLL_INTERVAL", "1", "not str"),
        ("WORKER_SHUTDOWN_GRACE", -1, "at least 0"),
        ("HOLD_LEASE_KILL_GRACE", "10", "not str"),
        ("PROVIDER_TIMEOUT", 0, "greater than 0"),
        ("STRIPE_TOLERANCE", 0, "greater than 0"),
        ("STRIPE_TOLERANCE", float("nan"), "finite"),
        ("WORKER_WAKEUP", "Poll", 'must be "auto" or "poll"'),
        ("WORKER_WAKEUP", "listen", 'must be "auto" or "poll"'),
        ("TUNED_SQL", "false", "must be True or False"),
        ("TUNED_SQL", 0, "must be True or False"),
        ("PREPARED_STATEMENTS", "no", "must be True or False"),
        ("GITHUB_API_URL", "api.github.com", "http(s) URL"),
        ("STRIPE_API_URL", None, "http(s) URL"),
        ("GITHUB_TOKEN", "", "non-empty str"),
        ("STRIPE_API_KEY", 123, "non-empty str"),
        ("SECRET_KEYS", "one-key", "list of Fernet keys"),
        ("SECRET_KEYS", [], "empty"),
        ("SECRET_KEYS", ["not-a-fernet-key"], "item 1 is not a Fernet key"),
        ("STRIPE_API_VERSION", "latest", "a Stripe API version looks like"),
        ("BASE_URL", "app.example.com", "not an http(s) URL"),
        ("BASE_URL", "", "not an http(s) URL"),
        ("STRIPE_API_VERSION", 20250331, "a Stripe API version looks like"),
        ("MAX_EVENT_PAYLOAD", 0, "must be a positive int (bytes)"),
        ("MAX_EVENT_PAYLOAD", "1MB", "must be a positive int (bytes)"),
        ("MAX_EVENT_PAYLOAD", 1048576.0, "must be a positive int (bytes)"),
        ("MAX_EVENT_PAYLOAD", True, "must be a positive int (bytes)"),
        ("MAX_EVENT_PAYLOAD", None, "must be a positive int (bytes)"),
    ],
)
def test_e016_a_value_of_the_wrong_type_or_range(key: str, value: Any, said: str) -> None:
    (message,) = checks.check_leases_settings({key: value})
    assert message.id == "django_leases.E016"
    assert isinstance(message, django_checks.Error)
    assert f"DJANGO_LEASES[{key!r}]" in message.msg
    assert said in message.msg
    if key in ("GITHUB_TOKEN", "STRIPE_API_KEY", "SECRET_KEYS") and value:
        assert repr(value) not in message.msg  # a secret is never quoted


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("DEFAULT_TTL", 5),
        ("MAX_TTL", TTL_CEILING),
        ("WORKER_POLL_INTERVAL", None),
        ("WORKER_POLL_INTERVAL", 0.5),
        ("WORKER_SHUTDOWN_GRACE", 0),  # no grace is a choice
        ("WORKER_WAKEUP", "poll"),
        ("TUNED_SQL", False),
        ("GITHUB_TOKEN", "ghp_x"),
        ("SECRET_KEYS", ["jW0Jb6eRWSWgwzGsX8bPJ6qyjM0kqwSFQrYfbTK9lvE="]),
        ("WEBHOOK_SECRETS", {"a": "s"}),
        ("STRIPE_API_VERSION", "2020-08-27"),
        ("BASE_URL", None),
        ("BASE_URL", "https://app.example.com/prefix/"),
        ("MAX_EVENT_PAYLOAD", 1),
        ("MAX_EVENT_PAYLOAD", 100 * 1024 * 1024),
        ("STRIPE_API_VERSION", "2025-03-31.basil"),
    ],
)
def test_e016_quiet_for_usable_values(key: str, value: Any) -> None:
    assert checks.check_leases_settings({key: value}) == []


@pytest.mark.parametrize("value", [["DEFAULT_TTL"], "DEFAULT_TTL=30"])
def test_registered_check_reports_a_django_leases_that_is_not_a_dict(
    value: Any, settings: Any
) -> None:
    """Every check runs (none crashes reading a setting from it) and E015 says why."""
    settings.DJANGO_LEASES = value
    messages = [m for m in _registered() if m.id == "django_leases.E015"]
    assert len(messages) == 1
    assert "must be a dict" in messages[0].msg
    assert DEFAULTS["DEFAULT_TTL"] == leases_settings.DEFAULT_TTL  # ignored, as said


def test_registered_check_reads_django_leases(settings: Any) -> None:
    settings.DJANGO_LEASES = {"DEFAULT_TLL": 60, "TUNED_SQL": "false"}
    messages = [m for m in _registered() if m.id in ("django_leases.E015", "django_leases.E016")]
    assert _ids(messages) == ["django_leases.E015", "django_leases.E016"]
    assert "Did you mean 'DEFAULT_TTL'?" in [m.hint for m in messages]


def test_w040_declared_sources_without_the_receiving_urls() -> None:
    """A project that declares sources but forgot ``include("django_leases.urls")`` is told
    so (their URL is ``-`` and enabling fails); with it, or with nothing declared, quiet."""
    declared = [TriggerDeclaration("hooks-a", "manual")]
    assert _ids(checks.check_receive_route(declared, True)) == ["django_leases.W040"]
    assert "hooks-a" in checks.check_receive_route(declared, True)[0].msg
    assert checks.check_receive_route(declared, False) == []
    assert checks.check_receive_route([], True) == []

    assert checks.receive_route_missing() is False  # the test URLconf includes it
    with override_settings(ROOT_URLCONF="tests.urls_without_leases"):
        assert checks.receive_route_missing() is True
        assert "django_leases.W040" in _ids(_registered())
    assert "django_leases.W040" not in _ids(_registered())


@pytest.mark.django_db
def test_our_partial_indexes_raise_no_w037_where_conditions_are_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On MariaDB / MySQL Django warns ``models.W037`` for a model with a partial index.
    For ours the full index serves the same queries (documented), so the warning is ours to
    silence — for our models only."""
    from django_leases.models import WorkflowRun, WorkflowStep

    monkeypatch.setattr(connection.features, "supports_partial_indexes", False)
    for model in (WorkflowRun, WorkflowStep):
        # What Django itself says of the model…
        plain = super(model, model).check(databases=[connection.alias])
        assert "models.W037" in _ids(plain), model
        # …and what the check run reports.
        assert "models.W037" not in _ids(model.check(databases=[connection.alias])), model
    everything = django_checks.run_checks(
        databases=[connection.alias], include_deployment_checks=False
    )
    assert not [
        m for m in everything if m.id == "models.W037" and m.obj in (WorkflowRun, WorkflowStep)
    ]

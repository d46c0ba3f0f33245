from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_models_and_migrations_agree() -> None:
    out = StringIO()
    try:
        call_command("makemigrations", "django_leases", "--check", "--dry-run", stdout=out)
    except SystemExit as exc:  # --check exits 1 when a migration would be created
        pytest.fail(f"makemigrations would create a migration:\n{out.getvalue()}")
        raise AssertionError from exc


def _latest_functions_migration() -> tuple[str, dict[str, str]]:
    """The latest django_leases migration that defines ``FUNCTIONS``: (name, its functions)."""
    import importlib
    import pkgutil

    import django_leases.migrations as package

    found = ("", {})
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"django_leases.migrations.{info.name}")
        if isinstance(getattr(module, "FUNCTIONS", None), dict):
            found = (info.name, module.FUNCTIONS)
    return found


def _drift() -> list[str]:
    """What differs between the current code's functions and the latest migration's."""
    from tests.functions_migration import definitions

    _, frozen = _latest_functions_migration()
    current = definitions()
    problems = [f"{name}: not in the migration" for name in sorted(set(current) - set(frozen))]
    problems += [f"{name}: not in the code" for name in sorted(set(frozen) - set(current))]
    problems += [
        f"{name}: another definition"
        for name in sorted(set(current) & set(frozen))
        if current[name] != frozen[name]
    ]
    return problems


@pytest.mark.postgres_only
@pytest.mark.django_db
def test_the_latest_functions_migration_holds_the_code_s_functions() -> None:
    """As ``makemigrations --check`` for the PostgreSQL functions: regenerate with
    ``python -m tests.functions_migration <name>`` (see that module)."""
    from django_leases.models.workflow import FUNCTIONS_MIGRATION

    name, frozen = _latest_functions_migration()
    assert name == FUNCTIONS_MIGRATION, "FUNCTIONS_MIGRATION does not name the latest one"
    assert frozen, "no migration holds the functions"
    assert _drift() == [], "the functions changed without a migration"


@pytest.mark.postgres_only
@pytest.mark.django_db
def test_the_drift_check_fails_when_the_generator_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_leases.workflows import sql

    monkeypatch.setattr(sql, "FUNCTION_SETTINGS", sql.FUNCTION_SETTINGS + " SET work_mem = '8MB'")
    drift = _drift()
    assert drift and all("not in the" in problem for problem in drift), drift


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_the_migrations_install_the_functions_and_drop_earlier_ones() -> None:
    from django.db import connection

    from django_leases.health import missing_functions

    assert missing_functions(connection) == []
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION dl_complete_run_000000000000() RETURNS int LANGUAGE sql AS 'SELECT 1'"
        )
    call_command("migrate", "django_leases", "0003", verbosity=0)
    call_command("migrate", "django_leases", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_proc WHERE proname = 'dl_complete_run_000000000000'"
        )
        assert cursor.fetchone()[0] == 0, "an earlier function was left behind"
    assert missing_functions(connection) == []

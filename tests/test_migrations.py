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


# -- the first release's squashed migration ------------------------------------------------------

SQUASH = "0001_squashed_0030_first_release"

#: Migrates the database of DATABASE_URL with the migrations the squash replaces, one by one,
#: as a checkout before the first release did (the squash ignored), up to TARGET.
_MIGRATE_THE_OLD_WAY = """
import os, django
django.setup()
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
executor = MigrationExecutor(connection)
executor.loader = MigrationLoader(connection, replace_migrations=False)
targets = [("django_leases", os.environ["TARGET"])]
executor.migrate(targets, plan=executor.migration_plan(targets))
"""


def _scratch_name(name: str) -> str:
    """``name`` made the test database's own: suites that run at once on one server (the
    passes of ``make test``, the matrix cells) never share a scratch database."""
    from django.db import connection

    return f"{connection.settings_dict['NAME']}_{name}"


def _fresh_database_env(env: dict[str, str], name: str) -> dict[str, str]:
    """``env`` pointed at a new, empty database ``name`` on the test database's server."""
    import os
    import tempfile

    from django.db import connection

    if connection.vendor == "sqlite":
        path = os.path.join(tempfile.mkdtemp(), f"{name}.sqlite3")
        return {**env, "DATABASE_URL": f"sqlite:///{path}"}
    name = _scratch_name(name)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cursor.execute(f'CREATE DATABASE "{name}"')
        else:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
            cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    return {**env, "DATABASE_URL": env["DATABASE_URL"].rsplit("/", 1)[0] + f"/{name}"}


def _drop_database(name: str) -> None:
    from django.db import connection

    if connection.vendor == "sqlite":
        return
    name = _scratch_name(name)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        else:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")


#: In a database migrated the old way up to 0027 (before a functions migration), leaves an
#: earlier function of a family behind, then migrates as ``manage.py migrate`` does; prints what
#: is left of that function and what the code's functions lack.
_LEAVE_AN_EARLIER_FUNCTION = (
    _MIGRATE_THE_OLD_WAY
    + """
with connection.cursor() as cursor:
    cursor.execute(
        "CREATE FUNCTION dl_complete_run_000000000000() RETURNS int LANGUAGE sql AS 'SELECT 1'"
    )
from django.core.management import call_command
call_command("migrate", "django_leases", verbosity=0)
from django_leases.health import missing_functions
with connection.cursor() as cursor:
    cursor.execute("SELECT count(*) FROM pg_proc WHERE proname = 'dl_complete_run_000000000000'")
    print("left", cursor.fetchone()[0], "missing", missing_functions(connection))
"""
)


@pytest.mark.postgres_only
@pytest.mark.timeout(600)
def test_the_migrations_install_the_functions_and_drop_earlier_ones(
    subprocess_env: dict[str, str],
) -> None:
    """A functions migration installs the code's functions and drops the earlier ones of
    their families (a database migrated before the first release meets ``0028`` on its way
    up). Run in a database of its own: the test database's history holds the squashed
    migration, which cannot be unapplied to a migration it replaces."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    name = "dl_functions_drop"
    env = _fresh_database_env(subprocess_env, name)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _LEAVE_AN_EARLIER_FUNCTION],
            cwd=ROOT,
            env={**env, "TARGET": "0027_workflow_step_claimants"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n")[-2] == "left 0 missing []", done.stdout
    finally:
        _drop_database(name)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("migrated_to", ["0030_lease_epochs", "0026_workflow_functions"])
def test_a_database_migrated_before_the_first_release_upgrades(
    migrated_to: str, subprocess_env: dict[str, str]
) -> None:
    """A checkout before the first release migrated its database with the migrations the
    squashed one replaces — all of them, or up to an older one. ``migrate`` then applies
    what is missing of them (nothing, or the rest), counts the squashed migration as
    applied, and leaves a schema the models agree with."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    name = f"dl_squash_{migrated_to[:4]}"
    env = _fresh_database_env(subprocess_env, name)
    try:
        old = subprocess.run(
            [sys.executable, "-c", _MIGRATE_THE_OLD_WAY],
            cwd=ROOT,
            env={**env, "TARGET": migrated_to},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert old.returncode == 0, old.stderr
        done = subprocess.run(
            [sys.executable, "manage.py", "migrate", "django_leases", "-v", "1"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        import re

        applied = re.findall(r"Applying django_leases\.(\w+)", done.stdout)
        missing = [f"00{n}" for n in range(int(migrated_to[:4]) + 1, 31)]
        # What it lacked of the thirty, then what came after them; never the squash.
        assert [name[:4] for name in applied if name[:4] <= "0030"] == missing, applied
        assert SQUASH not in applied, "the squashed migration was applied on top"
        shown = subprocess.run(
            [sys.executable, "manage.py", "showmigrations", "django_leases"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert f"[X] {SQUASH}" in shown.stdout, shown.stdout
        check = subprocess.run(
            [sys.executable, "manage.py", "makemigrations", "--check", "--dry-run"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        _drop_database(name)


def test_the_squashed_migration_replaces_every_migration_before_it() -> None:
    """Every migration of the first release's history is replaced (a new database applies
    the squashed one alone) and stays in the package (a partly migrated one applies the
    rest of them)."""
    import importlib
    import pkgutil

    import django_leases.migrations as package

    squash = importlib.import_module(f"django_leases.migrations.{SQUASH}").Migration
    on_disk = {info.name for info in pkgutil.iter_modules(package.__path__) if info.name != SQUASH}
    replaced = {name for app, name in squash.replaces if app == "django_leases"}
    assert replaced <= on_disk
    assert replaced == {name for name in on_disk if name[:4] <= "0030"}


def _compression(table: str) -> dict[str, str]:
    """``table``'s columns with a compression method of their own, and the method
    (``l``: LZ4, ``p``: pglz)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attname, attcompression FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attcompression <> ''",
            [table],
        )
        return dict(cursor.fetchall())


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_json_columns_compress_with_lz4_and_a_table_held_elsewhere_keeps_pglz(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """0043 gives every JSON column LZ4 compression; a table another transaction holds
    keeps its columns as they were, the migration goes through and says so, and applying it
    again once the table is free finishes the job."""
    from django.db import connection, connections
    from django.db.migrations.executor import MigrationExecutor

    step, run = "django_leases_workflowstep", "django_leases_workflowrun"
    lz4 = "0043_json_compression_lz4"
    assert _compression(step) == {"data": "l", "result": "l", "error": "l", "progress": "l"}
    assert _compression(run)["output"] == "l"

    def migrate(target: str) -> None:
        executor = MigrationExecutor(connection)
        executor.migrate([("django_leases", target)])

    holder = connections.create_connection("default")
    try:
        migrate("0042_step_fence_floor_functions")
        assert _compression(step) == {}
        with holder.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(f"LOCK TABLE {step} IN SHARE UPDATE EXCLUSIVE MODE")
            migrate(lz4)
            cursor.execute("ROLLBACK")
        assert _compression(step) == {}
        assert _compression(run)["output"] == "l"
        assert f"{step} keeps its compression" in capsys.readouterr().out
        migrate("0042_step_fence_floor_functions")
    finally:
        holder.close()
        migrate(lz4)
        MigrationExecutor(connection).migrate(
            MigrationExecutor(connection).loader.graph.leaf_nodes()
        )
    assert _compression(step)["result"] == "l"

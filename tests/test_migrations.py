import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from django_leases.models.lease import LEASE_FUNCTIONS_MIGRATION
from django_leases.models.workflow import FUNCTIONS_MIGRATION


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

SQUASH = "0001_squashed_0043_first_release"

#: The squashed migration that stood for 0001–0030 before :data:`SQUASH` took its place: a
#: checkout of that time migrated a new database with it alone (``tests/old_squash_migrations``
#: holds it as it was).
OLD_SQUASH = "0001_squashed_0030_first_release"

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

#: Migrates the (new) database of DATABASE_URL as a checkout did while OLD_SQUASH was the
#: package's first migration: OLD_SQUASH alone, which Django records with the thirty it
#: replaces.
_MIGRATE_WITH_THE_OLD_SQUASH = """
import django
django.setup()
from django.conf import settings
from django.core.management import call_command
settings.MIGRATION_MODULES = {"django_leases": "tests.old_squash_migrations"}
call_command("migrate", "django_leases", verbosity=0)
"""

#: Prints, as JSON, what the database of DATABASE_URL holds of the app: each table's columns
#: and constraints (Django's introspection); on PostgreSQL each index's definition (partial
#: ones with their condition), each column's storage options (fill factor, compression) and
#: each ``dl_`` function's definition; on SQLite each index's statement. The names SQLite and
#: MariaDB's introspection make up for unnamed constraints (``fk_0``,
#: ``__unnamed_constraint_6__``) count the table's columns in the order they were added, which
#: differs between a table built at once and one grown by migrations: they are left out.
_DESCRIBE = r"""
import json, re, django
django.setup()
from django.db import connection
introspection = connection.introspection
found = {"tables": {}, "indexes": [], "storage": [], "functions": {}}
with connection.cursor() as cursor:
    for table in sorted(introspection.table_names(cursor)):
        if not table.startswith("django_leases_"):
            continue
        columns = sorted(
            [str(value) for value in column]
            for column in introspection.get_table_description(cursor, table)
        )
        constraints = sorted(
            json.dumps(
                {**constraint, "name": re.sub(r"^(fk_\d+|__unnamed_constraint_\d+__)$", "", name)},
                sort_keys=True,
                default=str,
            )
            for name, constraint in introspection.get_constraints(cursor, table).items()
        )
        found["tables"][table] = {"columns": columns, "constraints": constraints}
    if connection.vendor == "postgresql":
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() "
            "AND starts_with(tablename, 'django_leases_') ORDER BY 1"
        )
        found["indexes"] = [row[0] for row in cursor.fetchall()]
        cursor.execute(
            "SELECT c.relname, c.reloptions::text, a.attname, a.attcompression::text "
            "FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid "
            "WHERE c.relnamespace = current_schema()::regnamespace AND a.attnum > 0 "
            "AND NOT a.attisdropped AND starts_with(c.relname, 'django_leases_') ORDER BY 1, 3"
        )
        found["storage"] = [list(row) for row in cursor.fetchall()]
        cursor.execute(
            "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p "
            "WHERE p.pronamespace = current_schema()::regnamespace "
            "AND starts_with(p.proname, 'dl_')"
        )
        found["functions"] = dict(cursor.fetchall())
    elif connection.vendor == "sqlite":
        cursor.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL "
            "AND tbl_name LIKE 'django_leases_%' ORDER BY 1"
        )
        found["indexes"] = [row[0] for row in cursor.fetchall()]
print(json.dumps(found))
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
    up). Run in a database of its own, migrated the old way: the test database was built by
    the squashed migration, which installs only the code's functions."""
    name = "dl_functions_drop"
    env = _fresh_database_env(subprocess_env, name)
    try:
        out = _python(_LEAVE_AN_EARLIER_FUNCTION, env, TARGET="0027_workflow_step_claimants")
        assert out.split("\n")[-2] == "left 0 missing []", out
    finally:
        _drop_database(name)


#: Prints the workflow functions the database of DATABASE_URL holds, one per line.
_FUNCTIONS_HELD = """
import django
django.setup()
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute(
        "SELECT proname FROM pg_proc WHERE pronamespace = current_schema()::regnamespace "
        "AND starts_with(proname, 'dl_')"
    )
    print(*sorted(row[0] for row in cursor.fetchall()), sep="\\n")
"""


@pytest.mark.postgres_only
@pytest.mark.timeout(600)
def test_migrating_back_one_functions_migration_leaves_the_functions_of_the_one_before(
    subprocess_env: dict[str, str],
) -> None:
    """Unapplying the latest functions migration (the code deployed back one release) leaves
    the database as the migrations before it built it: every function the previous functions
    migration installs, those its code's workers call, is still there. (A functions
    migration installs some functions by the same name as the one before it, unchanged:
    unapplying it must not drop those.) Applied again, it installs its own once more."""
    import importlib

    from tests.functions_migration import previous_functions
    from tests.helpers import manage

    latest = importlib.import_module(f"django_leases.migrations.{FUNCTIONS_MIGRATION}")
    before = next(dep for app, dep in latest.Migration.dependencies if app == "django_leases")
    name = "dl_functions_back"
    env = _fresh_database_env(subprocess_env, name)
    try:
        assert _migrate(env)
        assert set(latest.FUNCTIONS) <= set(_python(_FUNCTIONS_HELD, env).split())
        done = manage("migrate", "django_leases", before, env=env, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        held = set(_python(_FUNCTIONS_HELD, env).split())
        assert sorted(set(previous_functions(before)) - held) == []
        assert sorted(set(latest.FUNCTIONS) - set(previous_functions(before)) & held) == []
        assert _migrate(env)
        assert set(latest.FUNCTIONS) <= set(_python(_FUNCTIONS_HELD, env).split())
    finally:
        _drop_database(name)


def _python(code: str, env: dict[str, str], **more: str) -> str:
    """Run ``code`` in a child Python in the project's root with ``env`` (and ``more``) to its
    end, which must be a success; its output."""
    import subprocess
    import sys

    from tests.helpers import ROOT

    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, **more},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _migrate(env: dict[str, str]) -> list[str]:
    """``manage.py migrate django_leases`` on ``env``'s database, after which the models and
    the migrations agree there and the squashed migration counts as applied; the migrations
    it applied, in order."""
    import re

    from tests.helpers import manage

    done = manage("migrate", "django_leases", "-v", "1", env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    shown = manage("showmigrations", "django_leases", env=env, timeout=300)
    assert f"[X] {SQUASH}" in shown.stdout, shown.stdout
    check = manage("makemigrations", "--check", "--dry-run", env=env, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    return re.findall(r"Applying django_leases\.(\w+)", done.stdout)


def _recorded(env: dict[str, str]) -> list[str]:
    """The django_leases migrations ``env``'s database records as applied, by name."""
    code = (
        "import django; django.setup()\n"
        "from django.db import connection\n"
        "from django.db.migrations.recorder import MigrationRecorder\n"
        "applied = MigrationRecorder(connection).applied_migrations()\n"
        "print(*sorted(name for app, name in applied if app == 'django_leases'))\n"
    )
    return _python(code, env).split()


def _on_disk() -> list[str]:
    """The package's migrations but the squashed one, in order: those it replaces (0001–0043),
    then any a later release adds."""
    import pkgutil

    import django_leases.migrations as package

    return sorted(
        info.name for info in pkgutil.iter_modules(package.__path__) if info.name != SQUASH
    )


#: What a new database migrated by the squashed migration holds (``_DESCRIBE``), once a test
#: of this run described one.
_NEW: dict[str, Any] = {}


def _new_database(env: dict[str, str]) -> dict[str, Any]:
    """What a new database holds once ``migrate`` applied the squashed migration to it (the
    first and only one of the 43 it applies: it records it with the 43 it replaces), then any
    later one; described once a run."""
    if not _NEW:
        name = "dl_squash_new"
        new = _fresh_database_env(env, name)
        try:
            later = [migration for migration in _on_disk() if migration[:4] > "0043"]
            assert _migrate(new) == [SQUASH, *later]
            assert _recorded(new) == sorted([SQUASH, *_on_disk()])
            _NEW.update(json.loads(_python(_DESCRIBE, new)))
        finally:
            _drop_database(name)
    return _NEW


@pytest.mark.timeout(600)
def test_a_new_database_applies_the_squashed_migration_alone(
    subprocess_env: dict[str, str],
) -> None:
    """``migrate`` builds a new database with the squashed migration alone of the 43 it
    replaces (then the later ones); on PostgreSQL it has the code's functions (workflow and
    lease: what ``health`` asks for) and those the latest functions migrations keep for the
    previous release's workers, the run and step tables' fill factor and the JSON columns'
    LZ4 compression."""
    import importlib

    from django.db import connection

    from django_leases.models.lease import lease_functions
    from tests.functions_migration import definitions

    new = _new_database(subprocess_env)
    assert "django_leases_workflowstepattempt" in new["tables"]
    if connection.vendor != "postgresql":
        return
    kept = importlib.import_module(f"django_leases.migrations.{FUNCTIONS_MIGRATION}").KEPT
    assert set(new["functions"]) == {*definitions(), *lease_functions(), *kept}
    storage = {
        (table, column): (options, method) for table, options, column, method in new["storage"]
    }
    assert storage["django_leases_workflowstep", "result"] == ("{fillfactor=80}", "l")
    assert storage["django_leases_workflowrun", "output"] == ("{fillfactor=80}", "l")
    assert storage["django_leases_lease", "key"] == (None, "")


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "migrated_to",
    [
        "0043_json_compression_lz4",
        "0035_operators",
        "0030_lease_epochs",
        "0020_workflow_functions",
        OLD_SQUASH,
    ],
)
def test_a_database_migrated_before_the_first_release_upgrades(
    migrated_to: str, subprocess_env: dict[str, str]
) -> None:
    """A checkout before the first release migrated its database with the migrations the
    squashed one replaces — all of them, or up to an older one — or with the earlier squashed
    migration (:data:`OLD_SQUASH`, recorded with the thirty it replaced). ``migrate`` then
    applies what is missing of them (nothing, or the rest), counts the squashed migration as
    applied, and leaves the database a new one would be: the same tables, columns,
    constraints and indexes, storage options and functions (plus the earlier functions the
    functions migrations keep for a rolling deploy)."""
    import importlib

    name = f"dl_squash_{migrated_to[:4]}" + ("_old" if migrated_to == OLD_SQUASH else "")
    new = _new_database(subprocess_env)
    env = _fresh_database_env(subprocess_env, name)
    on_disk = _on_disk()
    try:
        if migrated_to == OLD_SQUASH:
            _python(_MIGRATE_WITH_THE_OLD_SQUASH, env)
            had = on_disk[:30]
            assert _recorded(env) == sorted([OLD_SQUASH, *had])
        else:
            _python(_MIGRATE_THE_OLD_WAY, env, TARGET=migrated_to)
            had = on_disk[: on_disk.index(migrated_to) + 1]
            # (all 43 applied: the migrate that applied them recorded the squashed one too)
            assert [migration for migration in _recorded(env) if migration != SQUASH] == had
        assert _migrate(env) == on_disk[len(had) :]
        upgraded = json.loads(_python(_DESCRIBE, env))
    finally:
        _drop_database(name)
    assert upgraded["tables"] == new["tables"]
    assert upgraded["indexes"] == new["indexes"]
    assert upgraded["storage"] == new["storage"]
    functions = upgraded["functions"]
    assert {function: functions.get(function) for function in new["functions"]} == new["functions"]
    kept = {
        *importlib.import_module(f"django_leases.migrations.{FUNCTIONS_MIGRATION}").KEPT,
        *importlib.import_module(f"django_leases.migrations.{LEASE_FUNCTIONS_MIGRATION}").KEPT,
    }
    assert set(functions) - set(new["functions"]) <= kept


def test_the_squashed_migration_replaces_every_migration_and_holds_their_functions() -> None:
    """Every migration of the first release's history is replaced (a new database applies
    the squashed one alone) and stays in the package (a partly migrated one applies the
    rest of them); no other squashed migration is left (Django 5.2 cannot load one squash
    of another). The functions it installs are the text the last functions migrations it
    replaces froze (a later functions migration installs its own beside them)."""
    import importlib

    squash = importlib.import_module(f"django_leases.migrations.{SQUASH}")
    on_disk = _on_disk()
    originals = [name for name in on_disk if name[:4] <= "0043"]
    assert [name for app, name in squash.Migration.replaces if app == "django_leases"] == originals
    assert len(originals) == 43 and not any("_squashed_" in name for name in on_disk)
    assert squash.Migration.dependencies == []
    modules = [importlib.import_module(f"django_leases.migrations.{name}") for name in originals]
    last_functions = [module for module in modules if hasattr(module, "FUNCTIONS")][-1]
    last_lease_functions = [module for module in modules if hasattr(module, "LEASE_FUNCTIONS")][-1]
    assert squash.FUNCTIONS == last_functions.FUNCTIONS
    assert squash.LEASE_FUNCTIONS == last_lease_functions.LEASE_FUNCTIONS
    assert last_lease_functions.__name__.rsplit(".", 1)[1] == LEASE_FUNCTIONS_MIGRATION
    assert FUNCTIONS_MIGRATION in on_disk


def test_a_migration_after_the_squash_depends_on_what_it_replaces_not_on_it() -> None:
    """A later migration names the last migration the squash replaces, which Django maps to
    the squash where the squash applies. Named after the squash itself, it stayed applied
    when ``migrate django_leases 0034_deploys`` unapplied the replaced migrations under it
    (on PostgreSQL its functions then went with 0042's, and the check that they are
    installed refused the ``migrate`` that would put them back)."""
    import importlib

    later = [name for name in _on_disk() if name[:4] > "0043"]
    assert later, "no migration after the squash: this test has nothing to look at"
    for name in later:
        migration = importlib.import_module(f"django_leases.migrations.{name}").Migration
        ours = [dependency for app, dependency in migration.dependencies if app == "django_leases"]
        assert SQUASH not in ours, f"{name} depends on {SQUASH}: name 0043_json_compression_lz4"


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

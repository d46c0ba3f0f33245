"""The migration that installs the workflow worker's PostgreSQL functions, as frozen text.

A migration must not call live code to build the SQL it installs (the code moves on, the
migration must not), so the functions' definitions are written into the migration as text.
This module writes that migration from the current code, and ``tests/test_migrations.py``
fails while the latest such migration and the code disagree, as ``makemigrations --check``
does for models::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/django_leases \\
        .venv/bin/python -m tests.functions_migration 0005_workflow_functions

(writes ``django_leases/migrations/0005_workflow_functions.py``, depending on the latest
migration; then set ``FUNCTIONS_MIGRATION`` in ``django_leases/models/workflow.py``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

TEMPLATE = '''"""PostgreSQL: the workflow worker's hot-path functions, as this version defines them.

Written by ``tests/functions_migration.py`` from ``django_leases.models.workflow.functions``;
frozen here, so this migration installs the same SQL whatever the code becomes. It installs
{count} functions and drops every earlier function of the same families ({families}) but
those the previous functions migration installed (``KEPT``): workers of the code before this
migration still call them while a rolling deploy applies it, so they are dropped by the next
functions migration. Unapplied, it drops only the functions the previous functions migration
did not install (``PREVIOUS``): the database is left as that migration built it, for the
workers of its code. The functions run their statements with sequential scans, bitmap scans,
sorts and JIT off (see ``django_leases.workflows.sql.FUNCTION_SETTINGS``). Elsewhere than
PostgreSQL this migration does nothing.
"""

from django.db import migrations

#: Function name -> its CREATE OR REPLACE FUNCTION statement.
FUNCTIONS = {{
{functions}}}

#: Name prefixes of the functions this migration replaces.
FAMILIES = {families_tuple}

#: The previous functions migration's functions: the workers of the code before this migration
#: call them.
PREVIOUS = {previous_names}

#: Those of ``PREVIOUS`` this migration does not install: kept for those workers.
KEPT = {kept}


def install(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for statement in FUNCTIONS.values():
            cursor.execute(statement)
        cursor.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p "
            "WHERE p.pronamespace = current_schema()::regnamespace "
            "AND starts_with(p.proname, 'dl_') AND NOT p.proname = ANY(%s) "
            "AND EXISTS (SELECT 1 FROM unnest(%s::text[]) AS f WHERE starts_with(p.proname, f))",
            [[*FUNCTIONS, *KEPT], list(FAMILIES)],
        )
        for (stale,) in cursor.fetchall():
            cursor.execute(f"DROP FUNCTION {{stale}}")


def uninstall(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for name in FUNCTIONS:
            if name not in PREVIOUS:  # the previous migration's stay, for its code's workers
                cursor.execute(f"DROP FUNCTION IF EXISTS {{name}}")


class Migration(migrations.Migration):
    dependencies = [("django_leases", "{previous}")]

    operations = [migrations.RunPython(install, uninstall, elidable=False)]
'''


def definitions() -> dict[str, str]:
    """The current code's functions: name -> ``CREATE OR REPLACE FUNCTION`` (PostgreSQL)."""
    from django.db import connection

    from django_leases.models.workflow import functions

    if connection.vendor != "postgresql":
        raise SystemExit("the functions are PostgreSQL's: run with a postgres:// DATABASE_URL")
    found = {}
    for function in functions(connection).values():
        name, statement = function.definition()
        found[name] = statement
    return found


def families() -> tuple[str, ...]:
    """The name prefixes of the current functions (``dl_<short>_``)."""
    from django.db import connection

    from django_leases.models.workflow import functions
    from django_leases.workflows.sql import FUNCTION_PREFIX

    return tuple(sorted(f"{FUNCTION_PREFIX}{short}_" for short in functions(connection)))


def render(previous: str, installed_before: Sequence[str]) -> str:
    """The migration's text, depending on migration ``previous``, keeping the functions
    named ``installed_before`` (the previous functions migration's)."""
    found = definitions()
    body = "".join(f"    {name!r}: {statement!r},\n" for name, statement in sorted(found.items()))
    prefixes = families()
    return TEMPLATE.format(
        count=len(found),
        families=", ".join(f"``{p}…``" for p in prefixes),
        families_tuple=repr(prefixes),
        functions=body,
        previous_names=repr(tuple(sorted(installed_before))),
        kept=repr(tuple(sorted(set(installed_before) - set(found)))),
        previous=previous,
    )


def previous_functions(previous: str) -> list[str]:
    """The functions the latest functions migration at or before migration ``previous``
    installs (one whose module has ``FUNCTIONS``), found by its dependencies on disk."""
    import importlib

    name: str | None = previous
    while name is not None:
        module = importlib.import_module(f"django_leases.migrations.{name}")
        if hasattr(module, "FUNCTIONS"):
            return list(module.FUNCTIONS)
        name = next(
            (dep for app, dep in module.Migration.dependencies if app == "django_leases"), None
        )
    return []


def main(argv: list[str]) -> int:
    import django

    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True)
    leaves = loader.graph.leaf_nodes("django_leases")
    path = Path(__file__).resolve().parent.parent / "django_leases" / "migrations"
    target = path / f"{argv[0]}.py"
    previous = leaves[0][1]
    if previous == argv[0]:  # rewriting the latest migration in place
        previous = loader.graph.node_map[leaves[0]].parents.copy().pop().key[1]
    replaced = loader.disk_migrations["django_leases", previous].replaces
    if replaced:
        # After a squashed migration, depend on the last one it replaces: Django maps that to
        # the squash where the squash applies, and ``migrate django_leases <a replaced one>``
        # then unapplies this migration too (depending on the squash itself, it stayed
        # applied with its dependencies gone).
        previous = replaced[-1][1]
    target.write_text(render(previous, previous_functions(previous)))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

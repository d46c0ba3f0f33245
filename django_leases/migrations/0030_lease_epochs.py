"""PostgreSQL: the lease operations with fencing-token epochs (acquire), frozen.

Frozen from ``django_leases.models.lease.lease_functions`` (``tests/test_lease_functions.py``
checks that the code and the latest lease functions migration agree). The acquire function
changed: a token it makes (a takeover, a new key) is at least the epoch floor of the server's
WAL timeline + 1 (``models.lease.PG_EPOCH_FLOOR``), so tokens granted after a promotion are
above every token granted before it. Refresh and release are unchanged (the same names).

A name carries the hash of its definition, so the new acquire is a new function beside the
old one. The previous release's acquire (``KEPT``) stays: its processes still call it while a
rolling deploy applies this migration (on a database that never failed over both grant the
same tokens); the next lease functions migration drops it. Elsewhere than PostgreSQL this
migration does nothing.
"""

from django.db import migrations

#: Function name -> its CREATE OR REPLACE FUNCTION statement.
LEASE_FUNCTIONS = {
    'dl_lease_acquire_518ac827135c': 'CREATE OR REPLACE FUNCTION dl_lease_acquire_518ac827135c(p_key text, p_holder text, p_ttl_us bigint, OUT r_id bigint, OUT r_token bigint, OUT r_expires_at timestamptz, OUT r_acquired_at timestamptz) LANGUAGE plpgsql VOLATILE AS $dl$\n#variable_conflict use_column\nBEGIN\n    UPDATE "django_leases_lease" AS l SET token = CASE WHEN (l.holder = p_holder AND l.expires_at > statement_timestamp()) THEN l.token ELSE GREATEST(l.token + 1, (((\'x\' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) * 1000000000000) + 1) END, acquired_at = CASE WHEN (l.holder = p_holder AND l.expires_at > statement_timestamp()) THEN l.acquired_at ELSE statement_timestamp() END, holder = p_holder, expires_at = statement_timestamp() + p_ttl_us * interval \'1 microsecond\', renewed_at = statement_timestamp(), released_at = NULL WHERE l.key = p_key AND (l.expires_at <= statement_timestamp() OR l.holder = p_holder) RETURNING l.id, l.token, l.expires_at, l.acquired_at INTO r_id, r_token, r_expires_at, r_acquired_at;\n    IF NOT FOUND THEN\n        INSERT INTO "django_leases_lease" AS l (key, holder, token, expires_at, acquired_at, renewed_at, released_at) VALUES (p_key, p_holder, (((\'x\' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) * 1000000000000) + 1, statement_timestamp() + p_ttl_us * interval \'1 microsecond\', statement_timestamp(), statement_timestamp(), NULL) ON CONFLICT (key) DO UPDATE SET token = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.token ELSE GREATEST(l.token + 1, (((\'x\' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) * 1000000000000) + 1) END, acquired_at = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.acquired_at ELSE excluded.acquired_at END, holder = excluded.holder, expires_at = excluded.expires_at, renewed_at = excluded.renewed_at, released_at = NULL WHERE l.expires_at <= statement_timestamp() OR l.holder = excluded.holder RETURNING l.id, l.token, l.expires_at, l.acquired_at INTO r_id, r_token, r_expires_at, r_acquired_at;\n    END IF;\nEND\n$dl$',
    'dl_lease_refresh_5337a261d12c': 'CREATE OR REPLACE FUNCTION dl_lease_refresh_5337a261d12c(p_key text, p_holder text, p_token bigint, p_ttl_us bigint, OUT r_expires_at timestamptz) LANGUAGE plpgsql VOLATILE AS $dl$\n#variable_conflict use_column\nBEGIN\n    UPDATE "django_leases_lease" SET expires_at = statement_timestamp() + p_ttl_us * interval \'1 microsecond\', renewed_at = statement_timestamp() WHERE key = p_key AND holder = p_holder AND token = p_token AND released_at IS NULL AND expires_at > statement_timestamp() RETURNING expires_at INTO r_expires_at;\nEND\n$dl$',
    'dl_lease_release_236676491e56': 'CREATE OR REPLACE FUNCTION dl_lease_release_236676491e56(p_key text, p_holder text, p_token bigint) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $dl$\n#variable_conflict use_column\nBEGIN\n    UPDATE "django_leases_lease" SET released_at = statement_timestamp(), expires_at = CASE WHEN expires_at > statement_timestamp() THEN statement_timestamp() ELSE expires_at END WHERE key = p_key AND holder = p_holder AND token = p_token AND released_at IS NULL;\n    RETURN FOUND;\nEND\n$dl$',
}

#: Name prefixes of the functions this migration replaces.
FAMILIES = ("dl_lease_acquire_", "dl_lease_refresh_", "dl_lease_release_")

#: The previous lease functions migration's functions: kept for the processes still running
#: its code (dropped by the next one).
KEPT = ("dl_lease_acquire_f76a713eb454",)


def install(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for statement in LEASE_FUNCTIONS.values():
            cursor.execute(statement)
        cursor.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p "
            "WHERE p.pronamespace = current_schema()::regnamespace "
            "AND starts_with(p.proname, 'dl_lease_') AND NOT p.proname = ANY(%s) "
            "AND EXISTS (SELECT 1 FROM unnest(%s::text[]) AS f WHERE starts_with(p.proname, f))",
            [[*LEASE_FUNCTIONS, *KEPT], list(FAMILIES)],
        )
        for (stale,) in cursor.fetchall():
            cursor.execute(f"DROP FUNCTION {stale}")


def uninstall(apps, schema_editor):  # type: ignore[no-untyped-def]
    # Back to 0017's functions: its acquire is still there (KEPT); this one goes.
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for name in LEASE_FUNCTIONS:
            if name.startswith("dl_lease_acquire_"):
                cursor.execute(f"DROP FUNCTION IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("django_leases", "0029_verbose_names")]

    operations = [migrations.RunPython(install, uninstall, elidable=False)]

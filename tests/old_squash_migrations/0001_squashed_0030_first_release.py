"""The first release's schema in one migration: what migrations 0001–0030 built, as the models
now are, with the PostgreSQL functions the code calls (frozen text) and the run and step
tables' fill factor.

A new database applies this migration alone. A database migrated from a checkout before the
first release has applied the migrations it ``replaces`` (all of them, or some: Django then
applies the rest of them, which stay in the package for that), and this one counts as applied
with them. The functions are frozen copies of ``0028_workflow_functions`` (the workflow
worker's) and ``0030_lease_epochs`` (the lease operations'); later functions migrations
follow this one. Elsewhere than PostgreSQL the functions and the fill factor are skipped.
"""

import django.db.models.deletion
from django.db import migrations, models

import django_leases.clock
import django_leases.ids

#: The workflow worker's functions (as ``0028_workflow_functions`` installs them).
FUNCTIONS = {
    'dl_claim_step_5c7d5ff2a775': 'CREATE OR REPLACE FUNCTION dl_claim_step_5c7d5ff2a775(p_seconds double precision, p_queues text[]) RETURNS TABLE(r0 boolean, r1 bigint, r2 uuid, r3 varchar, r4 varchar, r5 bigint, r6 text, r7 double precision, r8 timestamptz, r9 timestamptz, r10 varchar) LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off AS $dl$\n#variable_conflict use_column\nBEGIN\n    RETURN QUERY WITH lapsed AS ( SELECT EXISTS ( SELECT 1 FROM "django_leases_workflowstep" s WHERE s.status = \'running\' AND (p_queues IS NULL OR s.queue = ANY (p_queues)) AND ( s.lease_expires_at <= statement_timestamp() OR s.lease_expires_at IS NULL OR s.deadline_at <= statement_timestamp() ) AND EXISTS (SELECT 1 FROM "django_leases_workflowrun" r WHERE r.id = s.run_id AND (r.status = \'running\') IS TRUE) ) AS found ), picked AS ( SELECT s.id, s.status AS was, s.available_at FROM "django_leases_workflowstep" s WHERE NOT (SELECT found FROM lapsed) AND s.status IN (\'pending\', \'scheduled\', \'failed\') AND (p_queues IS NULL OR s.queue = ANY (p_queues)) AND s.available_at <= statement_timestamp() AND NOT (s.status = \'failed\' AND s.attempt >= s.retries + 1) AND EXISTS (SELECT 1 FROM "django_leases_workflowrun" r WHERE r.id = s.run_id AND (r.status = \'running\') IS TRUE) ORDER BY s.priority DESC, s.available_at, s.id LIMIT 1 FOR UPDATE OF s SKIP LOCKED ), claimed AS ( UPDATE "django_leases_workflowstep" AS s SET status = \'running\', attempt = CASE WHEN picked.was = \'failed\' THEN s.attempt + 1 ELSE s.attempt END, result = CASE WHEN picked.was = \'failed\' THEN NULL ELSE s.result END, error = CASE WHEN picked.was = \'failed\' THEN NULL ELSE s.error END, lease_expires_at = statement_timestamp() + make_interval(secs => p_seconds), deadline_at = CASE WHEN s.timeout IS NULL THEN NULL ELSE statement_timestamp() + make_interval(secs => s.timeout) END, updated_at = statement_timestamp() FROM picked WHERE s.id = picked.id RETURNING s.id, s.run_id, s.step_name, s.function_name, s.attempt, s.data, extract(epoch FROM statement_timestamp() - picked.available_at) AS waited ), begun AS ( INSERT INTO "django_leases_workflowstepattempt" AS a (step_id, attempt, status, started_at) SELECT id, attempt, \'running\', statement_timestamp() FROM claimed ON CONFLICT (step_id, attempt) DO UPDATE SET status = excluded.status, result = NULL, error = NULL, finished_at = NULL RETURNING a.started_at ) SELECT (SELECT found FROM lapsed), claimed.id, claimed.run_id, claimed.step_name, claimed.function_name, claimed.attempt::bigint, claimed.data::text, claimed.waited::double precision, claimed_run.created_at, (SELECT started_at FROM begun), claimed_run.workflow FROM (SELECT 1) AS one LEFT JOIN claimed ON true LEFT JOIN "django_leases_workflowrun" claimed_run ON claimed_run.id = claimed.run_id;\nEND\n$dl$',
    'dl_complete_run_21b2251beddb': 'CREATE OR REPLACE FUNCTION dl_complete_run_21b2251beddb(p_step_id bigint, p_payload text, p_attempt bigint, p_output text, p_key text, p_holder text, p_token bigint) RETURNS TABLE(r0 bigint, r1 bigint, r2 boolean, r3 timestamptz) LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off AS $dl$\n#variable_conflict use_column\nBEGIN\n    RETURN QUERY WITH step AS ( UPDATE "django_leases_workflowstep" SET status = \'succeeded\', result = p_payload::jsonb, error = NULL, lease_expires_at = NULL, updated_at = statement_timestamp() WHERE ("django_leases_workflowstep"."attempt" = (p_attempt) AND "django_leases_workflowstep"."id" = (p_step_id) AND "django_leases_workflowstep"."status" = \'running\') RETURNING id, run_id ), history AS ( UPDATE "django_leases_workflowstepattempt" SET status = \'succeeded\', result = p_payload::jsonb, finished_at = statement_timestamp() WHERE step_id = (SELECT id FROM step) AND attempt = p_attempt ), done AS ( UPDATE "django_leases_workflowrun" SET status = \'completed\', output = p_output::jsonb, error = NULL, pass_due_at = NULL, branches_left = 0, updated_at = statement_timestamp(), finished_at = statement_timestamp() WHERE id = (SELECT run_id FROM step) AND (status = \'running\') IS TRUE RETURNING id, parent_id, finished_at ), woken AS ( UPDATE "django_leases_workflowrun" SET pass_due_at = statement_timestamp(), pass_requests = pass_requests + 1, updated_at = statement_timestamp() WHERE id = (SELECT parent_id FROM done) AND (status = \'running\') IS TRUE ), released AS (WITH old AS (SELECT id, expires_at > statement_timestamp() AS live FROM "django_leases_lease" WHERE key = p_key AND EXISTS (SELECT 1 FROM step) AND holder = p_holder AND token = p_token AND released_at IS NULL FOR UPDATE) UPDATE "django_leases_lease" AS l SET released_at = statement_timestamp(), expires_at = CASE WHEN l.expires_at > statement_timestamp() THEN statement_timestamp() ELSE l.expires_at END FROM old WHERE l.id = old.id AND l.released_at IS NULL RETURNING old.live) SELECT (SELECT count(*) FROM step), (SELECT count(*) FROM done), (SELECT live FROM released), (SELECT finished_at FROM done) FROM (SELECT 1) AS one;\nEND\n$dl$',
    'dl_complete_run_alone_80094654d8db': 'CREATE OR REPLACE FUNCTION dl_complete_run_alone_80094654d8db(p_step_id bigint, p_payload text, p_attempt bigint, p_output text, p_holder text, p_channel text) RETURNS TABLE(r0 bigint, r1 uuid, r2 timestamptz, r3 bigint, r4 bigint, r5 varchar, r6 varchar, r7 bigint, r8 timestamptz, r9 timestamptz, r10 timestamptz, r11 timestamptz) LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off AS $dl$\n#variable_conflict use_column\nBEGIN\n    RETURN QUERY WITH step AS ( UPDATE "django_leases_workflowstep" SET status = \'succeeded\', result = p_payload::jsonb, error = NULL, lease_expires_at = NULL, updated_at = statement_timestamp() WHERE ("django_leases_workflowstep"."attempt" = (p_attempt) AND "django_leases_workflowstep"."id" = (p_step_id) AND "django_leases_workflowstep"."status" = \'running\') RETURNING id, run_id ), history AS ( UPDATE "django_leases_workflowstepattempt" SET status = \'succeeded\', result = p_payload::jsonb, finished_at = statement_timestamp() WHERE step_id = (SELECT id FROM step) AND attempt = p_attempt ), locked AS ( SELECT id FROM "django_leases_workflowrun" WHERE id = (SELECT run_id FROM step) AND (status = \'running\') IS TRUE FOR UPDATE ), taken AS (INSERT INTO "django_leases_lease" AS l (key, holder, token, expires_at, acquired_at, renewed_at, released_at) SELECT \'workflow-run:\' || locked.id::text, p_holder, 1, statement_timestamp(), statement_timestamp(), statement_timestamp(), statement_timestamp() FROM locked ON CONFLICT (key) DO UPDATE SET token = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.token ELSE l.token + 1 END, acquired_at = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.acquired_at ELSE excluded.acquired_at END, holder = excluded.holder, expires_at = excluded.expires_at, renewed_at = excluded.renewed_at, released_at = excluded.released_at WHERE l.expires_at <= statement_timestamp() OR l.holder = excluded.holder RETURNING id, key, holder, token, expires_at, acquired_at, renewed_at, released_at), done AS ( UPDATE "django_leases_workflowrun" SET status = \'completed\', output = p_output::jsonb, error = NULL, pass_due_at = NULL, branches_left = 0, updated_at = statement_timestamp(), finished_at = statement_timestamp() WHERE id = (SELECT id FROM locked) AND (status = \'running\') IS TRUE AND EXISTS (SELECT 1 FROM taken) RETURNING id, parent_id, finished_at ), woken AS ( UPDATE "django_leases_workflowrun" SET pass_due_at = statement_timestamp(), pass_requests = pass_requests + 1, updated_at = statement_timestamp() WHERE id = (SELECT parent_id FROM done) AND (status = \'running\') IS TRUE ), asked AS ( UPDATE "django_leases_workflowrun" SET pass_due_at = statement_timestamp(), pass_requests = pass_requests + 1, branches_left = 0, updated_at = statement_timestamp() WHERE id = (SELECT id FROM locked) AND NOT EXISTS (SELECT 1 FROM taken) RETURNING id ), notified AS (SELECT pg_notify(p_channel, \'\') FROM asked) SELECT (SELECT count(*) FROM step), (SELECT id FROM done), (SELECT finished_at FROM done), (SELECT count(*) FROM notified), taken.* FROM (SELECT 1) AS one LEFT JOIN taken ON true;\nEND\n$dl$',
    'dl_complete_run_alone_claiming_2acda0f2a33a': 'CREATE OR REPLACE FUNCTION dl_complete_run_alone_claiming_2acda0f2a33a(p_step_id bigint, p_payload text, p_attempt bigint, p_output text, p_holder text, p_channel text, p_next_ttl double precision, p_queues text[]) RETURNS TABLE(r0 bigint, r1 uuid, r2 timestamptz, r3 bigint, r4 bigint, r5 varchar, r6 varchar, r7 bigint, r8 timestamptz, r9 timestamptz, r10 timestamptz, r11 timestamptz, r12 boolean, r13 bigint, r14 uuid, r15 varchar, r16 varchar, r17 bigint, r18 text, r19 double precision, r20 timestamptz, r21 timestamptz, r22 varchar) LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off AS $dl$\n#variable_conflict use_column\nBEGIN\n    RETURN QUERY WITH step AS ( UPDATE "django_leases_workflowstep" SET status = \'succeeded\', result = p_payload::jsonb, error = NULL, lease_expires_at = NULL, updated_at = statement_timestamp() WHERE ("django_leases_workflowstep"."attempt" = (p_attempt) AND "django_leases_workflowstep"."id" = (p_step_id) AND "django_leases_workflowstep"."status" = \'running\') RETURNING id, run_id ), history AS ( UPDATE "django_leases_workflowstepattempt" SET status = \'succeeded\', result = p_payload::jsonb, finished_at = statement_timestamp() WHERE step_id = (SELECT id FROM step) AND attempt = p_attempt ), locked AS ( SELECT id FROM "django_leases_workflowrun" WHERE id = (SELECT run_id FROM step) AND (status = \'running\') IS TRUE FOR UPDATE ), taken AS (INSERT INTO "django_leases_lease" AS l (key, holder, token, expires_at, acquired_at, renewed_at, released_at) SELECT \'workflow-run:\' || locked.id::text, p_holder, 1, statement_timestamp(), statement_timestamp(), statement_timestamp(), statement_timestamp() FROM locked ON CONFLICT (key) DO UPDATE SET token = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.token ELSE l.token + 1 END, acquired_at = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.acquired_at ELSE excluded.acquired_at END, holder = excluded.holder, expires_at = excluded.expires_at, renewed_at = excluded.renewed_at, released_at = excluded.released_at WHERE l.expires_at <= statement_timestamp() OR l.holder = excluded.holder RETURNING id, key, holder, token, expires_at, acquired_at, renewed_at, released_at), done AS ( UPDATE "django_leases_workflowrun" SET status = \'completed\', output = p_output::jsonb, error = NULL, pass_due_at = NULL, branches_left = 0, updated_at = statement_timestamp(), finished_at = statement_timestamp() WHERE id = (SELECT id FROM locked) AND (status = \'running\') IS TRUE AND EXISTS (SELECT 1 FROM taken) RETURNING id, parent_id, finished_at ), woken AS ( UPDATE "django_leases_workflowrun" SET pass_due_at = statement_timestamp(), pass_requests = pass_requests + 1, updated_at = statement_timestamp() WHERE id = (SELECT parent_id FROM done) AND (status = \'running\') IS TRUE ), asked AS ( UPDATE "django_leases_workflowrun" SET pass_due_at = statement_timestamp(), pass_requests = pass_requests + 1, branches_left = 0, updated_at = statement_timestamp() WHERE id = (SELECT id FROM locked) AND NOT EXISTS (SELECT 1 FROM taken) RETURNING id ), notified AS (SELECT pg_notify(p_channel, \'\') FROM asked), lapsed AS ( SELECT EXISTS ( SELECT 1 FROM "django_leases_workflowstep" s WHERE s.status = \'running\' AND (p_queues IS NULL OR s.queue = ANY (p_queues)) AND ( s.lease_expires_at <= statement_timestamp() OR s.lease_expires_at IS NULL OR s.deadline_at <= statement_timestamp() ) AND EXISTS (SELECT 1 FROM "django_leases_workflowrun" r WHERE r.id = s.run_id AND (r.status = \'running\') IS TRUE) ) AS found ), picked AS ( SELECT s.id, s.status AS was, s.available_at FROM "django_leases_workflowstep" s JOIN "django_leases_workflowrun" r ON r.id = s.run_id WHERE NOT (SELECT found FROM lapsed) AND s.status IN (\'pending\', \'scheduled\', \'failed\') AND (p_queues IS NULL OR s.queue = ANY (p_queues)) AND s.available_at <= statement_timestamp() AND NOT (s.status = \'failed\' AND s.attempt >= s.retries + 1) AND (r.status = \'running\') IS TRUE ORDER BY s.priority DESC, s.available_at, s.id LIMIT 1 FOR UPDATE OF s SKIP LOCKED FOR SHARE OF r SKIP LOCKED ), claimed AS ( UPDATE "django_leases_workflowstep" AS s SET status = \'running\', attempt = CASE WHEN picked.was = \'failed\' THEN s.attempt + 1 ELSE s.attempt END, result = CASE WHEN picked.was = \'failed\' THEN NULL ELSE s.result END, error = CASE WHEN picked.was = \'failed\' THEN NULL ELSE s.error END, lease_expires_at = statement_timestamp() + make_interval(secs => p_next_ttl), deadline_at = CASE WHEN s.timeout IS NULL THEN NULL ELSE statement_timestamp() + make_interval(secs => s.timeout) END, updated_at = statement_timestamp() FROM picked WHERE s.id = picked.id RETURNING s.id, s.run_id, s.step_name, s.function_name, s.attempt, s.data, extract(epoch FROM statement_timestamp() - picked.available_at) AS waited ), begun AS ( INSERT INTO "django_leases_workflowstepattempt" AS a (step_id, attempt, status, started_at) SELECT id, attempt, \'running\', statement_timestamp() FROM claimed ON CONFLICT (step_id, attempt) DO UPDATE SET status = excluded.status, result = NULL, error = NULL, finished_at = NULL RETURNING a.started_at ) SELECT (SELECT count(*) FROM step), (SELECT id FROM done), (SELECT finished_at FROM done), (SELECT count(*) FROM notified), taken.*, (SELECT found FROM lapsed), claimed.id, claimed.run_id, claimed.step_name, claimed.function_name, claimed.attempt::bigint, claimed.data::text, claimed.waited::double precision, claimed_run.created_at, (SELECT started_at FROM begun), claimed_run.workflow FROM (SELECT 1) AS one LEFT JOIN taken ON true LEFT JOIN claimed ON true LEFT JOIN "django_leases_workflowrun" claimed_run ON claimed_run.id = claimed.run_id;\nEND\n$dl$',
    'dl_complete_run_alone_picking_df380d28ec20': 'CREATE OR REPLACE FUNCTION dl_complete_run_alone_picking_df380d28ec20(p_step_id bigint, p_payload text, p_attempt bigint, p_output text, p_holder text, p_channel text, p_next_holder text, p_next_ttl double precision) RETURNS TABLE(r0 bigint, r1 uuid, r2 timestamptz, r3 bigint, r4 bigint, r5 varchar, r6 varchar, r7 bigint, r8 timestamptz, r9 timestamptz, r10 timestamptz, r11 timestamptz, r12 uuid, r13 varchar, r14 varchar, r15 text, r16 bigint, r17 text, r18 bigint, r19 varchar, r20 varchar, r21 bigint, r22 timestamptz, r23 timestamptz, r24 timestamptz, r25 timestamptz) LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off AS $dl$\n#variable_conflict use_column\nBEGIN\n    RETURN QUERY WITH step AS ( UPDATE "django_leases_workflowstep" SET status = \'succeeded\', result = p_payload::jsonb, error = NULL, lease_expires_at = NULL, updated_at = statement_timestamp() WHERE ("django_leases_workflowstep"."attempt" = (p_attempt) AND "django_leases_workflowstep"."id" = (p_step_id) AND "django_leases_workflowstep"."status" = \'running\') RETURNING id, run_id ), history AS ( UPDATE "django_leases_workflowstepattempt" SET status = \'succeeded\', result = p_payload::jsonb, finished_at = statement_timestamp() WHERE step_id = (SELECT id FROM step) AND attempt = p_attempt ), locked AS ( SELECT id FROM "django_leases_workflowrun" WHERE id = (SELECT run_id FROM step) AND (status = \'running\') IS TRUE FOR UPDATE ), taken AS (INSERT INTO "django_leases_lease" AS l (key, holder, token, expires_at, acquired_at, renewed_at, released_at) SELECT \'workflow-run:\' || locked.id::text, p_holder, 1, statement_timestamp(), statement_timestamp(), statement_timestamp(), statement_timestamp() FROM locked ON CONFLICT (key) DO UPDATE SET token = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.token ELSE l.token + 1 END, acquired_at = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.acquired_at ELSE excluded.acquired_at END, holder = excluded.holder, expires_at = excluded.expires_at, renewed_at = excluded.renewed_at, released_at = excluded.released_at WHERE l.expires_at <= statement_timestamp() OR l.holder = excluded.holder RETURNING id, key, holder, token, expires_at, acquired_at, renewed_at, released_at), done AS ( UPDATE "django_leases_workflowrun" SET status = \'completed\', output = p_output::jsonb, error = NULL, pass_due_at = NULL, branches_left = 0, updated_at = statement_timestamp(), finished_at = statement_timestamp() WHERE id = (SELECT id FROM locked) AND (status = \'running\') IS TRUE AND EXISTS (SELECT 1 FROM taken) RETURNING id, parent_id, finished_at ), woken AS ( UPDATE "django_leases_workflowrun" SET pass_due_at = statement_timestamp(), pass_requests = pass_requests + 1, updated_at = statement_timestamp() WHERE id = (SELECT parent_id FROM done) AND (status = \'running\') IS TRUE ), asked AS ( UPDATE "django_leases_workflowrun" SET pass_due_at = statement_timestamp(), pass_requests = pass_requests + 1, branches_left = 0, updated_at = statement_timestamp() WHERE id = (SELECT id FROM locked) AND NOT EXISTS (SELECT 1 FROM taken) RETURNING id ), notified AS (SELECT pg_notify(p_channel, \'\') FROM asked), picked AS ( UPDATE "django_leases_workflowrun" SET pass_due_at = statement_timestamp() + make_interval(secs => p_next_ttl) WHERE id = ( SELECT id FROM "django_leases_workflowrun" WHERE status = \'running\' AND pass_due_at <= statement_timestamp() AND id IS DISTINCT FROM (SELECT run_id FROM step) AND id IS DISTINCT FROM (SELECT parent_id FROM done) ORDER BY pass_due_at LIMIT 1 FOR UPDATE SKIP LOCKED ) AND (status = \'running\') IS TRUE AND (pass_due_at <= statement_timestamp()) IS TRUE RETURNING "django_leases_workflowrun".id, "django_leases_workflowrun".workflow, "django_leases_workflowrun".status, "django_leases_workflowrun".input::text, "django_leases_workflowrun".pass_requests, (SELECT coalesce(json_agg(json_build_object(\'id\', s.id, \'step_name\', s.step_name, \'function_name\', s.function_name, \'status\', s.status, \'result\', s.result, \'error\', s.error, \'attempt\', s.attempt, \'retries\', s.retries, \'retry_delay\', s.retry_delay, \'retry_backoff\', s.retry_backoff, \'retry_delay_max\', s.retry_delay_max) ORDER BY s.id), \'[]\')::text FROM "django_leases_workflowstep" s WHERE s.run_id = "django_leases_workflowrun".id) ), granted AS (INSERT INTO "django_leases_lease" AS l (key, holder, token, expires_at, acquired_at, renewed_at, released_at) SELECT \'workflow-run:\' || picked.id::text, p_next_holder, 1, (statement_timestamp() + make_interval(secs => p_next_ttl)), statement_timestamp(), statement_timestamp(), NULL FROM picked ON CONFLICT (key) DO UPDATE SET token = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.token ELSE l.token + 1 END, acquired_at = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.acquired_at ELSE excluded.acquired_at END, holder = excluded.holder, expires_at = excluded.expires_at, renewed_at = excluded.renewed_at, released_at = NULL WHERE l.expires_at <= statement_timestamp() OR l.holder = excluded.holder RETURNING id, key, holder, token, expires_at, acquired_at, renewed_at, released_at) SELECT (SELECT count(*) FROM step), (SELECT id FROM done), (SELECT finished_at FROM done), (SELECT count(*) FROM notified), taken.*, picked.*, granted.* FROM (SELECT 1) AS one LEFT JOIN taken ON true LEFT JOIN (picked LEFT JOIN granted ON true) ON true;\nEND\n$dl$',
    'dl_complete_run_picking_e7d088df6ccc': 'CREATE OR REPLACE FUNCTION dl_complete_run_picking_e7d088df6ccc(p_step_id bigint, p_payload text, p_attempt bigint, p_output text, p_key text, p_holder text, p_token bigint, p_next_holder text, p_next_ttl double precision) RETURNS TABLE(r0 bigint, r1 bigint, r2 boolean, r3 timestamptz, r4 uuid, r5 varchar, r6 varchar, r7 text, r8 bigint, r9 text, r10 bigint, r11 varchar, r12 varchar, r13 bigint, r14 timestamptz, r15 timestamptz, r16 timestamptz, r17 timestamptz) LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off AS $dl$\n#variable_conflict use_column\nBEGIN\n    RETURN QUERY WITH step AS ( UPDATE "django_leases_workflowstep" SET status = \'succeeded\', result = p_payload::jsonb, error = NULL, lease_expires_at = NULL, updated_at = statement_timestamp() WHERE ("django_leases_workflowstep"."attempt" = (p_attempt) AND "django_leases_workflowstep"."id" = (p_step_id) AND "django_leases_workflowstep"."status" = \'running\') RETURNING id, run_id ), history AS ( UPDATE "django_leases_workflowstepattempt" SET status = \'succeeded\', result = p_payload::jsonb, finished_at = statement_timestamp() WHERE step_id = (SELECT id FROM step) AND attempt = p_attempt ), done AS ( UPDATE "django_leases_workflowrun" SET status = \'completed\', output = p_output::jsonb, error = NULL, pass_due_at = NULL, branches_left = 0, updated_at = statement_timestamp(), finished_at = statement_timestamp() WHERE id = (SELECT run_id FROM step) AND (status = \'running\') IS TRUE RETURNING id, parent_id, finished_at ), woken AS ( UPDATE "django_leases_workflowrun" SET pass_due_at = statement_timestamp(), pass_requests = pass_requests + 1, updated_at = statement_timestamp() WHERE id = (SELECT parent_id FROM done) AND (status = \'running\') IS TRUE ), released AS (WITH old AS (SELECT id, expires_at > statement_timestamp() AS live FROM "django_leases_lease" WHERE key = p_key AND EXISTS (SELECT 1 FROM step) AND holder = p_holder AND token = p_token AND released_at IS NULL FOR UPDATE) UPDATE "django_leases_lease" AS l SET released_at = statement_timestamp(), expires_at = CASE WHEN l.expires_at > statement_timestamp() THEN statement_timestamp() ELSE l.expires_at END FROM old WHERE l.id = old.id AND l.released_at IS NULL RETURNING old.live), picked AS ( UPDATE "django_leases_workflowrun" SET pass_due_at = statement_timestamp() + make_interval(secs => p_next_ttl) WHERE id = ( SELECT id FROM "django_leases_workflowrun" WHERE status = \'running\' AND pass_due_at <= statement_timestamp() AND id IS DISTINCT FROM (SELECT run_id FROM step) AND id IS DISTINCT FROM (SELECT parent_id FROM done) ORDER BY pass_due_at LIMIT 1 FOR UPDATE SKIP LOCKED ) AND (status = \'running\') IS TRUE AND (pass_due_at <= statement_timestamp()) IS TRUE RETURNING "django_leases_workflowrun".id, "django_leases_workflowrun".workflow, "django_leases_workflowrun".status, "django_leases_workflowrun".input::text, "django_leases_workflowrun".pass_requests, (SELECT coalesce(json_agg(json_build_object(\'id\', s.id, \'step_name\', s.step_name, \'function_name\', s.function_name, \'status\', s.status, \'result\', s.result, \'error\', s.error, \'attempt\', s.attempt, \'retries\', s.retries, \'retry_delay\', s.retry_delay, \'retry_backoff\', s.retry_backoff, \'retry_delay_max\', s.retry_delay_max) ORDER BY s.id), \'[]\')::text FROM "django_leases_workflowstep" s WHERE s.run_id = "django_leases_workflowrun".id) ), granted AS (INSERT INTO "django_leases_lease" AS l (key, holder, token, expires_at, acquired_at, renewed_at, released_at) SELECT \'workflow-run:\' || picked.id::text, p_next_holder, 1, (statement_timestamp() + make_interval(secs => p_next_ttl)), statement_timestamp(), statement_timestamp(), NULL FROM picked ON CONFLICT (key) DO UPDATE SET token = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.token ELSE l.token + 1 END, acquired_at = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.acquired_at ELSE excluded.acquired_at END, holder = excluded.holder, expires_at = excluded.expires_at, renewed_at = excluded.renewed_at, released_at = NULL WHERE l.expires_at <= statement_timestamp() OR l.holder = excluded.holder RETURNING id, key, holder, token, expires_at, acquired_at, renewed_at, released_at) SELECT (SELECT count(*) FROM step), (SELECT count(*) FROM done), (SELECT live FROM released), (SELECT finished_at FROM done), picked.*, granted.* FROM (SELECT 1) AS one LEFT JOIN (picked LEFT JOIN granted ON true) ON true;\nEND\n$dl$',
    'dl_insert_claimed_43b633adfeb2': 'CREATE OR REPLACE FUNCTION dl_insert_claimed_43b633adfeb2(p_run_id uuid, p_step_name text, p_function_name text, p_data text, p_retries bigint, p_retry_delay double precision, p_retry_backoff double precision, p_retry_delay_max double precision, p_seconds double precision, p_finish_pass bigint, p_claimant text) RETURNS TABLE(r0 bigint) LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off AS $dl$\n#variable_conflict use_column\nBEGIN\n    RETURN QUERY WITH step AS ( INSERT INTO "django_leases_workflowstep" ( run_id, step_name, function_name, data, status, attempt, retries, retry_delay, retry_backoff, retry_delay_max, lease_expires_at, claimant, available_at, created_at, updated_at ) SELECT r.id, p_step_name, p_function_name, p_data::jsonb, \'running\', 1, p_retries, p_retry_delay, p_retry_backoff, p_retry_delay_max, statement_timestamp() + make_interval(secs => p_seconds), p_claimant, statement_timestamp(), statement_timestamp(), statement_timestamp() FROM "django_leases_workflowrun" r WHERE r.id = p_run_id AND (r.status = \'running\') IS TRUE ON CONFLICT (run_id, step_name) DO NOTHING RETURNING id ), step_history AS ( INSERT INTO "django_leases_workflowstepattempt" (step_id, attempt, status, started_at) SELECT id, 1, \'running\', statement_timestamp() FROM step ), finished AS ( UPDATE "django_leases_workflowrun" SET pass_due_at = NULL WHERE id = p_run_id AND pass_requests = p_finish_pass AND EXISTS (SELECT 1 FROM step) ) SELECT id FROM step;\nEND\n$dl$',
    'dl_pick_pass_4029a381a74a': 'CREATE OR REPLACE FUNCTION dl_pick_pass_4029a381a74a(p_seconds double precision, p_holder text) RETURNS TABLE(r0 uuid, r1 varchar, r2 varchar, r3 text, r4 bigint, r5 text, r6 bigint, r7 varchar, r8 varchar, r9 bigint, r10 timestamptz, r11 timestamptz, r12 timestamptz, r13 timestamptz) LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off AS $dl$\n#variable_conflict use_column\nBEGIN\n    RETURN QUERY WITH picked AS ( UPDATE "django_leases_workflowrun" SET pass_due_at = statement_timestamp() + make_interval(secs => p_seconds) WHERE id = ( SELECT id FROM "django_leases_workflowrun" WHERE status = \'running\' AND pass_due_at <= statement_timestamp() ORDER BY pass_due_at LIMIT 1 FOR UPDATE SKIP LOCKED ) AND (status = \'running\') IS TRUE AND (pass_due_at <= statement_timestamp()) IS TRUE RETURNING "django_leases_workflowrun".id, "django_leases_workflowrun".workflow, "django_leases_workflowrun".status, "django_leases_workflowrun".input::text, "django_leases_workflowrun".pass_requests, (SELECT coalesce(json_agg(json_build_object(\'id\', s.id, \'step_name\', s.step_name, \'function_name\', s.function_name, \'status\', s.status, \'result\', s.result, \'error\', s.error, \'attempt\', s.attempt, \'retries\', s.retries, \'retry_delay\', s.retry_delay, \'retry_backoff\', s.retry_backoff, \'retry_delay_max\', s.retry_delay_max) ORDER BY s.id), \'[]\')::text FROM "django_leases_workflowstep" s WHERE s.run_id = "django_leases_workflowrun".id) ), granted AS (INSERT INTO "django_leases_lease" AS l (key, holder, token, expires_at, acquired_at, renewed_at, released_at) SELECT \'workflow-run:\' || picked.id::text, p_holder, 1, (statement_timestamp() + make_interval(secs => p_seconds)), statement_timestamp(), statement_timestamp(), NULL FROM picked ON CONFLICT (key) DO UPDATE SET token = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.token ELSE l.token + 1 END, acquired_at = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.acquired_at ELSE excluded.acquired_at END, holder = excluded.holder, expires_at = excluded.expires_at, renewed_at = excluded.renewed_at, released_at = NULL WHERE l.expires_at <= statement_timestamp() OR l.holder = excluded.holder RETURNING id, key, holder, token, expires_at, acquired_at, renewed_at, released_at) SELECT picked.*, granted.* FROM picked LEFT JOIN granted ON true;\nEND\n$dl$',
    'dl_set_result_claiming_next_ac00f77bc826': 'CREATE OR REPLACE FUNCTION dl_set_result_claiming_next_ac00f77bc826(p_step_id bigint, p_payload text, p_attempt bigint, p_hold double precision, p_step_name text, p_function_name text, p_data text, p_retries bigint, p_retry_delay double precision, p_retry_backoff double precision, p_retry_delay_max double precision, p_seconds double precision, p_finish_pass bigint, p_claimant text) RETURNS TABLE(r0 bigint, r1 uuid, r2 bigint, r3 bigint, r4 uuid, r5 varchar, r6 varchar, r7 text, r8 bigint, r9 text) LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off AS $dl$\n#variable_conflict use_column\nBEGIN\n    RETURN QUERY WITH step AS ( UPDATE "django_leases_workflowstep" SET status = \'succeeded\', result = p_payload::jsonb, error = NULL, lease_expires_at = NULL, updated_at = statement_timestamp() WHERE ("django_leases_workflowstep"."attempt" = (p_attempt) AND "django_leases_workflowstep"."id" = (p_step_id) AND "django_leases_workflowstep"."status" = \'running\') RETURNING id, run_id ), history AS ( UPDATE "django_leases_workflowstepattempt" SET status = \'succeeded\', result = p_payload::jsonb, finished_at = statement_timestamp() WHERE step_id = (SELECT id FROM step) AND attempt = p_attempt ), next AS ( INSERT INTO "django_leases_workflowstep" ( run_id, step_name, function_name, data, status, attempt, retries, retry_delay, retry_backoff, retry_delay_max, lease_expires_at, claimant, available_at, created_at, updated_at ) SELECT r.id, p_step_name, p_function_name, p_data::jsonb, \'running\', 1, p_retries, p_retry_delay, p_retry_backoff, p_retry_delay_max, statement_timestamp() + make_interval(secs => p_seconds), p_claimant, statement_timestamp(), statement_timestamp(), statement_timestamp() FROM "django_leases_workflowrun" r WHERE r.id = (SELECT run_id FROM step) AND (r.status = \'running\') IS TRUE AND r.branches_left <= 1 FOR SHARE OF r ON CONFLICT (run_id, step_name) DO NOTHING RETURNING id ), next_history AS ( INSERT INTO "django_leases_workflowstepattempt" (step_id, attempt, status, started_at) SELECT id, 1, \'running\', statement_timestamp() FROM next ), run AS ( UPDATE "django_leases_workflowrun" AS r SET pass_due_at = CASE WHEN r.branches_left > 1 THEN r.pass_due_at WHEN NOT EXISTS (SELECT 1 FROM next) THEN statement_timestamp() + make_interval(secs => p_hold) WHEN r.pass_requests = p_finish_pass THEN NULL ELSE statement_timestamp() END, branches_left = CASE WHEN r.branches_left > 1 THEN r.branches_left - 1 ELSE 0 END, pass_requests = pass_requests + 1, updated_at = statement_timestamp() WHERE id = (SELECT run_id FROM step) AND (status = \'running\') IS TRUE RETURNING r.id, r.workflow, r.status, r.input, r.pass_requests, r.pass_due_at, r.branches_left = 0 AND NOT EXISTS (SELECT 1 FROM next) AS asked ) SELECT (SELECT count(*) FROM step), (SELECT run_id FROM step), (SELECT id FROM next), (SELECT pass_requests FROM run WHERE pass_due_at IS NULL), run.id, run.workflow, run.status, run.input::text, run.pass_requests, (SELECT coalesce(json_agg(json_build_object(\'id\', s.id, \'step_name\', s.step_name, \'function_name\', s.function_name, \'status\', s.status, \'result\', s.result, \'error\', s.error, \'attempt\', s.attempt, \'retries\', s.retries, \'retry_delay\', s.retry_delay, \'retry_backoff\', s.retry_backoff, \'retry_delay_max\', s.retry_delay_max) ORDER BY s.id), \'[]\')::text FROM "django_leases_workflowstep" s WHERE s.run_id = run.id) FROM (SELECT 1) AS one LEFT JOIN run ON run.asked;\nEND\n$dl$',
    'dl_take_pass_cf9b7fa4b419': 'CREATE OR REPLACE FUNCTION dl_take_pass_cf9b7fa4b419(p_run_id uuid, p_seconds double precision, p_holder text) RETURNS TABLE(r0 uuid, r1 varchar, r2 varchar, r3 text, r4 bigint, r5 text, r6 bigint, r7 varchar, r8 varchar, r9 bigint, r10 timestamptz, r11 timestamptz, r12 timestamptz, r13 timestamptz) LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off SET jit = off AS $dl$\n#variable_conflict use_column\nBEGIN\n    RETURN QUERY WITH picked AS ( SELECT "django_leases_workflowrun".id, "django_leases_workflowrun".workflow, "django_leases_workflowrun".status, "django_leases_workflowrun".input::text, "django_leases_workflowrun".pass_requests, (SELECT coalesce(json_agg(json_build_object(\'id\', s.id, \'step_name\', s.step_name, \'function_name\', s.function_name, \'status\', s.status, \'result\', s.result, \'error\', s.error, \'attempt\', s.attempt, \'retries\', s.retries, \'retry_delay\', s.retry_delay, \'retry_backoff\', s.retry_backoff, \'retry_delay_max\', s.retry_delay_max) ORDER BY s.id), \'[]\')::text FROM "django_leases_workflowstep" s WHERE s.run_id = "django_leases_workflowrun".id) FROM "django_leases_workflowrun" WHERE id = p_run_id AND (status = \'running\') IS TRUE AND branches_left <= 1 ), granted AS (INSERT INTO "django_leases_lease" AS l (key, holder, token, expires_at, acquired_at, renewed_at, released_at) SELECT \'workflow-run:\' || picked.id::text, p_holder, 1, (statement_timestamp() + make_interval(secs => p_seconds)), statement_timestamp(), statement_timestamp(), NULL FROM picked ON CONFLICT (key) DO UPDATE SET token = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.token ELSE l.token + 1 END, acquired_at = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.acquired_at ELSE excluded.acquired_at END, holder = excluded.holder, expires_at = excluded.expires_at, renewed_at = excluded.renewed_at, released_at = NULL WHERE l.expires_at <= statement_timestamp() OR l.holder = excluded.holder RETURNING id, key, holder, token, expires_at, acquired_at, renewed_at, released_at) SELECT picked.*, granted.* FROM picked LEFT JOIN granted ON true;\nEND\n$dl$',
}

#: The lease operations' functions (as ``0030_lease_epochs`` installs them).
LEASE_FUNCTIONS = {
    'dl_lease_acquire_518ac827135c': 'CREATE OR REPLACE FUNCTION dl_lease_acquire_518ac827135c(p_key text, p_holder text, p_ttl_us bigint, OUT r_id bigint, OUT r_token bigint, OUT r_expires_at timestamptz, OUT r_acquired_at timestamptz) LANGUAGE plpgsql VOLATILE AS $dl$\n#variable_conflict use_column\nBEGIN\n    UPDATE "django_leases_lease" AS l SET token = CASE WHEN (l.holder = p_holder AND l.expires_at > statement_timestamp()) THEN l.token ELSE GREATEST(l.token + 1, (((\'x\' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) * 1000000000000) + 1) END, acquired_at = CASE WHEN (l.holder = p_holder AND l.expires_at > statement_timestamp()) THEN l.acquired_at ELSE statement_timestamp() END, holder = p_holder, expires_at = statement_timestamp() + p_ttl_us * interval \'1 microsecond\', renewed_at = statement_timestamp(), released_at = NULL WHERE l.key = p_key AND (l.expires_at <= statement_timestamp() OR l.holder = p_holder) RETURNING l.id, l.token, l.expires_at, l.acquired_at INTO r_id, r_token, r_expires_at, r_acquired_at;\n    IF NOT FOUND THEN\n        INSERT INTO "django_leases_lease" AS l (key, holder, token, expires_at, acquired_at, renewed_at, released_at) VALUES (p_key, p_holder, (((\'x\' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) * 1000000000000) + 1, statement_timestamp() + p_ttl_us * interval \'1 microsecond\', statement_timestamp(), statement_timestamp(), NULL) ON CONFLICT (key) DO UPDATE SET token = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.token ELSE GREATEST(l.token + 1, (((\'x\' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) * 1000000000000) + 1) END, acquired_at = CASE WHEN (l.holder = excluded.holder AND l.expires_at > statement_timestamp()) THEN l.acquired_at ELSE excluded.acquired_at END, holder = excluded.holder, expires_at = excluded.expires_at, renewed_at = excluded.renewed_at, released_at = NULL WHERE l.expires_at <= statement_timestamp() OR l.holder = excluded.holder RETURNING l.id, l.token, l.expires_at, l.acquired_at INTO r_id, r_token, r_expires_at, r_acquired_at;\n    END IF;\nEND\n$dl$',
    'dl_lease_refresh_5337a261d12c': 'CREATE OR REPLACE FUNCTION dl_lease_refresh_5337a261d12c(p_key text, p_holder text, p_token bigint, p_ttl_us bigint, OUT r_expires_at timestamptz) LANGUAGE plpgsql VOLATILE AS $dl$\n#variable_conflict use_column\nBEGIN\n    UPDATE "django_leases_lease" SET expires_at = statement_timestamp() + p_ttl_us * interval \'1 microsecond\', renewed_at = statement_timestamp() WHERE key = p_key AND holder = p_holder AND token = p_token AND released_at IS NULL AND expires_at > statement_timestamp() RETURNING expires_at INTO r_expires_at;\nEND\n$dl$',
    'dl_lease_release_236676491e56': 'CREATE OR REPLACE FUNCTION dl_lease_release_236676491e56(p_key text, p_holder text, p_token bigint) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $dl$\n#variable_conflict use_column\nBEGIN\n    UPDATE "django_leases_lease" SET released_at = statement_timestamp(), expires_at = CASE WHEN expires_at > statement_timestamp() THEN statement_timestamp() ELSE expires_at END WHERE key = p_key AND holder = p_holder AND token = p_token AND released_at IS NULL;\n    RETURN FOUND;\nEND\n$dl$',
}

#: The tables whose new pages keep room for HOT updates (see ``0023_workflow_hot_updates``).
FILLFACTOR_TABLES = ("django_leases_workflowrun", "django_leases_workflowstep")


def install(apps, schema_editor):  # type: ignore[no-untyped-def]
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return
    quote = connection.ops.quote_name
    for table in FILLFACTOR_TABLES:
        schema_editor.execute(f"ALTER TABLE {quote(table)} SET (fillfactor = 80)")
    with connection.cursor() as cursor:
        for statement in [*FUNCTIONS.values(), *LEASE_FUNCTIONS.values()]:
            cursor.execute(statement)


def uninstall(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for name in [*FUNCTIONS, *LEASE_FUNCTIONS]:
            cursor.execute(f"DROP FUNCTION IF EXISTS {name}")


class Migration(migrations.Migration):
    initial = True

    replaces = [
        ("django_leases", "0001_initial"),
        ("django_leases", "0002_trigger_secrets"),
        ("django_leases", "0003_workflow_functions"),
        ("django_leases", "0004_workflow_functions"),
        ("django_leases", "0005_workflow_workers"),
        ("django_leases", "0006_trigger_source_defaults"),
        ("django_leases", "0007_trigger_refusals"),
        ("django_leases", "0008_workflow_waits"),
        ("django_leases", "0009_workflow_run_keys"),
        ("django_leases", "0010_trigger_event_outcomes"),
        ("django_leases", "0011_workflow_children"),
        ("django_leases", "0012_workflow_functions"),
        ("django_leases", "0013_workflow_step_timeouts"),
        ("django_leases", "0014_clock_defaults"),
        ("django_leases", "0015_workflow_queues"),
        ("django_leases", "0016_workflow_schedules"),
        ("django_leases", "0017_lease_functions"),
        ("django_leases", "0018_workflow_run_ids"),
        ("django_leases", "0019_workflow_run_branches"),
        ("django_leases", "0020_workflow_functions"),
        ("django_leases", "0021_workflow_step_backoff"),
        ("django_leases", "0022_workflow_functions"),
        ("django_leases", "0023_workflow_hot_updates"),
        ("django_leases", "0024_workflow_functions"),
        ("django_leases", "0025_workflow_functions"),
        ("django_leases", "0026_workflow_functions"),
        ("django_leases", "0027_workflow_step_claimants"),
        ("django_leases", "0028_workflow_functions"),
        ("django_leases", "0029_verbose_names"),
        ("django_leases", "0030_lease_epochs"),
    ]

    dependencies = []

    operations = [
        migrations.CreateModel(
            name='TriggerSecret',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200, unique=True)),
                ('ciphertext', models.TextField()),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'ordering': ('name',),
            },
        ),
        migrations.CreateModel(
            name='TriggerSource',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200, unique=True, verbose_name='name')),
                ('kind', models.CharField(default='webhook', max_length=32, verbose_name='kind')),
                ('provider', models.CharField(max_length=64, verbose_name='provider')),
                ('config', models.JSONField(blank=True, default=dict, help_text='Non-secret provider config.', verbose_name='config')),
                ('base_url', models.CharField(blank=True, max_length=500, null=True, verbose_name='base URL')),
                ('label_prefix', models.CharField(blank=True, max_length=200, null=True, verbose_name='label prefix')),
                ('declared', models.BooleanField(default=True, verbose_name='declared')),
                ('enabled', models.BooleanField(default=False, verbose_name='enabled')),
                ('status', models.CharField(blank=True, max_length=32, null=True, verbose_name='status')),
                ('state', models.JSONField(blank=True, null=True, verbose_name='state')),
                ('detail', models.TextField(blank=True, null=True, verbose_name='detail')),
                ('updated_at', models.DateTimeField(auto_now=True, verbose_name='updated at')),
            ],
            options={
                'verbose_name': 'trigger source',
                'verbose_name_plural': 'trigger sources',
                'ordering': ('name',),
                'permissions': (('toggle_triggersource', 'Can enable, disable and tear down trigger sources'),),
            },
        ),
        migrations.CreateModel(
            name='TriggerSourceDefaults',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('base_url', models.CharField(blank=True, max_length=500, null=True)),
                ('label_prefix', models.CharField(blank=True, max_length=200, null=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'verbose_name': 'trigger-source defaults',
                'verbose_name_plural': 'trigger-source defaults',
            },
        ),
        migrations.CreateModel(
            name='WorkflowQueue',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200, unique=True)),
                ('starts', models.JSONField(blank=True, default=list)),
                ('updated_at', models.DateTimeField(db_default=django_leases.clock.DbNow())),
            ],
            options={
                'verbose_name': 'workflow queue',
                'ordering': ('name',),
            },
        ),
        migrations.CreateModel(
            name='WorkflowWorker',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('lease_key', models.CharField(max_length=255, unique=True)),
                ('host', models.CharField(max_length=255)),
                ('pid', models.PositiveIntegerField()),
                ('concurrency', models.PositiveIntegerField(default=1)),
                ('queues', models.JSONField(blank=True, default=list, help_text='Empty: every queue.')),
                ('wakeup', models.CharField(blank=True, default='', max_length=255)),
                ('in_flight', models.PositiveIntegerField(default=0)),
                ('started_at', models.DateTimeField(db_default=django_leases.clock.DbNow())),
                ('beat_at', models.DateTimeField(db_default=django_leases.clock.DbNow())),
                ('stopped_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'workflow worker',
                'ordering': ('-started_at',),
            },
        ),
        migrations.CreateModel(
            name='Lease',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=255, verbose_name='key')),
                ('holder', models.CharField(max_length=255, verbose_name='holder')),
                ('token', models.BigIntegerField(default=1, help_text='Fencing token; rises on every takeover.', verbose_name='token')),
                ('expires_at', models.DateTimeField(verbose_name='expires at')),
                ('acquired_at', models.DateTimeField(blank=True, null=True, verbose_name='acquired at')),
                ('renewed_at', models.DateTimeField(blank=True, null=True, verbose_name='renewed at')),
                ('released_at', models.DateTimeField(blank=True, null=True, verbose_name='released at')),
            ],
            options={
                'verbose_name': 'lease',
                'verbose_name_plural': 'leases',
                'ordering': ('key',),
                'permissions': (('force_release_lease', 'Can force-release a lease'),),
                'constraints': [models.UniqueConstraint(fields=('key',), name='dl_lease_unique_key')],
            },
        ),
        migrations.CreateModel(
            name='OrphanTriggerSource',
            fields=[
            ],
            options={
                'verbose_name': 'orphaned trigger source',
                'verbose_name_plural': 'orphaned trigger sources',
                'proxy': True,
                'indexes': [],
                'constraints': [],
            },
            bases=('django_leases.triggersource',),
        ),
        migrations.CreateModel(
            name='WorkflowRun',
            fields=[
                ('id', models.UUIDField(default=django_leases.ids.uuid7, editable=False, primary_key=True, serialize=False)),
                ('workflow', models.CharField(max_length=200)),
                ('status', models.CharField(choices=[('running', 'Running'), ('suspended', 'Suspended'), ('completed', 'Completed'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], default='running', max_length=16)),
                ('input', models.JSONField(blank=True, default=dict)),
                ('output', models.JSONField(blank=True, null=True)),
                ('error', models.JSONField(blank=True, null=True)),
                ('pass_due_at', models.DateTimeField(blank=True, null=True)),
                ('pass_requests', models.PositiveBigIntegerField(default=0)),
                ('branches_left', models.PositiveIntegerField(db_default=0, default=0, help_text='Parallel steps the last pass waits on that have not finished yet.')),
                ('key', models.CharField(blank=True, help_text='Idempotency key: one run per workflow and key.', max_length=255, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('parent', models.ForeignKey(blank=True, help_text='The run that started this one with run.child.', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='children', to='django_leases.workflowrun')),
            ],
            options={
                'ordering': ('-created_at',),
                'permissions': (('operate_workflowrun', 'Can resume, cancel and retry workflow runs'),),
            },
        ),
        migrations.CreateModel(
            name='TriggerEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('source_name', models.CharField(max_length=200, verbose_name='source name')),
                ('delivery_id', models.CharField(max_length=200, verbose_name='delivery id')),
                ('event', models.CharField(max_length=200, verbose_name='event')),
                ('payload', models.JSONField(verbose_name='payload')),
                ('outcome', models.CharField(blank=True, default='', help_text='What the handler did with the delivery, when it said so.', max_length=500)),
                ('received_at', models.DateTimeField(auto_now_add=True, verbose_name='received at')),
                ('source', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='events', to='django_leases.triggersource')),
                ('run', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, to='django_leases.workflowrun')),
            ],
            options={
                'verbose_name': 'trigger event',
                'verbose_name_plural': 'trigger events',
                'ordering': ('-received_at',),
            },
        ),
        migrations.CreateModel(
            name='WorkflowSchedule',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200, unique=True, verbose_name='name')),
                ('workflow', models.CharField(max_length=200, verbose_name='workflow')),
                ('cron', models.CharField(max_length=200, verbose_name='cron')),
                ('timezone', models.CharField(default='UTC', max_length=64, verbose_name='time zone')),
                ('input', models.JSONField(blank=True, default=dict, verbose_name='input')),
                ('catch_up', models.CharField(choices=[('latest', 'latest'), ('none', 'none')], default='latest', max_length=16, verbose_name='catch up')),
                ('declared', models.BooleanField(default=True, verbose_name='declared')),
                ('paused', models.BooleanField(default=False, verbose_name='paused')),
                ('next_tick', models.DateTimeField(blank=True, null=True, verbose_name='next tick')),
                ('last_tick', models.DateTimeField(blank=True, null=True, verbose_name='last tick')),
                ('last_run_id', models.UUIDField(blank=True, null=True, verbose_name='last run id')),
                ('created_at', models.DateTimeField(db_default=django_leases.clock.DbNow(), verbose_name='created at')),
                ('updated_at', models.DateTimeField(db_default=django_leases.clock.DbNow(), verbose_name='updated at')),
            ],
            options={
                'verbose_name': 'workflow schedule',
                'verbose_name_plural': 'workflow schedules',
                'ordering': ('name',),
                'permissions': (('pause_workflowschedule', 'Can pause and resume workflow schedules'),),
                'indexes': [models.Index(fields=['next_tick'], name='dl_schedule_next_tick')],
            },
        ),
        migrations.CreateModel(
            name='WorkflowStep',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('step_name', models.CharField(max_length=200)),
                ('function_name', models.CharField(max_length=200)),
                ('data', models.JSONField(blank=True, default=dict)),
                ('status', models.CharField(choices=[('pending', 'Pending'), ('scheduled', 'Scheduled'), ('running', 'Running'), ('succeeded', 'Succeeded'), ('failed', 'Failed')], default='pending', max_length=16)),
                ('result', models.JSONField(blank=True, null=True)),
                ('error', models.JSONField(blank=True, null=True)),
                ('attempt', models.PositiveIntegerField(default=1)),
                ('retries', models.PositiveIntegerField(default=5)),
                ('retry_delay', models.FloatField(default=0.0, help_text='Seconds before the first retry (later ones grow by the backoff).')),
                ('retry_backoff', models.FloatField(db_default=1.0, default=1.0, help_text='Factor each retry delay is multiplied by after the first (1: constant).')),
                ('retry_delay_max', models.FloatField(blank=True, help_text='Seconds no retry delay exceeds (empty: one day).', null=True)),
                ('timeout', models.FloatField(blank=True, help_text='Seconds an attempt may run before it is failed.', null=True)),
                ('deadline_at', models.DateTimeField(blank=True, help_text='When the running attempt times out (its timeout).', null=True)),
                ('lease_expires_at', models.DateTimeField(blank=True, null=True)),
                ('claimant', models.CharField(blank=True, db_default='', default='', help_text='Who the claim of the running attempt names, where its write named one.', max_length=32)),
                ('available_at', models.DateTimeField(blank=True, null=True)),
                ('queue', models.CharField(db_default='default', default='default', help_text="The queue it is claimed from (its step function's).", max_length=200)),
                ('priority', models.IntegerField(db_default=0, default=0, help_text='Higher is claimed first; FIFO within a priority.')),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('run', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='django_leases.workflowrun')),
            ],
            options={
                'ordering': ('created_at', 'id'),
            },
        ),
        migrations.CreateModel(
            name='WorkflowStepAttempt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('attempt', models.PositiveIntegerField()),
                ('status', models.CharField(choices=[('running', 'Running'), ('succeeded', 'Succeeded'), ('failed', 'Failed')], default='running', max_length=16)),
                ('result', models.JSONField(blank=True, null=True)),
                ('error', models.JSONField(blank=True, null=True)),
                ('started_at', models.DateTimeField(db_default=django_leases.clock.DbNow())),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('step', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='attempts', to='django_leases.workflowstep')),
            ],
            options={
                'ordering': ('id',),
            },
        ),
        migrations.CreateModel(
            name='WorkflowWait',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200)),
                ('kind', models.CharField(choices=[('sleep', 'Sleep'), ('event', 'Event'), ('child', 'Child')], max_length=16)),
                ('status', models.CharField(choices=[('waiting', 'Waiting'), ('done', 'Done'), ('timed_out', 'Timed Out')], default='waiting', max_length=16)),
                ('due_at', models.DateTimeField(blank=True, help_text="A sleep's end, or an event's timeout.", null=True)),
                ('payload', models.JSONField(blank=True, null=True)),
                ('created_at', models.DateTimeField(db_default=django_leases.clock.DbNow())),
                ('reached_at', models.DateTimeField(blank=True, null=True)),
                ('done_at', models.DateTimeField(blank=True, null=True)),
                ('child', models.ForeignKey(blank=True, help_text='The child run a run.child wait started.', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='django_leases.workflowrun')),
                ('run', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='waits', to='django_leases.workflowrun')),
            ],
            options={
                'verbose_name': 'workflow wait',
                'ordering': ('id',),
            },
        ),
        migrations.CreateModel(
            name='TriggerRefusal',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('reason', models.CharField(choices=[('not_receiving', 'unknown, orphaned or disabled source'), ('bad_request', 'bad Content-Length, or a one-value header sent twice'), ('too_large', 'body over WEBHOOK_MAX_BODY'), ('no_secret', 'the source has no usable signing secret'), ('bad_signature', 'signature missing or not matching'), ('malformed', 'signed, but not a delivery that can be read'), ('not_recorded', 'the handler or the database failed; nothing was kept')], max_length=32)),
                ('count', models.BigIntegerField(default=1)),
                ('last_status', models.PositiveSmallIntegerField()),
                ('first_refused_at', models.DateTimeField(auto_now_add=True)),
                ('last_refused_at', models.DateTimeField(auto_now_add=True)),
                ('source', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='refusals', to='django_leases.triggersource')),
            ],
            options={
                'verbose_name': 'refused deliveries',
                'verbose_name_plural': 'refused deliveries',
                'ordering': ('source', 'reason'),
                'constraints': [models.UniqueConstraint(fields=('source', 'reason'), name='dl_refusal_unique_reason')],
            },
        ),
        migrations.AddIndex(
            model_name='workflowrun',
            index=models.Index(condition=models.Q(('pass_due_at__isnull', False)), fields=['pass_due_at'], name='dl_run_pass_due'),
        ),
        migrations.AddIndex(
            model_name='workflowrun',
            index=models.Index(fields=['status', 'created_at'], name='dl_run_status'),
        ),
        migrations.AddConstraint(
            model_name='workflowrun',
            constraint=models.UniqueConstraint(fields=('workflow', 'key'), name='dl_run_unique_key'),
        ),
        migrations.AddConstraint(
            model_name='triggerevent',
            constraint=models.UniqueConstraint(fields=('source_name', 'delivery_id'), name='dl_event_unique_delivery'),
        ),
        migrations.AddIndex(
            model_name='workflowstep',
            index=models.Index(condition=models.Q(('status__in', ['pending', 'scheduled', 'failed'])), fields=['available_at'], name='dl_step_waiting'),
        ),
        migrations.AddIndex(
            model_name='workflowstep',
            index=models.Index(condition=models.Q(('status', 'running')), fields=['queue'], name='dl_step_running'),
        ),
        migrations.AddIndex(
            model_name='workflowstep',
            index=models.Index(condition=models.Q(('status__in', ['pending', 'scheduled', 'failed'])), fields=['-priority', 'available_at', 'id'], name='dl_step_claim_order'),
        ),
        migrations.AddIndex(
            model_name='workflowstep',
            index=models.Index(condition=models.Q(('status__in', ['pending', 'scheduled', 'failed'])), fields=['queue', '-priority', 'available_at', 'id'], name='dl_step_queue_waiting'),
        ),
        migrations.AddConstraint(
            model_name='workflowstep',
            constraint=models.UniqueConstraint(fields=('run', 'step_name'), name='dl_step_unique_name'),
        ),
        migrations.AddConstraint(
            model_name='workflowstepattempt',
            constraint=models.UniqueConstraint(fields=('step', 'attempt'), name='dl_attempt_unique'),
        ),
        migrations.AddConstraint(
            model_name='workflowwait',
            constraint=models.UniqueConstraint(fields=('run', 'name'), name='dl_wait_unique_name'),
        ),
        migrations.RunPython(install, uninstall, elidable=False),
    ]

"""The worker's hot statements as PL/pgSQL functions (PostgreSQL): the catalogue.

Each function's body is one statement of :mod:`django_leases.workflows.sql` with the
function's arguments in place of its parameters, so that every server connection caches its
plan; its name ends with a hash of its definition (:class:`~django_leases.workflows.sql.
Function`), so code whose statement changed never calls a function installed for another, and
versions live side by side while a rolling deploy runs. The migrations install them as frozen
text (``tests/functions_migration.py`` writes that migration; a test checks the latest one
holds exactly these). A leaf: the rules of other methods that the statements embed — the step
fence, the lease acquire and release — come in as :class:`Pieces` from the models.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from django_leases.frozen import frozen
from django_leases.workflows.sql import (
    CLAIM_STEP_TYPES,
    LEASE_TYPES,
    PASS_STATE_TYPES,
    Arg,
    Function,
    NewStep,
    Tables,
    claim_queue,
    claim_queue_counted,
    claim_queue_lock,
    claim_step,
    claim_step_except,
    completion,
    completion_alone,
    insert_claimed,
    pick_pass_alone,
    set_result_claiming_next,
    take_pass,
)


@frozen
class Pieces:
    """What the catalogue takes from the models: SQL of rules written beside them.

    Attributes:
        tables: the quoted table names.
        fence: the step fence for ``(step id, attempt)`` given as SQL expressions (argument
            names): ``(where, params)``.
        acquire: the lease acquire statement over ``rows`` (``INSERT … ON CONFLICT …``).
        acquire_released: the same for a grant released as it is made.
        release: the held-lease release statement for a key condition.
        grant: a fresh grant's five columns (one parameter, the TTL).
        released: a released grant's five columns (no parameter).
    """

    tables: Tables
    fence: Callable[[str, str], tuple[str, list[Any]]]
    acquire: Callable[[str], str]
    acquire_released: Callable[[str], str]
    release: Callable[[str], str]
    grant: str
    released: str


def _arg(name: str, sql_type: str) -> Arg:
    return Arg(name, sql_type)


def catalogue(pieces: Pieces) -> dict[str, Function]:
    """The worker's hot statements as PL/pgSQL functions, by short name: ``claim_step``,
    ``claim_queue`` (any limited queue), ``claim_queue_keyed`` (a keyed queue without rates),
    ``claim_queue_counted`` (a queue whose only limit is its concurrency),
    ``claim_step_except`` (the unlimited queues of a worker that also takes limited ones),
    ``take_pass``, ``pick_pass``, ``insert_claimed``, ``set_result_claiming_next``,
    ``complete_run``, ``complete_run_picking``, ``complete_run_alone``,
    ``complete_run_alone_picking`` and ``complete_run_alone_claiming``, built from the
    statements of :mod:`django_leases.workflows.sql` and the models' ``pieces``."""
    t = pieces.tables
    acquire, release, grant = pieces.acquire, pieces.release, pieces.grant
    step_id, attempt = _arg("p_step_id", "bigint"), _arg("p_attempt", "bigint")
    fence, fence_params = pieces.fence(step_id.name, attempt.name)
    completion_args = (
        step_id,
        _arg("p_payload", "text"),
        attempt,
        _arg("p_output", "text"),
        _arg("p_key", "text"),
        _arg("p_holder", "text"),
        _arg("p_token", "bigint"),
    )
    _, payload, _, output, key, holder, token = completion_args
    ttl, pick_holder = _arg("p_seconds", "double precision"), _arg("p_holder", "text")
    next_ttl, next_holder = _arg("p_next_ttl", "double precision"), _arg("p_next_holder", "text")
    insert_args = (
        _arg("p_run_id", "uuid"),
        _arg("p_step_name", "text"),
        _arg("p_function_name", "text"),
        _arg("p_data", "text"),
        _arg("p_retries", "bigint"),
        _arg("p_retry_delay", "double precision"),
        _arg("p_retry_backoff", "double precision"),
        _arg("p_retry_delay_max", "double precision"),
        _arg("p_seconds", "double precision"),
        _arg("p_finish_pass", "bigint"),
        _arg("p_claimant", "text"),
    )
    finish_pass, claimant = insert_args[9:]
    new_step = NewStep(*insert_args[1:9], claimant=claimant)
    completed = ("bigint", "bigint", "boolean", "timestamptz")
    hold = _arg("p_hold", "double precision")
    acquire_released, released = pieces.acquire_released, pieces.released
    alone_args = (
        step_id,
        payload,
        attempt,
        output,
        _arg("p_holder", "text"),
        _arg("p_channel", "text"),
    )
    alone_returns = ("bigint", "uuid", "timestamptz", "bigint", *LEASE_TYPES)
    picked = (*PASS_STATE_TYPES, *LEASE_TYPES)
    run_id = _arg("p_run_id", "uuid")
    queues = _arg("p_queues", "text[]")
    # A claim's name for itself, by which a caller whose reply was lost finds the step again.
    claim_claimant = _arg("p_claimant", "text")
    claim_queue_args = (
        ttl,
        _arg("p_queue", "text"),
        _arg("p_keyed", "boolean"),
        _arg("p_concurrency", "bigint"),
        _arg("p_rate_starts", "bigint"),
        _arg("p_rate_window", "double precision"),
        _arg("p_key_concurrency", "bigint"),
        _arg("p_key_rate_starts", "bigint"),
        _arg("p_key_rate_window", "double precision"),
    )
    # The completions differ only by what follows them (a pass picked, a step claimed).
    complete = partial(
        completion, t, fence, fence_params, release, payload, attempt, output, key, holder, token
    )
    complete_alone = partial(
        completion_alone, t, fence, fence_params, acquire_released, released, *alone_args[1:]
    )
    _, queue, _, concurrency, _, _, key_concurrency, _, _ = claim_queue_args
    found = (
        Function(
            "claim_queue",
            (*claim_queue_args, claim_claimant),
            CLAIM_STEP_TYPES,
            claim_queue(t, *claim_queue_args, claim_claimant),
            prelude=claim_queue_lock(t, queue),
        ),
        Function(
            "claim_queue_keyed",
            (ttl, queue, concurrency, key_concurrency, claim_claimant),
            CLAIM_STEP_TYPES,
            claim_queue(
                t,
                ttl,
                queue,
                True,
                concurrency,
                None,
                None,
                key_concurrency,
                None,
                None,
                claim_claimant,
            ),
            prelude=claim_queue_lock(t, queue),
        ),
        Function(
            "claim_queue_counted",
            (ttl, queue, concurrency, claim_claimant),
            CLAIM_STEP_TYPES,
            claim_queue_counted(t, ttl, queue, concurrency, claim_claimant),
            prelude=claim_queue_lock(t, queue),
        ),
        Function(
            "claim_step",
            (ttl, queues, claim_claimant),
            CLAIM_STEP_TYPES,
            claim_step(t, ttl, queues, claim_claimant),
        ),
        Function(
            "claim_step_except",
            (ttl, queues, _arg("p_excluded", "text[]"), claim_claimant),
            CLAIM_STEP_TYPES,
            claim_step_except(t, ttl, queues, _arg("p_excluded", "text[]"), claim_claimant),
        ),
        Function(
            "take_pass",
            (run_id, ttl, pick_holder),
            picked,
            take_pass(t, acquire, grant, run_id, ttl, pick_holder),
        ),
        Function(
            "pick_pass",
            (ttl, pick_holder),
            picked,
            pick_pass_alone(t, acquire, grant, ttl, pick_holder),
        ),
        Function(
            "insert_claimed",
            insert_args,
            ("bigint",),
            insert_claimed(t, insert_args[0], new_step, finish_pass),
        ),
        Function(
            "set_result_claiming_next",
            (step_id, payload, attempt, hold, *insert_args[1:]),
            ("bigint", "uuid", "bigint", "bigint", *PASS_STATE_TYPES),
            set_result_claiming_next(
                t, fence, fence_params, payload, attempt, hold, new_step, finish_pass
            ),
        ),
        Function("complete_run", completion_args, completed, complete()),
        Function("complete_run_alone", alone_args, alone_returns, complete_alone()),
        Function(
            "complete_run_alone_picking",
            (*alone_args, next_holder, next_ttl),
            (*alone_returns, *picked),
            complete_alone(pick=(acquire, grant, next_ttl, next_holder)),
        ),
        Function(
            "complete_run_alone_claiming",
            (*alone_args, next_ttl, queues, claim_claimant),
            (*alone_returns, *CLAIM_STEP_TYPES),
            complete_alone(claim=(next_ttl, queues, claim_claimant)),
        ),
        Function(
            "complete_run_picking",
            (*completion_args, next_holder, next_ttl),
            (*completed, *picked),
            complete(pick=(acquire, grant, next_ttl, next_holder)),
        ),
    )
    return {function.short: function for function in found}


__all__ = ["Pieces", "catalogue"]

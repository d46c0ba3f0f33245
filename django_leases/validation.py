"""Argument checks shared by every public entry point: one place for each rule.

A leaf module: it imports nothing of the package but the settings. Every check returns the
value it accepted (normalised where said) or raises ``ValueError`` with a message that names
what was wrong and never echoes a secret; nothing is ever truncated or guessed at.
"""

from __future__ import annotations

import decimal
import json
import math
import re
import traceback
import uuid
import weakref
from collections.abc import Mapping
from datetime import timedelta
from decimal import Decimal
from itertools import accumulate, repeat
from numbers import Real
from typing import Any

from django.db import connections

from django_leases.conf import MAX_QUEUE_KEY_LENGTH, leases_settings, max_event_payload

#: Longest lease key or holder accepted, in characters (the column width).
MAX_KEY_LENGTH = 255

#: Longest workflow, step, step-function, trigger-source or credential name, in characters.
MAX_NAME_LENGTH = 200

#: Shortest TTL accepted, in seconds: the database clock is read to the millisecond.
MIN_TTL = 0.001

#: Longest TTL any setting can allow, in seconds (100 years of 366 days): the database clock
#: plus this stays far inside what every backend's timestamp column stores (year 9999 on
#: SQLite and MariaDB/MySQL), while ``MAX_TTL`` (366 days by default) is what is allowed.
TTL_CEILING = 100 * 366 * 24 * 3600.0

#: Deepest nesting of lists and objects a stored JSON value may have.
MAX_JSON_DEPTH = 100

#: Most retries a step may ask for (``retries + 1`` attempts).
MAX_RETRIES = 1000

#: Longest delay between two attempts of a step, seconds (one day).
MAX_RETRY_DELAY = 86400.0

_UNSTORABLE_CHARS = re.compile("[\x00\ud800-\udfff]")


# -- names --------------------------------------------------------------------------------------


def string_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored in a text or JSON column on every supported database
    (a NUL character, or a lone surrogate), or ``None``."""
    if "\x00" in text:
        return "contains a NUL character (PostgreSQL cannot store one)"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate (not valid Unicode; it cannot be stored as UTF-8)"
    return None


def check_name(value: object, what: str, *, max_length: int = MAX_NAME_LENGTH) -> str:
    """Return ``value`` if it is a usable name, else raise ``ValueError`` naming ``what``.

    A usable name is a non-empty ``str`` of at most ``max_length`` characters (the column
    width) that can be stored: no NUL character, no lone surrogate. Longer names are refused,
    never truncated. ``what`` says whose name it is (``"Lease key"``, ``"Step name"``…).
    """
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > max_length:
        raise ValueError(f"{what} is {len(value)} characters long; the limit is {max_length}")
    problem = string_problem(value)
    if problem is not None:
        raise ValueError(f"{what} {problem}")
    return value


def check_source_name(name: object) -> str:
    """``name`` if it can name a trigger source (a ``str`` of 1 to :data:`MAX_NAME_LENGTH`
    characters, no NUL or lone surrogate); else ``ValueError`` naming it as a source name
    and its limit (not as the lease key it becomes)."""
    return check_name(name, "A trigger source name")


def check_lease_name(value: object, what: str) -> str:
    """:func:`check_name` for a lease ``key`` or ``holder`` (``what``): up to
    :data:`MAX_KEY_LENGTH` (255) characters."""
    return check_name(value, f"Lease {what}", max_length=MAX_KEY_LENGTH)


def check_run_key(value: object) -> str:
    """:func:`check_name` for a run's idempotency key (``start_workflow(key=)``): up to
    :data:`MAX_KEY_LENGTH` (255) characters. Returns it; raises ``ValueError``."""
    return check_name(value, "Run key", max_length=MAX_KEY_LENGTH)


#: Largest fencing token: what a signed 64-bit column (``Lease.token``, ``fence``) holds.
MAX_TOKEN = 2**63 - 1


def check_token(value: object, what: str) -> int:
    """``value`` if it is a fencing token: an ``int`` (not ``bool``) from 1 to
    :data:`MAX_TOKEN`; else ``ValueError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKEN:
        raise ValueError(f"{what} must be an int from 1 to {MAX_TOKEN}, not {value!r}"[:300])
    return value


def check_queue_key(value: object, what: str = "queue_key") -> str | None:
    """A queue key (``start_workflow(queue_key=)``, ``run.step(queue_key=)``): ``None``, or a
    name of 1 to 255 characters (:func:`check_name`); returns it.

    Raises:
        ValueError: anything else, naming ``what``.
    """
    if value is None:
        return None
    return check_name(value, what, max_length=MAX_QUEUE_KEY_LENGTH)


def check_identifier(value: object, what: str) -> str:
    """:func:`check_name` for a workflow, step or step-function name (up to 200 characters)."""
    return check_name(value, what)


# -- numbers of seconds -------------------------------------------------------------------------


def seconds(
    value: object,
    what: str,
    *,
    minimum: float = 0.0,
    above_minimum: bool = False,
    maximum: float | None = None,
) -> float:
    """``value`` (an ``int``, ``float``, ``Decimal`` or ``timedelta``) as float seconds, the
    one check of "a number of seconds" for every argument that is one.

    Refused with ``ValueError`` naming ``what``: ``bool`` and strings, NaN (a ``Decimal``
    signalling NaN included) and infinities, values below ``minimum`` (or equal to it,
    with ``above_minimum``), above ``maximum``.
    """
    if isinstance(value, timedelta):
        number = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, Real | Decimal):
        raise ValueError(
            f"{what} must be a timedelta or a number of seconds, not {type(value).__name__}"
        )
    elif isinstance(value, Decimal) and not value.is_finite():
        # float() of a signalling NaN raises ValueError without naming ``what``.
        raise ValueError(f"{what} must be a finite number of seconds, got {value!r}")
    else:
        try:
            number = float(value)
        except OverflowError:
            # The stubs' numbers.Real has no ">"; every real number has one.
            number = math.inf if value > 0 else -math.inf  # type: ignore[operator]
    if not math.isfinite(number):
        raise ValueError(f"{what} must be a finite number of seconds, got {value!r}")
    if above_minimum and number <= minimum:
        raise ValueError(f"{what} must be greater than {minimum:g} seconds, got {number:g}")
    if number < minimum:
        raise ValueError(f"{what} must be at least {minimum:g} seconds, got {number:g}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{what} of {number!r} s is longer than the limit of {maximum!r} s")
    return number


#: Longest wait a workflow's sleep or event timeout may ask for, seconds (about 100 years).
MAX_WAIT_SECONDS = 100 * 366 * 86400.0


def wait_seconds(value: object, what: str) -> float:
    """A workflow wait's seconds (a sleep, an event's timeout), checked as :func:`seconds`
    does, at most :data:`MAX_WAIT_SECONDS`."""
    return seconds(value, what, maximum=MAX_WAIT_SECONDS)


def ttl_seconds(ttl: object) -> float:
    """Return a TTL given as ``timedelta`` or seconds (a real number) as float seconds.

    Raises ``ValueError`` for anything else (``bool`` and strings included), for
    ``ttl <= 0``, for NaN/infinity, for a TTL shorter than :data:`MIN_TTL` (1 ms, the
    database clock's resolution) and for a TTL longer than ``DJANGO_LEASES["MAX_TTL"]``
    (366 days by default) or than :data:`TTL_CEILING` (100 years, whatever ``MAX_TTL`` says:
    an expiry beyond it may not be storable).
    """
    # The common case, checked cheaply (a lease operation is a few hundred microseconds): a
    # plain number within the bounds (NaN fails every comparison, and a huge int is above the
    # ceiling: both go on below, to the full check and its message).
    if (type(ttl) is float or type(ttl) is int) and (
        MIN_TTL <= ttl <= TTL_CEILING and ttl <= float(leases_settings.MAX_TTL)
    ):
        return float(ttl)
    number = seconds(ttl, "Lease ttl", above_minimum=True, maximum=TTL_CEILING)
    if number < MIN_TTL:
        raise ValueError(f"Lease ttl must be at least {MIN_TTL:g} seconds, got {number:g}")
    return seconds(number, "Lease ttl", maximum=float(leases_settings.MAX_TTL))


def renewable_ttl_seconds(ttl: object) -> float:
    """:func:`ttl_seconds` for a lease that is kept alive by renewals (``hold_lease``, the
    ``hold_lease`` command): also refuses a TTL shorter than three renewal intervals at the
    shortest interval (``3 × DJANGO_LEASES["RENEWAL_FLOOR"]``, 0.15 s by default), since
    such a lease would lapse before its first renewal. Raises ``ValueError``.
    """
    number = ttl_seconds(ttl)
    shortest = round(3 * float(leases_settings.RENEWAL_FLOOR), 6)
    if number < shortest:
        raise ValueError(
            f"A renewed lease needs a ttl of at least {shortest!r} s "
            f"(three renewals at the shortest interval), got {number!r}"
        )
    return number


def refused_ttl_settings() -> dict[str, str]:
    """The lease TTL settings in force that the limits in force refuse, each with why:
    ``DEFAULT_TTL`` (a renewed lease's: :func:`renewable_ttl_seconds`, so ``MAX_TTL`` and
    ``RENEWAL_FLOOR``) and ``STEP_LEASE_TTL`` (:func:`ttl_seconds`: ``MAX_TTL``). Returns
    ``{setting name: reason}``, empty when both are usable. A default left in place is
    judged too: ``{"MAX_TTL": 10}`` alone refuses both defaults of 30 s."""
    refused = {}
    for key, rule in (("DEFAULT_TTL", renewable_ttl_seconds), ("STEP_LEASE_TTL", ttl_seconds)):
        try:
            rule(getattr(leases_settings, key))
        except ValueError as exc:
            refused[key] = str(exc)
    return refused


# -- workflow arguments -------------------------------------------------------------------------


def check_attempt(attempt: object) -> int:
    """``attempt`` if it is an ``int`` ≥ 1 (a step's fencing number), else ``ValueError``."""
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ValueError(f"attempt must be an int >= 1, not {attempt!r}")
    return attempt


def check_retries(retries: object, retry_delay: object) -> tuple[int, float]:
    """Validate a step's ``retries`` and ``retry_delay``; returns them as ``(int, float)``.

    ``retries`` is an ``int`` (not ``bool``) with ``0 <= retries <=`` :data:`MAX_RETRIES`;
    ``retry_delay`` is a finite number of seconds with ``0 <= retry_delay <=``
    :data:`MAX_RETRY_DELAY`. Raises ``ValueError`` otherwise.
    """
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES:
        raise ValueError(f"retries must be an int from 0 to {MAX_RETRIES}, not {retries!r}")
    if isinstance(retry_delay, timedelta):
        raise ValueError(f"retry_delay must be a number of seconds, not {retry_delay!r}")
    return retries, seconds(retry_delay, "retry_delay", maximum=MAX_RETRY_DELAY)


def check_priority(priority: object, what: str = "priority") -> int:
    """A step priority: an ``int`` (not ``bool``) between -2**31 and 2**31-1; returns it.
    Raises ``ValueError`` otherwise."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"{what} must be an integer, not {priority!r}")
    if not -(2**31) <= priority < 2**31:
        raise ValueError(f"{what} must be between -2**31 and 2**31-1, not {priority}")
    return priority


def check_step_timeout(timeout: object) -> float | None:
    """A step's ``timeout``: ``None`` (no limit), or a finite number of seconds (or a
    ``timedelta``, as :func:`seconds` takes) above the minimum and at most
    :data:`MAX_WAIT_SECONDS`; returns it as a ``float`` (or ``None``). Raises ``ValueError``
    otherwise."""
    if timeout is None:
        return None
    return seconds(timeout, "Step timeout", above_minimum=True, maximum=MAX_WAIT_SECONDS)


def check_backoff(retry_backoff: object, retry_delay_max: object) -> tuple[float, float | None]:
    """Validate a step's ``retry_backoff`` and ``retry_delay_max``, the growth of its retry
    delay (see :func:`retry_delay_after`); returns them as ``(float, float | None)``.

    ``retry_backoff`` is a finite number (``int``, ``float``, ``Decimal``…; not ``bool``)
    ``>= 1.0``: the factor each retry delay is multiplied by after the first (1.0: every
    delay is ``retry_delay``). ``retry_delay_max`` is ``None`` (no cap but
    :data:`MAX_RETRY_DELAY`) or a finite number of seconds with ``0 <= retry_delay_max <=``
    :data:`MAX_RETRY_DELAY` (a ``timedelta`` is refused, as for ``retry_delay``). Raises
    ``ValueError`` naming the argument otherwise.
    """
    if isinstance(retry_backoff, bool) or not isinstance(retry_backoff, Real | Decimal):
        raise ValueError(
            f"retry_backoff must be a number >= 1.0 (the factor between two retry delays), "
            f"not {type(retry_backoff).__name__}"
        )
    if isinstance(retry_backoff, Decimal) and not retry_backoff.is_finite():
        factor = math.nan  # float() of a signalling NaN raises without naming the argument
    else:
        try:
            factor = float(retry_backoff)
        except OverflowError:  # an int beyond any float
            factor = math.inf
    if not math.isfinite(factor) or factor < 1.0:
        raise ValueError(
            f"retry_backoff must be a finite number >= 1.0 (the factor between two retry "
            f"delays), got {retry_backoff!r}"
        )
    if retry_delay_max is None:
        return factor, None
    if isinstance(retry_delay_max, timedelta):
        raise ValueError(f"retry_delay_max must be a number of seconds, not {retry_delay_max!r}")
    return factor, seconds(retry_delay_max, "retry_delay_max", maximum=MAX_RETRY_DELAY)


def parse_run_id(run_id: object) -> uuid.UUID:
    """``run_id`` (a ``uuid.UUID`` or its text) as a ``uuid.UUID``; ``ValueError`` otherwise."""
    if isinstance(run_id, uuid.UUID):
        return run_id
    try:
        return uuid.UUID(str(run_id).strip())
    except ValueError:
        raise ValueError(f"{run_id!r} is not a workflow run id (a UUID)") from None


# -- JSON ---------------------------------------------------------------------------------------


def _json_problem(value: Any, path: str, depth: int, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """The first reason ``value`` is not storable JSON, as ``"<path> <reason>"``, or ``None``.

    Recursion is bounded by ``max_depth`` (:data:`MAX_JSON_DEPTH`), so a deep or
    self-referencing value is refused rather than exhausting the stack.
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        problem = string_problem(value)
        return f"{path} {problem}" if problem else None
    if isinstance(value, int):
        try:
            str(value)
        except ValueError:  # beyond sys.get_int_max_str_digits()
            return f"{path} is an integer too large to write as JSON"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r} (not a JSON number)"
    if isinstance(value, list | tuple | dict):
        if depth >= max_depth:
            return f"{path} nests deeper than {max_depth} levels"
        if isinstance(value, dict):
            written: dict[str, Any] = {}
            for key, item in value.items():
                if key is not None and not isinstance(key, str | int | float | bool):
                    return f"{path} has a key of type {type(key).__name__} (keys must be str)"
                text = key if isinstance(key, str) else json.dumps(key, allow_nan=False)
                problem = string_problem(text)
                if problem:
                    return f"{path} has a key that {problem}"
                if text in written:
                    # json.dumps would write both and the stored object keep only one value.
                    return (
                        f"{path} has the keys {_safe_repr(written[text])} and {_safe_repr(key)}, "
                        f"both written as {text!a} in JSON (one value would be lost)"
                    )
                written[text] = key
                found = _json_problem(item, f"{path}[{text!a}]", depth + 1, max_depth)
                if found:
                    return found
            return None
        for index, item in enumerate(value):
            found = _json_problem(item, f"{path}[{index}]", depth + 1, max_depth)
            if found:
                return found
        return None
    return f"{path} is of type {type(value).__name__}, which is not JSON"


#: Deepest nesting of lists and objects MariaDB's JSON columns store: their ``CHECK
#: (JSON_VALID(...))`` refuses a value nested 32 levels or more ("Limit of 32 on JSON nested
#: structures depth").
MARIADB_JSON_DEPTH = 31


def json_depth(connection: Any) -> int:
    """The deepest nesting (levels of lists and objects, ``int``) a JSON column of
    ``connection``'s database (a Django connection) stores: :data:`MARIADB_JSON_DEPTH` on
    MariaDB; elsewhere the package's own limit, :data:`MAX_JSON_DEPTH` (PostgreSQL, SQLite
    and MySQL 8 store at least that)."""
    if connection.vendor == "mysql" and getattr(connection, "mysql_is_mariadb", False):
        return min(MARIADB_JSON_DEPTH, MAX_JSON_DEPTH)
    return MAX_JSON_DEPTH


#: Bytes of a statement kept for all but its one large JSON value (MariaDB / MySQL).
STATEMENT_ROOM = 64 * 1024

#: ``max_allowed_packet`` as each MariaDB / MySQL connection read it (a global of the server,
#: fixed for a session): asked once per connection object.
_packet_sizes: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def json_size_limit(connection: Any) -> int | None:
    """The most bytes of JSON text one value may take in a statement to ``connection``'s
    database (a Django connection): on MariaDB / MySQL the server's ``max_allowed_packet``
    less :data:`STATEMENT_ROOM` — a longer statement is refused and the server drops the
    connection, and the caller's transaction with it; elsewhere ``None`` (no limit short of
    the column's own). Asks the server once per connection."""
    if connection.vendor != "mysql":
        return None
    size = _packet_sizes.get(connection)
    if size is None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT @@max_allowed_packet")
            size = int(cursor.fetchone()[0])
        _packet_sizes[connection] = size
    return max(size - STATEMENT_ROOM, STATEMENT_ROOM)


def check_json(
    value: Any, what: str, *, max_depth: int = MAX_JSON_DEPTH, using: str | None = None
) -> Any:
    """Return ``value`` if it can be stored as JSON on every supported database, else raise.

    The one rule for every JSON value the workflow tables hold (run input and output, step
    data and results): ``None``, ``bool``, ``int``, finite ``float``, ``str``, ``list`` /
    ``tuple`` and ``dict`` (keys ``str``, or what ``json.dumps`` turns into one — no two keys
    of one object written alike, as ``1`` and ``"1"`` or ``None`` and ``"null"``), nested at
    most :data:`MAX_JSON_DEPTH` levels, with no string or key holding a NUL character
    (PostgreSQL's ``jsonb`` refuses ``\\u0000``) or a lone surrogate (not encodable as UTF-8).
    ``max_depth`` (``int``) lowers the nesting limit: for a value stored inside another JSON
    value (a task's arguments inside its step's data). ``using`` (a database alias): the
    value is stored there, so the limit is at most what that database's JSON columns store
    (:func:`json_depth`: 31 levels on MariaDB, whose columns refuse deeper values), and its
    text at most what one statement to it may carry (:func:`json_size_limit`: MariaDB's
    ``max_allowed_packet``).

    Raises ``ValueError`` naming ``what`` and where in the value the problem is (the message
    itself is always storable).
    """
    if using is None:
        _json_text(value, what, max_depth)
        return value
    connection = connections[using]
    text = _json_text(value, what, min(max_depth, json_depth(connection)))
    limit = json_size_limit(connection)
    if limit is not None and len(text) * 4 > limit:  # else it fits whatever its characters
        size = len(text.encode("utf-8"))
        if size > limit:
            raise ValueError(
                f"{what} must be storable JSON: $ is {size} bytes as JSON text, more than the "
                f"{limit} one statement to this database server may carry "
                "(max_allowed_packet)"
            )
    return value


#: What each character that may stand outside a string in JSON text adds to the nesting.
_NESTING_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _nesting(text: str) -> int:
    """The deepest nesting of lists and objects in ``text``, JSON as :func:`json.dumps`
    writes it (compact separators): its brackets outside strings, where a string's ``\\\\``
    and ``\\"`` escapes are dropped first so that every remaining ``"`` opens or closes
    one."""
    bare = text.replace("\\\\", "").replace('\\"', "")
    outside = "".join(bare.split('"')[::2])
    return max(accumulate(map(_NESTING_STEP.get, outside, repeat(0))), default=0)


def _quick_json_text(value: Any, max_depth: int) -> str | None:
    """``value`` as :func:`_json_text` writes it when a look at the text alone shows that
    :func:`_json_problem` would find nothing, else ``None`` (the walk then says what is
    wrong, or that nothing is). The encoder refuses what is not JSON, a non-finite number
    and an integer too long to write; sorting each object's keys refuses an object whose
    keys mix a string with another type, the only keys that could be written alike; a NUL
    is escaped as ``\\u0000`` (a string holding that text falls back to the walk); a lone
    surrogate is written as it is, which UTF-8 cannot encode. All in C, where the walk
    visits every value in Python: about 2× faster for a 100 KB result."""
    try:
        text = json.dumps(
            value, allow_nan=False, ensure_ascii=False, separators=(",", ":"), sort_keys=True
        )
    except (TypeError, ValueError, RecursionError):
        return None
    if "\\u0000" in text:
        return None
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return None
    if text.count("[") + text.count("{") > max_depth and _nesting(text) > max_depth:
        return None
    return text


def _json_text(value: Any, what: str, max_depth: int = MAX_JSON_DEPTH) -> str:
    """``value`` written as JSON, compactly (no spaces, non-ASCII characters as they are,
    each object's keys in order where they are of one type), once :func:`check_json`
    accepts it; raises its ``ValueError`` otherwise."""
    quick = _quick_json_text(value, max_depth)
    if quick is not None:
        return quick
    text = ""
    try:
        problem = _json_problem(value, "$", 0, max_depth)
        if problem is None:
            text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        problem = f"$ cannot be written as JSON ({type(exc).__name__})"
    if problem is not None:
        raise ValueError(f"{what} must be storable JSON: {clean_text(problem)}")
    return text


def check_event_payload(payload: Any, name: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Return ``payload`` if workflow event ``name`` (``str``) may carry it, else raise
    ``ValueError``: it must be storable JSON (:func:`check_json`, nested at most
    ``max_depth`` levels) of at most
    ``DJANGO_LEASES["MAX_EVENT_PAYLOAD"]`` bytes (:func:`~django_leases.conf.
    max_event_payload`), counted as its JSON written compactly in UTF-8 — about the size of
    the JSON document a sender sends.

    Raises:
        ValueError: the payload is not storable JSON, or larger than the limit (the message
            says both sizes and names the setting).
        ImproperlyConfigured: the setting is not an ``int`` ≥ 1.
    """
    what = f"Payload of event {name!r}"
    text = _json_text(payload, what, max_depth)
    limit = max_event_payload()
    if len(text) > limit or (not text.isascii() and len(text.encode("utf-8")) > limit):
        size = len(text.encode("utf-8"))
        raise ValueError(
            f"{what} is {size} bytes of JSON, over the limit of {limit} bytes "
            '(DJANGO_LEASES["MAX_EVENT_PAYLOAD"])'
        )
    return payload


def clean_text(text: str) -> str:
    """``text`` with NUL characters and lone surrogates replaced by U+FFFD (storable)."""
    return _UNSTORABLE_CHARS.sub("\ufffd", text)


def _safe_repr(value: Any) -> str:
    try:
        text = repr(value)
    except (Exception, RecursionError):
        text = f"<unprintable {type(value).__name__}>"
    return text if len(text) <= 2000 else text[:1997] + "..."


#: Characters of a traceback an error keeps: its end, where the frame that raised is.
TRACEBACK_KEPT = 8000
#: How many characters of an error's message, and of each text its ``error_fields`` add, an
#: error record keeps (the start): a message of megabytes would not fit the record's row
#: (MariaDB's ``max_allowed_packet``), and the attempt's error would be lost with it.
MESSAGE_KEPT = 10_000
#: How many characters of one chunk of a traceback (a frame, or the line naming the exception
#: with its message) :func:`traceback_text` keeps: a huge message must not push every frame,
#: and its own exception's name, out of the :data:`TRACEBACK_KEPT` kept.
TRACEBACK_CHUNK_KEPT = 2000


def _kept(text: str) -> str:
    """``text`` cut to its first :data:`MESSAGE_KEPT` characters (saying so), cleaned."""
    if len(text) > MESSAGE_KEPT:
        text = text[:MESSAGE_KEPT] + " … (the rest is cut)"
    return clean_text(text)


def traceback_text(error: BaseException) -> str:
    """``error``'s traceback as Python prints it, each chunk (a frame; the line naming an
    exception, with its message) cut to :data:`TRACEBACK_CHUNK_KEPT` characters and the whole
    to its last :data:`TRACEBACK_KEPT` (after a line saying so); a traceback that cannot be
    formatted says that."""
    try:
        chunks = traceback.format_exception(error)
    except Exception:  # a broken __str__ or __repr__ in a frame must not stop the record
        return f"<the traceback of {type(error).__name__} could not be formatted>"
    text = "".join(
        chunk if len(chunk) <= TRACEBACK_CHUNK_KEPT else chunk[:TRACEBACK_CHUNK_KEPT] + " … (cut)\n"
        for chunk in chunks
    )
    if len(text) > TRACEBACK_KEPT:
        text = "… (the start is cut)\n" + text[-TRACEBACK_KEPT:]
    return text


def error_json(error: BaseException | Mapping[str, Any] | str) -> dict[str, Any]:
    """The JSON form of a step or run error: at least ``{"message": str}``; always storable,
    on every supported database.

    An exception gives ``{"type": <class name>, "message": str(exc)}`` (its first
    :data:`MESSAGE_KEPT` characters, as for every text an error adds; plus, when it was
    raised, its ``traceback``: the text Python prints, chained causes included, its last
    :data:`TRACEBACK_KEPT` characters; its ``code`` attribute, if any; and the JSON values of
    its ``error_fields`` mapping, if it has one, which win);
    a mapping is kept when it is storable JSON (``message`` added if missing); a string
    becomes the message. NUL characters and lone surrogates in the message, type and code
    are replaced by U+FFFD, so the error can always be written.

    Errors nest at most :data:`MARIADB_JSON_DEPTH` levels whatever the database (the least a
    supported database stores, so an error reads the same everywhere): an exception's error
    is one level less, so that a run's ``STEP_FAILED`` error can hold it (``step_error``);
    an ``error_fields`` value or a mapping's value that would nest deeper is left out.
    """
    if isinstance(error, BaseException):
        try:
            message = str(error)
        except Exception:  # a broken __str__ must not stop the error being recorded
            message = f"<{type(error).__name__}: str() failed>"
        out: dict[str, Any] = {
            "type": clean_text(type(error).__name__),
            "message": _kept(message),
        }
        if error.__traceback__ is not None:
            out["traceback"] = clean_text(traceback_text(error))
        code = getattr(error, "code", None)
        if isinstance(code, str):
            out["code"] = clean_text(code)
        elif isinstance(code, int) and not isinstance(code, bool):
            out["code"] = code
        fields = getattr(error, "error_fields", None)
        if isinstance(fields, Mapping):  # what the exception asks to be recorded besides
            for key, field in fields.items():
                field = _kept(field) if isinstance(field, str) else field
                if _json_problem(field, "$", 2, MARIADB_JSON_DEPTH) is None:
                    out[clean_text(str(key))] = field
        return out
    if isinstance(error, Mapping):
        out = {str(k): v for k, v in error.items()}
        try:
            check_json(out, "error", max_depth=MARIADB_JSON_DEPTH)
        except ValueError:
            out = {
                str(k): v
                for k, v in out.items()
                if _json_problem(v, "$", 1, MARIADB_JSON_DEPTH) is None
                and string_problem(str(k)) is None
            }
            out["message"] = clean_text(str(error.get("message", "")) or _safe_repr(error))
        if not isinstance(out.get("message"), str):
            out["message"] = clean_text("" if out.get("message") is None else str(out["message"]))
        out["message"] = _kept(out["message"])
        return out
    return {"message": _kept(str(error))}


def as_stored(value: Any) -> Any:
    """JSON ``value`` (one :func:`check_json` accepts) as PostgreSQL's ``jsonb`` gives it
    back once stored: object keys in jsonb's order (shorter first, then bytewise), a key
    that is not a string as JSON writes it (``1`` as ``"1"``, ``None`` as ``"null"``), a
    tuple as a list, and a number written with an exponent read back as jsonb prints it
    (``1e+16`` comes back as the integer ``10000000000000000``, ``-0.0`` as ``0.0``). A pass
    that replays a result in memory must see what a pass reading it would see."""
    if isinstance(value, dict):
        try:
            keys = sorted(value, key=_jsonb_key_order)
        except AttributeError:  # a key that is not a string: as JSON writes it
            written = {json.dumps(key) if not isinstance(key, str) else key: key for key in value}
            return {
                key: as_stored(value[written[key]]) for key in sorted(written, key=_jsonb_key_order)
            }
        return {key: as_stored(value[key]) for key in keys}
    if isinstance(value, (list, tuple)):
        return [as_stored(item) for item in value]
    if isinstance(value, float):
        if value == 0.0:
            return 0.0  # numeric has no negative zero: -0.0 comes back as 0.0
        text = repr(value)
        if "e" in text:
            plain = format(decimal.Decimal(text), "f")
            return float(plain) if "." in plain else int(plain)
    return value


def _jsonb_key_order(key: str) -> tuple[int, bytes]:
    """Where jsonb puts object key ``key``: shorter first (in UTF-8), then bytewise."""
    written = key.encode()
    return len(written), written


__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_KEY_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_RETRIES",
    "MAX_RETRY_DELAY",
    "MAX_TAGS",
    "MAX_TAG_NAME_LENGTH",
    "MAX_TAG_VALUE_LENGTH",
    "MAX_WAIT_SECONDS",
    "MIN_TTL",
    "TTL_CEILING",
    "as_stored",
    "check_attempt",
    "check_backoff",
    "check_event_payload",
    "check_identifier",
    "check_json",
    "check_lease_name",
    "check_name",
    "check_priority",
    "check_retries",
    "check_step_timeout",
    "check_tags",
    "clean_text",
    "error_json",
    "parse_run_id",
    "parse_tag",
    "renewable_ttl_seconds",
    "seconds",
    "string_problem",
    "ttl_seconds",
    "wait_seconds",
]


# -- run tags -----------------------------------------------------------------------------------

#: At most this many tags per run (``start_workflow(..., tags=)``).
MAX_TAGS = 16
#: A tag's name: 1 to this many characters.
MAX_TAG_NAME_LENGTH = 64
#: A tag's value: at most this many characters (may be empty).
MAX_TAG_VALUE_LENGTH = 255


def check_tags(tags: object) -> dict[str, str] | None:
    """A run's ``tags`` checked: ``None`` (no tags), or a ``dict`` (any mapping) of at most
    :data:`MAX_TAGS` (16) entries whose names are ``str`` of 1 to 64 characters (no ``=``) and whose
    values are ``str`` of at most 255 characters (empty allowed); an empty dict is ``None``.
    Returns a new ``dict``; raises ``ValueError`` naming the offending tag otherwise."""
    if tags is None:
        return None
    if not isinstance(tags, Mapping):
        raise ValueError(f"tags must be a dict of str to str, not {type(tags).__name__}")
    if len(tags) > MAX_TAGS:
        raise ValueError(f"A run takes at most {MAX_TAGS} tags, not {len(tags)}")
    checked: dict[str, str] = {}
    for name, value in tags.items():
        check_name(name, "Tag name", max_length=MAX_TAG_NAME_LENGTH)
        if "=" in name:  # `--tag name=value` and the admin's filter split at the first "="
            raise ValueError(f"Tag name {name!r}: it may not hold '=' (name=value selects it)")
        if not isinstance(value, str):
            raise ValueError(f"Tag {name!r}: the value must be a str, not {type(value).__name__}")
        if len(value) > MAX_TAG_VALUE_LENGTH:
            raise ValueError(
                f"Tag {name!r}: the value is {len(value)} characters long; "
                f"the limit is {MAX_TAG_VALUE_LENGTH}"
            )
        problem = string_problem(value)
        if problem is not None:
            raise ValueError(f"Tag {name!r}: the value {problem}")
        checked[name] = value
    return checked or None


def parse_tag(text: str) -> tuple[str, str]:
    """``"name=value"`` (a command's ``--tag``) as ``(name, value)``: split at the first
    ``=``; raises ``ValueError`` without one or for a name or value :func:`check_tags`
    refuses."""
    name, equals, value = text.partition("=")
    if not equals:
        raise ValueError(f"A tag is NAME=VALUE, not {text!r}")
    check_tags({name: value})
    return name, value

"""The rules every django-leases management command follows, each written once.

* ``--database ALIAS``: :func:`add_database_argument` adds the option with one help text,
  :func:`database_alias` resolves its default through the router for the command's model and
  refuses an alias that is not configured with a usage error (exit :data:`USAGE_ERROR`, as
  argparse exits), never "unreachable". :func:`database_aliases` is the repeatable form.
* ``--format table|json`` on every command that prints rows: :func:`add_format_argument`
  and :func:`write_rows` (aligned columns under a header, or one JSON array of objects with
  stable keys and JSON-typed values: numbers, booleans, ``null``, ISO 8601 timestamps).
* Exit codes: :data:`EXIT_CODES` is the one table, command by command, of what each exit
  status means. It renders each command's ``--help`` epilog (:func:`exit_codes_help`) and the
  documentation's tables (:func:`exit_codes_markdown`, through the MkDocs hook, which fails
  the build when :func:`exit_code_problems` finds a status a command uses but its table lacks).
* A database that does not answer: :class:`LeasesCommand` reports it in one line naming the
  alias and exits :data:`DATABASE_UNREACHABLE` (:func:`unreachable_database_error`).
* :class:`LeasesCommand`, the commands' base class: the epilog, a help formatter that keeps
  hand-broken text as written, and :meth:`~LeasesCommand.add_subcommand`, whose subcommands
  also accept Django's own options (``--settings``, ``--pythonpath``, ``-v``…) after the
  subcommand's name (``manage.py leases list --settings mysite.settings``).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import os
import pkgutil
import re
import textwrap
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import date, datetime
from decimal import Decimal
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

from django.apps import apps
from django.core.management.base import (
    BaseCommand,
    CommandError,
    CommandParser,
    DjangoHelpFormatter,
    OutputWrapper,
)
from django.db import DatabaseError, connections, router
from django.db.models import Model

from django_leases import db, health, holder
from django_leases.frozen import frozen
from django_leases.validation import MAX_KEY_LENGTH, check_name, seconds
from django_leases.workflows import worker

if TYPE_CHECKING:
    from django_leases.triggers.lifecycle import LifecycleResult

#: Exit status of a ``CommandError`` raised without a ``returncode`` (Django's default).
COMMAND_ERROR = 1
#: Exit status of bad usage: what argparse exits with, and an unknown ``--database`` alias.
USAGE_ERROR = 2
#: Exit status when a database the command works on cannot be reached, on every command (as
#: ``leases_check`` and ``run_workflow_worker --once`` report it).
DATABASE_UNREACHABLE = health.EXIT_UNREACHABLE

# Statuses 0, 1, 2 and 4 mean the same on every command; a command's own outcomes use 3,
# then 5 and up (and hold_lease's, the shells' conventions), so that no status has two
# meanings in one command.

#: ``reconcile_trigger_sources``: at least one enabled source's setup failed.
EXIT_SETUP_FAILED = 3
#: ``trigger_sources``: the provider step failed (the row records it).
EXIT_PROVIDER_FAILED = 3
#: ``trigger_sources``: another operation held the source too long (``os.EX_TEMPFAIL``).
EXIT_BUSY = getattr(os, "EX_TEMPFAIL", 75)
#: ``workflow_runs``: the run's or step's state does not allow the operation.
EXIT_WRONG_STATE = 3
#: ``workflow_runs check-replay``: a live run would not replay on the code now deployed.
EXIT_REPLAY_DIVERGES = EXIT_WRONG_STATE

#: The package holding the commands (one module per command, named as the command).
COMMANDS_PACKAGE = "django_leases.management.commands"

#: The output formats of a listing.
FORMATS = ("table", "json")


# -- --database -------------------------------------------------------------------------------


def add_database_argument(
    parser: argparse.ArgumentParser, model: type[Model] | None, *, repeatable: bool = False
) -> None:
    """Add ``--database ALIAS`` to ``parser``, with the help text every command shares.

    Args:
        parser: the command's parser, or one subcommand's.
        model: the model whose writes the router places; its choice is the default alias.
            ``None`` only with ``repeatable``.
        repeatable: ``--database`` may be given several times (a list in ``options``); the
            default is then every alias django-leases writes to.

    Raises:
        ValueError: ``model`` is ``None`` without ``repeatable``.
    """
    if repeatable:
        parser.add_argument(
            "--database",
            action="append",
            metavar="ALIAS",
            help="Database alias to use; repeat for several. Default: every alias "
            "django-leases writes to (the router's choice for each of its models).",
        )
        return
    if model is None:
        raise ValueError("a single --database needs the model whose router choice is its default")
    parser.add_argument(
        "--database",
        default=None,
        metavar="ALIAS",
        help=f"Database alias to use. Default: the router's choice for "
        f"{model.__name__} ({router.db_for_write(model)!r}).",
    )


def database_alias(options: Mapping[str, Any], model: type[Model]) -> str:
    """The alias a command works on: ``--database``, else the router's choice for ``model``.

    Args:
        options: the command's options (``options["database"]``: a string or ``None``).
        model: the model whose writes the router places.

    Returns:
        A configured database alias.

    Raises:
        CommandError: with ``returncode`` :data:`USAGE_ERROR`, when the alias is not in
            ``DATABASES``.
    """
    return _configured(options.get("database") or router.db_for_write(model))


def database_aliases(options: Mapping[str, Any]) -> list[str] | None:
    """The aliases of a repeatable ``--database``: each checked, or ``None`` when none given.

    Args:
        options: the command's options (``options["database"]``: a list or ``None``).

    Returns:
        The configured aliases given, in order, or ``None`` (the command picks its default).

    Raises:
        CommandError: with ``returncode`` :data:`USAGE_ERROR`, for an alias that is not in
            ``DATABASES``.
    """
    given = options.get("database")
    if not given:
        return None
    return [_configured(alias) for alias in given]


def _configured(alias: str) -> str:
    if alias not in connections:
        known = ", ".join(repr(name) for name in connections)
        raise CommandError(
            f"Unknown database alias {alias!r} (configured: {known})", returncode=USAGE_ERROR
        )
    return alias


def _aliases(given: str | Sequence[str] | None) -> list[str]:
    """The aliases a command's ``--database`` names (``None``: every alias django-leases
    writes to)."""
    if given is None:
        return list(health.write_aliases())
    return [given] if isinstance(given, str) else list(given)


def unreachable_database_error(given: str | Sequence[str] | None) -> CommandError | None:
    """The error to report when a database a command works on does not answer.

    Args:
        given: the command's ``--database`` (an alias, a list of them, or ``None`` for every
            alias django-leases writes to).

    Returns:
        A ``CommandError`` naming the first alias that does not answer ``SELECT 1``, with
        ``returncode`` :data:`DATABASE_UNREACHABLE`; ``None`` when every one answers (the
        error was something else). An alias inside a caller's transaction is not probed.
    """
    aliases = _aliases(given)
    for alias in aliases:
        if alias in connections and not db.outside_transactions(connections[alias]):
            continue  # a caller's transaction (broken, perhaps): a probe would say nothing
        finding = health.check_database(alias)
        if finding.status == health.UNREACHABLE:
            return CommandError(
                f"Database {alias!r} is unreachable: {finding.message}",
                returncode=DATABASE_UNREACHABLE,
            )
    return None


def read_only_database_error(given: str | Sequence[str] | None) -> CommandError | None:
    """The error to report when a database a command writes to refuses writes: a
    PostgreSQL standby, a read-only session or server (:func:`~django_leases.db.read_only_reason`).

    Args:
        given: the command's ``--database`` (an alias, a list of them, or ``None`` for every
            alias django-leases writes to).

    Returns:
        A ``CommandError`` naming the first such alias and why, with ``returncode``
        :data:`DATABASE_UNREACHABLE` (the database cannot serve the command); ``None`` when
        every one takes writes, or cannot be asked (an unreachable database is
        :func:`unreachable_database_error`'s to report). An alias inside a caller's
        transaction is not asked.
    """
    aliases = _aliases(given)
    for alias in aliases:
        if alias not in connections or connections[alias].in_atomic_block:
            continue
        try:
            reason = db.read_only_reason(connections[alias])
        except DatabaseError:
            continue
        if reason is not None:
            return CommandError(
                f"Database {alias!r} refuses writes: {reason}. Point the command at the "
                "primary (a read-write database).",
                returncode=DATABASE_UNREACHABLE,
            )
    return None


def unmigrated_database_error(given: str | Sequence[str] | None) -> CommandError | None:
    """The error to report when a database a command works on has none of django-leases'
    tables: its migrations were never applied there, or the routers keep them off it.

    Args:
        given: the command's ``--database`` (an alias, a list of them, or ``None`` for every
            alias django-leases writes to).

    Returns:
        A ``CommandError`` naming the first such alias and saying to run ``migrate``, with
        ``returncode`` :data:`DATABASE_UNREACHABLE` (the database cannot serve the command);
        ``None`` when every one has them (the error was something else). An alias inside a
        caller's transaction is not looked at.
    """
    # deferred: the migration machinery, loaded only when a command fails on the database
    from django.db.migrations.recorder import MigrationRecorder

    aliases = _aliases(given)
    for alias in aliases:
        if alias not in connections or connections[alias].in_atomic_block:
            continue
        if not health.holds_tables(alias):
            return CommandError(
                f"django-leases' tables are not on database {alias!r}: the database routers "
                "keep them off it (allow_migrate). Name a database they are on.",
                returncode=DATABASE_UNREACHABLE,
            )
        try:
            applied = MigrationRecorder(connections[alias]).applied_migrations()
        except DatabaseError:
            continue
        if ("django_leases", "0001_initial") not in applied:
            return CommandError(
                f"django-leases' tables are not on database {alias!r}: its migrations were "
                f"never applied there. Run manage.py migrate --database {alias}.",
                returncode=DATABASE_UNREACHABLE,
            )
    return None


# -- bounded values ---------------------------------------------------------------------------

#: ``run_workflow_worker --concurrency``: at most this many threads, each with a database
#: connection of its own (PostgreSQL's default ``max_connections`` is 100).
MAX_CONCURRENCY = 256
#: ``workflow_runs list --limit`` and ``workflow_runs prune --batch-size``: at most this many.
MAX_ROWS = 10_000
#: ``workflow_runs prune --older-than``: at most this many days (a hundred years).
MAX_AGE_DAYS = 36_500.0
#: ``--wait`` of the trigger-source commands: at most this many seconds (an hour).
MAX_WAIT = 3_600.0
#: The TCP ports a ``--metrics-port`` may name.
PORTS = (1, 65_535)


def seconds_type(
    *,
    minimum: float = 0.0,
    above_minimum: bool = False,
    maximum: float | None = None,
    unit: str = "seconds",
    unit_seconds: float = 1.0,
) -> Callable[[str], float]:
    """An argparse ``type`` for an option that is a duration, checked by the one seconds
    validator (:func:`django_leases.validation.seconds`): finite, within the bounds.

    Args:
        minimum: the least value, in ``unit``.
        above_minimum: ``minimum`` itself is refused.
        maximum: the greatest value, in ``unit``; ``None`` for no bound.
        unit: the option's unit as its users say it (``"days"``).
        unit_seconds: the seconds in one ``unit`` (86400 for days).

    Returns:
        The converter: text → the number, in ``unit``. A value that is not a number, not
        finite or out of bounds raises ``argparse.ArgumentTypeError``, which argparse reports
        naming the option (a usage error, exit :data:`USAGE_ERROR`).
    """

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of {unit}: {text!r}") from None
        try:
            seconds(
                value * unit_seconds,
                unit,
                minimum=minimum * unit_seconds,
                above_minimum=above_minimum,
                maximum=None if maximum is None else maximum * unit_seconds,
            )
        except ValueError:
            bounds = f"greater than {minimum:g}" if above_minimum else f"at least {minimum:g}"
            if maximum is not None:
                bounds += f" and at most {maximum:g}"
            raise argparse.ArgumentTypeError(
                f"must be a finite number of {unit} {bounds}, not {text!r}"
            ) from None
        return value

    return convert


def integer_type(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse ``type`` for an option that is a whole number from ``minimum`` to
    ``maximum`` (both included).

    Args:
        minimum: the least value.
        maximum: the greatest value.

    Returns:
        The converter: text → the integer. Text that is not an integer, or out of bounds,
        raises ``argparse.ArgumentTypeError`` (a usage error naming the option).
    """

    def convert(text: str) -> int:
        out_of_range = argparse.ArgumentTypeError(
            f"must be from {minimum} to {maximum}, not {shown(text.strip())}"
        )
        try:
            value = int(text)
        except ValueError:
            if _WHOLE_NUMBER.fullmatch(text):  # more digits than Python reads
                raise out_of_range from None
            raise argparse.ArgumentTypeError(f"not an integer: {shown(text)!r}") from None
        if not minimum <= value <= maximum:
            raise out_of_range
        return value

    return convert


def name_type(what: str) -> Callable[[str], str]:
    """An argparse ``type`` for an argument that names a row to look up (a workflow, a run
    key, a schedule, a trigger source).

    Args:
        what: whose name it is, as the error says it (``"Workflow name"``).

    Returns:
        The converter: text → the same text. A name no row can bear (empty, holding a NUL
        or a lone surrogate, over 255 characters: :func:`~django_leases.validation.check_name`)
        raises ``argparse.ArgumentTypeError`` (a usage error naming the argument), never a
        database error at the lookup. Text holding a byte that is not UTF-8 is left to
        :class:`LeasesCommand`, which refuses it in every argument alike.
    """

    def convert(text: str) -> str:
        if _UNDECODABLE.search(text):
            return text  # a byte that is not UTF-8: LeasesCommand refuses it, as every such
        try:
            return check_name(text, what, max_length=MAX_KEY_LENGTH)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


#: Text ``int()`` reads as a whole number, when it has no more digits than Python's limit.
_WHOLE_NUMBER = re.compile(r"\s*[+-]?\d[\d_]*\s*")

#: How much of an argument an error message quotes.
_SHOWN = 60


def shown(text: str) -> str:
    """``text`` as an error message quotes it: at most :data:`_SHOWN` characters, a longer
    one cut with ``…`` and its length said."""
    if len(text) <= _SHOWN:
        return text
    return f"{text[:_SHOWN]}… ({len(text):,} characters)"


def json_argument(text: str, option: str) -> Any:
    """``text``, the value of option ``option`` (``"--input"``), read as JSON.

    Raises:
        CommandError: not JSON, nested too deeply, or holding a number of more digits
            than Python reads.
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise CommandError(f"{option} nests too deeply to be read as JSON") from None
    except ValueError as exc:  # JSONDecodeError, and an integer past Python's digit limit
        raise CommandError(f"{option} is not valid JSON: {exc}") from None


# -- --format table|json ----------------------------------------------------------------------


def add_seconds_argument(
    parser: CommandParser | argparse.ArgumentParser,
    flag: str,
    *,
    default: float | None,
    help: str,
    metavar: str = "S",
    **bounds: Any,
) -> None:
    """Add option ``flag``, a number of seconds checked by :func:`seconds_type`.

    Args:
        parser: the command's parser (or a subcommand's).
        flag: the option, ``"--wait"``.
        default: its value when not given, in seconds (``None``: the setting decides).
        help: the help text (it states the default and the bounds).
        metavar: how the help names the value.
        bounds: :func:`seconds_type`'s keyword arguments (``above_minimum``, ``maximum``…).
    """
    parser.add_argument(
        flag, type=seconds_type(**bounds), default=default, metavar=metavar, help=help
    )


def add_format_argument(
    parser: argparse.ArgumentParser, *, aliases: Mapping[str, str] | None = None
) -> None:
    """Add ``--format table|json`` (default ``table``) to ``parser``.

    Args:
        parser: the parser of a command, or subcommand, that prints rows.
        aliases: older spellings accepted and turned into a format (``{"text": "table"}``);
            the help and the error for a bad value name only ``table`` and ``json``.
    """
    spellings = dict(aliases or {})
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        type=lambda value: spellings.get(value, value),
        help="table: aligned columns under a header (default); json: one JSON document.",
    )


def cell_text(value: Any) -> str:
    """A value as a table cell: ``-`` for none, ISO 8601 to the second for a timestamp, and
    any control or bidirectional-override character escaped (``\n``, ``\u202e``), so a
    name taken from user input (a queue key, a lease key) cannot start a row of its own or
    turn the line around on the terminal.

    Args:
        value: a row's value.

    Returns:
        The cell's text.
    """
    if value is None or value == "":
        return "-"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


@frozen
class Column:
    """A column of a listing.

    Attributes:
        header: its title in ``table`` form (``"SECONDS LEFT"``).
        key: the key of its value in each row, which is the row's key in ``json`` form.
        text: how the value shows in a table cell (default :func:`cell_text`).
    """

    header: str
    key: str
    text: Callable[[Any], str] = cell_text


def columns(
    keys: Sequence[str],
    *,
    headers: Mapping[str, str] | None = None,
    text: Mapping[str, Callable[[Any], str]] | None = None,
) -> tuple[Column, ...]:
    """A listing's columns, by their keys.

    Args:
        keys: the rows' keys, in column order.
        headers: a header other than the key in capitals (``created_at`` → ``CREATED AT``).
        text: how a column's values show, where not :func:`cell_text`.

    Returns:
        One :class:`Column` per key.

    Raises:
        ValueError: ``headers`` or ``text`` names a key that is not a column.
    """
    headers = dict(headers or {})
    text = dict(text or {})
    unknown = (set(headers) | set(text)) - set(keys)
    if unknown:
        raise ValueError(f"not a column: {sorted(unknown)}")
    return tuple(
        Column(headers.get(key, key.replace("_", " ").upper()), key, text.get(key, cell_text))
        for key in keys
    )


def either(true: str, false: str) -> Callable[[Any], str]:
    """How a boolean column shows: ``true`` or ``false`` (``either("on", "off")``).

    Args:
        true: the text of a true value.
        false: the text of a false value.

    Returns:
        The cell formatter.
    """
    return lambda value: true if value else false


def write_rows(
    out: OutputWrapper | TextIO,
    output_format: str,
    columns: Sequence[Column],
    rows: Iterable[Mapping[str, Any]],
    *,
    empty: str,
) -> None:
    """Print ``rows`` as a table or as a JSON array.

    Args:
        out: where to write: a command's ``self.stdout``, or a text stream (each write then
            ends with a newline, as on ``self.stdout``).
        output_format: ``"json"`` for one JSON array of the rows (every key of each row,
            timestamps and UUIDs as strings); anything else for a table: a header line, then
            one line per row, columns two spaces apart, the last one not padded.
        columns: the table's columns.
        rows: the rows, each a mapping of JSON-ready values (and timestamps, UUIDs).
        empty: the line printed instead of a table without rows (``json`` prints ``[]``).
    """
    if not isinstance(out, OutputWrapper):
        out = OutputWrapper(out)  # one line per write, as a command's stdout
    rows = list(rows)
    if output_format == "json":
        out.write(json.dumps([dict(row) for row in rows], indent=2, default=json_value))
        return
    if not rows:
        out.write(empty)
        return
    table = [[column.header for column in columns]]
    table += [[column.text(row[column.key]) for column in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns) - 1)]
    for line in table:
        cells = [cell.ljust(width) for cell, width in zip(line, widths, strict=False)]
        out.write("  ".join([*cells, line[-1]]).rstrip())


def json_value(value: Any) -> Any:
    """``json.dumps``'s ``default`` for command output: timestamps as ISO 8601 text, UUIDs
    and decimals as strings; ``TypeError`` for anything else."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


# -- exit codes -------------------------------------------------------------------------------


@frozen
class ExitCode:
    """One row of a command's exit-code table.

    Attributes:
        codes: the exit statuses the row is about (``(126, 127)``); empty for a status the
            row describes in words (``label``).
        meaning: what it means, in Markdown (backquoted code is shown bare in ``--help``).
        label: shown instead of the codes (``"the child's"``, ``"128 + N"``).
    """

    codes: tuple[int, ...]
    meaning: str
    label: str = ""

    @property
    def shown(self) -> str:
        """The exit code column: the label, else the codes (``126 / 127``)."""
        return self.label or " / ".join(str(code) for code in self.codes)


@frozen
class ExitCodeTable:
    """A command's exit codes.

    Attributes:
        rows: its rows, in the order shown.
        forwards: the modules whose ``EXIT_*`` statuses the command exits with as it gets
            them (``sys.exit(holder.run())``); each of those must have a row.
    """

    rows: tuple[ExitCode, ...]
    forwards: tuple[ModuleType, ...] = ()

    @property
    def codes(self) -> set[int]:
        """Every status a row is about."""
        return {code for row in self.rows for code in row.codes}


def _table(
    *rows: tuple[int | tuple[int, ...] | str, str], forwards: Sequence[ModuleType] = ()
) -> ExitCodeTable:
    # (code, meaning), ((code, code), meaning) or ("label", meaning) → an ExitCodeTable.
    made = []
    for code, meaning in rows:
        if isinstance(code, str):
            made.append(ExitCode((), meaning, label=code))
        else:
            made.append(ExitCode(code if isinstance(code, tuple) else (code,), meaning))
    return ExitCodeTable(tuple(made), tuple(forwards))


_UNREACHABLE = (
    DATABASE_UNREACHABLE,
    "a database the command works on is unreachable, or django-leases' migrations were never "
    "applied to it (named on stderr)",
)

_USAGE = (
    USAGE_ERROR,
    "bad usage: an unknown option or subcommand, a malformed value, or an unknown "
    "`--database` alias; nothing was done",
)

#: Every command's exit codes, by command name.
EXIT_CODES: dict[str, ExitCodeTable] = {
    "hold_lease": _table(
        (
            "the child's",
            "CMD ran under the lease and exited with that code (a child killed by signal N: "
            "128 + N, as shells report it)",
        ),
        (
            holder.EXIT_TAKEN,
            "the key is held by another holder (or `--wait-timeout` passed); CMD was not started",
        ),
        (
            holder.EXIT_LOST,
            'the lease was lost while CMD ran (renewals answered "not held", or none '
            "succeeded within the TTL), or the final check after CMD ended could not confirm "
            "it; CMD got SIGTERM, then SIGKILL after `--grace`",
        ),
        (
            (holder.EXIT_CANNOT_EXECUTE, holder.EXIT_NOT_FOUND),
            "CMD could not be executed / was not found (as shells report it); the lease was "
            "released",
        ),
        (
            "128 + N",
            "the holder got signal N (SIGTERM, SIGINT, SIGHUP) before CMD was started; nothing ran",
        ),
        (COMMAND_ERROR, "bad arguments (key, `--ttl`, missing CMD…) or a database error"),
        _USAGE,
        _UNREACHABLE,
        forwards=[holder],
    ),
    "leases": _table(
        (0, "done"),
        (
            COMMAND_ERROR,
            "`release`: no live lease on KEY (none, or it is lapsed or released), or a "
            "malformed key; nothing changed",
        ),
        _USAGE,
        _UNREACHABLE,
    ),
    "leases_check": _table(
        (health.EXIT_OK, "healthy"),
        (health.EXIT_PROBLEMS, "at least one problem"),
        (
            health.EXIT_UNREACHABLE,
            f"a database is unreachable (takes precedence over {health.EXIT_PROBLEMS})",
        ),
        _USAGE,
        forwards=[health],
    ),
    "reconcile_trigger_sources": _table(
        (0, "done (also when nothing is declared)"),
        (
            COMMAND_ERROR,
            "a bad `--base-url` (not an http(s) URL) or `--label-prefix`; nothing written",
        ),
        _USAGE,
        (
            EXIT_SETUP_FAILED,
            "some setup failed: those rows say `failed` and the sources stay on; the errors "
            "are on stderr",
        ),
        _UNREACHABLE,
    ),
    "rotate_trigger_secrets": _table(
        (0, "done: every stored secret is encrypted with the primary key"),
        (
            COMMAND_ERROR,
            "a stored secret cannot be decrypted with the configured keys, or the keys are "
            "not usable; nothing changed",
        ),
        _USAGE,
        _UNREACHABLE,
    ),
    "run_workflow_worker": _table(
        (0, "stopped cleanly (with `--once`: nothing was left due)"),
        (
            COMMAND_ERROR,
            "refused to start: the database lacks the workflow functions, `--metrics-port` "
            'cannot be served, or DJANGO_LEASES["QUEUES"] is not usable',
        ),
        _USAGE,
        (
            worker.EXIT_THREAD_DIED,
            "a worker thread died (logged); the other threads were stopped so that a "
            "supervisor restarts the process rather than it running short-handed",
        ),
        (
            worker.EXIT_DATABASE_UNREACHABLE,
            "a database is unreachable: at the start, or with `--once` after 10 failures in "
            "a row (named on stderr); or, at the start, it lacks django-leases' tables or "
            "refuses writes (a standby, a read-only session)",
        ),
        (
            worker.EXIT_ABANDONED,
            "in-flight work was still running at the end of the shutdown grace: its step "
            "leases lapse and another worker takes the steps over as new attempts",
        ),
        forwards=[worker],
    ),
    "start_workflow": _table(
        (0, "started; the run's id is printed"),
        (
            COMMAND_ERROR,
            "an unknown workflow, or input that is not JSON (or not storable: lone "
            "surrogates, NUL characters, nested too deep); nothing written",
        ),
        _USAGE,
        _UNREACHABLE,
    ),
    "trigger_sources": _table(
        (0, "done"),
        (
            COMMAND_ERROR,
            "refused, nothing changed: an unknown source, `enable` of an orphan, no address, "
            "provider not installed, `forget` of a declared source, an empty or unusable "
            "secret; the reason on stderr",
        ),
        _USAGE,
        (
            EXIT_PROVIDER_FAILED,
            "the provider step failed: the switch change stands and the row says `failed`; "
            "the detail on stderr",
        ),
        _UNREACHABLE,
        (EXIT_BUSY, "another operation held the source for longer than `--wait`"),
    ),
    "workflow_queues": _table(
        (0, "listed"),
        (COMMAND_ERROR, 'DJANGO_LEASES["QUEUES"] is not usable (the message says why)'),
        _USAGE,
        _UNREACHABLE,
    ),
    "workflow_runs": _table(
        (0, "done; what changed is printed"),
        (
            COMMAND_ERROR,
            "an unknown or malformed run id, an unknown step, `--limit` below 1, a bad "
            "`--older-than` / `--batch-size`, or (send-event) a bad event name or a "
            "`--payload` that is not storable JSON, or (fork) a step the run never reached; "
            "nothing changed",
        ),
        _USAGE,
        (
            EXIT_WRONG_STATE,
            "the run's (or step's) state does not allow the operation; nothing changed (with "
            "several runs: that one's refusal is on stderr, the others changed); or "
            "(check-replay) a live run would meet an action other than the one it recorded "
            "(each one named on stdout), nothing changed",
        ),
        _UNREACHABLE,
    ),
    "workflow_schedules": _table(
        (0, "done (a pause or resume that changed nothing says so, and exits 0)"),
        (
            COMMAND_ERROR,
            "an unknown schedule name, or a bad backfill window (naive-free ISO dates, "
            "start before end, end not after now, at most 10,000 ticks); nothing changed",
        ),
        _USAGE,
        _UNREACHABLE,
    ),
}


def exit_codes_help(name: str, *, width: int = 79) -> str:
    """A command's exit codes as plain text, for its ``--help`` epilog.

    Args:
        name: the command's name (a key of :data:`EXIT_CODES`).
        width: the longest line.

    Returns:
        ``exit codes:`` then one row per code, meanings wrapped under themselves.

    Raises:
        KeyError: no table for ``name``.
    """
    rows = EXIT_CODES[name].rows
    column = max(len(row.shown) for row in rows) + 4
    lines = ["exit codes:"]
    for row in rows:
        lines += textwrap.wrap(
            row.meaning.replace("`", ""),
            width,
            initial_indent=f"  {row.shown}".ljust(column),
            subsequent_indent=" " * column,
        )
    return "\n".join(lines)


def exit_codes_markdown(name: str) -> str:
    """A command's exit codes as a Markdown table, for the documentation.

    Args:
        name: the command's name (a key of :data:`EXIT_CODES`).

    Returns:
        The table: a ``| exit code | meaning |`` header, then one row per code.

    Raises:
        KeyError: no table for ``name``.
    """
    lines = ["| exit code | meaning |", "|---|---|"]
    for row in EXIT_CODES[name].rows:
        meaning = row.meaning.replace("|", "\\|")  # a pipe would end the cell
        lines.append(f"| {row.shown} | {meaning} |")
    return "\n".join(lines)


def command_names() -> list[str]:
    """The names of django-leases' management commands (its command modules), sorted."""
    package = importlib.import_module(COMMANDS_PACKAGE)
    return sorted(info.name for info in pkgutil.iter_modules(package.__path__))


def exit_code_problems(name: str) -> list[str]:
    """What the exit-code table of command ``name`` lacks, read from the command's code.

    A command exits with :data:`USAGE_ERROR` (argparse, an unknown ``--database``) and
    :data:`DATABASE_UNREACHABLE` (:meth:`LeasesCommand.execute`); with
    :data:`COMMAND_ERROR` where it raises ``CommandError`` without a ``returncode``; with the
    status given to ``returncode=`` or ``sys.exit()`` where it is a number or a name for one;
    and, where that status is computed, with every ``EXIT_*`` status of the modules its table
    :attr:`~ExitCodeTable.forwards`.

    Args:
        name: the command's name.

    Returns:
        One sentence per problem (a status without a row, a computed status whose source the
        table does not name, no table at all); empty when the table is complete.
    """
    table = EXIT_CODES.get(name)
    if table is None:
        return [f"command {name!r} has no exit-code table in EXIT_CODES"]
    module = importlib.import_module(f"{COMMANDS_PACKAGE}.{name}")
    used, computed = _exits(module)
    problems = []
    if computed and not table.forwards:
        problems.append(
            f"{name} exits with a computed status ({', '.join(computed)}) but its table "
            "names no module it comes from (forwards)"
        )
    for source in table.forwards:
        used |= {
            value
            for key, value in vars(source).items()
            if key.startswith("EXIT_") and isinstance(value, int)
        }
    problems += [
        f"{name} exits with {code}, which its exit-code table lacks"
        for code in sorted(used - table.codes)
    ]
    return problems


def _exits(module: ModuleType) -> tuple[set[int], list[str]]:
    """The statuses ``module`` exits with, and the source text of those it computes."""
    used = {USAGE_ERROR, DATABASE_UNREACHABLE}  # argparse's, and LeasesCommand.execute's
    computed = []
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if not isinstance(node, ast.Call):
            continue
        callee = ast.unparse(node.func)
        given = [kw.value for kw in node.keywords if kw.arg == "returncode"]
        if callee in ("sys.exit", "SystemExit") and node.args:
            given.append(node.args[0])
        elif callee == "CommandError" and not given:
            used.add(COMMAND_ERROR)
        for expr in given:
            value = _value(expr, module)
            if isinstance(value, int):
                used.add(value)
            else:
                computed.append(ast.unparse(expr))
    return used, computed


def _value(expr: ast.expr, module: ModuleType) -> Any:
    """A literal or a (dotted) module-level name's value; ``None`` for anything computed."""
    if isinstance(expr, ast.Constant):
        return expr.value
    if isinstance(expr, ast.Name):
        return getattr(module, expr.id, None)
    if isinstance(expr, ast.Attribute):
        owner = _value(expr.value, module)
        return getattr(owner, expr.attr, None) if isinstance(owner, ModuleType) else None
    return None


# -- the commands' base class -----------------------------------------------------------------

#: A lone surrogate: what Python makes of a command-line byte that is not UTF-8.
_UNDECODABLE = re.compile("[\ud800-\udfff]")


class HelpFormatter(DjangoHelpFormatter):
    """Django's option order; text with line breaks of its own (an epilog, a description
    broken by hand) is kept as written, other text is wrapped."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


#: Django's options that mean nothing to repeat after a subcommand.
_TOP_LEVEL_ONLY = frozenset({"--version"})


class LeasesCommand(BaseCommand):
    """Base class of django-leases' commands.

    Its ``--help`` ends with :attr:`epilog_intro`, then the command's exit codes from
    :data:`EXIT_CODES` (the command's name is its module's). Subcommands made with
    :meth:`add_subcommand` accept Django's options after their name as well.
    """

    #: Text shown in ``--help`` before the exit codes (line breaks kept).
    epilog_intro: ClassVar[str] = ""

    #: Options passed on as the operating system gave them (a program's command line), not
    #: checked as text.
    raw_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._base_arguments: list[tuple[tuple[str, ...], dict[str, Any]]] = []
        self.verbosity = 1
        super().__init__(*args, **kwargs)

    def execute(self, *args: Any, **options: Any) -> str | None:
        """Django's ``execute``, with a database that cannot be reached reported as such.

        A ``DatabaseError`` escaping the command while one of its databases (``--database``,
        else every alias django-leases writes to) does not answer, or has never had
        django-leases' migrations applied, becomes a ``CommandError`` naming the alias (and,
        unmigrated, saying to run ``migrate``), with ``returncode``
        :data:`DATABASE_UNREACHABLE`: one line on stderr, no traceback. Any other database
        error propagates unchanged.

        Args:
            args: the command's positional arguments.
            options: its options.

        Returns:
            What the command's ``handle`` returned.

        Raises:
            CommandError: as the command raises it, or for an unreachable database.
        """
        self.verbosity = int(options.get("verbosity", 1))
        self._refuse_undecodable(args, options)
        try:
            return super().execute(*args, **options)
        except DatabaseError as exc:
            given = options.get("database")
            unusable = unreachable_database_error(given) or unmigrated_database_error(given)
            if unusable is None:
                raise
            raise unusable from exc

    def _refuse_undecodable(self, args: tuple[Any, ...], options: dict[str, Any]) -> None:
        """Refuse an argument that is not valid UTF-8 (a byte such as 0xff from a Latin-1
        terminal reaches Python as a lone surrogate, which no database driver encodes): a
        usage error naming it, before anything is done."""
        given = [("", arg) for arg in args] + [
            (name, value) for name, value in options.items() if name not in self.raw_options
        ]
        for name, value in given:
            for text in value if isinstance(value, list | tuple) else [value]:
                if isinstance(text, str) and _UNDECODABLE.search(text):
                    shown = f"--{name.replace('_', '-')} " if name else ""
                    raise CommandError(
                        f"The argument {shown}{text!r} is not valid UTF-8 text",
                        returncode=USAGE_ERROR,
                    )

    def confirm(self, message: str) -> None:
        """Write ``message``, a confirmation of what the command did, to stdout unless
        ``--verbosity 0`` asked for silence (Django's convention; errors still go to stderr,
        and requested output — a listing, JSON, a run id — is written whatever the
        verbosity)."""
        if self.verbosity >= 1:
            self.stdout.write(message)

    @property
    def command_name(self) -> str:
        """The command's name: its module's (``…commands.leases`` → ``leases``)."""
        return type(self).__module__.rsplit(".", 1)[-1]

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        """Django's parser, with :class:`HelpFormatter` and the exit codes as its epilog.

        Args:
            prog_name: the program (``manage.py``).
            subcommand: the command's name as invoked.
            kwargs: passed to Django's ``create_parser``.

        Returns:
            The parser.
        """
        kwargs.setdefault("formatter_class", HelpFormatter)
        self._base_arguments = []
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parts = [self.epilog_intro.strip("\n")]
        if self.command_name in EXIT_CODES:
            parts.append(exit_codes_help(self.command_name))
        parser.epilog = "\n\n".join(part for part in parts if part) + "\n"
        return parser

    def add_base_argument(self, parser: CommandParser, *args: Any, **kwargs: Any) -> None:
        """Add one of Django's options, remembered so that subcommands accept it too.

        Args:
            parser: the command's parser.
            args: the option strings.
            kwargs: ``add_argument``'s keyword arguments.
        """
        if not set(args) & _TOP_LEVEL_ONLY:
            self._base_arguments.append((args, dict(kwargs)))
        super().add_base_argument(parser, *args, **kwargs)

    def add_subcommand(
        self, actions: argparse._SubParsersAction[CommandParser], name: str, *, help: str
    ) -> CommandParser:
        """A subcommand's parser that also takes Django's options (``--settings``,
        ``--pythonpath``, ``-v``, ``--traceback``, ``--skip-checks``…) after its name.

        Those options default to nothing on the subcommand, so a value given before the
        subcommand's name (or Django's default) stands when it is not repeated after.

        Args:
            actions: what ``parser.add_subparsers()`` returned.
            name: the subcommand's name.
            help: its one-line help.

        Returns:
            The subcommand's parser.
        """
        sub: CommandParser = actions.add_parser(name, help=help, formatter_class=HelpFormatter)
        for args, kwargs in self._base_arguments:
            super().add_base_argument(sub, *args, **{**kwargs, "default": argparse.SUPPRESS})
        if self.requires_system_checks:  # Django adds it apart from the others
            sub.add_argument(
                "--skip-checks",
                action="store_true",
                default=argparse.SUPPRESS,
                help="Skip system checks.",
            )
        return sub

    def record_in_admin_history(
        self, subcommand: str, obj: Model, message: str | LifecycleResult
    ) -> None:
        """Write the change this command just made to ``obj`` into the admin's history
        (``LogEntry``, as the system user; :mod:`django_leases.admin.history`).

        Args:
            subcommand: the subcommand that made it (``"enable"``), said in the entry.
            obj: the row changed (or deleted: its ``pk`` still set).
            message: what was done (never a secret), or a trigger-source lifecycle result
                (``subcommand`` is then its operation): worded as the admin words it, a
                ``DELETION`` entry when the row is gone.

        Without ``django.contrib.admin`` installed nothing is written; an entry that cannot be
        written is reported on stderr. The change stands either way.
        """
        if not apps.is_installed("django.contrib.admin"):
            return
        # deferred: the admin is optional; importing it registers ModelAdmins, which needs
        # django.contrib.admin installed (a project without it runs every command).
        from django_leases.admin import history

        flag = history.CHANGE
        if not isinstance(message, str):
            flag = history.lifecycle_flag(message)
            message = history.lifecycle_message(subcommand, message)
        command = f"{self.command_name} {subcommand}"
        if history.log_change(obj, message, flag=flag, command=command) is None:
            self.stderr.write(
                "Warning: this change could not be recorded in the admin's history "
                f"(as the system user {history.SYSTEM_USERNAME!r}); see the log."
            )


__all__ = [
    "COMMAND_ERROR",
    "DATABASE_UNREACHABLE",
    "EXIT_BUSY",
    "EXIT_CODES",
    "EXIT_PROVIDER_FAILED",
    "EXIT_SETUP_FAILED",
    "EXIT_WRONG_STATE",
    "FORMATS",
    "MAX_AGE_DAYS",
    "MAX_CONCURRENCY",
    "MAX_ROWS",
    "MAX_WAIT",
    "PORTS",
    "USAGE_ERROR",
    "Column",
    "ExitCode",
    "ExitCodeTable",
    "HelpFormatter",
    "LeasesCommand",
    "add_database_argument",
    "add_format_argument",
    "cell_text",
    "columns",
    "command_names",
    "database_alias",
    "database_aliases",
    "either",
    "exit_code_problems",
    "exit_codes_help",
    "exit_codes_markdown",
    "integer_type",
    "read_only_database_error",
    "seconds_type",
    "unmigrated_database_error",
    "unreachable_database_error",
    "write_rows",
]

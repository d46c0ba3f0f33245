"""Trigger-source declarations: webhook sources declared in code (DESIGN §6).

Each installed app's ``triggers.py`` is imported when Django starts (see ``apps.py``) and
declares its sources there::

    from django_leases.triggers import StartWorkflow, webhook_source

    webhook_source(
        "github-pushes",
        provider="github",
        config={"repository": "octo-org/octo-repo"},
        events={"push": StartWorkflow("build-preview")},
    )

A declaration only says what *may* be received. A source receives nothing until its row is
synced (``manage.py reconcile_trigger_sources``) and an operator enables it in the admin.

Handlers map an event name (GitHub's ``X-GitHub-Event``) to what a delivery does:

* :class:`StartWorkflow` — start a workflow run with the delivery's payload (the JSON body
  the provider sent) as its input, or with the whole delivery (:meth:`Delivery.as_input`:
  source, event, action, delivery id and payload) when given ``input="delivery"``. The run is
  created in the transaction that records the delivery, so an accepted delivery is never
  lost. The payload form lets the same workflow be started by hand with a saved payload
  (``manage.py start_workflow NAME --input "$(cat payload.json)"``);
* :class:`SendEvent` — send an event to the run the delivery names (a run waiting in
  ``run.wait_for_event``), in that same transaction; a delivery for no waiting run is
  recorded with that outcome;
* a plain function ``handler(delivery: Delivery) -> uuid.UUID | Handled | None``. It is
  called inside that same transaction, so its database writes commit with the delivery or
  not at all; it must therefore be short (no network calls, no waiting). If it returns a run
  id (it started a workflow itself), the delivery is linked to that run; a
  :class:`~django_leases.triggers.values.Handled` also records what it did (``outcome``).
  Long work belongs in a workflow.

An event without a handler (GitHub's ``ping``, say) is still recorded, and starts nothing.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from django.db import DatabaseError

from django_leases.exceptions import WorkflowEventRefusedError, WorkflowRunStateError
from django_leases.frozen import frozen
from django_leases.models.wait import WorkflowWait
from django_leases.models.workflow import WorkflowRun
from django_leases.triggers.values import Delivery, Handled, Handler
from django_leases.validation import MAX_NAME_LENGTH, check_identifier, check_run_key, parse_run_id

if TYPE_CHECKING:
    from django_leases.models import TriggerSource
    from django_leases.triggers.providers.base import Provider

logger = logging.getLogger("django_leases.triggers")

#: Kinds of trigger source. Only webhooks exist so far.
KINDS = frozenset({"webhook"})

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

# Config keys that would carry a secret. Config is stored in the database and shown in the
# admin, so secrets are refused here; they belong to the credential store.
_SECRET_WORDS = ("secret", "password", "token", "private_key", "api_key")


class _Unread(Exception):
    """A handler's own callable (``key``, ``run``) raised on a delivery: the text says what."""


def _read_off(delivery: Delivery, read: Callable[[Delivery], Any], what: str) -> Any:
    """``read(delivery)``, the project's callable that picks something off a delivery.

    What it raises — a ``KeyError`` on a payload of another shape, say — is the delivery's
    problem, not the server's: it becomes :class:`_Unread` (the delivery is recorded with
    that outcome, and the provider is not asked to send it again), logged with its
    traceback. A ``DatabaseError`` propagates: the delivery is then not recorded and the
    provider retries it, as for any failure of ours.
    """
    try:
        return read(delivery)
    except DatabaseError:
        raise
    except Exception as exc:
        logger.warning(
            "Trigger source %r: the handler's %s raised on delivery %r",
            delivery.source,
            what,
            delivery.delivery_id,
            exc_info=True,
        )
        raise _Unread(f"its {what} raised {_shown(exc)}") from exc


@frozen
class StartWorkflow:
    """Handler that starts workflow ``workflow`` (a ``str``) for each delivery.

    ``input`` picks the run's input: ``"payload"`` (default) — the decoded JSON body the
    provider sent (for GitHub, exactly the webhook payload); ``"delivery"`` — the envelope
    of :meth:`Delivery.as_input` (source, provider, event, action, delivery id, payload).
    ``key`` (a callable on the :class:`Delivery` returning a ``str``, or ``None`` for no
    key) gives the run an idempotency key — e.g. the pull request's number — so a second
    delivery for the same thing starts nothing, and a :class:`SendEvent` handler can find
    the run by its key.

    The run is created with :func:`django_leases.workflows.start_workflow` inside the
    transaction that records the delivery. The workflow does not need to be registered when
    the declaration is made (apps import in any order); the system check
    ``django_leases.W009`` reports one that is still missing once Django has started.
    """

    workflow: str
    input: Literal["payload", "delivery"] = "payload"
    key: Callable[[Delivery], str | None] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.workflow, str) or not self.workflow:
            raise ValueError("StartWorkflow needs a workflow name (a non-empty str)")
        if self.input not in ("payload", "delivery"):
            raise ValueError(
                f"StartWorkflow input must be 'payload' or 'delivery', not {self.input!r}"
            )
        if self.key is not None and not callable(self.key):
            raise ValueError("StartWorkflow key must be a callable on the delivery, or None")

    def __call__(self, delivery: Delivery) -> uuid.UUID | Handled:
        """Start the run (or find the one with the same key); returns its id. A ``key``
        callable that raises on the delivery, or returns what no run key can be (not a
        ``str``, empty, over 255 characters), starts nothing: the delivery is recorded with
        that outcome (a :class:`Handled` without a run). Raises what ``start_workflow``
        raises."""
        value = delivery.payload if self.input == "payload" else delivery.as_input()
        try:
            key = None if self.key is None else _read_off(delivery, self.key, "key")
        except _Unread as exc:
            return Handled(None, f"workflow {self.workflow!r} not started: {exc}")
        if key is not None:
            try:
                check_run_key(key)
            except ValueError as exc:  # the sender's data: sent again, it would fail again
                return Handled(None, f"workflow {self.workflow!r} not started: {exc}")
        # deferred: start-up cost. This module loads as Django starts (the providers, the
        # checks); the engine (fencing, renewal, tracing) only when a delivery starts a run.
        from django_leases.workflows import engine

        return engine.start_workflow(self.workflow, value, key=key, using=delivery.using)


@frozen
class SendEvent:
    """Handler that turns each delivery into event ``name`` for the run it names.

    ``run`` is a callable on the :class:`Delivery` that returns the run's id (a
    ``uuid.UUID`` or its text), or ``None`` when the delivery is for no run — for a run
    started with a key, ``lambda d: run_for_key("pr-review", str(d.payload["number"]))``
    (:func:`run_for_key`). ``payload`` picks the event's payload: ``"payload"`` (default,
    the decoded JSON body) or ``"delivery"`` (:meth:`Delivery.as_input`).

    The event is sent with ``WorkflowWait.objects.send_event`` inside the transaction that
    records the delivery, so the delivery, the event and the run's wake-up commit together.
    A delivery that names no run, names something that is not a run id (``run`` returned
    another type, or text that is not a UUID), an unknown or finished run, a wait that
    already has its event (or timed out), or carries a payload no event may have (over
    ``DJANGO_LEASES["MAX_EVENT_PAYLOAD"]`` bytes of JSON), is still recorded — with that
    outcome on its row, never as an error (a provider would only send it again). So is one
    on which ``run`` raises (a payload of another shape): the error is logged and named in
    the outcome.

    Raises ``ValueError`` where it is declared for a ``name`` no wait can have (empty,
    over 200 characters, a NUL character), a ``run`` that is not callable, or another
    ``payload``.
    """

    name: str
    run: Callable[[Delivery], uuid.UUID | str | None]
    payload: Literal["payload", "delivery"] = "payload"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("SendEvent needs an event name (a non-empty str)")
        # The rule send_event applies, here where it is declared, not on every delivery.
        check_identifier(self.name, "SendEvent event name")
        if not callable(self.run):
            raise ValueError("SendEvent run must be a callable on the delivery")
        if self.payload not in ("payload", "delivery"):
            raise ValueError(
                f"SendEvent payload must be 'payload' or 'delivery', not {self.payload!r}"
            )

    def __call__(self, delivery: Delivery) -> Handled:
        """Send the event; returns what came of it (never raises for a refused event, nor
        for a ``run`` that returns something other than a run id or raises on the delivery;
        a ``DatabaseError`` propagates)."""
        try:
            named = _read_off(delivery, self.run, "run")
        except _Unread as exc:
            return Handled(None, f"event {self.name!r} not delivered: {exc}")
        if named is None:
            return Handled(None, f"event {self.name!r}: the delivery names no run")
        try:
            # Only a UUID or its text: str() of anything else is no run's id either. Read
            # as the plain types, so a subclass's own methods are never called.
            if isinstance(named, uuid.UUID):
                run_id: uuid.UUID | None = uuid.UUID(int=named.int)
            else:
                run_id = parse_run_id(str.__str__(named)) if isinstance(named, str) else None
        except Exception:  # the project's callable returned something no run id is made of
            run_id = None
        if run_id is None:
            return Handled(
                None,
                f"event {self.name!r} not delivered: the delivery names "
                f"{_shown(named)}, which is not a workflow run id (a UUID)",
            )
        value = delivery.payload if self.payload == "payload" else delivery.as_input()
        store = WorkflowWait.objects.db_manager(delivery.using)
        try:
            wait = store.send_event(run_id, self.name, value)
        except (
            WorkflowRun.DoesNotExist,
            WorkflowRunStateError,
            WorkflowEventRefusedError,
            ValueError,  # the payload cannot be an event's: not storable, or too large
        ) as exc:
            return Handled(None, f"event {self.name!r} not delivered: {exc}")
        return Handled(wait.run_id, f"event {self.name!r} sent to run {wait.run_id}")


def _shown(value: object) -> str:
    """``value`` as a short, storable text for an outcome: its ``repr``, cut to 80
    characters (``repr`` escapes NUL characters and lone surrogates)."""
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else f"{text[:77]}..."


def run_for_key(workflow: str, key: str, *, using: str | None = None) -> uuid.UUID | None:
    """The id of the run of ``workflow`` started with ``key`` (``start_workflow(...,
    key=...)``), or ``None``: for a :class:`SendEvent`'s ``run``."""
    runs = WorkflowRun.objects if using is None else WorkflowRun.objects.db_manager(using)
    return runs.id_for_key(workflow, key)


@frozen
class TriggerDeclaration:
    """A trigger source as declared in code. Build one with :func:`webhook_source`.

    Attributes:
        name: unique source name; also the URL segment (``hooks/<name>/``).
        provider: an installed provider's name (``"github"``, ``"stripe"``, ``"manual"``).
        kind: ``"webhook"``.
        config: non-secret provider config (GitHub: ``{"repository": "owner/repo"}``).
        events: event name → handler (:class:`StartWorkflow` or a function).
    """

    name: str
    provider: str
    kind: str = "webhook"
    config: Mapping[str, Any] = field(default_factory=dict)
    events: Mapping[str, Handler] = field(default_factory=dict)

    def handler_for(self, event: str) -> Handler | None:
        """The handler of ``event``, or ``None`` when the source does not handle it."""
        return self.events.get(event)

    def started_workflows(self) -> list[str]:
        """Names of the workflows this source's handlers start (for the system checks)."""
        return sorted({h.workflow for h in self.events.values() if isinstance(h, StartWorkflow)})


_declarations: dict[str, TriggerDeclaration] = {}


def _check_source_name(name: object) -> str:
    if not isinstance(name, str):
        raise ValueError(f"A trigger source name must be a str, not {type(name).__name__}")
    if not name or len(name) > MAX_NAME_LENGTH or not _NAME.match(name):
        raise ValueError(
            f"Trigger source name {name!r} is not usable: it must be 1 to {MAX_NAME_LENGTH} "
            "characters of letters, digits, '-', '_' or '.', starting with a letter or digit "
            "(it is part of the webhook URL)"
        )
    return name


# -- the provider table: filled by django_leases.triggers.providers (imported by the app) -----

_providers: dict[str, Provider] = {}
_built_in: dict[str, Provider] = {}


def get_provider(name: str) -> Provider | None:
    """The provider named ``name`` (``str``), or ``None`` when none is installed under it."""
    return _providers.get(name) if isinstance(name, str) else None


def secret_set_by_hand(provider_name: str) -> bool:
    """Whether an operator may store the signing secret of a source of provider
    ``provider_name`` (``str``) by hand — the admin's form and ``trigger_sources set-secret``
    both ask this. ``True`` where no registration sets one (``manual``) and where the setup
    sends ours to the provider (GitHub: the stored secret is sent at the source's next
    enable); ``False`` where the provider chooses its own and never shows it again (Stripe:
    another one stored would refuse every delivery, and its setup stores the right one), and
    where no provider of that name is installed."""
    provider = get_provider(provider_name)
    return provider is not None and (not provider.manages_registration or provider.takes_secret)


def setup_may_have_run(row: TriggerSource) -> bool:
    """Whether a setup of source ``row`` may have registered it at its provider without
    recording it: one that failed (its answer lost after the provider made it), or one cut
    short (status still ``pending``: its process died, or its lease was lost, before the
    outcome was written)."""
    return row.status in ("failed", "pending")


def may_be_registered(row: TriggerSource) -> bool:
    """Whether a teardown of source ``row`` at its provider may find something to drop: its
    provider is installed here, and a registration is recorded (``state``) or a setup may
    have made one it never recorded (:func:`setup_may_have_run`, for a provider that
    registers sources through its API). What the admin's Orphans view offers "Tear down"
    for."""
    provider = get_provider(row.provider)
    if provider is None:
        return False
    if row.state is not None:
        return True
    return provider.manages_registration and setup_may_have_run(row)


def provider_names() -> list[str]:
    """Names of the installed providers, sorted."""
    return sorted(_providers)


def register_provider(provider: Provider, *, built_in: bool = False) -> Provider:
    """Install ``provider`` under ``provider.name`` (replacing one of that name); returns it.
    ``built_in``: one of the package's own (:func:`unregister_provider` brings it back).

    Raises ``ValueError`` when ``provider`` has no name or lacks a provider's methods.
    """
    name = getattr(provider, "name", None)
    methods = ("setup", "check", "teardown", "verify", "parse")
    if (
        not isinstance(name, str)
        or not name
        or not all(callable(getattr(provider, method, None)) for method in methods)
    ):
        raise ValueError("register_provider() needs a Provider instance with a name")
    _providers[provider.name] = provider
    if built_in:
        _built_in[provider.name] = provider
    return provider


def unregister_provider(name: str) -> None:
    """Remove provider ``name``; a built-in one comes back as built. Unknown: no-op."""
    _providers.pop(name, None)
    if name in _built_in:
        _providers[name] = _built_in[name]


def _check_provider(name: str, provider: object) -> str:
    if not isinstance(provider, str) or get_provider(provider) is None:
        raise ValueError(
            f"Trigger source {name!r}: unknown provider {provider!r} "
            f"(installed: {', '.join(provider_names())})"
        )
    return provider


def _check_config(name: str, config: object) -> dict[str, Any]:
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise ValueError(f"Trigger source {name!r}: config must be a dict")
    for key in config:
        if not isinstance(key, str):
            raise ValueError(f"Trigger source {name!r}: config keys must be str")
        if any(word in key.lower() for word in _SECRET_WORDS):
            raise ValueError(
                f"Trigger source {name!r}: config key {key!r} looks like a secret; config is "
                "stored and shown to operators, so secrets do not belong in it"
            )
    return dict(config)


def _check_events(name: str, events: object) -> dict[str, Handler]:
    if not isinstance(events, Mapping):
        raise ValueError(f"Trigger source {name!r}: events must be a dict of event → handler")
    checked: dict[str, Handler] = {}
    for event, handler in events.items():
        if not isinstance(event, str) or not event or len(event) > 200:
            raise ValueError(
                f"Trigger source {name!r}: event names must be non-empty str of at most "
                f"200 characters, got {event!r}"
            )
        if not callable(handler):
            raise ValueError(
                f"Trigger source {name!r}: the handler of {event!r} must be StartWorkflow(...), "
                "SendEvent(...) or a function"
            )
        checked[event] = handler
    return checked


def webhook_source(
    name: str,
    *,
    provider: str,
    events: Mapping[str, Handler],
    config: Mapping[str, Any] | None = None,
) -> TriggerDeclaration:
    """Declare (and register) a webhook trigger source; returns its :class:`TriggerDeclaration`.

    Args:
        name: unique source name (``str``, letters, digits, ``-_.``, ≤ 200 characters).
        provider: the name of an installed provider: ``"github"``, ``"stripe"``,
            ``"manual"``, or one added with ``providers.register_provider``.
        events: event name → handler (:class:`StartWorkflow` or a function).
        config: non-secret provider config (keys that look like secrets are refused).

    Declaring the same name again with an equal declaration returns the existing one (a
    re-imported module); a different declaration under a taken name is an error.

    Raises:
        ValueError: a bad name, an unknown provider, bad events or config, or a name
            already declared differently.
    """
    _check_source_name(name)
    _check_provider(name, provider)
    declaration = TriggerDeclaration(
        name=name,
        provider=provider,
        kind="webhook",
        config=MappingProxyType(_check_config(name, config)),
        events=MappingProxyType(_check_events(name, events)),
    )
    return register(declaration)


def register(declaration: TriggerDeclaration) -> TriggerDeclaration:
    """Add ``declaration`` to the registry; returns the registered one.

    Raises ``ValueError`` when another, different declaration has the name already.
    """
    existing = _declarations.get(declaration.name)
    if existing is not None:
        same = (
            existing.provider == declaration.provider
            and existing.kind == declaration.kind
            and dict(existing.config) == dict(declaration.config)
            and dict(existing.events) == dict(declaration.events)
        )
        if not same:
            raise ValueError(f"Trigger source {declaration.name!r} is already declared")
        return existing
    _declarations[declaration.name] = declaration
    return declaration


def get_declaration(name: str) -> TriggerDeclaration | None:
    """The declaration named ``name``, or ``None`` when no loaded code declares it."""
    return _declarations.get(name)


def declarations() -> list[TriggerDeclaration]:
    """Every registered declaration, sorted by name."""
    return [_declarations[name] for name in sorted(_declarations)]


def unregister(name: str) -> None:
    """Remove a declaration (for tests that declare their own sources). Unknown: no-op."""
    _declarations.pop(name, None)

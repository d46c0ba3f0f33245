"""The trigger-source lifecycle: reconcile, enable, disable, teardown, forget (DESIGN §6).

Every operation on a source runs under the lease ``trigger-source:<name>``
(:func:`django_leases.leases.hold_lease`), so two operators, or two deploys running
``reconcile_trigger_sources`` at once, never set one source up twice: the second waits (up
to ``wait`` seconds) for the first to finish, then sees what it recorded. The provider's
``setup`` reuses the registration named in ``source.state``, so a second setup updates
rather than duplicates. Each write to the row is fenced by that lease
(``Lease.objects.fenced``): an operation whose lease lapsed while it waited on a provider
writes nothing (:class:`~django_leases.exceptions.LeaseLostError`).

The admin, the commands and your own code all call these functions; the rules live here
only. Each follows the reference lifecycle:

* :func:`reconcile` syncs the declarations (and the address) into rows, then sets up the
  enabled, declared sources; a disabled source gets no provider call at all. The address is
  the ``base_url`` given, else ``DJANGO_LEASES["BASE_URL"]``, else the last one a reconcile
  was given (kept project-wide, so a source declared in a later deploy gets it too);
* :func:`enable` needs an address (checked before anything changes), flips the source on,
  then sets it up. A failed setup leaves it **on** with status ``failed`` and the error as
  detail, the earlier ``state`` kept, so a retry reuses the registration;
* :func:`disable` flips the source off first (every process refuses its deliveries from the
  next request: the receive view reads the row), then tears its registration down and
  clears ``state`` (status ``off``). A failed teardown keeps ``state``, so enabling again
  reuses that registration rather than creating a second one;
* :func:`teardown` stops receiving, tears the registration down and deletes the row and its
  signing secret (a declared source comes back, off, at the next reconcile);
* :func:`forget` deletes an orphan's row and secret without asking the provider.

Nothing here runs inside ``transaction.atomic()``: the lease must commit to protect
anything, and provider calls are network calls that must not hold a transaction open.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import field
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections, router
from django.urls import NoReverseMatch, get_script_prefix, reverse

from django_leases import db
from django_leases.conf import leases_settings
from django_leases.exceptions import (
    LeaseError,
    LeaseTakenError,
    MisuseError,
    NoAddress,
    NoReceiveURL,
    ProviderError,
    ProviderNotInstalled,
    SourceBusy,
    SourceOrphaned,
    TriggerSourceError,
)
from django_leases.frozen import frozen
from django_leases.leases import HeldLease, hold_lease
from django_leases.models.lease import Lease
from django_leases.models.trigger import (
    TriggerSecret,
    TriggerSecretQuerySet,
    TriggerSource,
    TriggerSourceQuerySet,
)
from django_leases.triggers import providers, registry
from django_leases.triggers.providers import MANUAL
from django_leases.validation import check_source_name, seconds

if TYPE_CHECKING:
    from django_leases.triggers.providers import Provider

logger = logging.getLogger("django_leases.triggers")

_T = TypeVar("_T")

#: Seconds an operation waits for another one on the same source to finish by default.
DEFAULT_WAIT = 30.0

#: Prefix of the lease key each source's operations hold (``trigger-source:<name>``).
LEASE_PREFIX = "trigger-source:"


@frozen
class LifecycleResult:
    """What one lifecycle operation on one source came to.

    Attributes:
        name: the source.
        action: ``"reconcile"``, ``"enable"``, ``"disable"``, ``"teardown"`` or ``"forget"``.
        ok: ``False`` when the provider step failed (the row says so: status ``failed``).
        changed: whether the switch flipped (enable / disable) or the row was deleted.
        enabled: the switch afterwards (``None`` once the row is deleted).
        status: the row's status afterwards (``None`` once the row is deleted).
        detail: text for operators (instructions, what was done, or the error). Never a
            secret.
    """

    name: str
    action: str
    ok: bool
    changed: bool
    enabled: bool | None
    status: str | None
    detail: str

    def __str__(self) -> str:
        return f"{self.name}: {self.detail}"


@frozen
class Reconciled:
    """What :func:`reconcile` did: every row after the sync, and each enabled source's setup."""

    sources: list[TriggerSource]
    results: list[LifecycleResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every setup succeeded (``True`` when none was due)."""
        return all(result.ok for result in self.results)


def lease_key(name: str) -> str:
    """The lease key that serialises operations on source ``name``."""
    return f"{LEASE_PREFIX}{name}"


def receive_url(source: TriggerSource) -> str:
    """The full URL deliveries to ``source`` are posted to: its ``base_url`` + the route.

    ``base_url`` is where the project's URLconf root is served (any script prefix
    included), so the route is taken without the current script prefix. Raises
    :class:`NoAddress` when the source has no ``base_url`` and :class:`NoReceiveURL` when
    ``django_leases.urls`` is not included.
    """
    if not source.base_url:
        raise NoAddress(source.name)
    try:
        path = reverse("django_leases:receive-webhook", args=[source.name])
    except NoReverseMatch:
        raise NoReceiveURL(source.name) from None
    prefix = get_script_prefix()
    if prefix != "/" and path.startswith(prefix):
        path = "/" + path[len(prefix) :]
    return source.base_url.rstrip("/") + path


#: Why a source has no receiving URL, as :func:`missing_url` names it, and what to do.
MISSING_URL_HINTS = {
    "no_address": "no address yet: run reconcile_trigger_sources --base-url URL",
    "no_route": (
        "django_leases.urls is not in the URLconf: add path('', include('django_leases.urls'))"
    ),
}


def missing_url(source: TriggerSource) -> str | None:
    """Why :func:`receive_url` has no URL for ``source``: ``"no_address"`` (no ``base_url``
    known yet), ``"no_route"`` (``django_leases.urls`` is not included), or ``None`` when it
    has one. :data:`MISSING_URL_HINTS` says what to do about each."""
    try:
        receive_url(source)
    except NoAddress:
        return "no_address"
    except NoReceiveURL:
        return "no_route"
    return None


def _objects(using: str | None) -> TriggerSourceQuerySet:
    rows = TriggerSource.objects.all()
    return rows.using(using) if using else rows


def _secrets(using: str | None) -> TriggerSecretQuerySet:
    # A manager with the QuerySet's methods (the stubs' plugin makes its class, unnamed here).
    return TriggerSecret.objects.db_manager(using or router.db_for_write(TriggerSecret))  # type: ignore[return-value]


def _provider(name: str) -> Provider | None:
    return providers.get_provider(name)


@contextmanager
def _source_lease(name: str, using: str | None, wait: float) -> Iterator[HeldLease]:
    """Hold ``trigger-source:<name>``, waiting up to ``wait`` s for another holder.

    Raises ``ValueError`` for a ``name`` that is no source name (:func:`check_source_name`)
    or a bad ``wait``."""
    check_source_name(name)
    seconds(wait, "wait")
    alias = using or router.db_for_write(Lease)
    if not db.outside_transactions(connections[alias]):
        raise MisuseError(
            f"Trigger source {name!r}: enable, disable, teardown and reconcile take the "
            "source's lease, which cannot be held inside transaction.atomic() (a TestCase) "
            "or with autocommit off. "
            "To test a webhook handler, use django_leases.testing.enable_source() and "
            "deliver(); to test setup at a provider, use a TransactionTestCase."
        )
    try:
        with hold_lease(lease_key(name), using=using, wait=wait) as held:
            yield held
    except LeaseTakenError as exc:
        if exc.key != lease_key(name):
            raise
        raise SourceBusy(name, wait) from None


def _fenced(held: HeldLease, using: str | None, write: Callable[[], _T]) -> _T:
    """Run ``write`` in a transaction that commits only while ``held`` is still ours."""
    alias = using or router.db_for_write(Lease)
    with Lease.objects.using(alias).fenced(held.lease):
        return write()


def _result(
    objects: TriggerSourceQuerySet, name: str, action: str, *, ok: bool, changed: bool
) -> LifecycleResult:
    row = objects.named(name)
    return LifecycleResult(
        name=name,
        action=action,
        ok=ok,
        changed=changed,
        enabled=row.enabled,
        status=row.status,
        detail=row.detail or "",
    )


def _secret_for(provider: Provider, name: str, using: str | None) -> str | None:
    """Our signing secret for providers that take one (created on first use), else ``None``."""
    if not provider.takes_secret:
        return None
    return str(_secrets(using).ensure_secret(name))


def _set_up(
    objects: TriggerSourceQuerySet,
    held: HeldLease,
    using: str | None,
    name: str,
    provider: Provider,
    secret: str | None,
) -> bool:
    """Set source ``name`` up at ``provider`` and record the outcome. Returns success.

    Called under the source's lease with the row enabled. A failure is recorded (status
    ``failed``, the error as detail, ``state`` kept) rather than raised.
    """
    _fenced(
        held,
        using,
        lambda: objects.record(name, status="pending", detail=f"Setting up at {provider.name}…"),
    )
    row = objects.named(name)
    try:
        url = receive_url(row)
        torn, why = _tear_down_previous(row)
        if not torn:
            raise ProviderError(why)
        outcome = provider.setup(row, url, secret)
        if outcome.status not in ("registered", "manual"):
            raise ProviderError(
                f"Provider {provider.name!r} answered setup with unknown status {outcome.status!r}"
            )
    except (ProviderError, TriggerSourceError) as exc:
        message = f"Setup at {provider.name} failed: {exc}"
    except Exception as exc:
        # Not a provider's own, safe error: keep its text out of the row (it could quote
        # anything), and leave the traceback to the server log.
        logger.exception("Setting up trigger source %r at %s failed", name, provider.name)
        message = (
            f"Setup at {provider.name} failed unexpectedly ({type(exc).__name__}); "
            "see the server log"
        )
    else:

        def keep() -> bool:
            now = objects.named(name, lock=True)
            if now.provider != row.provider:
                # A deploy's sync moved the source to another provider while this setup ran:
                # what it made at the former one is kept as the sync keeps a registration,
                # for the next setup to tear down first (a secret the former made is not).
                moved = {"provider": row.provider, "config": row.config, "state": outcome.state}
                objects.record(
                    name,
                    status="pending",
                    detail=(
                        f"Moved to {now.provider} while being set up at {provider.name}: that "
                        "registration is torn down at the next setup (reconcile)."
                    ),
                    state={"previous": moved},
                )
                return False
            if outcome.secret:
                _secrets(using).set_secret(name, outcome.secret)
            objects.record(name, status=outcome.status, detail=outcome.detail, state=outcome.state)
            return True

        if not _fenced(held, using, keep):
            logger.warning("Trigger source %r moved to another provider during its setup", name)
            return False
        logger.info("Trigger source %r set up at %s: %s", name, provider.name, outcome.status)
        return True
    _fenced(held, using, lambda: objects.record(name, status="failed", detail=message))
    logger.warning("Trigger source %r: %s", name, message)
    return False


def reconcile(
    base_url: str | None = None,
    label_prefix: str | None = None,
    *,
    using: str | None = None,
    wait: float = DEFAULT_WAIT,
) -> Reconciled:
    """Sync the declarations into rows, then set up every enabled, declared source.

    Args:
        base_url: where the project is served (``https://app.example.com``); ``None``
            takes ``DJANGO_LEASES["BASE_URL"]`` when set, else keeps each row's known
            address and gives a row without one (a new source) the last address a
            reconcile was given.
        label_prefix: how endpoints are labelled at providers; ``None`` keeps the known one.
        using: the database alias (default: the router's choice).
        wait: seconds to wait for another operation on a source before skipping it.

    Disabled sources and orphans get no provider call. A source whose setup fails (or that
    stays busy, or lacks an address or its provider) is recorded ``failed`` where a row
    write is possible and reported in :attr:`Reconciled.results`; the others still run.

    Raises:
        ValueError: a bad ``base_url`` or ``label_prefix`` (nothing written).
    """
    objects = _objects(using)
    if base_url is None:
        base_url = leases_settings.BASE_URL
    rows = objects.sync(registry.declarations(), base_url=base_url, label_prefix=label_prefix)
    results: list[LifecycleResult] = []
    for row in rows:
        if not (row.declared and row.enabled):
            continue
        try:
            results.append(_reconcile_one(objects, row.name, using, wait))
        except (TriggerSourceError, LeaseError) as exc:  # that source's; the others go on
            results.append(
                LifecycleResult(
                    name=row.name,
                    action="reconcile",
                    ok=False,
                    changed=False,
                    enabled=True,
                    status=row.status,
                    detail=str(exc),
                )
            )
    return Reconciled(sources=list(objects.order_by("name")), results=results)


def _reconcile_one(
    objects: TriggerSourceQuerySet, name: str, using: str | None, wait: float
) -> LifecycleResult:
    with _source_lease(name, using, wait) as held:
        row = objects.named(name)
        if not (row.declared and row.enabled):  # changed while we waited
            return _result(objects, name, "reconcile", ok=True, changed=False)
        provider = _provider(row.provider)
        try:
            if provider is None:
                raise ProviderNotInstalled(name, row.provider)
            receive_url(row)
            secret = _secret_for(provider, name, using)
        except TriggerSourceError as exc:
            message = str(exc)
            _fenced(held, using, lambda: objects.record(name, status="failed", detail=message))
            return _result(objects, name, "reconcile", ok=False, changed=False)
        ok = _set_up(objects, held, using, name, provider, secret)
        return _result(objects, name, "reconcile", ok=ok, changed=False)


def store_secret(
    name: str, secret: str, *, using: str | None = None, wait: float = DEFAULT_WAIT
) -> bool:
    """Store ``secret`` (``str``), typed by an operator (``trigger_sources set-secret``, the
    admin's form), as the signing secret of source ``name``, encrypted; then, where the
    source is on, its setup is instructions to follow (status ``manual``) and its provider
    registers nothing (``manual``; not a source a sync just moved elsewhere), record them
    again: they say which secret the sender signs with, and asked for one until now. Other
    sources are left as they are (GitHub's is sent the stored secret at its next enable).

    Args:
        name: the source.
        secret: the signing secret.
        using: the database alias (default: the router's choice).
        wait: seconds to wait for another operation on the source (``float``).

    Returns whether the instructions were recorded again. A source busy past ``wait``, a
    lease lost, or a call inside ``transaction.atomic()`` leaves them as they were (logged;
    the next reconcile records them): the secret is stored all the same.

    Raises (nothing stored):
        ValueError: an empty, overlong or control-character secret, or a bad name.
        ImproperlyConfigured: the credential store cannot encrypt (the webhooks extra).
    """
    _secrets(using).set_secret(name, secret)
    try:
        with _source_lease(name, using, wait) as held:
            objects = _objects(using)
            row = objects.filter(name=name).first()
            if row is None or not (row.declared and row.enabled) or row.status != MANUAL:
                return False
            provider = _provider(row.provider)
            if provider is None or provider.manages_registration:
                return False  # (moved to such a provider by a sync: it is set up by enable)
            return _set_up(objects, held, using, name, provider, _secret_for(provider, name, using))
    except (TriggerSourceError, LeaseError, MisuseError) as exc:
        logger.warning(
            "Trigger source %r: signing secret stored; its instructions are recorded again at "
            "the next reconcile (%s)",
            name,
            exc,
        )
        return False


def enable(name: str, *, using: str | None = None, wait: float = DEFAULT_WAIT) -> LifecycleResult:
    """Turn source ``name`` on, then set it up at its provider.

    Enabling a source that is on already sets it up again (a retry after ``failed``); the
    provider reuses the registration in ``state``.

    Args:
        name: the source.
        using: the database alias (default: the router's choice).
        wait: seconds to wait for another operation on the source (``float``).

    Returns a :class:`LifecycleResult`; ``ok=False`` when the setup failed (the source is
    on, with status ``failed`` and the error as detail).

    Raises (nothing changed):
        UnknownTriggerSourceError: no such row.
        SourceOrphaned: the source is no longer declared.
        ProviderNotInstalled: its provider is not installed.
        NoAddress: no ``base_url`` is known (run ``reconcile_trigger_sources --base-url``).
        NoReceiveURL: ``django_leases.urls`` is not in the URLconf.
        SourceBusy: another operation held the source for more than ``wait`` seconds.
        ValueError: ``name`` is no source name (not a ``str`` of 1–200 characters), or a bad
            ``wait``.
        LeaseLostError: the source's lease lapsed mid-way (that write was not made).
        MisuseError: called inside ``transaction.atomic()`` (a ``TestCase``): the lease
            would protect nothing; tests use :func:`django_leases.testing.enable_source`.
    """
    objects = _objects(using)
    with _source_lease(name, using, wait) as held:
        row = objects.named(name)
        if not row.declared:
            raise SourceOrphaned(name)
        provider = _provider(row.provider)
        if provider is None:
            raise ProviderNotInstalled(name, row.provider)
        receive_url(row)
        secret = _secret_for(provider, name, using)
        changed = _fenced(held, using, lambda: objects.set_enabled(name, True))
        ok = _set_up(objects, held, using, name, provider, secret)
        return _result(objects, name, "enable", ok=ok, changed=changed)


def disable(name: str, *, using: str | None = None, wait: float = DEFAULT_WAIT) -> LifecycleResult:
    """Turn source ``name`` off, then tear its registration down at the provider.

    The switch flips (and commits) before the provider is called, so deliveries are refused
    from the next request on, in every process. On success ``state`` is cleared and the
    status is ``off``. A failed teardown (or a provider that is not installed) leaves the
    source off with status ``failed`` and ``state`` kept, so enabling it again reuses that
    registration. Orphans can be disabled too.

    Returns a :class:`LifecycleResult` (``ok=False`` when the teardown failed).

    Raises (nothing changed): :class:`UnknownTriggerSourceError`, :class:`SourceBusy`,
    ``ValueError`` for a name that is no source name (1–200 characters) or a bad ``wait``.
    """
    objects = _objects(using)
    with _source_lease(name, using, wait) as held:
        row = objects.named(name)
        provider = _provider(row.provider)
        shown = provider.name if provider is not None else row.provider

        def flip() -> bool:
            changed = objects.set_enabled(name, False)
            objects.record(name, status="pending", detail=f"Disabled; tearing down at {shown}…")
            return changed

        changed = _fenced(held, using, flip)
        ok, message = _tear_down(
            objects.named(name), provider, after_failed_setup=registry.setup_may_have_run(row)
        )
        if ok:
            if provider is not None and not provider.manages_registration:
                message = (
                    "Disabled. Remove the webhook you registered by hand at the sender "
                    "(its deliveries are refused meanwhile)."
                )
            else:
                message = f"Disabled; its registration at {shown}, if any, was removed."
            _fenced(
                held, using, lambda: objects.record(name, status="off", detail=message, state=None)
            )
        else:
            message = f"Disabled (deliveries are refused), but {message}"
            _fenced(held, using, lambda: objects.record(name, status="failed", detail=message))
        return _result(objects, name, "disable", ok=ok, changed=changed)


def _tear_down_previous(row: TriggerSource) -> tuple[bool, str]:
    """Tear down the registration ``row`` kept from its former provider (its declaration
    moved to another: the sync recorded it as ``state["previous"]``). Returns (success,
    error text); nothing to do is success."""
    state = row.state if isinstance(row.state, dict) else {}
    previous = state.get("previous")
    if not isinstance(previous, dict):
        return True, ""
    former = copy.copy(row)
    former.provider = str(previous.get("provider"))
    former.config = previous.get("config") or {}
    former.state = previous.get("state")
    ok, message = _tear_down(former, _provider(former.provider))
    return ok, "" if ok else f"the registration at the former provider: {message}"


def _tear_down(
    row: TriggerSource, provider: Provider | None, *, after_failed_setup: bool = False
) -> tuple[bool, str]:
    """Ask the provider to drop ``row``'s registration: the recorded one and, after a failed
    setup (one may have run: :func:`~django_leases.triggers.registry.setup_may_have_run`),
    one the provider holds for the source's address all the same — a setup whose answer was
    lost, or that was cut short, after the provider made it. That one is looked for also
    when an earlier registration is still recorded: the failed setup may have replaced it
    (the recorded one gone at the provider, or moved with the repository). Returns
    (success, error text)."""
    torn, why = _tear_down_previous(row)
    if not torn:
        return False, why
    if provider is None:
        if row.state is None:
            return True, ""
        return False, (
            f"provider {row.provider!r} is not installed, so its registration was not torn "
            "down; the state is kept"
        )
    if row.state is not None:
        torn, why = _provider_teardown(row, provider)
        if not torn:
            return False, why
    if not after_failed_setup or not provider.manages_registration:
        return True, ""
    try:
        found = provider.unrecorded(row, receive_url(row))
    except (NoAddress, NoReceiveURL):
        return True, ""  # never had an address: nothing can post to it
    except ProviderError as exc:
        return False, f"looking for a registration at {provider.name} failed: {exc}"
    if found is None:
        return True, ""
    row.state = found
    return _provider_teardown(row, provider)


def _provider_teardown(row: TriggerSource, provider: Provider) -> tuple[bool, str]:
    """``provider.teardown(row)`` (the registration ``row.state`` names); returns (success,
    error text), the error logged when it is not the provider's own."""
    try:
        provider.teardown(row)
    except ProviderError as exc:
        return False, f"teardown at {provider.name} failed: {exc}; the state is kept"
    except Exception as exc:
        logger.exception("Tearing down trigger source %r at %s failed", row.name, provider.name)
        return False, (
            f"teardown at {provider.name} failed unexpectedly ({type(exc).__name__}; see the "
            "server log); the state is kept"
        )
    logger.info("Trigger source %r torn down at %s", row.name, provider.name)
    return True, ""


def teardown(name: str, *, using: str | None = None, wait: float = DEFAULT_WAIT) -> LifecycleResult:
    """Stop receiving, tear source ``name`` down at its provider, then delete its row.

    Its signing secret is deleted with the row; deliveries already recorded are kept. A
    declared source comes back (off) at the next reconcile.

    Returns a :class:`LifecycleResult`: ``ok=True, changed=True`` once the row is gone;
    ``ok=False`` when the provider's teardown failed (the row stays, off, status
    ``failed``, its state kept).

    Raises (nothing changed): :class:`UnknownTriggerSourceError`,
    :class:`ProviderNotInstalled` (a registration is recorded but its provider is missing:
    :func:`forget` it instead), :class:`SourceBusy`, ``ValueError`` for a name that is no
    source name (1–200 characters) or a bad ``wait``.
    """
    objects = _objects(using)
    with _source_lease(name, using, wait) as held:
        row = objects.named(name)
        provider = _provider(row.provider)
        if row.state is not None and provider is None:
            raise ProviderNotInstalled(name, row.provider)
        _fenced(held, using, lambda: objects.set_enabled(name, False))
        ok, message = _tear_down(
            objects.named(name), provider, after_failed_setup=registry.setup_may_have_run(row)
        )
        if not ok:
            text = f"Not torn down: {message}"
            _fenced(held, using, lambda: objects.record(name, status="failed", detail=text))
            return _result(objects, name, "teardown", ok=False, changed=False)

        def delete() -> None:
            objects.remove(name)
            _delete_secret(name, using)

        _fenced(held, using, delete)
        shown = provider.name if provider is not None else row.provider
        if row.state is None:
            detail = f"Deleted (nothing was registered at {shown})."
        else:
            detail = f"Torn down at {shown} and deleted."
        return _deleted(name, "teardown", detail)


def forget(name: str, *, using: str | None = None, wait: float = DEFAULT_WAIT) -> LifecycleResult:
    """Delete orphan ``name``'s row and signing secret, without asking its provider.

    For an orphan whose provider is gone, or whose registration was removed by hand. A
    registration still recorded in ``state`` is left at the provider (the detail says so).

    Raises (nothing changed): :class:`UnknownTriggerSourceError`,
    :class:`~django_leases.triggers.errors.SourceStillDeclared` (only orphans are
    forgotten), :class:`SourceBusy`, ``ValueError`` for a name that is no source name
    (1–200 characters) or a bad ``wait``.
    """
    objects = _objects(using)
    with _source_lease(name, using, wait) as held:
        row = objects.named(name)

        def delete() -> None:
            objects.forget(name)
            _delete_secret(name, using)

        _fenced(held, using, delete)
        detail = "Forgotten."
        if row.state is not None:
            detail += (
                f" Its registration at {row.provider} ({_identifiers(row.state)}) was not "
                "torn down; remove it there by hand if it still exists."
            )
        return _deleted(name, "forget", detail)


def _deleted(name: str, action: str, detail: str) -> LifecycleResult:
    """The result of an operation that deleted the source's row (it has no state now)."""
    return LifecycleResult(
        name=name, action=action, ok=True, changed=True, enabled=None, status=None, detail=detail
    )


def _identifiers(state: Any) -> str:
    if isinstance(state, dict):
        return ", ".join(f"{key}={value}" for key, value in sorted(state.items()))
    return str(state)


def _delete_secret(name: str, using: str | None) -> None:
    _secrets(using).delete_secret(name)

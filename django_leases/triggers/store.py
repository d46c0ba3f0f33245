"""The trigger-source store: QuerySet methods of ``TriggerSource`` and ``TriggerEvent``.

Follows the reference ``TriggerSourceStore`` (DESIGN §6):

* ``sync(declared)`` upserts the declared rows and marks every other row ``declared=False``
  (an orphan) without deleting it; it never touches ``enabled`` (off by default), ``status``
  or ``state``, and keeps a known ``base_url`` / ``label_prefix`` when none is given;
* ``record(name, …)`` replaces ``state`` only when one is given and always overwrites
  ``detail``; ``set_enabled(name, …)`` flips the switch; ``forget(name)`` deletes an
  orphan's row and ``remove(name)`` any row (the reference ``deleteTriggerSource``, used
  once the provider's registration is torn down); an unknown name is an
  :class:`~django_leases.triggers.errors.UnknownTriggerSourceError`.

Statuses (:data:`STATUSES`): ``off`` (nothing registered), ``pending`` (a setup or teardown
is under way, or was interrupted), ``registered`` (the provider's API holds our endpoint),
``manual`` (registration is the operator's job; ``detail`` says how), ``failed`` (the last
setup or teardown failed; ``detail`` says why). A new row has no status yet (shown as off).
These methods are the storage rules only; the provider calls and the lease that keeps two
operators apart live in :mod:`django_leases.triggers.lifecycle`.

Each method opens its own transaction on the database the router picks for writes.
This module imports no models at import time (the models import it).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import IntegrityError, connections, models, router, transaction
from django.db.models.functions import Now

from django_leases.triggers.errors import (
    SourceNotReceiving,
    SourceStillDeclared,
    UnknownTriggerSourceError,
)
from django_leases.triggers.registry import Delivery, Handler

if TYPE_CHECKING:
    from django_leases.models import TriggerEvent, TriggerSource
    from django_leases.triggers.providers import ParsedDelivery


class DeclaredSource(Protocol):
    """What ``sync`` needs of a declaration (a :class:`TriggerDeclaration` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def provider(self) -> str: ...
    @property
    def config(self) -> Any: ...


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: ``record(..., state=UNSET)`` (the default) keeps the stored state.
UNSET: Any = _Unset()

#: What ``TriggerSource.status`` may hold (besides ``None``, a row never set up).
STATUSES = ("off", "pending", "registered", "manual", "failed")

_MAX_ADDRESS = 500
_MAX_LABEL_PREFIX = 200


def _check_base_url(base_url: object) -> str:
    if not isinstance(base_url, str):
        raise ValueError(f"base_url must be a str, not {type(base_url).__name__}")
    if len(base_url) > _MAX_ADDRESS:
        raise ValueError(f"base_url is longer than {_MAX_ADDRESS} characters")
    try:
        URLValidator(schemes=["http", "https"])(base_url)
    except ValidationError:
        raise ValueError(
            f"base_url {base_url!r} is not an http(s) URL (e.g. https://example.com)"
        ) from None
    return base_url.rstrip("/")


def _check_label_prefix(label_prefix: object) -> str:
    if not isinstance(label_prefix, str):
        raise ValueError(f"label_prefix must be a str, not {type(label_prefix).__name__}")
    if len(label_prefix) > _MAX_LABEL_PREFIX:
        raise ValueError(f"label_prefix is longer than {_MAX_LABEL_PREFIX} characters")
    if not label_prefix.isprintable():
        raise ValueError("label_prefix must not hold control characters")
    return label_prefix


#: The PostgreSQL advisory lock id that serialises ``sync`` (the bytes of "dl_trigs").
SYNC_LOCK_ID = 0x646C5F7472696773  # "dl_trigs"


def _serialise_syncs(alias: str) -> None:
    """Make concurrent syncs take turns, for the length of the current transaction.

    Row locks alone cannot order them: each sync also inserts rows the others cannot see
    yet (the unique index makes a second insert of a name wait for the first transaction),
    and those waits interleave with the row locks into deadlocks. PostgreSQL gets one
    transaction-scoped advisory lock; SQLite's IMMEDIATE transaction already holds the
    database's write lock; other databases rely on the row locks taken next.
    """
    connection = connections[alias]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SYNC_LOCK_ID])


class TriggerSourceQuerySet(models.QuerySet["TriggerSource"]):
    """Domain methods of ``TriggerSource.objects``. Each opens the transaction it needs."""

    def _alias(self) -> str:
        return self._db or router.db_for_write(self.model)  # type: ignore[attr-defined]

    def _rows(self, alias: str) -> TriggerSourceQuerySet:
        return self.model._default_manager.using(alias).all()

    # -- reading ------------------------------------------------------------------------------

    def declared(self) -> TriggerSourceQuerySet:
        """Rows whose declaration is in the code."""
        return self.filter(declared=True)

    def orphaned(self) -> TriggerSourceQuerySet:
        """Rows whose declaration left the code (orphans)."""
        return self.filter(declared=False)

    def named(self, name: str) -> TriggerSource:
        """The row of ``name``. Raises :class:`UnknownTriggerSourceError` when there is none."""
        row = self.filter(name=name).first() if isinstance(name, str) else None
        if row is None:
            raise UnknownTriggerSourceError(name)
        return row

    def receivable(self, name: str) -> TriggerSource | None:
        """The row of ``name`` if it is declared **and** enabled, else ``None``."""
        if not isinstance(name, str):
            return None
        return self.filter(name=name, declared=True, enabled=True).first()

    # -- writing ------------------------------------------------------------------------------

    def sync(
        self,
        declared: Iterable[DeclaredSource],
        *,
        base_url: str | None = None,
        label_prefix: str | None = None,
    ) -> list[TriggerSource]:
        """Make the rows match the declarations in code.

        Args:
            declared: the declarations (e.g. ``registry.declarations()``).
            base_url: where the app is served (``http(s)://…``; a trailing ``/`` is dropped);
                ``None`` keeps each row's known address.
            label_prefix: how the app labels provider endpoints; ``None`` keeps the known one.

        Upserts each declared row (``kind``, ``provider``, ``config``, ``declared=True``);
        new rows start disabled. Every other row becomes an orphan (``declared=False``); no
        row is deleted. ``enabled``, ``status`` and ``state`` are never touched. Concurrent
        syncs leave exactly one row per name.

        Returns every row (declared and orphaned), sorted by name.

        Raises:
            ValueError: a duplicate or unusable name, a bad ``base_url`` or ``label_prefix``;
                nothing is written.
        """
        sources = sorted(declared, key=lambda source: source.name)
        names = [source.name for source in sources]
        if len(set(names)) != len(names):
            raise ValueError("sync() got two declarations with the same name")
        for source in sources:
            if not isinstance(source.name, str) or not source.name or len(source.name) > 200:
                raise ValueError(f"Unusable trigger source name {source.name!r}")
        address: dict[str, Any] = {}
        if base_url is not None:
            address["base_url"] = _check_base_url(base_url)
        if label_prefix is not None:
            address["label_prefix"] = _check_label_prefix(label_prefix)

        alias = self._alias()
        with transaction.atomic(using=alias):
            rows = self._rows(alias)
            _serialise_syncs(alias)
            # Then lock the existing rows in name order: record / set_enabled on one row
            # wait here rather than in the middle of the sync.
            list(rows.select_for_update().order_by("name").values_list("pk", flat=True))
            rows.bulk_create(
                [
                    self.model(
                        name=source.name,
                        kind=source.kind,
                        provider=source.provider,
                        config=dict(source.config),
                        declared=True,
                        enabled=False,
                        **address,
                    )
                    for source in sources
                ],
                ignore_conflicts=True,
            )
            rows.filter(name__in=names, declared=False).update(declared=True, updated_at=Now())
            for source in sources:
                rows.filter(name=source.name).update(
                    kind=source.kind,
                    provider=source.provider,
                    config=dict(source.config),
                    **address,
                )
            rows.filter(declared=True).exclude(name__in=names).update(
                declared=False, updated_at=Now()
            )
            return list(rows.order_by("name"))

    def set_enabled(self, name: str, enabled: bool) -> bool:
        """Turn source ``name`` on or off. Returns ``True`` if the switch changed.

        Only the ``enabled`` flag (and ``updated_at``) is written. The source row is locked
        first, the same lock :meth:`TriggerEventQuerySet.accept` takes, so the two serialise:
        once this returns, no delivery is recorded for a disabled source, in any process,
        also one whose body was still arriving; a delivery being recorded at that moment
        commits first and this waits for it. Raises
        :class:`UnknownTriggerSourceError` for an unknown name, ``ValueError`` for a
        non-bool ``enabled``.
        """
        if not isinstance(enabled, bool):
            raise ValueError(f"enabled must be a bool, not {type(enabled).__name__}")
        alias = self._alias()
        with transaction.atomic(using=alias):
            rows = self._rows(alias)
            row = rows.select_for_update().filter(name=name).first()
            if row is None:
                raise UnknownTriggerSourceError(name)
            if row.enabled == enabled:
                return False
            rows.filter(pk=row.pk).update(enabled=enabled, updated_at=Now())
            return True

    def record(
        self,
        name: str,
        *,
        status: str | None,
        detail: str | None = None,
        state: Any = UNSET,
    ) -> None:
        """Record the outcome of a provider step for source ``name``.

        Args:
            name: the source.
            status: one of :data:`STATUSES` or ``None``; stored as given.
            detail: the last instructions or error (``str``); always overwritten, ``None``
                clearing it.
            state: provider identifiers (a JSON-serialisable ``dict``) or ``None``; replaced
                only when given (the default, :data:`UNSET`, keeps the stored state).

        Raises:
            UnknownTriggerSourceError: no row has that name (nothing written).
            ValueError: an unknown status, a non-``str`` detail or a state that is not a
                JSON object (nothing written).
        """
        if status is not None and status not in STATUSES:
            raise ValueError(f"Unknown trigger source status {status!r} (known: {STATUSES})")
        if detail is not None and not isinstance(detail, str):
            raise ValueError(f"detail must be a str or None, not {type(detail).__name__}")
        updates: dict[str, Any] = {"status": status, "detail": detail, "updated_at": Now()}
        if state is not UNSET:
            if state is not None and not isinstance(state, dict):
                raise ValueError(f"state must be a dict or None, not {type(state).__name__}")
            if state is not None:
                try:
                    json.dumps(state)
                except (TypeError, ValueError):
                    raise ValueError("state must be JSON-serialisable") from None
            updates["state"] = state
        alias = self._alias()
        with transaction.atomic(using=alias):
            if not self._rows(alias).filter(name=name).update(**updates):
                raise UnknownTriggerSourceError(name)

    def forget(self, name: str) -> None:
        """Delete the row of orphan ``name`` (its declaration left the code).

        Nothing is asked of the provider: a registration it still holds stays there (tear it
        down first when the provider is installed). Deliveries already recorded are kept
        (their ``source`` becomes ``NULL``; ``source_name`` stays).

        Raises:
            UnknownTriggerSourceError: no row has that name.
            SourceStillDeclared: the source is declared in code (a sync would bring the row
                back at once; disable it instead). Nothing is deleted.
        """
        alias = self._alias()
        with transaction.atomic(using=alias):
            rows = self._rows(alias)
            declared = rows.select_for_update().filter(name=name).values_list("declared", flat=True)
            found = list(declared)
            if not found:
                raise UnknownTriggerSourceError(name)
            if found[0]:
                raise SourceStillDeclared(name)
            rows.filter(name=name, declared=False).delete()

    def remove(self, name: str) -> None:
        """Delete the row of ``name``, declared or not (the reference ``deleteTriggerSource``).

        Used once a source is torn down at its provider; a declared source comes back, off,
        at the next sync. Raises :class:`UnknownTriggerSourceError` for an unknown name.
        """
        alias = self._alias()
        with transaction.atomic(using=alias):
            deleted, _ = self._rows(alias).filter(name=name).delete()
            if not deleted:
                raise UnknownTriggerSourceError(name)


@dataclass(frozen=True)
class Accepted:
    """Outcome of :meth:`TriggerEventQuerySet.accept`.

    ``created`` is ``False`` for a repeated delivery id (nothing was processed again);
    ``run_id`` is the workflow run the delivery started (``None`` when it started none).
    """

    event: TriggerEvent
    created: bool
    run_id: uuid.UUID | None


class TriggerEventQuerySet(models.QuerySet["TriggerEvent"]):
    """Domain methods of ``TriggerEvent.objects``."""

    def _alias(self) -> str:
        return self._db or router.db_for_write(self.model)  # type: ignore[attr-defined]

    def accept(
        self, source: TriggerSource, parsed: ParsedDelivery, handler: Handler | None
    ) -> Accepted:
        """Record a verified delivery and run its handler, in one transaction.

        The ``TriggerEvent`` row and whatever the handler writes (a workflow run) commit
        together: if the handler raises, nothing is kept and the error propagates. A
        delivery id already recorded for this source is not processed again
        (``created=False``), also when two copies arrive at once.

        The source row is locked first (``SELECT … FOR UPDATE``; on SQLite the IMMEDIATE
        transaction's write lock) and read again: a source disabled or orphaned since the
        caller looked it up raises :class:`SourceNotReceiving` and nothing is recorded.
        :meth:`TriggerSourceQuerySet.set_enabled` takes the same lock, so a delivery is
        either recorded before the switch flips or refused after it (DESIGN §6).
        """
        alias = self._alias()
        rows = self.model._default_manager.using(alias)
        sources = source._meta.model._default_manager.using(alias)
        with transaction.atomic(using=alias):
            current = (
                sources.select_for_update()
                .filter(pk=source.pk)
                .values_list("declared", "enabled")
                .first()
            )
            if current != (True, True):
                raise SourceNotReceiving(f"No enabled trigger source named {source.name!r}")
            try:
                with transaction.atomic(using=alias):
                    event = rows.create(
                        source=source,
                        source_name=source.name,
                        delivery_id=parsed.delivery_id,
                        event=parsed.event,
                        payload=parsed.payload,
                    )
            except IntegrityError:
                existing = rows.filter(
                    source_name=source.name, delivery_id=parsed.delivery_id
                ).first()
                if existing is None:  # the unique constraint was not the cause
                    raise
                return Accepted(event=existing, created=False, run_id=existing.run_id)
            run_id = None
            if handler is not None:
                delivery = Delivery(
                    source=source.name,
                    provider=source.provider,
                    event=parsed.event,
                    delivery_id=parsed.delivery_id,
                    payload=parsed.payload,
                    using=alias,
                )
                returned = handler(delivery)
                if isinstance(returned, uuid.UUID):
                    run_id = returned
                    rows.filter(pk=event.pk).update(run_id=run_id)
                    event.run_id = run_id
            return Accepted(event=event, created=True, run_id=run_id)

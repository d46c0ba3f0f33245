"""The trigger-source store: QuerySet methods of ``TriggerSource`` and ``TriggerEvent``.

Follows the reference ``TriggerSourceStore`` (DESIGN §6):

* ``sync(declared)`` upserts the declared rows and marks every other row ``declared=False``
  (an orphan) without deleting it; it never touches ``enabled`` (off by default), ``status``
  or ``state``, and keeps a known ``base_url`` / ``label_prefix`` when none is given;
* ``record(name, …)`` replaces ``state`` only when one is given and always overwrites
  ``detail``; ``set_enabled(name, …)`` flips the switch; an unknown name is an
  :class:`~django_leases.triggers.errors.UnknownTriggerSourceError`.

Each method opens its own transaction on the database the router picks for writes.
This module imports no models at import time (the models import it).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import IntegrityError, models, router, transaction
from django.db.models.functions import Now

from django_leases.triggers.errors import SourceNotReceiving, UnknownTriggerSourceError
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
            # Lock the existing rows in name order first: a second sync waits here rather
            # than deadlocking with this one halfway through.
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

        ``status`` is stored as given; ``detail`` (the last instructions or error) is always
        overwritten, ``None`` clearing it; ``state`` (provider identifiers only, JSON) is
        replaced only when given. Raises :class:`UnknownTriggerSourceError` for an unknown
        name.
        """
        updates: dict[str, Any] = {"status": status, "detail": detail, "updated_at": Now()}
        if state is not UNSET:
            updates["state"] = state
        alias = self._alias()
        with transaction.atomic(using=alias):
            if not self._rows(alias).filter(name=name).update(**updates):
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

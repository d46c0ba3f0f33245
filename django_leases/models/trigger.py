"""Trigger sources, the deliveries they received and their encrypted secrets, with the rules
that govern them (DESIGN §6): ``TriggerSource.objects``, ``TriggerEvent.objects``,
``TriggerSecret.objects``.

The source store follows the reference ``TriggerSourceStore``:

* ``sync(declared)`` upserts the declared rows and marks every other row ``declared=False``
  (an orphan) without deleting it; it never touches ``enabled`` (off by default), ``status``
  or ``state``, and keeps a known ``base_url`` / ``label_prefix`` when none is given. The
  last ones a sync was given are also kept project-wide (:class:`TriggerSourceDefaults`,
  one row), and a row without its own — a source declared in a later deploy — gets them;
  the reference store leaves such a row without an address, so it could not be enabled;
* ``record(name, …)`` replaces ``state`` only when one is given and always overwrites
  ``detail``; ``set_enabled(name, …)`` flips the switch; ``forget(name)`` deletes an
  orphan's row and ``remove(name)`` any row (the reference ``deleteTriggerSource``, used
  once the provider's registration is torn down); an unknown name is an
  :class:`~django_leases.exceptions.UnknownTriggerSourceError`.

Statuses: :data:`~django_leases.triggers.values.STATUSES`. These methods are the storage
rules only; the provider calls and the lease that keeps two operators apart live in
:mod:`django_leases.triggers.lifecycle`.

Secrets (a source's webhook signing secret, stored under the source's name) are Fernet tokens
(``cryptography``'s ``MultiFernet``: AES-128-CBC with HMAC-SHA256, authenticated). The plain
secret is never written to a log, a message, the admin, ``state`` or ``detail``;
``TriggerSecret.objects`` is the only way to it. Keys, newest first (the first encrypts; every
one decrypts):

* ``DJANGO_LEASES["SECRET_KEYS"]`` — a list of Fernet keys (``Fernet.generate_key()``:
  32 bytes, URL-safe base64). To rotate: put a new key first, keep the old ones after it,
  run ``manage.py rotate_trigger_secrets``, then drop the old keys.
* otherwise, keys derived from Django's ``SECRET_KEY`` and then each of
  ``SECRET_KEY_FALLBACKS`` with HKDF-SHA256 (salt ``django-leases``, info
  ``trigger-secrets``). Rotating Django's ``SECRET_KEY`` the documented way (old key into
  ``SECRET_KEY_FALLBACKS``) keeps the stored secrets readable; run ``rotate_trigger_secrets``
  before dropping the fallback.

``DJANGO_LEASES["WEBHOOK_SECRETS"]`` (source name → secret) is an override read from
settings, for ``manual`` sources whose secret comes from the environment: when it names a
source, ``signing_secret`` and ``ensure_secret`` answer it instead of the store.

Each method opens its own transaction on the database the router picks for writes.

``cryptography`` comes with the ``webhooks`` extra and is imported when a secret is first
encrypted or decrypted, not with the models: a project without trigger sources needs neither
it nor its dependencies (system check ``django_leases.E033`` names the extra when a declared
source needs it).
"""

from __future__ import annotations

import base64
import json
import logging
import re
import secrets as _secrets
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.validators import URLValidator
from django.db import IntegrityError, connections, models, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_leases import clock, db
from django_leases.clock import AutoTimeField, DbNow
from django_leases.conf import leases_settings, webhooks_extra
from django_leases.exceptions import (
    CredentialError,
    SourceNotReceiving,
    SourceStillDeclared,
    UnknownTriggerSourceError,
)
from django_leases.triggers.values import (
    REFUSAL_REASONS,
    STATUSES,
    UNSET,
    Accepted,
    Delivery,
    Handled,
    Handler,
    ParsedDelivery,
)
from django_leases.validation import MAX_NAME_LENGTH, check_name, check_source_name

if TYPE_CHECKING:  # cryptography (the webhooks extra) is imported when a secret is used
    from cryptography.fernet import MultiFernet

__all__ = [
    "STATUSES",
    "UNSET",
    "OrphanTriggerSource",
    "TriggerEvent",
    "TriggerEventQuerySet",
    "TriggerRefusal",
    "TriggerRefusalQuerySet",
    "TriggerSecret",
    "TriggerSecretQuerySet",
    "TriggerSource",
    "TriggerSourceDefaults",
    "TriggerSourceQuerySet",
]


class DeclaredSource(Protocol):
    """What ``sync`` needs of a declaration (a :class:`TriggerDeclaration` has it)."""

    @property
    def name(self) -> str:
        """The source's name (``str``, 1–200 characters)."""

    @property
    def kind(self) -> str:
        """The kind of source (``"webhook"``)."""

    @property
    def provider(self) -> str:
        """The provider's name (``"github"``, ``"stripe"``, ``"manual"``…)."""

    @property
    def config(self) -> Mapping[str, Any]:
        """The declaration's non-secret provider config (a mapping)."""


_MAX_ADDRESS = 500
_MAX_LABEL_PREFIX = 200


def check_base_url(base_url: object) -> str:
    """``base_url`` without a trailing ``/`` if it is an http(s) URL of at most 500
    characters; ``ValueError`` otherwise (the one rule for a source's address).

    A host name of one label (``http://testserver``, Django's test client's host;
    ``http://web:8000``, a service on a container network) is an address too: Django's
    ``URLValidator`` wants a dot in a host name other than ``localhost``."""
    return _check_base_url(base_url)


#: A host name of one DNS label (no dot), as in ``http://testserver``.
_ONE_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _one_label_as_localhost(url: str) -> str:
    """``url`` with a one-label host name put as ``localhost`` (so ``URLValidator`` judges
    the rest of it), else ``url`` unchanged. ``urlsplit`` drops tabs and line breaks, so a
    URL holding any is left to ``URLValidator`` as it is (which refuses it)."""
    if not url.isprintable() or " " in url:
        return url
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return url
    if host is None or not _ONE_LABEL.fullmatch(host) or host.isdigit():
        return url
    netloc = parts.netloc
    at = netloc.rfind("@") + 1
    if netloc[at : at + len(host)].lower() != host:
        return url
    return urlunsplit(parts._replace(netloc=netloc[:at] + "localhost" + netloc[at + len(host) :]))


def _check_base_url(base_url: object) -> str:
    if not isinstance(base_url, str):
        raise ValueError(f"base_url must be a str, not {type(base_url).__name__}")
    if len(base_url) > _MAX_ADDRESS:
        raise ValueError(f"base_url is longer than {_MAX_ADDRESS} characters")
    try:
        URLValidator(schemes=["http", "https"])(_one_label_as_localhost(base_url))
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


logger = logging.getLogger("django_leases.triggers")

#: The PostgreSQL advisory lock id that serialises ``sync`` (the bytes of "dl_trigs").
SYNC_LOCK_ID = 0x646C5F7472696773  # "dl_trigs"


def _serialise_syncs(alias: str) -> None:
    """Make concurrent syncs take turns, for the length of the current transaction.

    Row locks alone cannot order them: each sync also inserts rows the others cannot see
    yet (the unique index makes a second insert of a name wait for the first transaction),
    and those waits interleave with the row locks into deadlocks. PostgreSQL gets one
    transaction-scoped advisory lock; SQLite's IMMEDIATE transaction already holds the
    database's write lock; MariaDB / MySQL lock the one row of TriggerSourceDefaults; other
    databases rely on the row locks taken next.
    """
    connection = connections[alias]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SYNC_LOCK_ID])
    elif connection.vendor == "mysql":
        # No transaction-scoped advisory lock there (GET_LOCK outlives the transaction). An
        # upsert locks the row at once, creating it if need be; a plain insert's duplicate-key
        # check would take a shared lock first, and two syncs upgrading theirs would deadlock.
        q = connection.ops.quote_name
        meta = TriggerSourceDefaults._meta
        pk = q(str(meta.pk.column))
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {q(meta.db_table)} ({pk}, {q('updated_at')}) "
                f"VALUES (1, {clock.now_sql(connection)}) ON DUPLICATE KEY UPDATE {pk} = {pk}"
            )


class TriggerSourceQuerySet(db.RoutedQuerySet["TriggerSource"]):
    """Domain methods of ``TriggerSource.objects``. Each opens the transaction it needs."""

    def _alias(self) -> str:
        return self.write_alias()

    def with_refused(self) -> TriggerSourceQuerySet:
        """Annotate ``refused``: how many deliveries to each source were refused, all reasons
        together (``0`` when none; the tallies are :class:`TriggerRefusal`'s)."""
        total = (
            TriggerRefusal.objects.filter(source=models.OuterRef("pk"))
            .order_by()
            .values("source")
            .annotate(total=models.Sum("count"))
            .values("total")
        )
        return self.annotate(
            refused=Coalesce(
                models.Subquery(total), Value(0), output_field=models.BigIntegerField()
            )
        )

    def _rows(self, alias: str) -> models.QuerySet[TriggerSource]:
        return self.model._default_manager.using(alias).all()

    # -- reading ------------------------------------------------------------------------------

    def declared(self) -> TriggerSourceQuerySet:
        """Rows whose declaration is in the code."""
        return self.filter(declared=True)

    def orphaned(self) -> TriggerSourceQuerySet:
        """Rows whose declaration left the code (orphans)."""
        return self.filter(declared=False)

    def named(self, name: str, *, lock: bool = False) -> TriggerSource:
        """The row of ``name``; with ``lock``, locked for the rest of the caller's
        transaction (the lock a sync takes on every row). Raises
        :class:`UnknownTriggerSourceError` when there is none."""
        rows = self.select_for_update() if lock else self
        row = rows.filter(name=name).first() if isinstance(name, str) else None
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
        row is deleted. ``enabled``, ``status`` and ``state`` are never touched. A source
        whose provider changed loses its stored signing secret, in the same transaction (a
        warning is logged): nobody at the new sender knows it, and check ``W008`` then says
        one is missing. Concurrent syncs leave exactly one row per name.

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
            try:
                check_source_name(source.name)
            except ValueError as exc:
                raise ValueError(f"Unusable trigger source name {source.name!r}: {exc}") from None
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
            # Read apart from the lock above, which stays the statement it was: on MariaDB,
            # locking the rows through another column set takes them in another order and
            # deadlocks with concurrent syncs (the rows are ours now: this read is stable).
            providers = dict(rows.values_list("name", "provider"))
            known = TriggerSourceDefaults.objects.remember(alias, **address)
            # A source whose provider changed keeps no signing secret: the old provider's (or
            # one we made for it) is one nobody at the new sender knows, and with it kept
            # check W008 stayed silent while every delivery got 401.
            switched = sorted(
                source.name
                for source in sources
                if providers.get(source.name) not in (None, source.provider)
            )
            # The registration made at the former provider is kept, as ``state["previous"]``,
            # for the lifecycle to tear down before the source is set up at its new one.
            previous = {
                name: {"previous": {"provider": providers[name], "config": config, "state": state}}
                for name, config, state in rows.filter(name__in=switched).values_list(
                    "name", "config", "state"
                )
                if state is not None and "previous" not in state
            }
            if switched:
                TriggerSecret.objects.db_manager(alias).filter(name__in=switched).delete()
                for name in switched:
                    logger.warning(
                        "Trigger source %r changed provider (%s → %s): its stored signing "
                        "secret was deleted; store the new sender's secret",
                        name,
                        providers[name],
                        next(source.provider for source in sources if source.name == name),
                    )
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
            rows.filter(name__in=names, declared=False).update(declared=True, updated_at=DbNow())
            for source in sources:
                kept = {"state": previous[source.name]} if source.name in previous else {}
                rows.filter(name=source.name).update(
                    kind=source.kind,
                    provider=source.provider,
                    config=dict(source.config),
                    **address,
                    **kept,
                )
            rows.filter(declared=True).exclude(name__in=names).update(
                declared=False, updated_at=DbNow()
            )
            # A declared row with no address of its own (new, or older than any address)
            # gets the project's last one.
            for field, value in known.items():
                if value is not None and field not in address:
                    rows.filter(name__in=names, **{f"{field}__isnull": True}).update(
                        **{field: value}
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
            rows.filter(pk=row.pk).update(enabled=enabled, updated_at=DbNow())
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
        updates: dict[str, Any] = {"status": status, "detail": detail, "updated_at": DbNow()}
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
            rows = self._rows(alias)
            # Locked first, as forget() does: a refusal counted meanwhile (a delivery to the
            # source, off by now) waits for the delete, then finds no row (and is logged),
            # instead of inserting a refusal between the cascade and the row's delete.
            if not rows.select_for_update().filter(name=name).exists():
                raise UnknownTriggerSourceError(name)
            rows.filter(name=name).delete()


#: A delivery's outcome when it started no workflow run (its handler called a function, or
#: its run was deleted since); otherwise the outcome is its run's status.
NO_RUN = "no-run"


class TriggerEventQuerySet(db.RoutedQuerySet["TriggerEvent"]):
    """Domain methods of ``TriggerEvent.objects``."""

    def with_run_outcome(self) -> TriggerEventQuerySet:
        """Annotate ``run_outcome``: what came of each accepted delivery's run — :data:`NO_RUN`,
        or the status of the workflow run it started (``running``, ``completed``, ``failed``,
        …). What the handler itself said is the ``outcome`` field."""
        return self.annotate(
            run_outcome=Coalesce(F("run__status"), Value(NO_RUN), output_field=models.CharField())
        )

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
        alias = self.write_alias()
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
                        source_id=source.pk,
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
                outcome = ""
                if isinstance(returned, Handled):
                    run_id, outcome = returned.run_id, returned.outcome[:OUTCOME_LENGTH]
                elif isinstance(returned, uuid.UUID):
                    run_id = returned
                if run_id is not None or outcome:
                    rows.filter(pk=event.pk).update(run_id=run_id, outcome=outcome)
                    event.run_id, event.outcome = run_id, outcome
            return Accepted(event=event, created=True, run_id=run_id)


# -- secrets ------------------------------------------------------------------------------------

#: Longest secret accepted, characters.
MAX_SECRET_LENGTH = 4096
#: Bytes of randomness in a generated secret (256 bits, 43 URL-safe characters).
GENERATED_BYTES = 32


def _derive(secret_key: str | bytes) -> bytes:
    with webhooks_extra():
        # deferred: cryptography is the optional webhooks extra, costly to import
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    material = secret_key.encode("utf-8") if isinstance(secret_key, str) else secret_key
    derived = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=b"django-leases", info=b"trigger-secrets"
    ).derive(material)
    return base64.urlsafe_b64encode(derived)


def _keys() -> list[bytes]:
    """The Fernet keys, the encrypting one first: ``SECRET_KEYS`` when set, then the keys
    derived from Django's ``SECRET_KEY`` and each of ``SECRET_KEY_FALLBACKS`` — which, after
    ``SECRET_KEYS``, only decrypt: a secret stored before ``SECRET_KEYS`` was set stays
    readable until ``rotate_trigger_secrets`` encrypts it with its first key."""
    derived = [
        _derive(key)
        for key in [
            getattr(django_settings, "SECRET_KEY", None),
            *(getattr(django_settings, "SECRET_KEY_FALLBACKS", []) or []),
        ]
        if key
    ]
    configured = leases_settings.SECRET_KEYS
    if configured is None:
        if not derived:
            raise ImproperlyConfigured(
                'Set SECRET_KEY or DJANGO_LEASES["SECRET_KEYS"] to store trigger secrets'
            )
        return derived
    if isinstance(configured, str | bytes) or not isinstance(configured, list | tuple):
        raise ImproperlyConfigured(
            'DJANGO_LEASES["SECRET_KEYS"] must be a list of Fernet keys, newest first'
        )
    keys = [k.encode("ascii") if isinstance(k, str) else k for k in configured]
    if not keys:
        raise ImproperlyConfigured('DJANGO_LEASES["SECRET_KEYS"] is empty')
    return keys + [key for key in derived if key not in keys]


def fernet() -> MultiFernet:
    """The configured keys as a ``MultiFernet`` (the first key encrypts).

    Raises ``ImproperlyConfigured`` when no key is configured or one is not a Fernet key
    (the message never quotes a key), or when cryptography (the ``webhooks`` extra) is not
    installed.
    """
    with webhooks_extra():
        # deferred: cryptography is the optional webhooks extra, costly to import
        from cryptography.fernet import Fernet, MultiFernet
    try:
        return MultiFernet([Fernet(key) for key in _keys()])
    except (ValueError, TypeError):
        raise ImproperlyConfigured(
            'DJANGO_LEASES["SECRET_KEYS"] holds a value that is not a Fernet key '
            "(32 bytes, URL-safe base64: Fernet.generate_key())"
        ) from None


def _check_secret(secret: object) -> str:
    if not isinstance(secret, str) or not secret.strip():
        raise ValueError("A secret must be a non-empty str")
    if len(secret) > MAX_SECRET_LENGTH:
        raise ValueError(f"A secret must be at most {MAX_SECRET_LENGTH} characters")
    if not secret.isprintable():
        raise ValueError("A secret must not hold control characters")
    return secret


def _invalid_token() -> type[Exception]:
    """``cryptography.fernet.InvalidToken`` (imported by :func:`fernet` already)."""
    with webhooks_extra():
        # deferred: cryptography is the optional webhooks extra, costly to import
        from cryptography.fernet import InvalidToken
    return InvalidToken


def _decrypt(name: str, ciphertext: str, box: MultiFernet) -> str:
    try:
        return box.decrypt(ciphertext.encode("ascii")).decode("utf-8")
    except (_invalid_token(), UnicodeError):
        raise CredentialError(
            f"The stored secret {name!r} cannot be decrypted with the configured keys "
            '(DJANGO_LEASES["SECRET_KEYS"] or SECRET_KEY/SECRET_KEY_FALLBACKS)',
            name,
        ) from None


def _override(name: str) -> str | None:
    configured = leases_settings.WEBHOOK_SECRETS
    if not isinstance(configured, Mapping):
        return None
    value = configured.get(name)
    return value if isinstance(value, str) and value else None


class TriggerSecretQuerySet(db.RoutedQuerySet["TriggerSecret"]):
    """Domain methods of ``TriggerSecret.objects``: the encrypted credential store."""

    def get_secret(self, name: str) -> str | None:
        """The stored secret ``name`` (``str``), or ``None`` when none is stored.

        Raises :class:`CredentialError` when it cannot be decrypted, ``ImproperlyConfigured``
        for unusable keys.
        """
        if not isinstance(name, str):
            return None
        row = self.rows().filter(name=name).values_list("ciphertext", flat=True).first()
        return None if row is None else _decrypt(name, row, fernet())

    def set_secret(self, name: str, secret: str) -> None:
        """Store ``secret`` (``str``) under ``name``, encrypted with the primary key, replacing
        any stored one.

        Raises ``ValueError`` for an empty, overlong (> 4096 characters) or control-character
        secret or a bad name (nothing stored; the message never quotes the secret).
        """
        check_name(name, "A credential name")
        _check_secret(secret)
        ciphertext = fernet().encrypt(secret.encode("utf-8")).decode("ascii")
        with transaction.atomic(using=self.write_alias()):
            self.rows().update_or_create(name=name, defaults={"ciphertext": ciphertext})

    def ensure_secret(self, name: str) -> str:
        """The signing secret of ``name``, creating one when there is none; returns it.

        ``DJANGO_LEASES["WEBHOOK_SECRETS"][name]`` wins when set (nothing is stored then);
        otherwise the stored secret; otherwise a new one (:func:`secrets.token_urlsafe`, 256
        bits) is stored and returned. Concurrent callers get the same secret.
        """
        check_name(name, "A credential name")
        override = _override(name)
        if override is not None:
            return override
        with transaction.atomic(using=self.write_alias()):
            box = fernet()
            candidate = _secrets.token_urlsafe(GENERATED_BYTES)
            row, _created = self.rows().get_or_create(
                name=name,
                defaults={"ciphertext": box.encrypt(candidate.encode("utf-8")).decode("ascii")},
            )
            return _decrypt(name, row.ciphertext, box)

    def delete_secret(self, name: str) -> None:
        """Delete the stored secret ``name``; none stored is a no-op."""
        if not isinstance(name, str):
            return
        with transaction.atomic(using=self.write_alias()):
            self.rows().filter(name=name).delete()

    def signing_secret(self, name: str) -> str | None:
        """The secret deliveries to source ``name`` must be signed with, or ``None``.

        ``DJANGO_LEASES["WEBHOOK_SECRETS"][name]`` when set, else the stored one. Raises
        :class:`CredentialError` when the stored one cannot be decrypted.
        """
        override = _override(name) if isinstance(name, str) else None
        return override if override is not None else self.get_secret(name)

    def secret_origin(self, name: str) -> str | None:
        """Where the secret deliveries to source ``name`` are checked with comes from, without
        reading it: ``"settings"`` (``DJANGO_LEASES["WEBHOOK_SECRETS"][name]``, which wins),
        ``"stored"`` (the credential store), or ``None`` when there is none — deliveries are
        then refused (401)."""
        if _override(name) is not None:
            return "settings"
        return "stored" if self.rows().filter(name=name).exists() else None

    def stored_names(self) -> set[str]:
        """The names with a stored secret."""
        return set(self.rows().values_list("name", flat=True))

    def rotate_keys(self) -> int:
        """Re-encrypt every stored secret with the current primary key; returns how many.

        Run after putting a new key first (in ``SECRET_KEYS``, or a new ``SECRET_KEY`` with
        the old one in ``SECRET_KEY_FALLBACKS``); afterwards the old keys can be dropped. One
        transaction: a secret that no configured key decrypts raises :class:`CredentialError`
        and nothing is changed.
        """
        box = fernet()
        count = 0
        with transaction.atomic(using=self.write_alias()):
            for row in self.rows().select_for_update().order_by("name"):
                try:
                    rotated = box.rotate(row.ciphertext.encode("ascii")).decode("ascii")
                except (_invalid_token(), UnicodeError):
                    raise CredentialError(
                        f"The stored secret {row.name!r} cannot be decrypted with the "
                        "configured keys; nothing was re-encrypted",
                        row.name,
                    ) from None
                self.rows().filter(pk=row.pk).update(ciphertext=rotated)
                count += 1
        return count


# -- the models ---------------------------------------------------------------------------------


class TriggerSource(models.Model):
    """A webhook source declared in code. Off until an operator enables it.

    ``declared`` turns ``False`` when the declaration leaves the code (an orphan); the row
    stays until it is torn down or forgotten. ``state`` holds provider identifiers only;
    secrets never live here.
    """

    name = models.CharField(_("name"), max_length=MAX_NAME_LENGTH, unique=True)
    kind = models.CharField(_("kind"), max_length=32, default="webhook")
    provider = models.CharField(_("provider"), max_length=64)
    config = models.JSONField(
        _("config"), default=dict, blank=True, help_text=_("Non-secret provider config.")
    )
    base_url = models.CharField(_("base URL"), max_length=500, null=True, blank=True)
    label_prefix = models.CharField(_("label prefix"), max_length=200, null=True, blank=True)
    declared = models.BooleanField(_("declared"), default=True)
    enabled = models.BooleanField(_("enabled"), default=False)
    status = models.CharField(_("status"), max_length=32, null=True, blank=True)
    state = models.JSONField(_("state"), null=True, blank=True)
    detail = models.TextField(_("detail"), null=True, blank=True)
    updated_at = AutoTimeField(_("updated at"), auto_now=True)

    objects: ClassVar[TriggerSourceQuerySet] = TriggerSourceQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("name",)
        verbose_name = _("trigger source")
        verbose_name_plural = _("trigger sources")
        permissions = (
            ("toggle_triggersource", "Can enable, disable and tear down trigger sources"),
        )

    def __str__(self) -> str:
        return self.name


class TriggerSourceDefaultsQuerySet(db.RoutedQuerySet["TriggerSourceDefaults"]):
    """Domain methods of ``TriggerSourceDefaults.objects``."""

    def remember(
        self, alias: str, *, base_url: str | None = None, label_prefix: str | None = None
    ) -> dict[str, str | None]:
        """Store the ``base_url`` / ``label_prefix`` given (``None``: keep the known one) on
        database ``alias``; returns both as now known. Called by ``sync`` in its transaction."""
        rows = self.model._default_manager.using(alias)
        row, _ = rows.select_for_update().get_or_create(pk=1)
        given = {
            field: value
            for field, value in (("base_url", base_url), ("label_prefix", label_prefix))
            if value is not None
        }
        if given:
            rows.filter(pk=1).update(**given, updated_at=DbNow())
        return {
            "base_url": given.get("base_url", row.base_url),
            "label_prefix": given.get("label_prefix", row.label_prefix),
        }

    def known(self) -> TriggerSourceDefaults | None:
        """The project's last address and label prefix, or ``None`` before any sync."""
        return self.rows().filter(pk=1).first()


class TriggerSourceDefaults(models.Model):
    """The project-wide address (``base_url``) and ``label_prefix`` the last sync was given:
    one row (``pk=1``). A source declared later gets them, so a deploy's reconcile without
    ``--base-url`` still gives a new source the known address."""

    base_url = models.CharField(max_length=500, null=True, blank=True)
    label_prefix = models.CharField(max_length=200, null=True, blank=True)
    updated_at = AutoTimeField(auto_now=True)

    objects: ClassVar[TriggerSourceDefaultsQuerySet] = TriggerSourceDefaultsQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        verbose_name = _("trigger-source defaults")
        verbose_name_plural = _("trigger-source defaults")

    def __str__(self) -> str:
        return self.base_url or gettext("(no address yet)")


class OrphanTriggerSource(TriggerSource):
    """Rows whose declaration left the code: the admin's Orphans view."""

    class Meta:
        proxy = True
        app_label = "django_leases"
        verbose_name = _("orphaned trigger source")
        verbose_name_plural = _("orphaned trigger sources")


#: Longest outcome a ``TriggerEvent`` keeps (longer ones are cut).
OUTCOME_LENGTH = 500


class TriggerEvent(models.Model):
    """A delivery accepted from a trigger source (deduplicated by delivery id)."""

    source = models.ForeignKey(
        TriggerSource, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    source_name = models.CharField(_("source name"), max_length=200)
    delivery_id = models.CharField(_("delivery id"), max_length=200)
    event = models.CharField(_("event"), max_length=200)
    payload = models.JSONField(_("payload"))
    run = models.ForeignKey(
        "django_leases.WorkflowRun", null=True, blank=True, on_delete=models.SET_NULL
    )
    outcome = models.CharField(
        max_length=OUTCOME_LENGTH,
        blank=True,
        default="",
        help_text=_("What the handler did with the delivery, when it said so."),
    )
    received_at = AutoTimeField(_("received at"), auto_now_add=True)

    objects: ClassVar[TriggerEventQuerySet] = TriggerEventQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("-received_at",)
        verbose_name = _("trigger event")
        verbose_name_plural = _("trigger events")
        constraints = (
            models.UniqueConstraint(
                fields=["source_name", "delivery_id"], name="dl_event_unique_delivery"
            ),
        )

    def __str__(self) -> str:
        return f"{self.source_name} {self.event} {self.delivery_id}"


class TriggerRefusalQuerySet(db.RoutedQuerySet["TriggerRefusal"]):
    """Domain methods of ``TriggerRefusal.objects``."""

    def tally(self, source_name: str, reason: str, status: int) -> bool:
        """Count one refused delivery to source ``source_name`` for ``reason``.

        Args:
            source_name: the source name the delivery was sent to (from the URL).
            reason: one of :data:`~django_leases.triggers.values.REFUSAL_REASONS`.
            status: the HTTP status answered.

        Returns ``True`` when counted, ``False`` when no source row has that name (a name
        never declared: not counted, so refusals cannot add rows without bound) — at once,
        asking no database, for a name no row can have (not a usable name: a NUL character,
        which PostgreSQL cannot even compare, a lone surrogate, over 200 characters). One
        ``UPDATE`` of the (source, reason) row in the common case; the first refusal of a
        reason inserts it, and an insert lost to a concurrent one is counted by updating.

        Raises ``ValueError`` for a reason not in ``REFUSAL_REASONS``; database errors
        propagate (the receiver logs them and answers as it would have).
        """
        if reason not in REFUSAL_REASONS:
            raise ValueError(f"Unknown refusal reason {reason!r}")
        try:
            check_source_name(source_name)
        except ValueError:
            return False
        alias = self.write_alias()
        rows = self.model._default_manager.using(alias)
        bump = {"count": F("count") + 1, "last_status": status, "last_refused_at": DbNow()}
        for _try in range(2):
            if rows.filter(source__name=source_name, reason=reason).update(**bump):
                return True
            source = TriggerSource._default_manager.using(alias).filter(name=source_name).first()
            if source is None:
                return False
            try:
                with transaction.atomic(using=alias):
                    rows.create(source_id=source.pk, reason=reason, last_status=status)
                return True
            except IntegrityError:  # a concurrent first refusal inserted it: update it
                continue
        return False

    def by_source(self, names: Iterable[str] | None = None) -> dict[str, dict[str, TriggerRefusal]]:
        """The tallies, by source name and then reason (one query; reasons never seen and
        sources never refused are absent). ``names``: only these sources (default all)."""
        rows = self.rows().select_related("source")
        if names is not None:
            rows = rows.filter(source__name__in=list(names))
        tallies: dict[str, dict[str, TriggerRefusal]] = {}
        for row in rows:
            tallies.setdefault(row.source.name, {})[row.reason] = row
        return tallies


class TriggerRefusal(models.Model):
    """How many deliveries to a source were refused for one reason: counts only, no bodies
    or headers kept. One row per (source, reason); deleted with its source."""

    source = models.ForeignKey(TriggerSource, on_delete=models.CASCADE, related_name="refusals")
    reason = models.CharField(
        max_length=32, choices=[(key, text) for key, (_status, text) in REFUSAL_REASONS.items()]
    )
    count = models.BigIntegerField(default=1)
    last_status = models.PositiveSmallIntegerField()
    first_refused_at = AutoTimeField(auto_now_add=True)
    last_refused_at = AutoTimeField(auto_now_add=True)

    objects: ClassVar[TriggerRefusalQuerySet] = TriggerRefusalQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("source", "reason")
        verbose_name = _("refused deliveries")
        verbose_name_plural = _("refused deliveries")
        constraints = (
            models.UniqueConstraint(fields=["source", "reason"], name="dl_refusal_unique_reason"),
        )

    def __str__(self) -> str:
        return f"{self.reason}: {self.count}"


class TriggerSecret(models.Model):
    """A secret (a trigger source's webhook signing secret), encrypted with Fernet.

    Only ``TriggerSecret.objects`` reads and writes it; ``ciphertext`` is a Fernet token
    under one of the keys of ``DJANGO_LEASES["SECRET_KEYS"]`` (or the keys derived from
    ``SECRET_KEY``). The plain secret is never stored, logged or shown.
    """

    name = models.CharField(max_length=MAX_NAME_LENGTH, unique=True)
    ciphertext = models.TextField()
    updated_at = AutoTimeField(auto_now=True)

    objects: ClassVar[TriggerSecretQuerySet] = TriggerSecretQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"<TriggerSecret {self.name!r}>"

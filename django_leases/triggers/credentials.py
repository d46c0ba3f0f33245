"""The encrypted credential store: trigger sources' webhook signing secrets (DESIGN §6).

Secrets are stored as Fernet tokens (``cryptography``'s ``MultiFernet``: AES-128-CBC with
HMAC-SHA256, authenticated) in ``TriggerSecret`` rows. A source's signing secret is stored
under the source's name. The plain secret is never written to a log, a message, the admin,
``state`` or ``detail``; this module's functions are the only way to it.

Keys, newest first (the first encrypts; every one decrypts):

* ``DJANGO_LEASES["SECRET_KEYS"]`` — a list of Fernet keys (``Fernet.generate_key()``:
  32 bytes, URL-safe base64). To rotate: put a new key first, keep the old ones after it,
  run ``manage.py rotate_trigger_secrets``, then drop the old keys.
* otherwise, keys derived from Django's ``SECRET_KEY`` and then each of
  ``SECRET_KEY_FALLBACKS`` with HKDF-SHA256 (salt ``django-leases``, info
  ``trigger-secrets``). It works out of the box, and rotating Django's ``SECRET_KEY`` the
  documented way (old key into ``SECRET_KEY_FALLBACKS``) keeps the stored secrets readable;
  run ``rotate_trigger_secrets`` before dropping the fallback.

``DJANGO_LEASES["WEBHOOK_SECRETS"]`` (source name → secret) is an override read from
settings, for ``manual`` sources whose secret comes from the environment: when it names a
source, :func:`signing_secret` and :func:`ensure_secret` answer it instead of the store.
"""

from __future__ import annotations

import base64
import secrets as _secrets
from collections.abc import Mapping

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import router, transaction

from django_leases.conf import leases_settings

#: Longest credential name, characters (the column width).
MAX_NAME_LENGTH = 200
#: Longest secret accepted, characters.
MAX_SECRET_LENGTH = 4096
#: Bytes of randomness in a generated secret (256 bits, 43 URL-safe characters).
GENERATED_BYTES = 32


class CredentialError(Exception):
    """A stored secret cannot be decrypted with the configured keys (the key that encrypted
    it was dropped, or the row was altered). The message names the secret, never its value."""


def _derive(secret_key: str | bytes) -> bytes:
    material = secret_key.encode("utf-8") if isinstance(secret_key, str) else secret_key
    derived = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=b"django-leases", info=b"trigger-secrets"
    ).derive(material)
    return base64.urlsafe_b64encode(derived)


def _keys() -> list[bytes]:
    configured = leases_settings.SECRET_KEYS
    if configured is not None:
        if isinstance(configured, str | bytes) or not isinstance(configured, list | tuple):
            raise ImproperlyConfigured(
                'DJANGO_LEASES["SECRET_KEYS"] must be a list of Fernet keys, newest first'
            )
        keys = [k.encode("ascii") if isinstance(k, str) else k for k in configured]
        if not keys:
            raise ImproperlyConfigured('DJANGO_LEASES["SECRET_KEYS"] is empty')
        return keys
    primary = getattr(django_settings, "SECRET_KEY", None)
    if not primary:
        raise ImproperlyConfigured(
            'Set SECRET_KEY or DJANGO_LEASES["SECRET_KEYS"] to store trigger secrets'
        )
    fallbacks = list(getattr(django_settings, "SECRET_KEY_FALLBACKS", []) or [])
    return [_derive(key) for key in [primary, *fallbacks] if key]


def fernet() -> MultiFernet:
    """The configured keys as a ``MultiFernet`` (the first key encrypts).

    Raises ``ImproperlyConfigured`` when no key is configured or one is not a Fernet key
    (the message never quotes a key).
    """
    try:
        return MultiFernet([Fernet(key) for key in _keys()])
    except (ValueError, TypeError):
        raise ImproperlyConfigured(
            'DJANGO_LEASES["SECRET_KEYS"] holds a value that is not a Fernet key '
            "(32 bytes, URL-safe base64: Fernet.generate_key())"
        ) from None


def _alias(using: str | None) -> str:
    from django_leases.models import TriggerSecret

    return using or router.db_for_write(TriggerSecret)


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"A credential name must be a str of 1 to {MAX_NAME_LENGTH} characters")
    return name


def _check_secret(secret: object) -> str:
    if not isinstance(secret, str) or not secret.strip():
        raise ValueError("A secret must be a non-empty str")
    if len(secret) > MAX_SECRET_LENGTH:
        raise ValueError(f"A secret must be at most {MAX_SECRET_LENGTH} characters")
    if not secret.isprintable():
        raise ValueError("A secret must not hold control characters")
    return secret


def _decrypt(name: str, ciphertext: str, box: MultiFernet) -> str:
    try:
        return box.decrypt(ciphertext.encode("ascii")).decode("utf-8")
    except (InvalidToken, UnicodeError):
        raise CredentialError(
            f"The stored secret {name!r} cannot be decrypted with the configured keys "
            '(DJANGO_LEASES["SECRET_KEYS"] or SECRET_KEY/SECRET_KEY_FALLBACKS)'
        ) from None


def get_secret(name: str, *, using: str | None = None) -> str | None:
    """The stored secret ``name`` (``str``), or ``None`` when none is stored.

    Args:
        name: the credential's name (a source's signing secret: the source name).
        using: database alias (default: the router's write database for ``TriggerSecret``).

    Raises :class:`CredentialError` when it cannot be decrypted, ``ImproperlyConfigured``
    for unusable keys.
    """
    from django_leases.models import TriggerSecret

    if not isinstance(name, str):
        return None
    row = (
        TriggerSecret.objects.using(_alias(using))
        .filter(name=name)
        .values_list("ciphertext", flat=True)
        .first()
    )
    return None if row is None else _decrypt(name, row, fernet())


def set_secret(name: str, secret: str, *, using: str | None = None) -> None:
    """Store ``secret`` (``str``) under ``name``, encrypted with the primary key, replacing
    any stored one.

    Raises ``ValueError`` for an empty, overlong (> 4096 characters) or control-character
    secret or a bad name (nothing stored; the message never quotes the secret).
    """
    from django_leases.models import TriggerSecret

    _check_name(name)
    _check_secret(secret)
    ciphertext = fernet().encrypt(secret.encode("utf-8")).decode("ascii")
    alias = _alias(using)
    with transaction.atomic(using=alias):
        TriggerSecret.objects.using(alias).update_or_create(
            name=name, defaults={"ciphertext": ciphertext}
        )


def _override(name: str) -> str | None:
    configured = leases_settings.WEBHOOK_SECRETS
    if not isinstance(configured, Mapping):
        return None
    value = configured.get(name)
    return value if isinstance(value, str) and value else None


def ensure_secret(name: str, *, using: str | None = None) -> str:
    """The signing secret of ``name``, creating one when there is none; returns it.

    ``DJANGO_LEASES["WEBHOOK_SECRETS"][name]`` wins when set (nothing is stored then);
    otherwise the stored secret; otherwise a new one (:func:`secrets.token_urlsafe`, 256
    bits) is stored and returned. Concurrent callers get the same secret.
    """
    from django_leases.models import TriggerSecret

    _check_name(name)
    override = _override(name)
    if override is not None:
        return override
    alias = _alias(using)
    with transaction.atomic(using=alias):
        box = fernet()
        candidate = _secrets.token_urlsafe(GENERATED_BYTES)
        row, _created = TriggerSecret.objects.using(alias).get_or_create(
            name=name,
            defaults={"ciphertext": box.encrypt(candidate.encode("utf-8")).decode("ascii")},
        )
        return _decrypt(name, row.ciphertext, box)


def delete_secret(name: str, *, using: str | None = None) -> None:
    """Delete the stored secret ``name``; none stored is a no-op."""
    from django_leases.models import TriggerSecret

    if not isinstance(name, str):
        return
    alias = _alias(using)
    with transaction.atomic(using=alias):
        TriggerSecret.objects.using(alias).filter(name=name).delete()


def signing_secret(name: str, *, using: str | None = None) -> str | None:
    """The secret deliveries to source ``name`` must be signed with, or ``None``.

    ``DJANGO_LEASES["WEBHOOK_SECRETS"][name]`` when set, else the stored one. Raises
    :class:`CredentialError` when the stored one cannot be decrypted.
    """
    return _override(name) if _override(name) is not None else get_secret(name, using=using)


def rotate_keys(*, using: str | None = None) -> int:
    """Re-encrypt every stored secret with the current primary key; returns how many.

    Run after putting a new key first (in ``SECRET_KEYS``, or a new ``SECRET_KEY`` with the
    old one in ``SECRET_KEY_FALLBACKS``); afterwards the old keys can be dropped. One
    transaction: a secret that no configured key decrypts raises :class:`CredentialError`
    and nothing is changed.
    """
    from django_leases.models import TriggerSecret

    alias = _alias(using)
    box = fernet()
    count = 0
    with transaction.atomic(using=alias):
        rows = TriggerSecret.objects.using(alias).select_for_update().order_by("name")
        for row in rows:
            try:
                rotated = box.rotate(row.ciphertext.encode("ascii")).decode("ascii")
            except (InvalidToken, UnicodeError):
                raise CredentialError(
                    f"The stored secret {row.name!r} cannot be decrypted with the configured "
                    "keys; nothing was re-encrypted"
                ) from None
            TriggerSecret.objects.using(alias).filter(pk=row.pk).update(ciphertext=rotated)
            count += 1
    return count

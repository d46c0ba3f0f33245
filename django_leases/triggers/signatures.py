"""Webhook signatures, computed and verified the way each provider does it.

GitHub (``X-Hub-Signature-256``): ``"sha256=" + hex(HMAC-SHA256(key=secret as UTF-8,
msg=the raw request body))``. GitHub sends no timestamp, so the signature gives no replay
protection; a repeated delivery id is caught by the receiver instead.

Stripe (``Stripe-Signature``): ``"t=<unix seconds>,v1=<hex>"`` where ``v1 =
hex(HMAC-SHA256(key=endpoint secret as UTF-8 — the whole ``whsec_…`` string —,
msg="<t>." + raw body))``. A header may carry several ``v1`` entries (while Stripe rolls a
secret) and a ``v0`` entry, which is ignored; any matching ``v1`` accepts. A timestamp older
than the tolerance (default 300 s, ``DJANGO_LEASES["STRIPE_TOLERANCE"]``) is refused as a
replay, as Stripe's own libraries do.

Every comparison is constant-time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hashlib
import hmac
import time

GITHUB_SIGNATURE_HEADER = "X-Hub-Signature-256"
STRIPE_SIGNATURE_HEADER = "Stripe-Signature"
_GITHUB_PREFIX = "sha256="

#: Stripe's default tolerance, seconds (stripe-python's ``DEFAULT_TOLERANCE``).
STRIPE_DEFAULT_TOLERANCE = 300

#: Longest ``Stripe-Signature`` header read, characters (a few dozen ``v1`` entries).
_MAX_STRIPE_HEADER = 4096


def _check_secret(secret: object) -> bytes:
    if not isinstance(secret, str) or not secret:
        raise ValueError("A webhook secret must be a non-empty str")
    return secret.encode("utf-8")


def github_signature(secret: str, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value GitHub sends for ``body`` signed with ``secret``.

    Args:
        secret: the webhook secret (``str``, used as UTF-8).
        body: the exact request body (``bytes``).

    Returns ``"sha256=<64 hex digits>"``. Raises ``ValueError`` for an empty secret.
    """
    digest = hmac.new(_check_secret(secret), body, hashlib.sha256).hexdigest()
    return _GITHUB_PREFIX + digest


def verify_github_signature(secret: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` (the received ``X-Hub-Signature-256``) signs ``body`` with ``secret``.

    Compares in constant time (:func:`hmac.compare_digest`). A missing or malformed header,
    or an empty secret, is ``False``; never raises for bad input.
    """
    if not header or not isinstance(header, str) or not isinstance(secret, str) or not secret:
        return False
    if not isinstance(body, bytes):
        return False
    expected = github_signature(secret, body).encode("ascii")
    # Headers arrive as latin-1 text; compare bytes so a non-ASCII value is simply unequal.
    # GitHub sends lower-case hex; upper-case hex from another sender is the same digest.
    received = header.strip().lower().encode("utf-8", "replace")
    return hmac.compare_digest(expected, received)


def _stripe_digest(secret: str, timestamp: int, body: bytes) -> str:
    signed = str(timestamp).encode("ascii") + b"." + body
    return hmac.new(_check_secret(secret), signed, hashlib.sha256).hexdigest()


def stripe_signature(secret: str, body: bytes, timestamp: int) -> str:
    """The ``Stripe-Signature`` value Stripe sends for ``body`` signed at ``timestamp``.

    Args:
        secret: the endpoint's signing secret (``str``, the whole ``whsec_…`` value).
        body: the exact request body (``bytes``).
        timestamp: when it was signed, Unix seconds (``int``).

    Returns ``"t=<timestamp>,v1=<64 hex digits>"``. Raises ``ValueError`` for an empty
    secret or a timestamp that is not a non-negative ``int``.
    """
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise ValueError("A Stripe signature timestamp must be a non-negative int (seconds)")
    return f"t={timestamp},v1={_stripe_digest(secret, timestamp, body)}"


def parse_stripe_header(header: str) -> tuple[int, list[str]] | None:
    """Split a ``Stripe-Signature`` value into its timestamp and its ``v1`` signatures.

    Returns ``(t, [v1, …])``, or ``None`` when there is no single usable ``t`` or no ``v1``.
    Other schemes (``v0``) and unknown elements are ignored.
    """
    if not isinstance(header, str) or len(header) > _MAX_STRIPE_HEADER:
        return None
    timestamps: list[str] = []
    signatures: list[str] = []
    for element in header.split(","):
        key, sep, value = element.strip().partition("=")
        if not sep:
            continue
        if key == "t":
            timestamps.append(value.strip())
        elif key == "v1":
            signatures.append(value.strip())
    if len(timestamps) != 1 or not signatures:
        return None
    text = timestamps[0]
    if not text.isascii() or not text.isdigit() or len(text) > 12:
        return None
    return int(text), signatures


def verify_stripe_signature(
    secret: str,
    body: bytes,
    header: str | None,
    *,
    tolerance: float = STRIPE_DEFAULT_TOLERANCE,
    now: float | None = None,
) -> bool:
    """Whether ``header`` (the received ``Stripe-Signature``) signs ``body`` with ``secret``.

    Args:
        secret: the endpoint's signing secret (``str``).
        body: the exact request body (``bytes``).
        header: the ``Stripe-Signature`` value, or ``None``.
        tolerance: how far in the past (seconds) the signed timestamp may lie; older is a
            replay and refused. A value ``<= 0`` turns the check off (as in stripe-python).
        now: the current Unix time in seconds (default: :func:`time.time`; for tests).

    Accepts when any ``v1`` entry matches (constant-time comparison of each); ``v0`` is
    ignored. Missing or malformed header, empty secret, stale timestamp: ``False``. Never
    raises for bad input.
    """
    if not header or not isinstance(secret, str) or not secret or not isinstance(body, bytes):
        return False
    parsed = parse_stripe_header(header)
    if parsed is None:
        return False
    timestamp, candidates = parsed
    expected = _stripe_digest(secret, timestamp, body).encode("ascii")
    matched = False
    for candidate in candidates:
        # Check every entry (no early exit) so the time taken does not tell which matched.
        received = candidate.lower().encode("utf-8", "replace")
        matched = hmac.compare_digest(expected, received) | matched
    if not matched:
        return False
    current = time.time() if now is None else now
    return not (tolerance > 0 and timestamp < current - tolerance)

"""Webhook signatures, computed and verified the way each provider does it.

GitHub (``X-Hub-Signature-256``): ``"sha256=" + hex(HMAC-SHA256(key=secret as UTF-8,
msg=the raw request body))``. GitHub sends no timestamp, so the signature gives no replay
protection; a repeated delivery id is caught by the receiver instead.
"""

from __future__ import annotations

import hashlib
import hmac

GITHUB_SIGNATURE_HEADER = "X-Hub-Signature-256"
_GITHUB_PREFIX = "sha256="


def github_signature(secret: str, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value GitHub sends for ``body`` signed with ``secret``.

    Args:
        secret: the webhook secret (``str``, used as UTF-8).
        body: the exact request body (``bytes``).

    Returns ``"sha256=<64 hex digits>"``. Raises ``ValueError`` for an empty secret.
    """
    if not isinstance(secret, str) or not secret:
        raise ValueError("A webhook secret must be a non-empty str")
    digest = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    return _GITHUB_PREFIX + digest


def verify_github_signature(secret: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` (the received ``X-Hub-Signature-256``) signs ``body`` with ``secret``.

    Compares in constant time (:func:`hmac.compare_digest`). A missing or malformed header,
    or an empty secret, is ``False``; never raises for bad input.
    """
    if not header or not isinstance(secret, str) or not secret:
        return False
    expected = github_signature(secret, body).encode("ascii")
    # Headers arrive as latin-1 text; compare bytes so a non-ASCII value is simply unequal.
    # GitHub sends lower-case hex; upper-case hex from another sender is the same digest.
    received = header.strip().lower().encode("utf-8", "replace")
    return hmac.compare_digest(expected, received)

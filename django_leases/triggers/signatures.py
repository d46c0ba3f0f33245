"""Webhook signatures, computed and verified the way each provider does it.

GitHub (``X-Hub-Signature-256``): ``"sha256=" + hex(HMAC-SHA256(key=secret as UTF-8,
msg=the raw request body))``. GitHub sends no timestamp, so the signature gives no replay
protection: the receiver drops a delivery id it has seen, but the id is not signed (a body
sent again under a new id is accepted; a ``StartWorkflow(key=...)`` from the payload is the
guard).

Stripe (``Stripe-Signature``): ``"t=<unix seconds>,v1=<hex>"`` where ``v1 =
hex(HMAC-SHA256(key=endpoint secret as UTF-8 — the whole ``whsec_…`` string —,
msg="<t>." + raw body))``. A header may carry several ``v1`` entries (while Stripe rolls a
secret) and a ``v0`` entry, which is ignored; any matching ``v1`` accepts. A timestamp older
than the tolerance (default 300 s, ``DJANGO_LEASES["STRIPE_TOLERANCE"]``) is refused as a
replay, as Stripe's own libraries do.

A signature header is read exactly in its documented format, or refused:

* GitHub: ``sha256=`` (lower case) and 64 hex digits (either case: the same digest);
* Stripe: comma-separated ``key=value`` elements with nothing between them — one
  ``t=<1 to 12 digits>``, one or more ``v1=<64 hex digits>``, and other schemes ``v<digits>=``
  (``v0``) whose value is visible ASCII without a comma, which are ignored. Any other key, an
  empty element or a space around ``,`` or ``=`` is refused, as Stripe's own libraries do.

The only whitespace allowed is around the whole value: spaces and horizontal tabs, the
optional whitespace HTTP puts around a field value (RFC 9110 §5.5), which servers usually strip
before the application sees the header. Any other character before, inside or after — a
vertical tab, a form feed, CR, LF, NUL, a no-break space, any non-ASCII — makes the header
unreadable, so the delivery is refused.

Every comparison is constant-time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time

GITHUB_SIGNATURE_HEADER = "X-Hub-Signature-256"
STRIPE_SIGNATURE_HEADER = "Stripe-Signature"
_GITHUB_PREFIX = "sha256="

#: Stripe's default tolerance, seconds (stripe-python's ``DEFAULT_TOLERANCE``).
STRIPE_DEFAULT_TOLERANCE = 300

#: Longest ``Stripe-Signature`` header read, characters (a few dozen ``v1`` entries).
_MAX_STRIPE_HEADER = 4096

#: What HTTP allows around a field value (RFC 9110 §5.5: OWS is SP / HTAB), and nothing else.
_HTTP_WHITESPACE = " \t"

_GITHUB_FORMAT = re.compile(r"sha256=[0-9a-fA-F]{64}")
_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")
_STRIPE_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_STRIPE_SCHEME = re.compile(r"v[0-9]+")
#: The value of a scheme we ignore (``v0``): visible ASCII but the element separator.
_STRIPE_OTHER_VALUE = re.compile(r"[!-+\--~]+")


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

    Args:
        secret: the webhook secret (``str``).
        body: the exact request body (``bytes``).
        header: the received header value, or ``None``.

    Returns ``True`` only for ``sha256=<64 hex digits>`` (the hex in either case; spaces and
    tabs around the whole value allowed, nothing else: see the module docstring) holding the
    right digest, compared in constant time (:func:`hmac.compare_digest`). A missing or
    malformed header, or an empty secret, is ``False``; never raises for bad input.
    """
    if not header or not isinstance(header, str) or not isinstance(secret, str) or not secret:
        return False
    if not isinstance(body, bytes):
        return False
    value = header.strip(_HTTP_WHITESPACE)
    if not _GITHUB_FORMAT.fullmatch(value):
        return False
    expected = github_signature(secret, body).encode("ascii")
    # GitHub sends lower-case hex; upper-case hex from another sender is the same digest.
    received = (_GITHUB_PREFIX + value.removeprefix(_GITHUB_PREFIX).lower()).encode("ascii")
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


def _stripe_elements(header: str) -> list[tuple[str, str]] | None:
    """The ``(key, value)`` elements of a ``Stripe-Signature`` value, ``None`` if unreadable."""
    elements: list[tuple[str, str]] = []
    for element in header.strip(_HTTP_WHITESPACE).split(","):
        key, sep, value = element.partition("=")
        if not sep:
            return None
        if key == "t":
            if not _STRIPE_TIMESTAMP.fullmatch(value):
                return None
        elif key == "v1":
            if not _HEX_DIGEST.fullmatch(value):
                return None
        elif not (_STRIPE_SCHEME.fullmatch(key) and _STRIPE_OTHER_VALUE.fullmatch(value)):
            return None
        elements.append((key, value))
    return elements


def parse_stripe_header(header: str) -> tuple[int, list[str]] | None:
    """Split a ``Stripe-Signature`` value into its timestamp and its ``v1`` signatures.

    Args:
        header: the received header value (``str``).

    Returns ``(t, [v1, …])``, or ``None`` when the value is not exactly in the documented
    format (see the module docstring), holds no single ``t`` or no ``v1``, or is longer than
    4,096 characters. Other schemes (``v0``) are ignored. Never raises for bad input.
    """
    if not isinstance(header, str) or len(header) > _MAX_STRIPE_HEADER:
        return None
    elements = _stripe_elements(header)
    if elements is None:
        return None
    timestamps = [value for key, value in elements if key == "t"]
    signatures = [value for key, value in elements if key == "v1"]
    if len(timestamps) != 1 or not signatures:
        return None
    return int(timestamps[0]), signatures


def stripe_header_repeated(header: str) -> bool:
    """Whether a ``Stripe-Signature`` value is two or more headers joined into one.

    WSGI servers and Django's ASGI handler join a header sent twice into one value with
    ``,``, which is also Stripe's element separator. Stripe sends one ``t`` per header, so a
    value with more than one ``t=`` element (however the rest is written) was repeated.

    Args:
        header: the received header value (``str``).

    Returns ``True`` or ``False``; never raises for bad input.
    """
    if not isinstance(header, str):
        return False
    keys = (element.partition("=")[0].strip(_HTTP_WHITESPACE) for element in header.split(","))
    return sum(key == "t" for key in keys) > 1


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

    Returns ``True`` when the header is exactly in the documented format (see the module
    docstring) and any ``v1`` entry matches (constant-time comparison of each); ``v0`` is
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

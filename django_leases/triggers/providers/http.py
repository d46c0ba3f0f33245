"""One place for the providers' HTTP calls: timeouts, and errors made safe to show.

A provider API call either returns the ``httpx.Response`` (any status; the provider reads
it) or raises :class:`ProviderError` for a network failure, naming only the provider, the
step and the kind of failure — never a header, so never a token.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx

from django_leases.conf import leases_settings
from django_leases.triggers.providers.base import ProviderError

#: Longest provider error message quoted back to operators, characters.
_MAX_QUOTED = 300


def timeout() -> float:
    """``DJANGO_LEASES["PROVIDER_TIMEOUT"]`` in seconds (connect and read each)."""
    value = leases_settings.PROVIDER_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ProviderError('DJANGO_LEASES["PROVIDER_TIMEOUT"] must be a positive number')
    return float(value)


@functools.cache
def _tls() -> ssl.SSLContext:
    # Built once per process: loading the CA bundle for every call is slow.
    return httpx.create_ssl_context()


def call(
    provider: str,
    step: str,
    method: str,
    url: str,
    **kwargs: Any,
) -> httpx.Response:
    """Send one request; returns the response whatever its status.

    Args:
        provider: shown in errors (``"GitHub"``).
        step: what was being done, shown in errors (``"create the webhook"``).
        method, url: the request; ``kwargs`` go to :meth:`httpx.Client.request`.

    Raises :class:`ProviderError` (message without any header or body) on a timeout or a
    network failure.
    """
    try:
        with httpx.Client(timeout=timeout(), follow_redirects=False, verify=_tls()) as client:
            return client.request(method, url, **kwargs)
    except httpx.TimeoutException:
        raise ProviderError(
            f"{provider}: could not {step}: the API did not answer within {timeout():g} s"
        ) from None
    except httpx.InvalidURL:
        raise ProviderError(f"{provider}: could not {step}: the API URL is not usable") from None
    except httpx.HTTPError as exc:
        raise ProviderError(
            f"{provider}: could not {step}: {type(exc).__name__} reaching the API"
        ) from None


def mask(text: str, *secrets: str | None) -> str:
    """``text`` with every non-empty one of ``secrets`` replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def masked(error: ProviderError, *secrets: str | None) -> ProviderError:
    """``error`` again, its message masked (:func:`mask`) — the last guard before a message
    leaves a provider step."""
    return ProviderError(mask(str(error), *secrets))


def quoted_message(response: httpx.Response, *secrets: str | None) -> str:
    """A short, safe excerpt of an API error body (its ``message``), for operators.

    Any of ``secrets`` that appears in it is masked; the excerpt is cut at 300 characters.
    """
    message = ""
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict):
        inner = data.get("error")
        if isinstance(inner, dict):  # Stripe: {"error": {"message": …}}
            data = inner
        text = data.get("message")
        if isinstance(text, str):
            message = text
    message = " ".join(mask(message, *secrets).split())
    if len(message) > _MAX_QUOTED:
        message = message[: _MAX_QUOTED - 1] + "…"
    return message


def failure(provider: str, step: str, response: httpx.Response, *secrets: str | None) -> str:
    """The operator's message for an API answer that is not a success."""
    reasons = {
        401: "the API credentials were refused (401)",
        403: "the API credentials lack the rights needed (403)",
        404: "not found (404)",
        422: "the API refused the request (422)",
        429: "rate-limited (429)",
    }
    status = response.status_code
    reason = reasons.get(status) or (
        f"the API failed ({status})" if status >= 500 else f"unexpected answer ({status})"
    )
    quoted = quoted_message(response, *secrets)
    return f"{provider}: could not {step}: {reason}" + (f": {quoted}" if quoted else "")

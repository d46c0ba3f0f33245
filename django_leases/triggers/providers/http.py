"""One place for the providers' HTTP calls: timeouts, and errors made safe to show.

A provider API call either returns the ``httpx.Response`` (any status; the provider reads
it) or raises :class:`ProviderError` for a network failure, naming only the provider, the
step and the kind of failure — never a header, so never a token.

``httpx`` comes with the ``webhooks`` extra (``pip install "django-leases[webhooks]"``) and
is imported by the first call, not when Django starts: a project without trigger sources
needs neither it nor its dependencies (system check ``django_leases.E033`` names the extra
when a declared source needs it).
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django_leases.conf import leases_settings, webhooks_extra
from django_leases.triggers.providers.base import ProviderError

if TYPE_CHECKING:
    # deferred: httpx is the optional webhooks extra, costly to import
    import httpx

#: Longest provider error message quoted back to operators, characters.
_MAX_QUOTED = 300


def timeout() -> float:
    """``DJANGO_LEASES["PROVIDER_TIMEOUT"]`` in seconds (connect and read each)."""
    value = leases_settings.PROVIDER_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ProviderError('DJANGO_LEASES["PROVIDER_TIMEOUT"] must be a positive number')
    return float(value)


def credential(provider: str, what: str, setting: str, variable: str) -> str:
    """The API credential ``DJANGO_LEASES[setting]``, else the environment ``variable``,
    stripped: ``credential("GitHub", "token", "GITHUB_TOKEN", "DJANGO_LEASES_GITHUB_TOKEN")``.
    Raises :class:`ProviderError` naming both places (never a value) when neither holds one."""
    value = getattr(leases_settings, setting) or os.environ.get(variable)
    if not isinstance(value, str) or not value.strip():
        raise ProviderError(
            f'{provider}: no API {what}: set DJANGO_LEASES["{setting}"] or {variable}'
        )
    return value.strip()


def api_url(provider: str, config: Mapping[str, Any] | None, default: str) -> str:
    """The API root: the source's ``config["api_url"]``, else ``default`` (the setting), without
    a trailing ``/``. Raises :class:`ProviderError` for one that is not an http(s) URL."""
    url = (config or {}).get("api_url") or default
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ProviderError(f"{provider}: the API URL must be an http(s) URL")
    return url.rstrip("/")


def json_or_none(response: httpx.Response) -> Any:
    """The response body as JSON, or ``None`` when it is not JSON (the caller checks what it
    holds)."""
    try:
        return response.json()
    except ValueError:
        return None


@functools.cache
def _tls() -> ssl.SSLContext:
    # Built once per process: loading the CA bundle for every call is slow.
    with webhooks_extra():
        # deferred: httpx is the optional webhooks extra, costly to import
        import httpx
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
    network failure, ``ImproperlyConfigured`` when httpx (the ``webhooks`` extra) is not
    installed.
    """
    with webhooks_extra():
        # deferred: httpx is the optional webhooks extra, costly to import
        import httpx
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


#: The shortest run of a secret's characters :func:`mask` hides wherever it appears.
MIN_MASKED_RUN = 8


def _folded(text: str) -> str:
    """``text`` in lower case, character for character (a character whose lower case is
    longer, such as ``İ``, stays), so that positions in it are positions in ``text``."""
    return "".join(c if len(c.lower()) != 1 else c.lower() for c in text)


def _hidden_spans(text: str, secret: str) -> list[tuple[int, int]]:
    """Where ``text`` holds what :func:`mask` hides of ``secret``: ``(start, end)`` pairs."""
    folded, key = _folded(text), _folded(secret)
    if len(key) < MIN_MASKED_RUN:
        spans, start = [], folded.find(key)
        while start != -1:
            spans.append((start, start + len(key)))
            start = folded.find(key, start + 1)
        return spans
    # Every run of MIN_MASKED_RUN or more characters shared with the secret is a chain of
    # MIN_MASKED_RUN-long windows each found in it, so marking those windows marks the runs.
    windows = {key[i : i + MIN_MASKED_RUN] for i in range(len(key) - MIN_MASKED_RUN + 1)}
    return [
        (i, i + MIN_MASKED_RUN)
        for i in range(len(folded) - MIN_MASKED_RUN + 1)
        if folded[i : i + MIN_MASKED_RUN] in windows
    ]


def mask(text: str, *secrets: str | None) -> str:
    """``text`` with whatever could give one of ``secrets`` away replaced by ``***``.

    Args:
        text: a message that may quote a provider's answer.
        secrets: the secrets it must not show (API tokens and keys, signing secrets);
            ``None`` and empty ones are skipped.

    Returns the masked text. For a secret of :data:`MIN_MASKED_RUN` (8) characters or more,
    every run of 8 or more of its consecutive characters found in ``text`` is hidden: the whole
    secret, a prefix, a suffix or an inner piece of it, compared without regard to case. Runs
    that touch or overlap become one ``***``. A secret shorter than 8 characters is hidden
    where it appears whole (its shorter pieces would hide ordinary words, and pieces of a
    secret that short give little away). Never raises.
    """
    spans = sorted(span for secret in secrets if secret for span in _hidden_spans(text, secret))
    merged: list[list[int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    pieces, shown = [], 0
    for start, end in merged:
        pieces += [text[shown:start], "***"]
        shown = end
    return "".join([*pieces, text[shown:]])


def masked(error: ProviderError, *secrets: str | None) -> ProviderError:
    """``error`` again, its message masked (:func:`mask`: any run of 8 or more characters of
    one of ``secrets``) — the last guard before a message leaves a provider step."""
    return ProviderError(mask(str(error), *secrets))


def quoted_message(response: httpx.Response, *secrets: str | None) -> str:
    """A short, safe excerpt of an API error body (its ``message``), for operators.

    Whatever could give one of ``secrets`` away is masked first (:func:`mask`: any run of 8 or
    more of a secret's characters); the excerpt is then cut at 300 characters.
    """
    message = ""
    data = json_or_none(response)
    if isinstance(data, dict):
        inner = data.get("error")
        if isinstance(inner, dict):  # Stripe: {"error": {"message": …}}
            data = inner
        text = data.get("message")
        if isinstance(text, str):
            message = text
        # GitHub's 422 says "Validation Failed" and puts the reasons in errors[].message.
        errors = data.get("errors")
        if isinstance(errors, list):
            reasons = [e.get("message") for e in errors if isinstance(e, dict)]
            told = "; ".join(r for r in reasons if isinstance(r, str) and r)
            if told:
                message = f"{message}: {told}" if message else told
    message = " ".join(mask(message, *secrets).split())
    if len(message) > _MAX_QUOTED:
        message = message[: _MAX_QUOTED - 1] + "…"
    return message


def rate_limited(response: httpx.Response) -> bool:
    """Whether a 403 or 429 is a rate limit, not a refusal: GitHub answers its limits with
    403 and ``Retry-After``, or ``X-RateLimit-Remaining: 0``."""
    headers = response.headers
    return (
        response.status_code == 429
        or "Retry-After" in headers
        or headers.get("X-RateLimit-Remaining", "").strip() == "0"
    )


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
    if status in (403, 429) and rate_limited(response):
        reason = f"rate-limited ({status})"
        wait = response.headers.get("Retry-After", "").strip()
        if wait.isdigit():
            reason += f", retry after {int(wait)} s"
    quoted = quoted_message(response, *secrets)
    return f"{provider}: could not {step}: {reason}" + (f": {quoted}" if quoted else "")

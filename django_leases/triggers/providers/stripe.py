"""The ``stripe`` provider: webhook endpoints over Stripe's API.

Declaration config (non-secret, all optional): ``{"api_url": "https://api.stripe.com"}``.
API root: ``config["api_url"]``, else ``DJANGO_LEASES["STRIPE_API_URL"]``. Key (a secret key
``sk_…`` or a restricted key with "Webhook Endpoints: write"): ``DJANGO_LEASES["STRIPE_API_KEY"]``,
else the ``DJANGO_LEASES_STRIPE_API_KEY`` environment variable; sent only as HTTP Basic user.

Setup creates ``POST /v1/webhook_endpoints`` (form-encoded: ``url``, ``enabled_events[]`` —
the declared event names, or ``*`` when ``*`` is declared —, ``description`` = label prefix +
source name, ``metadata[trigger_source]``) and hands the ``secret`` Stripe returns **once** to
the lifecycle (:attr:`SetupOutcome.secret`), which stores it encrypted; state is
``{"endpoint_id": "we_…"}``. Re-setup with a recorded endpoint that still exists updates it
(``url``, ``enabled_events``, and ``disabled=false``: an endpoint Stripe disabled after its
deliveries kept failing is enabled again) — unless no signing secret is stored for the
source any more:
Stripe never shows a secret again, so that endpoint is deleted and a new one created. An
endpoint deleted behind our back, or one never recorded, is looked for by URL first (deleted,
for the same reason, as we cannot have its secret) and then created: a source never owns two
endpoints.

Every call sends ``Stripe-Version``: :data:`API_VERSION`, the version these requests and the
fields read from the answers (``id``, ``url``, ``secret``, ``enabled_events``, ``status``, a
list's ``data``) are written against, unless ``DJANGO_LEASES["STRIPE_API_VERSION"]`` names
another (as a Django project pins the version its Stripe SDK calls use). Without it, Stripe
would answer in the account's default version, which differs between accounts and changes when
someone upgrades it in the Dashboard. The endpoint is created without ``api_version``, so the
events Stripe sends to it are rendered in the account's default version, as for an endpoint
added in the Dashboard: the pin changes how we talk to the API, not what your handlers receive.

Receiving: ``Stripe-Signature`` (``t=…,v1=…``, tolerance ``DJANGO_LEASES["STRIPE_TOLERANCE"]``
seconds, default 300); delivery id = the event's ``id``; event name = its ``type``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.db import router

from django_leases.conf import leases_settings
from django_leases.exceptions import MalformedDelivery
from django_leases.models import TriggerSecret
from django_leases.triggers.credentials import get_secret
from django_leases.triggers.providers.base import (
    REGISTERED,
    ParsedDelivery,
    Provider,
    ProviderError,
    SetupOutcome,
    checked_identifier,
    declared_events,
    decode_json_object,
    label_for,
    repeated_header,
)
from django_leases.triggers.providers.http import (
    api_url,
    call,
    credential,
    failure,
    json_or_none,
    masked,
)
from django_leases.triggers.signatures import (
    STRIPE_DEFAULT_TOLERANCE,
    stripe_header_repeated,
    verify_stripe_signature,
)

if TYPE_CHECKING:  # httpx (the webhooks extra) is imported by http.call, when used
    import httpx

    from django_leases.models import TriggerSource

KEY_VARIABLE = "DJANGO_LEASES_STRIPE_API_KEY"

#: The Stripe API version every call pins (``Stripe-Version``): the current version in Stripe's
#: API-versioning documentation when this provider was last checked against it.
API_VERSION = "2026-09-30.endive"

#: What a Stripe API version looks like: a release date, and the release's name since 2024
#: (``2024-09-30.acacia``; older ones are bare dates, ``2020-08-27``).
_API_VERSION_FORMAT = re.compile(r"^\d{4}-\d{2}-\d{2}(\.[a-z]+)?$")


def check_api_version(value: object) -> str:
    """``value`` if it is a Stripe API version (``2026-09-30.endive``), else ``ValueError``."""
    if not isinstance(value, str) or not _API_VERSION_FORMAT.match(value):
        raise ValueError(f"a Stripe API version looks like {API_VERSION!r}, not {value!r}")
    return value


def api_version() -> str:
    """The ``Stripe-Version`` sent: ``DJANGO_LEASES["STRIPE_API_VERSION"]``, else
    :data:`API_VERSION`. Raises :class:`ProviderError` for a value that is not a version."""
    value = leases_settings.STRIPE_API_VERSION
    if value is None:
        return API_VERSION
    try:
        return check_api_version(value)
    except ValueError as exc:
        raise ProviderError(f'Stripe: DJANGO_LEASES["STRIPE_API_VERSION"]: {exc}') from None


def _key() -> str:
    return credential("Stripe", "key", "STRIPE_API_KEY", KEY_VARIABLE)


def _api_url(config: Mapping[str, Any] | None) -> str:
    return api_url("Stripe", config, leases_settings.STRIPE_API_URL)


_ENDPOINT_ID = re.compile(r"^[A-Za-z0-9_]{1,100}$")


def _endpoint_id(state: Mapping[str, Any] | None) -> str | None:
    endpoint_id = (state or {}).get("endpoint_id")
    if isinstance(endpoint_id, str) and _ENDPOINT_ID.match(endpoint_id):
        return endpoint_id
    return None


def tolerance() -> float:
    """``DJANGO_LEASES["STRIPE_TOLERANCE"]`` in seconds; 300 when it is not a positive
    number (replay protection cannot be switched off by a typo)."""
    value = leases_settings.STRIPE_TOLERANCE
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return float(STRIPE_DEFAULT_TOLERANCE)
    return float(value)


class StripeProvider(Provider):
    """Stripe webhook endpoints (see the module docstring)."""

    name = "stripe"
    manages_registration = True
    takes_secret = False
    sender_headers = (
        ("Content-Type", "application/json: a Stripe event, with its 'id' and 'type'"),
        (
            "Stripe-Signature",
            "t=<Unix time>,v1=<hex HMAC-SHA256 of '<t>.<raw body>', keyed with the signing "
            "secret>; at most the tolerance old",
        ),
    )

    def validate_config(self, config: Mapping[str, Any]) -> None:
        """``api_url``, when given, must be an http(s) URL. Raises ``ValueError``."""
        if config.get("api_url") is not None:
            try:
                _api_url(config)
            except ProviderError as exc:
                raise ValueError(str(exc)) from None

    # -- HTTP ------------------------------------------------------------------------------

    def _call(
        self, step: str, method: str, api: str, path: str, key: str, **kwargs: Any
    ) -> httpx.Response:
        headers = {"Stripe-Version": api_version()}
        return call("Stripe", step, method, api + path, auth=(key, ""), headers=headers, **kwargs)

    @staticmethod
    def _fail(step: str, response: httpx.Response, *secrets: str | None) -> ProviderError:
        return ProviderError(failure("Stripe", step, response, *secrets))

    @staticmethod
    def _object(response: httpx.Response, step: str) -> dict[str, Any]:
        data = json_or_none(response)
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            raise ProviderError(f"Stripe: could not {step}: the API's answer holds no id")
        return data

    # -- management ------------------------------------------------------------------------

    @staticmethod
    def _events(source: TriggerSource) -> list[str]:
        events = declared_events(source)
        return ["*"] if not events or "*" in events else events

    def _form(self, source: TriggerSource, url: str, *, create: bool) -> dict[str, Any]:
        form: dict[str, Any] = {
            "url": url,
            "enabled_events[]": self._events(source),
            "description": label_for(source),
        }
        if create:
            form["metadata[trigger_source]"] = source.name
        else:  # an endpoint Stripe disabled after failed deliveries is enabled again
            form["disabled"] = "false"
        return form

    @staticmethod
    def _outcome(endpoint: Mapping[str, Any], verb: str, secret: str | None) -> SetupOutcome:
        events = endpoint.get("enabled_events")
        shown = ", ".join(str(e) for e in events) if isinstance(events, list) else "?"
        status = endpoint.get("status")
        note = f" (status {status} at Stripe)" if status not in (None, "enabled") else ""
        return SetupOutcome(
            status=REGISTERED,
            state={"endpoint_id": endpoint["id"]},
            detail=f"Stripe webhook endpoint {endpoint['id']} {verb}: posts to "
            f"{endpoint.get('url', '?')} for {shown}{note}",
            secret=secret,
        )

    def _retrieve(self, api: str, endpoint_id: str, key: str) -> dict[str, Any] | None:
        step = f"look up webhook endpoint {endpoint_id}"
        response = self._call(step, "GET", api, f"/v1/webhook_endpoints/{endpoint_id}", key)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self._fail(step, response, key)
        return self._object(response, step)

    def _delete(self, api: str, endpoint_id: str, key: str) -> None:
        step = f"delete webhook endpoint {endpoint_id}"
        response = self._call(step, "DELETE", api, f"/v1/webhook_endpoints/{endpoint_id}", key)
        if response.status_code not in (200, 404):
            raise self._fail(step, response, key)

    def _find_by_url(self, api: str, url: str, key: str) -> list[str]:
        step = "list the webhook endpoints"
        response = self._call(step, "GET", api, "/v1/webhook_endpoints", key, params={"limit": 100})
        if response.status_code != 200:
            raise self._fail(step, response, key)
        data = json_or_none(response)
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise ProviderError(f"Stripe: could not {step}: the answer holds no list")
        return [
            item["id"]
            for item in items
            if isinstance(item, dict) and isinstance(item.get("id"), str) and item.get("url") == url
        ]

    @staticmethod
    def _secret_stored(source: TriggerSource) -> bool:
        using = source._state.db or router.db_for_write(TriggerSecret)
        return get_secret(source.name, using=using) is not None

    def setup(self, source: TriggerSource, url: str, secret: str | None) -> SetupOutcome:
        """Create or update the webhook endpoint posting to ``url``.

        ``secret`` is ignored: Stripe chooses the signing secret. Returns status
        ``"registered"``, state ``{"endpoint_id"}`` and, when an endpoint was created, the
        ``secret`` to store. Raises :class:`ProviderError`.
        """
        config = source.config or {}
        api, key = _api_url(config), _key()
        try:
            return self._setup(source, url, api, key)
        except ProviderError as exc:
            raise masked(exc, key) from None

    def _setup(self, source: TriggerSource, url: str, api: str, key: str) -> SetupOutcome:
        recorded = _endpoint_id(source.state)
        if recorded is not None and self._retrieve(api, recorded, key) is not None:
            if self._secret_stored(source):
                step = f"update webhook endpoint {recorded}"
                response = self._call(
                    step,
                    "POST",
                    api,
                    f"/v1/webhook_endpoints/{recorded}",
                    key,
                    data=self._form(source, url, create=False),
                )
                if response.status_code == 200:
                    return self._outcome(self._object(response, step), "updated", None)
                if response.status_code != 404:
                    raise self._fail(step, response, key)
            else:
                # Its secret is lost (Stripe shows it only at creation): replace it.
                self._delete(api, recorded, key)
        for endpoint_id in self._find_by_url(api, url, key):
            # Ours from a setup whose state was never recorded; its secret is unknown.
            self._delete(api, endpoint_id, key)
        step = "create the webhook endpoint"
        response = self._call(
            step,
            "POST",
            api,
            "/v1/webhook_endpoints",
            key,
            data=self._form(source, url, create=True),
        )
        if response.status_code != 200:
            raise self._fail(step, response, key)
        endpoint = self._object(response, step)
        returned = endpoint.get("secret")
        if not isinstance(returned, str) or not returned:
            raise ProviderError(
                f"Stripe: webhook endpoint {endpoint['id']} was created but Stripe returned no "
                "signing secret"
            )
        return self._outcome(endpoint, "created", returned)

    def check(self, source: TriggerSource) -> SetupOutcome:
        """Retrieve the recorded endpoint. Raises :class:`ProviderError` when it is gone,
        none is recorded, it is disabled at Stripe, or Stripe cannot be reached."""
        endpoint_id = _endpoint_id(source.state)
        if endpoint_id is None:
            raise ProviderError("Stripe: no webhook endpoint is recorded for this source")
        config = source.config or {}
        endpoint = self._retrieve(_api_url(config), endpoint_id, _key())
        if endpoint is None:
            raise ProviderError(f"Stripe: webhook endpoint {endpoint_id} no longer exists")
        if endpoint.get("status") == "disabled":
            raise ProviderError(f"Stripe: webhook endpoint {endpoint_id} is disabled at Stripe")
        return self._outcome(endpoint, "found", None)

    def unrecorded(self, source: TriggerSource, url: str) -> dict[str, Any] | None:
        """An endpoint that posts to ``url``, as a state, if any."""
        key = _key()
        try:
            found = self._find_by_url(_api_url(source.config or {}), url, key)
        except ProviderError as exc:
            raise masked(exc, key) from None
        return {"endpoint_id": found[0]} if found else None

    def teardown(self, source: TriggerSource) -> None:
        """Delete the recorded endpoint; one already gone (404) or none recorded is success."""
        endpoint_id = _endpoint_id(source.state)
        if endpoint_id is None:
            return
        self._delete(_api_url(source.config or {}), endpoint_id, _key())

    # -- receiving -------------------------------------------------------------------------

    def refuse_repeated_headers(self, headers: Mapping[str, str]) -> None:
        """``Stripe-Signature`` sent twice: its value holds more than one ``t=`` (a comma is
        its own separator, so it tells nothing). Raises :class:`MalformedDelivery`."""
        if stripe_header_repeated(headers.get("stripe-signature", "")):
            raise repeated_header("Stripe-Signature")

    def verify(self, secret: str, body: bytes, headers: Mapping[str, str]) -> bool:
        """Whether ``Stripe-Signature`` signs ``body`` with ``secret`` within
        ``STRIPE_TOLERANCE`` seconds (``bool``); never raises for bad input."""
        return verify_stripe_signature(
            secret, body, headers.get("stripe-signature"), tolerance=tolerance()
        )

    def parse(self, body: bytes, headers: Mapping[str, str]) -> ParsedDelivery:
        """The event type, event id and payload of a Stripe event body as a
        :class:`ParsedDelivery`; raises :class:`MalformedDelivery`."""
        payload = decode_json_object(body)
        event_id, event_type = payload.get("id"), payload.get("type")
        if not isinstance(event_id, str) or not isinstance(event_type, str):
            raise MalformedDelivery("The body is not a Stripe event: it needs 'id' and 'type'")
        return ParsedDelivery(
            event=checked_identifier(event_type, "The event's type"),
            delivery_id=checked_identifier(event_id, "The event's id"),
            payload=payload,
        )

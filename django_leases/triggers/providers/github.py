"""The ``github`` provider: repository webhooks over GitHub's REST API.

Declaration config (non-secret)::

    {"repository": "owner/repo",          # required
     "api_url": "https://ghe.example.com/api/v3",   # optional, per source (GitHub Enterprise)
     "insecure_ssl": False}                # optional; True lets GitHub skip TLS verification

API root: ``config["api_url"]``, else ``DJANGO_LEASES["GITHUB_API_URL"]`` (default
``https://api.github.com``). Token (a fine-grained token with "Webhooks: write" on the
repository, or a classic one with ``admin:repo_hook``): ``DJANGO_LEASES["GITHUB_TOKEN"]``, else
the ``DJANGO_LEASES_GITHUB_TOKEN`` environment variable. It is sent only in the
``Authorization`` header and never appears in a message.

Setup creates ``POST /repos/{owner}/{repo}/hooks`` (``name "web"``, ``active``, the declared
events, ``config {url, content_type "json", secret, insecure_ssl}``) and records
``{"hook_id": id, "repository": "owner/repo"}``. Re-setup with a recorded hook that still
exists updates it (``PATCH``) instead; a recorded hook deleted behind our back, or none
recorded, first looks for a hook of the repository already posting to the URL (a setup whose
state was never recorded) and reuses it, and only then creates one. So one source never owns
two hooks. ``ping`` is not subscribed to (GitHub sends it by itself on creation).

Receiving: ``X-Hub-Signature-256``; event ``X-GitHub-Event``; delivery id
``X-GitHub-Delivery``; body JSON (content type ``json``) or a form with one ``payload`` field
(GitHub's default content type ``form``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from django_leases.conf import leases_settings
from django_leases.exceptions import MalformedDelivery
from django_leases.triggers.providers.base import (
    REGISTERED,
    ParsedDelivery,
    Provider,
    ProviderError,
    SetupOutcome,
    declared_events,
    decode_json_object,
    header_value,
)
from django_leases.triggers.providers.http import (
    api_url,
    call,
    credential,
    failure,
    json_or_none,
    masked,
)
from django_leases.triggers.signatures import verify_github_signature

if TYPE_CHECKING:  # httpx (the webhooks extra) is imported by http.call, when used
    import httpx

    from django_leases.models import TriggerSource

TOKEN_VARIABLE = "DJANGO_LEASES_GITHUB_TOKEN"
_REPOSITORY = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
#: Events GitHub sends without a subscription (and refuses in a hook's ``events``).
_UNSUBSCRIBABLE = frozenset({"ping"})


def _token() -> str:
    return credential("GitHub", "token", "GITHUB_TOKEN", TOKEN_VARIABLE)


def _repository(config: Mapping[str, Any] | None) -> str:
    repository = (config or {}).get("repository")
    if (
        isinstance(repository, str)
        and _REPOSITORY.match(repository)
        and all(part.strip(".") for part in repository.split("/"))  # not "." or ".."
    ):
        return repository
    raise ProviderError(
        f"GitHub: the source's config needs a repository as 'owner/repo', not {repository!r}"
    )


def _api_url(config: Mapping[str, Any] | None) -> str:
    return api_url("GitHub", config, leases_settings.GITHUB_API_URL)


def _hook_id(state: Mapping[str, Any] | None) -> int | None:
    hook_id = (state or {}).get("hook_id")
    return hook_id if isinstance(hook_id, int) and not isinstance(hook_id, bool) else None


class GitHubProvider(Provider):
    """GitHub repository webhooks (see the module docstring)."""

    name = "github"
    manages_registration = True
    takes_secret = True
    single_valued_headers = (
        "X-Hub-Signature-256",
        "X-GitHub-Event",
        "X-GitHub-Delivery",
        "Content-Type",
    )
    sender_headers = (
        (
            "Content-Type",
            "application/json (or application/x-www-form-urlencoded with one 'payload' field)",
        ),
        ("X-GitHub-Event", "the event's name: one of the declared events"),
        ("X-GitHub-Delivery", "an id unique to the delivery (a repeated id is not processed)"),
        (
            "X-Hub-Signature-256",
            "sha256= then the hex HMAC-SHA256 of the raw body, keyed with the signing secret",
        ),
    )

    def validate_config(self, config: Mapping[str, Any]) -> None:
        """``repository`` must be ``"owner/repo"``; ``api_url``, when given, an http(s) URL;
        ``insecure_ssl``, when given, a bool. Raises ``ValueError``."""
        try:
            _repository(config)
            if config.get("api_url") is not None:
                _api_url(config)
        except ProviderError as exc:
            raise ValueError(str(exc)) from None
        if not isinstance(config.get("insecure_ssl", False), bool):
            raise ValueError("GitHub: config 'insecure_ssl' must be True or False")

    # -- HTTP ------------------------------------------------------------------------------

    def _call(
        self, step: str, method: str, api: str, path: str, token: str, **kwargs: Any
    ) -> httpx.Response:
        return call(
            "GitHub",
            step,
            method,
            api + path,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": "2022-11-28",
            },
            **kwargs,
        )

    @staticmethod
    def _fail(step: str, response: httpx.Response, *secrets: str | None) -> ProviderError:
        return ProviderError(failure("GitHub", step, response, *secrets))

    @staticmethod
    def _hook(response: httpx.Response, step: str) -> dict[str, Any]:
        data = json_or_none(response)
        if not isinstance(data, dict) or not isinstance(data.get("id"), int):
            raise ProviderError(f"GitHub: could not {step}: the API's answer holds no hook id")
        return data

    # -- management ------------------------------------------------------------------------

    def _body(self, source: TriggerSource, url: str, secret: str) -> dict[str, Any]:
        events = [e for e in declared_events(source) if e not in _UNSUBSCRIBABLE] or ["push"]
        insecure = bool((source.config or {}).get("insecure_ssl", False))
        return {
            "name": "web",
            "active": True,
            "events": events,
            "config": {
                "url": url,
                "content_type": "json",
                "secret": secret,
                "insecure_ssl": "1" if insecure else "0",
            },
        }

    def _outcome(self, hook: Mapping[str, Any], repository: str, verb: str) -> SetupOutcome:
        events = hook.get("events")
        shown = ", ".join(str(e) for e in events) if isinstance(events, list) else "?"
        url = (hook.get("config") or {}).get("url", "?")
        active = "" if hook.get("active", True) else " (inactive at GitHub)"
        return SetupOutcome(
            status=REGISTERED,
            state={"hook_id": hook["id"], "repository": repository},
            detail=f"GitHub webhook {hook['id']} on {repository} {verb}: posts to {url} "
            f"for {shown}{active}",
        )

    def _find_by_url(self, api: str, repository: str, url: str, token: str) -> int | None:
        step = f"list the webhooks of {repository}"
        response = self._call(
            step, "GET", api, f"/repos/{repository}/hooks", token, params={"per_page": 100}
        )
        if response.status_code != 200:
            raise self._fail(step, response, token)
        hooks = json_or_none(response)
        if not isinstance(hooks, list):
            raise ProviderError(f"GitHub: could not {step}: the answer is not a list")
        for hook in hooks:
            if (
                isinstance(hook, dict)
                and isinstance(hook.get("id"), int)
                and isinstance(hook.get("config"), dict)
                and hook["config"].get("url") == url
            ):
                return int(hook["id"])
        return None

    def _update(
        self,
        api: str,
        repository: str,
        hook_id: int,
        body: dict[str, Any],
        token: str,
        secret: str,
    ) -> dict[str, Any] | None:
        """PATCH hook ``hook_id``; returns it, or ``None`` when it no longer exists."""
        step = f"update webhook {hook_id} on {repository}"
        patch = {"active": True, "events": body["events"], "config": body["config"]}
        response = self._call(
            step, "PATCH", api, f"/repos/{repository}/hooks/{hook_id}", token, json=patch
        )
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self._fail(step, response, secret, token)
        return self._hook(response, step)

    def setup(self, source: TriggerSource, url: str, secret: str | None) -> SetupOutcome:
        """Create or update the repository webhook posting to ``url``, signed with ``secret``.

        Returns status ``"registered"`` and state ``{"hook_id", "repository"}``. Raises
        :class:`ProviderError` (no secret, no token, bad config, API refusal or failure).
        """
        if not secret:
            raise ProviderError("GitHub: setup needs a signing secret for the webhook")
        config = source.config or {}
        repository, api, token = _repository(config), _api_url(config), _token()
        try:
            return self._setup(source, url, secret, repository, api, token)
        except ProviderError as exc:
            raise masked(exc, secret, token) from None

    def _setup(
        self, source: TriggerSource, url: str, secret: str, repository: str, api: str, token: str
    ) -> SetupOutcome:
        body = self._body(source, url, secret)
        recorded = _hook_id(source.state)
        recorded_repository = (source.state or {}).get("repository", repository)
        if recorded is not None and recorded_repository != repository:
            # The declaration moved to another repository: remove the old hook first.
            self._delete(api, str(recorded_repository), recorded, token)
            recorded = None
        if recorded is not None:
            hook = self._update(api, repository, recorded, body, token, secret)
            if hook is not None:
                return self._outcome(hook, repository, "updated")
        found = self._find_by_url(api, repository, url, token)
        if found is not None:
            hook = self._update(api, repository, found, body, token, secret)
            if hook is not None:
                return self._outcome(hook, repository, "reused")
        step = f"create the webhook on {repository}"
        response = self._call(step, "POST", api, f"/repos/{repository}/hooks", token, json=body)
        if response.status_code != 201:
            raise self._fail(step, response, secret, token)
        return self._outcome(self._hook(response, step), repository, "created")

    def check(self, source: TriggerSource) -> SetupOutcome:
        """``GET`` the recorded hook. Raises :class:`ProviderError` when it is gone,
        none is recorded, or GitHub cannot be reached."""
        hook_id = _hook_id(source.state)
        if hook_id is None:
            raise ProviderError("GitHub: no webhook is recorded for this source")
        config = source.config or {}
        repository = str((source.state or {}).get("repository") or _repository(config))
        api, token = _api_url(config), _token()
        step = f"look up webhook {hook_id} on {repository}"
        try:
            response = self._call(step, "GET", api, f"/repos/{repository}/hooks/{hook_id}", token)
        except ProviderError as exc:
            raise masked(exc, token) from None
        if response.status_code == 404:
            raise ProviderError(f"GitHub: webhook {hook_id} on {repository} no longer exists")
        if response.status_code != 200:
            raise self._fail(step, response, token)
        return self._outcome(self._hook(response, step), repository, "found")

    def _delete(self, api: str, repository: str, hook_id: int, token: str) -> None:
        step = f"delete webhook {hook_id} on {repository}"
        try:
            path = f"/repos/{repository}/hooks/{hook_id}"
            response = self._call(step, "DELETE", api, path, token)
        except ProviderError as exc:
            raise masked(exc, token) from None
        if response.status_code not in (204, 404):
            raise self._fail(step, response, token)

    def unrecorded(self, source: TriggerSource, url: str) -> dict[str, Any] | None:
        """The hook of the declared repository that posts to ``url``, as a state, if any."""
        config = source.config or {}
        repository, api, token = _repository(config), _api_url(config), _token()
        try:
            found = self._find_by_url(api, repository, url, token)
        except ProviderError as exc:
            raise masked(exc, token) from None
        return None if found is None else {"hook_id": found, "repository": repository}

    def teardown(self, source: TriggerSource) -> None:
        """``DELETE`` the recorded hook; one already gone (404) or none recorded is success."""
        hook_id = _hook_id(source.state)
        if hook_id is None:
            return
        config = source.config or {}
        repository = str((source.state or {}).get("repository") or _repository(config))
        self._delete(_api_url(config), repository, hook_id, _token())

    # -- receiving -------------------------------------------------------------------------

    def verify(self, secret: str, body: bytes, headers: Mapping[str, str]) -> bool:
        """Whether ``X-Hub-Signature-256`` is the HMAC-SHA256 of ``body`` with ``secret``
        (``bool``); never raises for bad input."""
        return verify_github_signature(secret, body, headers.get("x-hub-signature-256"))

    def parse(self, body: bytes, headers: Mapping[str, str]) -> ParsedDelivery:
        """The event (``X-GitHub-Event``), delivery id (``X-GitHub-Delivery``) and JSON payload
        (a JSON or form-encoded body) as a :class:`ParsedDelivery`; raises
        :class:`MalformedDelivery`."""
        event = header_value(headers, "x-github-event", "X-GitHub-Event")
        delivery_id = header_value(headers, "x-github-delivery", "X-GitHub-Delivery")
        content_type = (headers.get("content-type") or "").split(";")[0].strip().lower()
        if content_type == "application/x-www-form-urlencoded":
            try:
                fields = parse_qs(body.decode("utf-8"), strict_parsing=True)
            except (UnicodeDecodeError, ValueError):
                raise MalformedDelivery("The form body cannot be read") from None
            values = fields.get("payload", [])
            if len(values) != 1:
                raise MalformedDelivery("The form body needs exactly one 'payload' field")
            payload = decode_json_object(values[0])
        else:
            payload = decode_json_object(body)
        return ParsedDelivery(event=event, delivery_id=delivery_id, payload=payload)

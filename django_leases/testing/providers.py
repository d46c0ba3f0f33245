"""A fake webhook provider for tests: records every call, fails on demand, no network.

Install it for the length of a test with :func:`installed_provider`::

    from django_leases.testing.providers import FakeProvider, installed_provider

    with installed_provider(FakeProvider("fake")) as fake:
        webhook_source("pushes", provider="fake", events={...})
        ...
        enable("pushes")
        assert fake.created == 1

:class:`FakeProvider` behaves like a provider with an API (``manages_registration=True``)
that takes our signing secret (``takes_secret=True``), unless told otherwise. Its
"provider side" (the registrations it holds) lives in memory, or, given ``ledger=PATH``, in
a JSON file shared by every process that installs a fake with that path (for races between
processes; POSIX only, as the file is locked with ``fcntl``). Deliveries are signed like
GitHub's: ``X-Fake-Signature: sha256=<hex HMAC>`` of the body, with ``X-Fake-Event`` and
``X-Fake-Delivery`` headers (see :meth:`sign`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from django_leases.exceptions import MisuseError
from django_leases.triggers.providers import (
    ParsedDelivery,
    Provider,
    ProviderError,
    SetupOutcome,
    decode_json_object,
    get_provider,
    register_provider,
    unregister_provider,
)
from django_leases.triggers.providers.base import header_value

if TYPE_CHECKING:
    from django_leases.models import TriggerSource

_P = TypeVar("_P", bound=Provider)


class FakeProvider(Provider):
    """A provider whose "API" is a dict (or a JSON file), recording calls.

    Args:
        name: the provider name declarations use (``str``).
        manages_registration: ``False`` behaves like ``manual``: setup returns status
            ``manual`` with instructions and registers nothing.
        takes_secret: whether setup wants our signing secret.
        returns_secret: a secret setup hands back once (as Stripe does), or ``None``.
        ledger: a JSON file holding the registrations, shared across processes.

    Attributes:
        calls: ``(step, source name)`` per call, in order (``step`` is ``"setup"``,
            ``"check"`` or ``"teardown"``); thread-safe.
        secrets_seen: the secret each setup was given, by source name.
        fail_setup / fail_teardown / fail_check: set to a message to make that step raise
            :class:`ProviderError` with it; ``None`` (the default) lets it succeed.
        setup_gate: when set to a :class:`threading.Event`, setup waits for it (with
            ``setup_entered`` set first), so a test can hold a setup mid-way.
    """

    def __init__(
        self,
        name: str = "fake",
        *,
        manages_registration: bool = True,
        takes_secret: bool = True,
        returns_secret: str | None = None,
        ledger: str | Path | None = None,
    ) -> None:
        self.name = name
        self.manages_registration = manages_registration
        self.takes_secret = takes_secret
        self.returns_secret = returns_secret
        self.ledger = Path(ledger) if ledger is not None else None
        self.calls: list[tuple[str, str]] = []
        self.secrets_seen: dict[str, str | None] = {}
        self.fail_setup: str | None = None
        self.fail_teardown: str | None = None
        self.fail_check: str | None = None
        self.setup_gate: threading.Event | None = None
        self.setup_entered = threading.Event()
        self._lock = threading.Lock()
        self._memory: dict[str, Any] = {"next": 1, "hooks": {}, "created": 0}

    # -- the "provider side" ---------------------------------------------------------------

    @contextmanager
    def _side(self) -> Iterator[dict[str, Any]]:
        """The registrations, locked (across processes too, with a ledger)."""
        with self._lock:
            if self.ledger is None:
                yield self._memory
                return
            try:
                import fcntl  # POSIX only: the package imports on Windows, a ledger does not
            except ImportError:
                raise MisuseError(
                    "FakeProvider(ledger=...) locks its file with fcntl, which this system "
                    "lacks (POSIX only): use it without a ledger"
                ) from None
            self.ledger.touch(exist_ok=True)
            with self.ledger.open("r+") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                try:
                    text = handle.read()
                    data = json.loads(text) if text else {"next": 1, "hooks": {}, "created": 0}
                    yield data
                    handle.seek(0)
                    handle.truncate()
                    handle.write(json.dumps(data))
                    handle.flush()
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)

    @property
    def hooks(self) -> dict[str, dict[str, Any]]:
        """The registrations the "provider" holds now: hook id (``str``) → url and source."""
        with self._side() as data:
            return dict(data["hooks"])

    @property
    def created(self) -> int:
        """How many registrations were ever created (a reused one is not counted again)."""
        with self._side() as data:
            return int(data["created"])

    def count(self, step: str) -> int:
        """How many times ``step`` (``"setup"``, ``"check"``, ``"teardown"``) was called."""
        with self._lock:
            return sum(1 for called, _ in self.calls if called == step)

    def _called(self, step: str, source: TriggerSource) -> None:
        with self._lock:
            self.calls.append((step, source.name))

    # -- management ------------------------------------------------------------------------

    def setup(self, source: TriggerSource, url: str, secret: str | None) -> SetupOutcome:
        """Record the call; wait on ``setup_gate`` if set; raise ``ProviderError(fail_setup)`` if
        set; else register (or update) a hook posting to ``url`` in the shared side file and
        return a ``registered`` :class:`SetupOutcome` (``manual`` when
        ``manages_registration`` is off)."""
        self._called("setup", source)
        with self._lock:
            self.secrets_seen[source.name] = secret
        if self.setup_gate is not None:
            self.setup_entered.set()
            self.setup_gate.wait(timeout=120)
        if self.fail_setup is not None:
            raise ProviderError(self.fail_setup)
        if not self.manages_registration:
            return SetupOutcome(
                status="manual",
                state=None,
                detail=f"Register {url} by hand at {self.name}.",
            )
        with self._side() as data:
            known = (source.state or {}).get("hook_id")
            if known is not None and str(known) in data["hooks"]:
                hook_id = str(known)
                data["hooks"][hook_id]["url"] = url
                detail = f"Hook {hook_id} updated to post to {url}."
            else:
                hook_id = str(data["next"])
                data["next"] += 1
                data["created"] += 1
                data["hooks"][hook_id] = {"url": url, "source": source.name}
                detail = f"Hook {hook_id} registered to post to {url}."
        return SetupOutcome(
            status="registered",
            state={"hook_id": int(hook_id)},
            detail=detail,
            secret=self.returns_secret,
        )

    def check(self, source: TriggerSource) -> SetupOutcome:
        """Record the call; the hook recorded in ``source.state`` as a ``registered``
        :class:`SetupOutcome`. Raises ``ProviderError`` when ``fail_check`` is set or the hook
        is gone."""
        self._called("check", source)
        if self.fail_check is not None:
            raise ProviderError(self.fail_check)
        known = (source.state or {}).get("hook_id")
        with self._side() as data:
            hook = data["hooks"].get(str(known))
        if hook is None:
            raise ProviderError(f"Hook {known} is gone at {self.name}")
        return SetupOutcome(
            status="registered", state=source.state, detail=f"Hook {known} posts to {hook['url']}."
        )

    def teardown(self, source: TriggerSource) -> None:
        """Record the call and delete the recorded hook (a hook already gone is success). Raises
        ``ProviderError`` when ``fail_teardown`` is set."""
        self._called("teardown", source)
        if self.fail_teardown is not None:
            raise ProviderError(self.fail_teardown)
        known = (source.state or {}).get("hook_id")
        with self._side() as data:
            data["hooks"].pop(str(known), None)

    # -- receiving -------------------------------------------------------------------------

    @staticmethod
    def sign(secret: str, body: bytes) -> str:
        """The ``X-Fake-Signature`` value of ``body`` under ``secret``."""
        return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()

    def verify(self, secret: str, body: bytes, headers: Mapping[str, str]) -> bool:
        """Whether ``X-Fake-Signature`` is :meth:`sign` of ``body`` under ``secret`` (``bool``);
        never raises for bad input."""
        given = headers.get("x-fake-signature")
        if not isinstance(given, str) or not secret:
            return False
        return hmac.compare_digest(given.encode(), self.sign(secret, body).encode())

    def parse(self, body: bytes, headers: Mapping[str, str]) -> ParsedDelivery:
        """The ``X-Fake-Event``, ``X-Fake-Delivery`` and JSON object body as a
        :class:`ParsedDelivery`; raises :class:`MalformedDelivery`."""
        return ParsedDelivery(
            event=header_value(headers, "x-fake-event", "X-Fake-Event"),
            delivery_id=header_value(headers, "x-fake-delivery", "X-Fake-Delivery"),
            payload=decode_json_object(body),
        )


@contextmanager
def installed_provider(provider: _P) -> Iterator[_P]:
    """Install ``provider`` under its name for the ``with`` block; yields it.

    Whatever was installed under that name before (a built-in provider, say) comes back
    afterwards.
    """
    previous = get_provider(provider.name)
    register_provider(provider)
    try:
        yield provider
    finally:
        if previous is not None:
            register_provider(previous)
        else:
            unregister_provider(provider.name)

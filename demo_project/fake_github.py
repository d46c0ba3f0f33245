"""A small local stand-in for GitHub's REST API: repository webhooks, kept in memory.

The demo points the ``github`` provider at it (``DJANGO_LEASES["GITHUB_API_URL"]``, from the
``DEMO_GITHUB_API_URL`` environment variable), so enabling the demo's GitHub source really
registers a hook over HTTP — and disabling it really deletes it — without the internet.

Endpoints (the subset of https://docs.github.com/rest/repos/webhooks the provider uses), each
answering as GitHub does:

=========================================  ======================================================
``GET    /repos/{owner}/{repo}/hooks``       200, the repository's hooks
``POST   /repos/{owner}/{repo}/hooks``       201 + ``Location``; 422 for a bad body. Like GitHub,
                                           it then sends a signed ``ping`` delivery to the hook
``GET    /repos/{owner}/{repo}/hooks/{id}``  200 or 404
``PATCH  /repos/{owner}/{repo}/hooks/{id}``  200 or 404 (``config``, ``events``, ``active``,
                                           ``add_events``, ``remove_events``)
``DELETE /repos/{owner}/{repo}/hooks/{id}``  204 or 404
``POST   …/hooks/{id}/pings``               204, and a ``ping`` delivery
=========================================  ======================================================

Every request needs ``Authorization: Bearer <token>`` (401 ``Bad credentials`` otherwise). A
hook's secret is echoed as ``"********"``, as GitHub does.

Run it on its own with ``python -m demo_project.fake_github --port 8765 --token T``; the tour
runs it in a thread (:class:`FakeGitHub`).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import random
import re
import threading
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_HOOKS = re.compile(r"^/repos/(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)/hooks/?$")
_HOOK = re.compile(
    r"^/repos/(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)/hooks/(?P<id>[0-9]+)(?P<pings>/pings)?/?$"
)
_ZEN = "Design for failure."


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Hook:
    """A registered hook (``secret`` is never shown in an answer)."""

    id: int
    repository: str
    events: list[str]
    active: bool
    config: dict[str, Any]
    secret: str | None
    created_at: str = field(default_factory=_now)
    updated_at: str = field(default_factory=_now)

    def as_json(self, api: str) -> dict[str, Any]:
        url = f"{api}/repos/{self.repository}/hooks/{self.id}"
        config = dict(self.config)
        if self.secret:
            config["secret"] = "********"
        return {
            "type": "Repository",
            "id": self.id,
            "name": "web",
            "active": self.active,
            "events": list(self.events),
            "config": config,
            "updated_at": self.updated_at,
            "created_at": self.created_at,
            "url": url,
            "test_url": f"{url}/test",
            "ping_url": f"{url}/pings",
            "deliveries_url": f"{url}/deliveries",
            "last_response": {"code": None, "status": "unused", "message": None},
        }


@dataclass
class Ping:
    """A ``ping`` delivery the fake sent: to which URL, and the status it got (``None``:
    unreachable)."""

    hook_id: int
    url: str
    status: int | None


class FakeGitHub:
    """The fake API server, run in a daemon thread.

    Args:
        host, port: where to listen (``port=0`` picks a free port; see :attr:`url`).
        token: the API token every request must carry (``str``).
        send_pings: send a signed ``ping`` delivery when a hook is created (as GitHub does).

    Attributes ``calls`` (``(method, path, status)`` tuples, oldest first) and ``pings``
    (:class:`Ping`) record what happened; :meth:`hooks` lists what is registered.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str = "demo-github-token",
        send_pings: bool = True,
    ) -> None:
        self.token = token
        self.send_pings = send_pings
        self.calls: list[tuple[str, str, int]] = []
        self.pings: list[Ping] = []
        self._hooks: dict[int, Hook] = {}
        # Ids start at a random point, as a real GitHub's would, so a hook id recorded by an
        # earlier run of the demo never names a hook of this one.
        self._next_id = random.randint(10_000_000, 99_000_000)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The API root, e.g. ``http://127.0.0.1:8765``."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeGitHub:
        """Serve in a daemon thread; returns ``self``."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fake-github", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()

    def hooks(self, repository: str | None = None) -> list[dict[str, Any]]:
        """The registered hooks (as the API shows them), of ``repository`` or all."""
        with self._lock:
            return [
                hook.as_json(self.url)
                for hook in self._hooks.values()
                if repository is None or hook.repository == repository
            ]

    # -- the API ---------------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "FakeGitHub/1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def _answer(
                self, status: int, body: Any = None, headers: dict[str, str] | None = None
            ) -> None:
                path = self.path.split("?", 1)[0]
                with fake._lock:
                    fake.calls.append((self.command, path, status))
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                if body is not None:
                    self.send_header("Content-Type", "application/json; charset=utf-8")
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorised(self) -> bool:
                expected = f"Bearer {fake.token}"
                given = self.headers.get("Authorization", "")
                if hmac.compare_digest(given.encode(), expected.encode()):
                    return True
                self._answer(401, {"message": "Bad credentials"})
                return False

            def _json_body(self) -> dict[str, Any] | None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._answer(400, {"message": "Problems parsing JSON"})
                    return None
                if not isinstance(body, dict):
                    self._answer(400, {"message": "Problems parsing JSON"})
                    return None
                return body

            def _route(self) -> tuple[str, int | None, bool] | None:
                path = self.path.split("?", 1)[0]
                if match := _HOOKS.match(path):
                    return match["repo"], None, False
                if match := _HOOK.match(path):
                    return match["repo"], int(match["id"]), bool(match["pings"])
                self._answer(404, {"message": "Not Found"})
                return None

            def _hook(self, repository: str, hook_id: int) -> Hook | None:
                with fake._lock:
                    hook = fake._hooks.get(hook_id)
                if hook is None or hook.repository != repository:
                    self._answer(404, {"message": "Not Found"})
                    return None
                return hook

            def do_GET(self) -> None:
                if not self._authorised() or (route := self._route()) is None:
                    return
                repository, hook_id, pings = route
                if pings:
                    self._answer(404, {"message": "Not Found"})
                elif hook_id is None:
                    self._answer(200, fake.hooks(repository))
                elif (hook := self._hook(repository, hook_id)) is not None:
                    self._answer(200, hook.as_json(fake.url))

            def do_POST(self) -> None:
                if not self._authorised() or (route := self._route()) is None:
                    return
                repository, hook_id, pings = route
                if hook_id is not None:
                    if not pings:
                        self._answer(404, {"message": "Not Found"})
                    elif (hook := self._hook(repository, hook_id)) is not None:
                        self._answer(204)
                        fake._ping_later(hook)
                    return
                body = self._json_body()
                if body is None:
                    return
                problem = _invalid(body, creating=True)
                if problem:
                    self._answer(422, {"message": "Validation Failed", "errors": [problem]})
                    return
                config = dict(body["config"])
                secret = config.pop("secret", None)
                config.setdefault("content_type", "form")
                config.setdefault("insecure_ssl", "0")
                with fake._lock:
                    fake._next_id += 1
                    hook = Hook(
                        id=fake._next_id,
                        repository=repository,
                        events=list(body.get("events") or ["push"]),
                        active=bool(body.get("active", True)),
                        config=config,
                        secret=secret,
                    )
                    fake._hooks[hook.id] = hook
                shown = hook.as_json(fake.url)
                self._answer(201, shown, {"Location": shown["url"]})
                fake._ping_later(hook)

            def do_PATCH(self) -> None:
                if not self._authorised() or (route := self._route()) is None:
                    return
                repository, hook_id, pings = route
                if hook_id is None or pings:
                    self._answer(404, {"message": "Not Found"})
                    return
                body = self._json_body()
                if body is None or (hook := self._hook(repository, hook_id)) is None:
                    return
                problem = _invalid(body, creating=False)
                if problem:
                    self._answer(422, {"message": "Validation Failed", "errors": [problem]})
                    return
                with fake._lock:
                    if "config" in body:
                        config = dict(body["config"])
                        if "secret" in config:
                            hook.secret = config.pop("secret")
                        hook.config.update(config)
                    if "events" in body:
                        hook.events = list(body["events"])
                    for event in body.get("add_events") or []:
                        if event not in hook.events:
                            hook.events.append(event)
                    for event in body.get("remove_events") or []:
                        if event in hook.events:
                            hook.events.remove(event)
                    if "active" in body:
                        hook.active = bool(body["active"])
                    hook.updated_at = _now()
                self._answer(200, hook.as_json(fake.url))

            def do_DELETE(self) -> None:
                if not self._authorised() or (route := self._route()) is None:
                    return
                repository, hook_id, pings = route
                if hook_id is None or pings:
                    self._answer(404, {"message": "Not Found"})
                    return
                if self._hook(repository, hook_id) is None:
                    return
                with fake._lock:
                    fake._hooks.pop(hook_id, None)
                self._answer(204)

        return Handler

    # -- pings -----------------------------------------------------------------------------

    def _ping_later(self, hook: Hook) -> None:
        if self.send_pings:
            threading.Thread(target=self._ping, args=(hook,), daemon=True).start()

    def _ping(self, hook: Hook) -> None:
        """POST a ``ping`` delivery to the hook's URL, signed with its secret."""
        url = str(hook.config.get("url") or "")
        body = json.dumps(
            {
                "zen": _ZEN,
                "hook_id": hook.id,
                "hook": hook.as_json(self.url),
                "repository": {"full_name": hook.repository, "name": hook.repository.split("/")[1]},
                "sender": {"login": "fake-github"},
            }
        ).encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "GitHub-Hookshot/fake",
            "X-GitHub-Event": "ping",
            "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-GitHub-Hook-ID": str(hook.id),
            "X-GitHub-Hook-Installation-Target-Type": "repository",
        }
        if hook.secret:
            digest = hmac.new(hook.secret.encode(), body, hashlib.sha256).hexdigest()
            headers["X-Hub-Signature-256"] = f"sha256={digest}"
        status: int | None
        try:
            request = urllib.request.Request(url, data=body, headers=headers, method="POST")
            with urllib.request.urlopen(request, timeout=10) as response:
                status = response.status
        except urllib.error.HTTPError as error:
            status = error.code
        except (OSError, ValueError):
            status = None
        with self._lock:
            self.pings.append(Ping(hook.id, url, status))


def _invalid(body: dict[str, Any], *, creating: bool) -> dict[str, str] | None:
    """What GitHub's validation would refuse in a create/update body, or ``None``."""
    if creating and body.get("name", "web") != "web":
        return {"resource": "Hook", "code": "invalid", "field": "name"}
    config = body.get("config")
    if creating or config is not None:
        if not isinstance(config, dict):
            return {"resource": "Hook", "code": "missing_field", "field": "config"}
        url = config.get("url")
        if creating and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
            return {"resource": "Hook", "code": "custom", "field": "url"}
        if config.get("content_type", "form") not in ("json", "form"):
            return {"resource": "Hook", "code": "invalid", "field": "content_type"}
    for name in ("events", "add_events", "remove_events"):
        value = body.get(name)
        if value is not None and (
            not isinstance(value, list) or not all(isinstance(e, str) for e in value)
        ):
            return {"resource": "Hook", "code": "invalid", "field": name}
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--token", default="demo-github-token")
    args = parser.parse_args()
    fake = FakeGitHub(args.host, args.port, token=args.token)
    print(f"Fake GitHub API on {fake.url} (token {args.token!r}); Ctrl-C stops it.", flush=True)
    try:
        fake._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        fake._server.server_close()


if __name__ == "__main__":
    main()

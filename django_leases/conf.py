"""Settings of django-leases, read lazily from ``settings.DJANGO_LEASES``.

``DJANGO_LEASES`` is an optional dict; every key has a default. Values are read on each
access, so ``override_settings`` works in tests. System check ``django_leases.E015`` reports a
key not in this table (naming the one meant, where one is close) and ``django_leases.E016`` a
value of the wrong type or range (the rules: ``checks.SETTING_RULES``). A ``DJANGO_LEASES``
that is not a dict is ignored (every key keeps its default) and reported by E015.

=============================  =========  =====================================================
key                            default    meaning
=============================  =========  =====================================================
``DEFAULT_TTL``                ``30``     seconds a ``hold_lease`` lease lives between renewals
``RENEWAL_FLOOR``              ``0.05``   shortest renewal interval, seconds (interval = TTL/3)
``MAX_TTL``                    ``31622400`` longest TTL accepted, seconds (366 days); at most
                                          ``TTL_CEILING`` (100 years), which no setting lifts
``STEP_LEASE_TTL``             ``30``     seconds a claimed workflow step's lease lives
``WORKER_POLL_INTERVAL``       ``None``   seconds an idle workflow worker waits between polls;
                                          ``None``: 1.0 on PostgreSQL (LISTEN/NOTIFY wakes it
                                          at once), 0.25 elsewhere
``WORKER_WAKEUP``              ``"auto"`` how idle workers learn of new work: ``"auto"`` LISTEN/
                                          NOTIFY on PostgreSQL unless the database sets
                                          ``DISABLE_SERVER_SIDE_CURSORS`` (a pooler in
                                          transaction mode), else polling; ``"poll"`` always poll
``WORKER_SHUTDOWN_GRACE``      ``30``     seconds a worker lets in-flight steps finish on SIGTERM
``HOLD_LEASE_KILL_GRACE``      ``10``     seconds ``manage.py hold_lease`` waits after SIGTERM
                                          before it SIGKILLs a child whose lease was lost
``WEBHOOK_MAX_BODY``           ``1048576`` largest webhook body accepted, bytes (else 413)
``MAX_EVENT_PAYLOAD``          ``1048576`` largest workflow event payload accepted, bytes of
                                          its JSON (compact, UTF-8): a larger one is refused
                                          with ``ValueError``, nothing written, by
                                          ``send_event`` and every way to send one (a
                                          ``SendEvent`` webhook handler records the refusal as
                                          the delivery's outcome). See :func:`max_event_payload`
``WEBHOOK_SECRETS``            ``{}``     source name -> signing secret; when set it wins over
                                          the encrypted credential store (for ``manual``
                                          sources whose secret comes from the environment)
``BASE_URL``                   ``None``   where the project's URLconf root is served
                                          (``https://app.example.com``): the address trigger
                                          sources are registered at. Set, every reconcile uses
                                          it (``--base-url`` still wins for that run); ``None``:
                                          the last address a reconcile was given
``SECRET_KEYS``                ``None``   Fernet keys (urlsafe base64, 32 bytes) encrypting stored
                                          secrets, newest first; ``None`` derives them from
                                          ``SECRET_KEY`` + ``SECRET_KEY_FALLBACKS`` (HKDF)
``PROVIDER_TIMEOUT``           ``10.0``   seconds a provider API call may take (connect, read)
``GITHUB_API_URL``             ``"https://api.github.com"`` GitHub REST API root (GitHub
                                          Enterprise: ``https://HOST/api/v3``)
``GITHUB_TOKEN``               ``None``   GitHub token with repository hook rights; ``None``
                                          reads the ``DJANGO_LEASES_GITHUB_TOKEN`` variable
``STRIPE_API_URL``             ``"https://api.stripe.com"`` Stripe API root
``STRIPE_API_KEY``             ``None``   Stripe secret key (``sk_…``); ``None`` reads the
                                          ``DJANGO_LEASES_STRIPE_API_KEY`` variable
``STRIPE_TOLERANCE``           ``300``    seconds a Stripe signature's timestamp may lie in the
                                          past before the delivery is refused as a replay
``STRIPE_API_VERSION``         ``None``   the ``Stripe-Version`` every Stripe API call sends;
                                          ``None``: the version the provider is written
                                          against (``providers.stripe.API_VERSION``)
``TUNED_SQL``                  ``True``   send each rule's hand-written statement where the
                                          database has one (PostgreSQL, SQLite); ``False``:
                                          the portable ORM path everywhere (same rules, more
                                          round trips; for debugging and the test suite)
``QUEUES``                     ``{}``     queue name -> ``{"concurrency": N, "rate": "N/s"}``
                                          (both optional): at most ``concurrency`` steps of
                                          the queue running across every worker, at most
                                          ``rate`` starts per second / minute / hour
                                          (``"10/s"``, ``"600/m"``, ``"3600/h"``), both
                                          cluster-wide, on the database clock; per queue
                                          key, ``key_concurrency`` and ``key_rate`` (a
                                          queue with either serves its keys round-robin).
                                          ``"default"`` is always a queue (unlimited unless
                                          listed). See :func:`queue_limits`
``PREPARED_STATEMENTS``        ``True``   have PostgreSQL prepare the worker's hot statements
                                          (outside ``atomic()``); off by itself behind a pooler
                                          that refuses them, or where the database sets
                                          ``DISABLE_SERVER_SIDE_CURSORS``
``SCHEDULES``                  ``{}``     schedule name -> ``{"workflow", "cron", "timezone",
                                          "input", "catch_up"}``: a run of the workflow per
                                          cron tick (:mod:`django_leases.workflows.schedules`;
                                          check ``django_leases.E026``)
``PRUNE``                      ``None``   prune finished runs on a cron schedule: ``{"schedule":
                                          "17 * * * *", "older_than": timedelta(days=30)}``,
                                          optionally ``"batch_size"`` (runs per transaction,
                                          default 500), ``"timezone"`` (of ``schedule``,
                                          default ``"UTC"``) and ``"queue"`` (of the prune step,
                                          default ``"default"``). The workers start one
                                          ``WorkflowRun.objects.prune`` run per tick, exactly
                                          once across them, as the built-in schedule
                                          ``django_leases.prune``; ``None``: never
                                          (:mod:`django_leases.workflows.retention`; check
                                          ``django_leases.E031``)
=============================  =========  =====================================================
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from django.conf import Settings as DjangoSettings
from django.conf import UserSettingsHolder
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from django_leases.exceptions import QueueConfigError
from django_leases.frozen import frozen

DEFAULTS: dict[str, Any] = {
    "DEFAULT_TTL": 30.0,
    "RENEWAL_FLOOR": 0.05,
    "MAX_TTL": 366 * 24 * 3600.0,
    "STEP_LEASE_TTL": 30.0,
    "WORKER_POLL_INTERVAL": None,
    "WORKER_WAKEUP": "auto",
    "WORKER_SHUTDOWN_GRACE": 30.0,
    "HOLD_LEASE_KILL_GRACE": 10.0,
    "WEBHOOK_MAX_BODY": 1024 * 1024,
    "MAX_EVENT_PAYLOAD": 1024 * 1024,
    "WEBHOOK_SECRETS": {},
    "BASE_URL": None,
    "SECRET_KEYS": None,
    "PROVIDER_TIMEOUT": 10.0,
    "GITHUB_API_URL": "https://api.github.com",
    "GITHUB_TOKEN": None,
    "STRIPE_API_URL": "https://api.stripe.com",
    "STRIPE_API_KEY": None,
    "STRIPE_TOLERANCE": 300,
    "STRIPE_API_VERSION": None,
    "TUNED_SQL": True,
    "PREPARED_STATEMENTS": True,
    "SCHEDULES": {},
    "PRUNE": None,
    "QUEUES": {},
}


_ABSENT = object()

#: The longest ``WORKER_POLL_INTERVAL`` (and ``--poll-interval``), seconds: a day. An idle
#: worker is woken by notifications; a longer wait than this is a mistake (and past what a
#: thread can wait for, an error on every idle thread).
MAX_POLL_INTERVAL = 24 * 3600.0


def _lookup_overrides() -> Any:
    """``settings.DJANGO_LEASES`` (or ``None``), read afresh on every call — override_settings
    and the settings fixture change it — but cheaply: a lease operation reads settings a few
    times and costs a few hundred microseconds, and an absent setting read through
    ``LazySettings.__getattr__`` raises and catches an exception each time. So the layers
    Django keeps settings in are looked at directly: LazySettings' own cache of what was read,
    then each ``UserSettingsHolder`` (``configure()``, ``override_settings``) down to the
    settings module or ``global_settings``; anything else takes Django's own way."""
    found = django_settings.__dict__.get("DJANGO_LEASES", _ABSENT)
    if found is not _ABSENT:
        return found
    layer: Any = django_settings.__dict__.get("_wrapped")
    for _ in range(64):  # override_settings nests; a cycle is not expected
        values = getattr(layer, "__dict__", None)
        if values is None:
            break
        if "DJANGO_LEASES" in values:
            return values["DJANGO_LEASES"]
        if type(layer) is UserSettingsHolder:
            if "DJANGO_LEASES" in layer._deleted:
                return None
            layer = layer.default_settings
            continue
        if type(layer) is DjangoSettings or isinstance(layer, ModuleType):
            return None  # read at start-up from the settings module: absent there
        break
    return getattr(django_settings, "DJANGO_LEASES", None)


class _Settings:
    """Attribute access to the ``DJANGO_LEASES`` dict, falling back to :data:`DEFAULTS`."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Unknown django-leases setting {name!r}")
        overrides = _lookup_overrides() or {}
        if not isinstance(overrides, Mapping):
            return DEFAULTS[name]  # not a dict: ignored, as check E015 reports
        return overrides.get(name, DEFAULTS[name])


leases_settings = _Settings()


# -- limits in bytes ----------------------------------------------------------------------------


def check_byte_limit(value: object, what: str) -> int:
    """``value`` if it is a number of bytes a limit may be: an ``int`` ≥ 1 (not ``bool``);
    else ``ValueError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive int (bytes), not {value!r}")
    return value


def max_event_payload() -> int:
    """``DJANGO_LEASES["MAX_EVENT_PAYLOAD"]``, read now: the largest workflow event payload
    accepted, in bytes of its JSON written compactly in UTF-8 (``int``, default 1 MiB).

    Raises:
        ImproperlyConfigured: the setting is not an ``int`` ≥ 1 (check
            ``django_leases.E016`` reports it at start-up).
    """
    try:
        return check_byte_limit(
            leases_settings.MAX_EVENT_PAYLOAD, 'DJANGO_LEASES["MAX_EVENT_PAYLOAD"]'
        )
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None


# -- queues -------------------------------------------------------------------------------------

#: The queue of a step function that names none; always known, unlimited unless configured.
DEFAULT_QUEUE = "default"

#: Longest queue name (the step's ``queue`` column).
MAX_QUEUE_LENGTH = 200

#: Seconds of each rate unit.
RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}

_RATE = re.compile(r"^\s*(\d+)\s*/\s*([smh])\s*$")
_QUEUE_KEYS = ("concurrency", "rate", "key_concurrency", "key_rate")

#: Longest queue key (``start_workflow(queue_key=)``, the step's ``queue_key`` column).
MAX_QUEUE_KEY_LENGTH = 255


@frozen
class QueueLimits:
    """One queue's limits, from ``DJANGO_LEASES["QUEUES"]``.

    Attributes:
        name: the queue.
        concurrency: at most this many of its steps running at once across every worker
            (``int`` ≥ 1), or ``None``: no limit.
        rate: the rate as written (``"10/s"``), or ``None``: no limit.
        rate_starts: at most this many starts (``int`` ≥ 1) …
        rate_window: … in any window of this many seconds (``float``: 1, 60 or 3600).
        key_concurrency: at most this many of its steps of one queue key running at once
            across every worker (``int`` ≥ 1), or ``None``: no limit.
        key_rate: the per-key rate as written (``"2/s"``), or ``None``: no limit.
        key_rate_starts: at most this many starts of one key (``int`` ≥ 1) …
        key_rate_window: … in any window of this many seconds.
    """

    name: str
    concurrency: int | None = None
    rate: str | None = None
    rate_starts: int = 0
    rate_window: float = 0.0
    key_concurrency: int | None = None
    key_rate: str | None = None
    key_rate_starts: int = 0
    key_rate_window: float = 0.0

    @property
    def keyed(self) -> bool:
        """Whether the queue has per-key limits: its keys are served round-robin and each
        key's running steps and starts are counted (DESIGN §5c)."""
        return self.key_concurrency is not None or self.key_rate is not None

    @property
    def limited(self) -> bool:
        """Whether a claim of the queue's steps must take the queue lock (a limit is set)."""
        return self.concurrency is not None or self.rate is not None or self.keyed


#: The largest count a queue limit may name (``concurrency``, ``key_concurrency``, a rate's
#: ``N``): a PostgreSQL ``integer``, as the tuned claim passes it. A larger one would be no
#: limit in practice, and the claim's statement could not take it.
MAX_QUEUE_LIMIT = 2**31 - 1


def parse_rate(value: object, what: str = "rate") -> tuple[int, float]:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` (``N`` an integer from 1 to
    :data:`MAX_QUEUE_LIMIT`) as ``(N, window seconds)``.

    Raises ``ValueError`` (naming ``what``) for anything else.
    """
    match = _RATE.match(value) if isinstance(value, str) else None
    if match is None or not 1 <= int(match.group(1)) <= MAX_QUEUE_LIMIT:
        raise ValueError(
            f'{what} must be "N/s", "N/m" or "N/h" with N an integer from 1 to '
            f'{MAX_QUEUE_LIMIT} (e.g. "10/s", "600/m"), not {value!r}'
        )
    return int(match.group(1)), RATE_UNITS[match.group(2)]


def parse_queues(value: object) -> dict[str, QueueLimits]:
    """``DJANGO_LEASES["QUEUES"]`` (``value``) as queue name -> :class:`QueueLimits`, with
    ``"default"`` always present.

    Raises ``ValueError`` with a message naming the bad part: not a dict, a name that is not
    a non-empty string of at most 200 characters, a queue's value not a dict, an unknown key,
    a ``concurrency`` that is not an integer from 1 to :data:`MAX_QUEUE_LIMIT` (``bool``
    refused), a malformed ``rate``.
    """
    what = 'DJANGO_LEASES["QUEUES"]'
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a dict of queue name -> limits, not {value!r}")
    found = {DEFAULT_QUEUE: QueueLimits(DEFAULT_QUEUE)}
    for name, limits in value.items():
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_QUEUE_LENGTH:
            raise ValueError(
                f"{what}: a queue name must be a non-empty string of at most "
                f"{MAX_QUEUE_LENGTH} characters, not {name!r}"
            )
        where = f"{what}[{name!r}]"
        if limits is None:
            limits = {}
        if not isinstance(limits, Mapping):
            raise ValueError(
                f'{where} must be a dict such as {{"concurrency": 1, "rate": "10/s"}}, '
                f"not {limits!r}"
            )
        unknown = sorted(str(key) for key in limits if key not in _QUEUE_KEYS)
        if unknown:
            raise ValueError(
                f"{where} has unknown key(s) {', '.join(unknown)}; known: {', '.join(_QUEUE_KEYS)}"
            )
        counts = {}
        for option in ("concurrency", "key_concurrency"):
            count = limits.get(option)
            if count is not None and (
                isinstance(count, bool)
                or not isinstance(count, int)
                or not 1 <= count <= MAX_QUEUE_LIMIT
            ):
                raise ValueError(
                    f'{where}["{option}"] must be an integer from 1 to {MAX_QUEUE_LIMIT} (or '
                    f"absent: no limit), not {count!r}"
                )
            counts[option] = count
        rate = limits.get("rate")
        starts, window = (0, 0.0) if rate is None else parse_rate(rate, f'{where}["rate"]')
        key_rate = limits.get("key_rate")
        key_starts, key_window = (
            (0, 0.0) if key_rate is None else parse_rate(key_rate, f'{where}["key_rate"]')
        )
        found[name] = QueueLimits(
            name,
            counts["concurrency"],
            rate,
            starts,
            window,
            counts["key_concurrency"],
            key_rate,
            key_starts,
            key_window,
        )
    return found


#: The last ``QUEUES`` value :func:`queue_limits` parsed: a deep copy of it, and what it parsed
#: to. The worker asks for the limits twice per step; parsing them each time was a tenth of a
#: middle step's CPU. The setting is still read on every call, and compared (``==``, in C for
#: the dicts it is made of) with the copy, so an override, or a dict changed in place, is
#: parsed afresh.
_parsed_queues: tuple[object, dict[str, QueueLimits]] | None = None


def queue_limits() -> dict[str, QueueLimits]:
    """The configured queues (``DJANGO_LEASES["QUEUES"]``, read now) by name, ``"default"``
    always among them (a new dict on each call).

    Raises:
        QueueConfigError: the setting is not usable (an ``ImproperlyConfigured``; check
            ``django_leases.E016`` reports it at start-up).
    """
    global _parsed_queues
    value = leases_settings.QUEUES
    parsed = _parsed_queues
    try:
        if parsed is not None and type(value) is type(parsed[0]) and value == parsed[0]:
            return dict(parsed[1])
    except Exception:  # a value whose comparison raises: parsed (and refused) below
        pass
    try:
        limits = parse_queues(value)
    except ValueError as exc:
        raise QueueConfigError(str(exc)) from None
    try:
        _parsed_queues = (copy.deepcopy(value), limits)
    except Exception:  # a mapping that cannot be copied is parsed on every call
        _parsed_queues = None
    return dict(limits)


def check_queue_names(names: object) -> list[str]:
    """The queue names a worker is told to take (``--queue``), checked against the
    configured queues; returns them, deduplicated in order (``[]``: every queue).

    Raises:
        QueueConfigError: a name is not configured (``"default"`` always is), or the
            setting itself is not usable.
    """
    known = queue_limits()
    if not isinstance(names, list | tuple):
        raise QueueConfigError(f"queues must be a list of queue names, not {names!r}")
    unknown = [str(name) for name in names if name not in known]
    if unknown:
        raise QueueConfigError(
            f"Unknown queue(s) {', '.join(map(repr, unknown))}: configure them in "
            f'DJANGO_LEASES["QUEUES"] (known: {", ".join(sorted(known))})'
        )
    return list(dict.fromkeys(str(name) for name in names))


# -- the webhooks extra -------------------------------------------------------------------------

#: The distributions ``pip install "django-leases[webhooks]"`` adds, and why: trigger sources
#: store their signing secrets encrypted (cryptography) and call the providers' APIs (httpx).
#: Nothing imports them until a trigger source uses them.
WEBHOOKS_EXTRA: dict[str, str] = {
    "cryptography": "stored signing secrets are encrypted with it",
    "httpx": "the GitHub and Stripe providers call their APIs with it",
}


@contextmanager
def webhooks_extra() -> Iterator[None]:
    """Around the import of a module that the ``webhooks`` extra installs
    (``with webhooks_extra(): import httpx``): an ``ImportError`` of it becomes an
    ``ImproperlyConfigured`` naming the extra (system check ``django_leases.E033`` says so at
    start-up for the declared sources that need it)."""
    try:
        yield
    except ImportError as exc:
        top = (exc.name or "").partition(".")[0]
        if top not in WEBHOOKS_EXTRA:
            raise
        raise ImproperlyConfigured(
            f"Trigger sources need {top}, which is not installed ({WEBHOOKS_EXTRA[top]}): "
            'pip install "django-leases[webhooks]"'
        ) from exc

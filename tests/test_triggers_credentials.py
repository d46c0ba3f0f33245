"""The encrypted credential store: round trips, keys, rotation, and secrets kept out of sight."""

from __future__ import annotations

import logging
from io import StringIO
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.contrib import admin
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command

from django_leases import checks
from django_leases.models import TriggerSecret
from django_leases.triggers import registry
from django_leases.triggers.credentials import (
    CredentialError,
    delete_secret,
    ensure_secret,
    get_secret,
    rotate_keys,
    set_secret,
    signing_secret,
)
from django_leases.triggers.registry import StartWorkflow, TriggerDeclaration, webhook_source
from tests.helpers import race

pytestmark = pytest.mark.django_db

SECRET = "whsec_plain_text_never_stored_as_is"


def _ciphertext(name: str) -> str:
    return TriggerSecret.objects.get(name=name).ciphertext


def test_a_secret_round_trips_and_is_stored_encrypted() -> None:
    assert get_secret("src") is None
    set_secret("src", SECRET)
    assert get_secret("src") == SECRET
    stored = _ciphertext("src")
    assert SECRET not in stored
    assert stored.startswith("gAAAAA")  # a Fernet token: version byte 0x80, base64
    set_secret("src", "replaced-secret")
    assert get_secret("src") == "replaced-secret"
    assert TriggerSecret.objects.count() == 1


def test_unicode_secrets_survive() -> None:
    set_secret("src", "sécret-🔑")
    assert get_secret("src") == "sécret-🔑"


def test_delete_and_deleting_nothing() -> None:
    set_secret("src", SECRET)
    delete_secret("src")
    assert get_secret("src") is None
    delete_secret("src")
    delete_secret(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", "   ", "a\nb", "x" * 4097, None, 5])
def test_unusable_secrets_are_refused_without_quoting_them(bad: Any) -> None:
    with pytest.raises(ValueError) as caught:
        set_secret("src", bad)
    if isinstance(bad, str) and bad.strip():
        assert bad not in str(caught.value)
    assert not TriggerSecret.objects.exists()


@pytest.mark.parametrize("name", ["", "x" * 201, None])
def test_unusable_names_are_refused(name: Any) -> None:
    with pytest.raises(ValueError, match="name"):
        set_secret(name, SECRET)


def test_ensure_secret_creates_once_and_then_returns_the_same() -> None:
    first = ensure_secret("src")
    assert len(first) >= 43  # 256 bits, URL-safe base64
    assert ensure_secret("src") == first == get_secret("src")
    assert ensure_secret("other") != first


def test_settings_override_the_store(settings: Any) -> None:
    set_secret("src", SECRET)
    settings.DJANGO_LEASES = {"WEBHOOK_SECRETS": {"src": "from-settings"}}
    assert signing_secret("src") == "from-settings"
    assert ensure_secret("src") == "from-settings"
    assert get_secret("src") == SECRET  # the store itself is unchanged
    assert ensure_secret("fresh") == get_secret("fresh")
    settings.DJANGO_LEASES = {}
    assert signing_secret("src") == SECRET
    assert signing_secret("missing") is None


def test_keys_derived_from_secret_key_survive_a_django_key_rotation(settings: Any) -> None:
    settings.SECRET_KEY = "old-django-secret-key-" + "x" * 40
    settings.SECRET_KEY_FALLBACKS = []
    set_secret("src", SECRET)
    old_ciphertext = _ciphertext("src")
    # Rotate Django's key the documented way: the old one moves to the fallbacks.
    settings.SECRET_KEY = "new-django-secret-key-" + "y" * 40
    settings.SECRET_KEY_FALLBACKS = ["old-django-secret-key-" + "x" * 40]
    assert get_secret("src") == SECRET
    assert rotate_keys() == 1
    assert _ciphertext("src") != old_ciphertext
    settings.SECRET_KEY_FALLBACKS = []
    assert get_secret("src") == SECRET


def test_configured_fernet_keys_and_rotation(settings: Any) -> None:
    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.DJANGO_LEASES = {"SECRET_KEYS": [old_key]}
    set_secret("a", "secret-a")
    set_secret("b", "secret-b")
    settings.DJANGO_LEASES = {"SECRET_KEYS": [new_key]}
    with pytest.raises(CredentialError) as caught:
        get_secret("a")
    assert "secret-a" not in str(caught.value) and old_key not in str(caught.value)
    settings.DJANGO_LEASES = {"SECRET_KEYS": [new_key, old_key]}
    assert rotate_keys() == 2
    settings.DJANGO_LEASES = {"SECRET_KEYS": [new_key]}
    assert (get_secret("a"), get_secret("b")) == ("secret-a", "secret-b")
    assert Fernet(new_key.encode()).decrypt(_ciphertext("a").encode()) == b"secret-a"


def test_moving_from_secret_key_to_configured_keys_loses_no_secret(settings: Any) -> None:
    """A secret stored under the keys derived from ``SECRET_KEY`` stays readable once
    ``SECRET_KEYS`` is set (those keys still decrypt, after the configured ones), and
    ``rotate_trigger_secrets`` encrypts it with the first configured key. (It could no
    longer be read: deliveries refused, ``rotate_trigger_secrets`` exiting 1.)"""
    settings.DJANGO_LEASES = {}
    set_secret("a", "secret-a")
    new_key = Fernet.generate_key().decode()
    settings.DJANGO_LEASES = {"SECRET_KEYS": [new_key]}
    assert get_secret("a") == "secret-a"
    assert rotate_keys() == 1
    assert Fernet(new_key.encode()).decrypt(_ciphertext("a").encode()) == b"secret-a"
    set_secret("b", "secret-b")  # the first configured key encrypts
    assert Fernet(new_key.encode()).decrypt(_ciphertext("b").encode()) == b"secret-b"


def test_rotation_with_an_undecryptable_secret_changes_nothing(settings: Any) -> None:
    key, lost = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.DJANGO_LEASES = {"SECRET_KEYS": [key]}
    set_secret("a", "secret-a")
    TriggerSecret.objects.create(
        name="b", ciphertext=Fernet(lost.encode()).encrypt(b"secret-b").decode()
    )
    before = {row.name: row.ciphertext for row in TriggerSecret.objects.all()}
    settings.DJANGO_LEASES = {"SECRET_KEYS": [Fernet.generate_key().decode(), key]}
    with pytest.raises(CredentialError, match="'b'") as caught:
        rotate_keys()
    assert "secret-b" not in str(caught.value)
    assert {row.name: row.ciphertext for row in TriggerSecret.objects.all()} == before


@pytest.mark.parametrize("keys", [[], "one-string", ["not-a-fernet-key"], [b"short"]])
def test_unusable_configured_keys_are_improperly_configured(settings: Any, keys: Any) -> None:
    settings.DJANGO_LEASES = {"SECRET_KEYS": keys}
    with pytest.raises(ImproperlyConfigured) as caught:
        set_secret("src", SECRET)
    assert "not-a-fernet-key" not in str(caught.value)


def test_the_rotate_command(settings: Any) -> None:
    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.DJANGO_LEASES = {"SECRET_KEYS": [old_key]}
    set_secret("a", "secret-a")
    settings.DJANGO_LEASES = {"SECRET_KEYS": [new_key, old_key]}
    out = StringIO()
    call_command("rotate_trigger_secrets", stdout=out)
    assert out.getvalue().strip() == "Re-encrypted 1 stored trigger secret with the primary key."
    assert "secret-a" not in out.getvalue()
    settings.DJANGO_LEASES = {"SECRET_KEYS": [new_key]}
    assert get_secret("a") == "secret-a"
    settings.DJANGO_LEASES = {"SECRET_KEYS": [Fernet.generate_key().decode()]}
    with pytest.raises(CommandError, match="cannot be decrypted"):
        call_command("rotate_trigger_secrets", stdout=StringIO())


def test_secrets_stay_out_of_reprs_admin_and_logs(caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    set_secret("src", SECRET)
    ensure_secret("src")
    get_secret("src")
    rotate_keys()
    row = TriggerSecret.objects.get(name="src")
    assert SECRET not in repr(row) + str(row)
    assert TriggerSecret not in admin.site._registry
    assert SECRET not in caplog.text


# -- the system check W008 with the store --------------------------------------------------------


def _known(name: str) -> bool:
    return True


def _w008(declaration: TriggerDeclaration, **kwargs: Any) -> list[str]:
    messages = checks.check_webhook_settings([declaration], {}, 1024, _known, **kwargs)
    return [m.id for m in messages]


def test_w008_looks_in_the_store() -> None:
    manual = TriggerDeclaration(name="m", provider="manual", events={})
    github = TriggerDeclaration(name="g", provider="github", events={})
    # The store cannot be read: nothing is known either way (W014, not W008).
    assert _w008(manual) == ["django_leases.W014"]
    assert _w008(github) == ["django_leases.W014"]
    # A manual source needs an operator to store its secret.
    assert _w008(manual, stored=set(), enabled=set()) == ["django_leases.W008"]
    assert _w008(manual, stored={"m"}, enabled=set()) == []
    # GitHub/Stripe get theirs at setup: only an enabled one without it is a problem.
    assert _w008(github, stored=set(), enabled=set()) == []
    assert _w008(github, stored=set(), enabled={"g"}) == ["django_leases.W008"]
    assert _w008(github, stored={"g"}, enabled={"g"}) == []


def test_w014_says_the_store_could_not_be_read_and_suggests_no_rotation() -> None:
    for provider in ("manual", "github", "stripe"):
        declaration = TriggerDeclaration(name="src", provider=provider, events={})
        (message,) = checks.check_webhook_settings(
            [declaration], {}, 1024, _known, unreadable="the store is away"
        )
        assert message.id == "django_leases.W014"
        assert message.msg.startswith(
            "Could not check whether trigger source 'src' has a signing secret: the store is away."
        )
        assert "has no signing secret" not in message.msg
        hint = (message.hint or "").lower()
        assert "migrate" in hint
        assert "disable" not in hint and "enable" not in hint and "new secret" not in hint
        # A secret from the settings needs no store: nothing to report.
        assert checks.check_webhook_settings([declaration], {"src": "s"}, 1024, _known) == []


def test_w008_registered_check_reads_the_store() -> None:
    webhook_source("checks-manual", provider="manual", events={"x": StartWorkflow("w")})
    try:
        from django.core.checks import run_checks

        def ours() -> list[str]:
            return [
                m.id
                for m in run_checks(tags=["django_leases", "database"], databases=["default"])
                if "'checks-manual'" in m.msg and m.id == "django_leases.W008"
            ]

        assert ours() == ["django_leases.W008"]
        set_secret("checks-manual", SECRET)
        assert ours() == []
    finally:
        registry.unregister("checks-manual")


@pytest.mark.django_db(transaction=True)
def test_concurrent_ensure_secret_agrees_on_one_secret() -> None:
    results = race([lambda: ensure_secret("raced")] * 6)
    assert all(isinstance(result, str) for result in results), results
    assert set(results) == {get_secret("raced")}
    assert TriggerSecret.objects.filter(name="raced").count() == 1


def test_a_provider_change_deletes_the_stored_secret_so_w008_speaks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """github → manual: the secret made for GitHub is one nobody at the new sender knows.
    Kept, it silenced W008 while every delivery got 401; the sync now deletes it."""
    from django_leases.models import TriggerSource

    github = TriggerDeclaration("switching", "github", config={"repository": "a/b"})
    TriggerSource.objects.sync([github])
    set_secret("switching", SECRET)
    set_secret("other", SECRET)
    TriggerSource.objects.sync([github])  # the same provider: kept
    assert get_secret("switching") == SECRET
    manual = TriggerDeclaration("switching", "manual")
    assert checks.check_secrets([manual], {}, {"switching", "other"}, set(), "") == []

    with caplog.at_level(logging.WARNING, logger="django_leases.triggers"):
        TriggerSource.objects.sync([manual])
    assert get_secret("switching") is None
    assert get_secret("other") == SECRET
    assert "changed provider (github → manual)" in caplog.text
    assert SECRET not in caplog.text
    stored = TriggerSecret.objects.stored_names()
    found = checks.check_secrets([manual], {}, stored, set(), "")
    assert [message.id for message in found] == ["django_leases.W008"]

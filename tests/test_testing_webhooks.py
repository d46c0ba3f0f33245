"""``django_leases.testing.enable_source`` and ``deliver``: a webhook handler tested inside
Django's ``TestCase`` (one transaction), for the GitHub, Stripe and manual providers — where
enabling a source for real refuses, and ``http://testserver`` is an address."""

from __future__ import annotations

from typing import Any

from django.core.management import call_command
from django.test import TestCase, override_settings

from django_leases.exceptions import MisuseError
from django_leases.models import TriggerEvent, TriggerRefusal, TriggerSource, WorkflowRun
from django_leases.testing import deliver, drive, enable_source
from django_leases.testing.webhooks import TEST_SECRET, signature_scheme
from django_leases.triggers import lifecycle, registry
from django_leases.triggers.registry import StartWorkflow, webhook_source
from django_leases.workflows import workflow

SOURCES = {
    "tw-github": ("github", {"repository": "acme/app"}),
    "tw-stripe": ("stripe", {}),
    "tw-manual": ("manual", {}),
    "tw-manual-stripe": ("manual", {"signature": "stripe"}),
}


@workflow("tests.webhooks.echo")
def echo(run: Any, input: dict[str, Any]) -> Any:
    return {"got": input}


class DeliverTests(TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        for name, (provider, config) in SOURCES.items():
            webhook_source(
                name,
                provider=provider,
                config=config,
                events={"ping": StartWorkflow("tests.webhooks.echo")},
            )

    @classmethod
    def tearDownClass(cls) -> None:
        for name in SOURCES:
            registry.unregister(name)
        super().tearDownClass()

    def test_each_provider_s_delivery_is_received_and_starts_its_run(self) -> None:
        for name in SOURCES:
            with self.subTest(name):
                self.assertEqual(enable_source(name), TEST_SECRET)
                response = deliver(name, "ping", {"n": 1}, delivery_id=f"d-{name}")
                self.assertEqual(response.status_code, 202, response.content)
                run = drive(response.json()["run_id"])
                assert run is not None
                payload = run.output["got"]
                self.assertEqual(payload["n"], 1)
                if signature_scheme(name) == "stripe":
                    self.assertEqual((payload["id"], payload["type"]), (f"d-{name}", "ping"))
                # The same delivery id again: a repeat, processed once.
                again = deliver(name, "ping", {"n": 1}, delivery_id=f"d-{name}")
                self.assertEqual(again.status_code, 200)
        self.assertEqual(TriggerEvent.objects.count(), len(SOURCES))
        self.assertEqual(WorkflowRun.objects.count(), len(SOURCES))
        self.assertEqual(
            {(s.name, s.enabled) for s in TriggerSource.objects.filter(name__in=SOURCES)},
            {(name, True) for name in SOURCES},
        )

    def test_a_wrong_secret_or_a_disabled_source_is_refused_as_for_real(self) -> None:
        enable_source("tw-github", secret="s3cret-of-this-test")
        self.assertEqual(deliver("tw-github", "ping", secret="another").status_code, 401)
        self.assertEqual(deliver("tw-github", "ping").status_code, 202)
        TriggerSource.objects.set_enabled("tw-github", False)
        self.assertEqual(deliver("tw-github", "ping").status_code, 404)
        self.assertEqual(
            set(TriggerRefusal.objects.values_list("reason", flat=True)),
            {"bad_signature", "not_receiving"},
        )

    def test_a_webhook_secrets_entry_is_the_secret(self) -> None:
        with override_settings(DJANGO_LEASES={"WEBHOOK_SECRETS": {"tw-stripe": "whsec_set"}}):
            self.assertEqual(enable_source("tw-stripe", secret="ignored"), "whsec_set")
            self.assertEqual(deliver("tw-stripe", "ping").status_code, 202)

    def test_bad_use_is_a_clear_error(self) -> None:
        with self.assertRaisesMessage(ValueError, "No loaded code declares"):
            enable_source("tw-nobody")
        with self.assertRaisesMessage(ValueError, "has no signing secret"):
            deliver("tw-github", "ping")
        self.assertFalse(TriggerSource.objects.filter(enabled=True).exists())

    def test_enabling_for_real_in_a_test_case_says_what_to_use(self) -> None:
        call_command("reconcile_trigger_sources", "--base-url", "http://testserver", stdout=None)
        self.assertEqual(TriggerSource.objects.get(name="tw-manual").base_url, "http://testserver")
        with self.assertRaisesMessage(MisuseError, "django_leases.testing.enable_source()"):
            lifecycle.enable("tw-manual")
        self.assertFalse(TriggerSource.objects.get(name="tw-manual").enabled)


def test_a_one_label_host_is_an_address_and_nothing_looser_is() -> None:
    from django_leases.models.trigger import check_base_url

    for url in (
        "http://testserver",
        "http://web:8000/app/",
        "https://u:p@hooks",
        "http://localhost",
    ):
        assert check_base_url(url) == url.rstrip("/")
    for url in (
        "testserver",
        "http://",
        "http://-web",
        "http://web-",
        "http://12345",
        "http://under_score",
        "http://web\n",
        "http://we\tb",
        "ftp://web",
        "http://a.b",
    ):
        try:
            check_base_url(url)
        except ValueError:
            continue
        raise AssertionError(f"{url!r} was taken as an address")

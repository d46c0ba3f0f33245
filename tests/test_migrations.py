from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_models_and_migrations_agree() -> None:
    out = StringIO()
    try:
        call_command("makemigrations", "django_leases", "--check", "--dry-run", stdout=out)
    except SystemExit as exc:  # --check exits 1 when a migration would be created
        pytest.fail(f"makemigrations would create a migration:\n{out.getvalue()}")
        raise AssertionError from exc

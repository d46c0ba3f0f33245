"""Settings of the demo project, read from the environment with django-environ.

``DATABASE_URL`` picks the database (default: ``sqlite:///demo.sqlite3`` beside manage.py);
``postgres://postgres@127.0.0.1:5432/demo`` runs it on PostgreSQL,
``mysql://root@127.0.0.1:3306/demo`` on MariaDB / MySQL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import environ  # type: ignore[import-untyped]

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, False),
    SECRET_KEY=(str, "demo-insecure-secret-key-change-me"),
    ALLOWED_HOSTS=(list, ["127.0.0.1", "localhost", "testserver"]),
)

DEBUG = env("DEBUG")
SECRET_KEY = env("SECRET_KEY")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_leases",
    "demo_project.journal",
    "demo_project.previews",
    "demo_project.shop",
    "demo_project.reviews",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "demo_project.urls"
WSGI_APPLICATION = "demo_project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def database_from_url(url: str) -> dict[str, Any]:
    """A ``DATABASES`` entry for ``url``; SQLite and MariaDB / MySQL get the settings leases
    need.

    SQLite: IMMEDIATE transactions (``select_for_update()`` is a no-op there, so the write
    lock taken at BEGIN is what serialises read-decide-write), a 20 s busy timeout and WAL.
    """
    config: dict[str, Any] = environ.Env.db_url_config(url)
    if config["ENGINE"] == "django.db.backends.mysql":
        # MariaDB / MySQL: four-byte UTF-8, READ COMMITTED (Django's default, said out loud:
        # the guarded re-reads need the latest committed row) and strict mode (a value that
        # does not fit is an error, never truncated).
        config.setdefault("OPTIONS", {}).update(
            {
                "charset": "utf8mb4",
                "isolation_level": "read committed",
                "init_command": "SET sql_mode = 'STRICT_TRANS_TABLES'",
            }
        )
    if config["ENGINE"] == "django.db.backends.sqlite3":
        config.setdefault("OPTIONS", {}).update(
            {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            }
        )
    return config


DATABASES = {
    "default": database_from_url(
        env("DATABASE_URL", default="") or f"sqlite:///{BASE_DIR / 'demo.sqlite3'}"
    )
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
USE_I18N = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_leases": {
            "handlers": ["console"],
            "level": env("LEASES_LOG_LEVEL", default="INFO"),
        },
        "demo_project": {"handlers": ["console"], "level": "INFO"},
    },
}

DJANGO_LEASES = {
    # An override of the credential store: github-pushes signs with this secret
    # (DEMO_GITHUB_WEBHOOK_SECRET changes it) instead of one generated when it is enabled.
    # stripe-orders' secret is stored encrypted with `trigger_sources set-secret`.
    "WEBHOOK_SECRETS": {
        "github-pushes": env("DEMO_GITHUB_WEBHOOK_SECRET", default="demo-webhook-secret")
    },
    # The shop's receipts (demo_project/shop/tasks.py) go out one at a time, whichever worker
    # thread takes them: the limit is decided in the claim, on the database.
    "QUEUES": {"mail": {"concurrency": 1}},
    # A per-second schedule (six fields, seconds first) of the journal's `demo-tick` workflow.
    # The tour keeps it paused but for its last stage. Declared here rather than on the
    # @workflow, so code that reuses the demo's apps without its settings (the test suite)
    # gets no schedule firing every second. Every tick starts its run ("allow"), even one
    # that comes while the last tick's run is still live: the tour counts one run per tick.
    "SCHEDULES": {
        "demo-tick": {
            "workflow": "demo-tick",
            "cron": "* * * * * *",
            "catch_up": "none",
            "overlap": "allow",
        }
    },
}
# Django's Tasks framework runs on the workflow workers (django.tasks on Django 6, the
# django-tasks backport on Django 5.2: the `demo` extra installs it).
TASKS = {
    "default": {
        "BACKEND": "django_leases.tasks.TaskBackend",
        "QUEUES": ["default", "mail"],
    }
}
# The tour runs its workers with a short step lease (DEMO_STEP_LEASE_TTL, seconds) so a paused
# worker's step is taken over within seconds; unset, the library's default applies.
if env("DEMO_STEP_LEASE_TTL", default=""):
    DJANGO_LEASES["STEP_LEASE_TTL"] = env.float("DEMO_STEP_LEASE_TTL")
# The tour's local fake of GitHub's API (demo_project/fake_github.py); the token comes from
# DJANGO_LEASES_GITHUB_TOKEN.
if env("DEMO_GITHUB_API_URL", default=""):
    DJANGO_LEASES["GITHUB_API_URL"] = env("DEMO_GITHUB_API_URL")

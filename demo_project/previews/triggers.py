"""The demo's trigger source: GitHub pushes to one repository start a preview build.

The signing secret is ``DJANGO_LEASES["WEBHOOK_SECRETS"]["github-pushes"]`` in the demo
settings (from ``DEMO_GITHUB_WEBHOOK_SECRET``). The source receives nothing until
``manage.py reconcile_trigger_sources`` has synced it and an operator enables it.
"""

from django_leases.triggers import StartWorkflow, webhook_source

github_pushes = webhook_source(
    "github-pushes",
    provider="github",
    config={"repository": "octo-org/octo-repo"},
    events={"push": StartWorkflow("build-preview")},
)

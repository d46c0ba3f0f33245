"""The task chaos test's task backend, in one place for the workers' settings
(``tests/chaosapp/settings.py``) and the test process (which enqueues under
``override_settings``): attempts enough for any chaos, no retry delay. Importable before
the apps are ready."""

#: The backend's alias in ``TASKS``.
TASK_BACKEND = "chaos"
#: Its ``TASKS`` entry.
TASK_BACKEND_SETTINGS = {
    "BACKEND": "django_leases.tasks.TaskBackend",
    "QUEUES": ["default"],
    "OPTIONS": {"retries": 50, "retry_delay": 0},
}

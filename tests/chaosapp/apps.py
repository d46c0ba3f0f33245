from django.apps import AppConfig


class ChaosAppConfig(AppConfig):
    """The chaos test app: counts ``task_finished`` in every worker process from start-up
    (whichever process ends a task's run, it may never have run a task itself)."""

    name = "tests.chaosapp"

    def ready(self) -> None:
        from django_leases.tasks_api import task_finished
        from tests.chaosapp.tasks import count_finished

        task_finished.connect(count_finished, dispatch_uid="tests.chaosapp.count_finished")

from django.contrib import admin

from demo_project.journal.models import Digest, StepExecution


@admin.register(StepExecution)
class StepExecutionAdmin(admin.ModelAdmin):
    list_display = ("started_at", "workflow", "step_name", "attempt", "worker", "outcome", "run_id")
    list_filter = ("outcome", "workflow", "step_name")
    search_fields = ("run_id",)

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(Digest)
class DigestAdmin(admin.ModelAdmin):
    list_display = ("name", "runs_completed", "runs_running", "token", "holder", "updated_at")

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

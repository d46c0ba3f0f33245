from django.contrib import admin

from demo_project.previews.models import PreviewBuild, PreviewComment


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(PreviewBuild)
class PreviewBuildAdmin(ReadOnly):
    list_display = ("written_at", "repository", "ref", "sha", "build_id", "attempt", "written_by")
    search_fields = ("run_id", "repository", "sha", "build_id")


@admin.register(PreviewComment)
class PreviewCommentAdmin(ReadOnly):
    list_display = ("written_at", "repository", "commit", "url", "attempt", "written_by")
    search_fields = ("run_id", "repository", "commit")

"""The run list's operations on the selected runs, and the run page's fork (DESIGN §5c).

:class:`RunOperatorActions` is mixed into the run admin
(:class:`~django_leases.admin.workflows.WorkflowRunAdmin`). Its three list actions —
**resume**, **cancel** and **retry** (every failed step of each run) — need the
``operate_workflowrun`` permission and call
``WorkflowRun.objects...operate_each(operation)``: each run in a transaction of its own, a
``LogEntry`` for each run changed, and a message for each run (up to
:data:`MESSAGES_PER_RUN` runs; past that, one summary and the first refusals).
:meth:`RunOperatorActions.fork_from_form` is the run page's "Fork from step" form
(``WorkflowRun.objects.fork``); the list action *Fork the selected runs from their failed
step* forks each from the step that failed it (``WorkflowRun.objects.fork_from_failed``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_leases.admin.base import AdminMixinOf
from django_leases.exceptions import UnknownWorkflowError
from django_leases.models import WorkflowRun
from django_leases.workflows.registry import get_workflow
from django_leases.workflows.values import RunChange, StepStatus, status_said

#: With more selected runs than this, the outcome is one summary message, not one per run.
MESSAGES_PER_RUN = 10
#: Refusals named one by one in a summary.
REFUSALS_SHOWN = 5


class RunOperatorActions(AdminMixinOf[WorkflowRun]):
    """List actions on the selected runs, and the fork form of a run's page."""

    def said(self, change: RunChange) -> str:
        """How a change is said to the operator (the run admin words it)."""
        return str(change)

    @admin.action(description=_("Resume the selected runs"), permissions=["operate"])
    def resume_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        """Resume each selected suspended or failed run (``WorkflowRun.objects.resume``)."""
        self._operate_selected(request, queryset, "resume")

    @admin.action(description=_("Cancel the selected runs"), permissions=["operate"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        """Cancel each selected running or suspended run (``WorkflowRun.objects.cancel``)."""
        self._operate_selected(request, queryset, "cancel")

    @admin.action(
        description=_("Retry the failed steps of the selected runs"), permissions=["operate"]
    )
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        """Run every failed step of each selected run again (``WorkflowRun.objects.retry``)."""
        self._operate_selected(request, queryset, "retry")

    @admin.action(
        description=_("Fork the selected runs from their failed step"), permissions=["operate"]
    )
    def fork_runs(self, request: HttpRequest, queryset: QuerySet[WorkflowRun]) -> None:
        """Fork each selected run from the step that failed it
        (``WorkflowRun.objects.fork_from_failed``): a history entry on each run forked."""
        forked, refused = 0, []
        selected = list(queryset.order_by("created_at", "id"))
        for run in selected:
            try:
                get_workflow(run.workflow)  # as fork_run: only a workflow this code runs
                fork = WorkflowRun.objects.fork_from_failed(run.pk)
            except (ValueError, UnknownWorkflowError, WorkflowRun.DoesNotExist) as exc:
                refused.append(str(exc))
                continue
            forked += 1
            self.log_change(request, run, f"Forked from its failed step as run {fork.pk}")
        if forked:
            self.message_user(
                request,
                ngettext("%(count)d run forked.", "%(count)d runs forked.", forked)
                % {"count": forked},
                messages.SUCCESS,
            )
        if len(selected) > MESSAGES_PER_RUN:
            self._say_refused(request, refused)
            return
        for refusal in refused:  # each run left alone, named by its refusal
            self.message_user(
                request, gettext("Not forked: %(error)s.") % {"error": refusal}, messages.ERROR
            )

    def _operate_selected(
        self, request: HttpRequest, queryset: QuerySet[WorkflowRun], operation: str
    ) -> None:
        outcomes = queryset.operate_each(operation)  # type: ignore[attr-defined]
        runs = {
            run.pk: run for run in WorkflowRun.objects.filter(pk__in=[o.run_id for o in outcomes])
        }
        changed = [o for o in outcomes if o.change is not None]
        refused = [o for o in outcomes if o.refused]
        along = [o for o in outcomes if o.with_run is not None]
        for outcome in outcomes:
            run = runs.get(outcome.run_id)
            if run is None:
                continue
            if outcome.change is not None:
                self.log_change(request, run, str(outcome.change))
            elif outcome.with_run is not None:
                self.log_change(request, run, f"Cancelled with run {outcome.with_run}")
        if len(outcomes) <= MESSAGES_PER_RUN:
            for outcome in outcomes:
                if outcome.change is not None:
                    self.message_user(request, self.said(outcome.change), messages.SUCCESS)
                elif outcome.with_run is not None:
                    self.message_user(
                        request,
                        gettext("Run %(run)s: cancelled with run %(with)s.")
                        % {"run": outcome.run_id, "with": outcome.with_run},
                        messages.SUCCESS,
                    )
                else:
                    self.message_user(
                        request,
                        gettext("Nothing changed: %(error)s.") % {"error": outcome.refusal},
                        messages.ERROR,
                    )
            return
        if changed:
            after = Counter(
                status_said(str(o.change.after)) for o in changed if o.change is not None
            )
            self.message_user(
                request,
                ngettext("%(count)d run changed", "%(count)d runs changed", len(changed))
                % {"count": len(changed)}
                + " ("
                + ", ".join(f"{status}: {count}" for status, count in sorted(after.items()))
                + ").",
                messages.SUCCESS,
            )
        if along:
            self.message_user(
                request,
                ngettext(
                    "%(count)d more run was cancelled with a run it belongs to.",
                    "%(count)d more runs were cancelled with runs they belong to.",
                    len(along),
                )
                % {"count": len(along)},
                messages.SUCCESS,
            )
        self._say_refused(request, [str(o.refusal) for o in refused])

    def _say_refused(self, request: HttpRequest, refusals: list[str]) -> None:
        """One message for the runs an action left alone (``refusals``: why, one per run):
        how many, and the first :data:`REFUSALS_SHOWN` reasons; none when there are none."""
        if not refusals:
            return
        self.message_user(
            request,
            ngettext(
                "%(count)d run refused; nothing changed there: %(first)s",
                "%(count)d runs refused; nothing changed there: %(first)s",
                len(refusals),
            )
            % {
                "count": len(refusals),
                "first": "; ".join(refusals[:REFUSALS_SHOWN])
                + ("…" if len(refusals) > REFUSALS_SHOWN else ""),
            },
            messages.ERROR,
        )

    def fork_from_form(self, request: HttpRequest, run: WorkflowRun) -> WorkflowRun | None:
        """Fork ``run`` from the step named in the form (``step``): the new run, logged on
        both runs; ``None`` with an error message when refused (nothing written)."""
        step_name = request.POST.get("step", "")
        try:
            get_workflow(run.workflow)  # as fork_run: only a workflow this code runs
            fork = WorkflowRun.objects.fork(run.pk, step_name)
        except (ValueError, UnknownWorkflowError, WorkflowRun.DoesNotExist) as exc:
            self.message_user(
                request, gettext("Nothing forked: %(error)s.") % {"error": exc}, messages.ERROR
            )
            return None
        self.log_change(request, run, f"Forked from step {step_name!r} as run {fork.pk}")
        self.log_addition(request, fork, f"Forked from run {run.pk} at step {step_name!r}")
        self.message_user(
            request,
            gettext("Run %(fork)s forked from step %(step)s of run %(run)s.")
            % {"fork": fork.pk, "step": step_name, "run": run.pk},
            messages.SUCCESS,
        )
        return fork

    #: Step names the fork form offers (the run's latest; any other may be typed).
    FORK_STEPS_SHOWN = 200

    def operator_context(self, run: WorkflowRun) -> dict[str, Any]:
        """What the run page's fork form offers: the names of the run's latest
        :data:`FORK_STEPS_SHOWN` steps, oldest first (the form takes any name typed)."""
        names = list(
            run.steps.exclude(status=StepStatus.PATCH)
            .order_by("-id")
            .values_list("step_name", flat=True)[: self.FORK_STEPS_SHOWN]
        )
        return {"fork_steps": names[::-1]}


__all__ = ["MESSAGES_PER_RUN", "RunOperatorActions"]

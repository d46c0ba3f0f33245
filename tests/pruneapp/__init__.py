"""Settings for the worker processes of ``test_workflow_prune_schedule`` (no app: the prune
workflow is built in)."""

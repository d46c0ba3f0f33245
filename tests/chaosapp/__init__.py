"""A test app for the workflow chaos acceptance test (``tests/test_workflow_chaos.py``).

Worker subprocesses run with ``DJANGO_SETTINGS_MODULE=tests.chaosapp.settings``, which adds
this app to ``INSTALLED_APPS`` so its ``workflows.py`` is imported at start-up.
"""

"""A tiny Django app for ``bench/workflows.py``: the no-op work every contender runs.

``settings`` configures one project with every contender installed side by side (same
database, same connection settings); ``workflows`` registers ours' one-step no-op workflow and
``tasks`` the peers' no-op tasks. Only public APIs of each library are used.
"""

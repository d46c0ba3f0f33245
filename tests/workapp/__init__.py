"""Workflows every process of the suite registers (this app is in the test settings), for the
tests that run workers and commands as child processes."""

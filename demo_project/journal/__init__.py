"""What each of the demo's step functions did: which worker ran which attempt, and whether the
attempt's own write landed or was refused as stale (see :mod:`demo_project.journal.fencing`)."""

"""The squashed migration ``0001_squashed_0030_first_release`` as the package held it before
``0001_squashed_0043_first_release`` took its place: ``tests/test_migrations.py`` migrates a
database with it (``MIGRATION_MODULES``), as a checkout of that time did, and upgrades it."""

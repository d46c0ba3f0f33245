"""A test app whose worker processes fire a per-second schedule (``test_schedule_workers``)."""

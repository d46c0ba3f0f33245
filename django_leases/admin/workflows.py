"""Admin for workflows (registered on import)."""

"""Admin for triggers (registered on import)."""

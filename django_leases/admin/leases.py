"""Admin for leases (registered on import)."""

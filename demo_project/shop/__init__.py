"""The demo shop: a paid Stripe order reserves stock and records its receipt."""

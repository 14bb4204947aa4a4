"""flora.backends."""

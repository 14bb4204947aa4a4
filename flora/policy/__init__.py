"""flora.policy."""

"""flora.validation."""

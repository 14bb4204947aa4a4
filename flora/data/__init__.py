"""flora.data."""

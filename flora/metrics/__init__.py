"""flora.metrics."""

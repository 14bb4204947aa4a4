"""flora.curate."""

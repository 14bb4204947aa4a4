"""flora.caption."""

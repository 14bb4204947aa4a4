"""flora.segment."""

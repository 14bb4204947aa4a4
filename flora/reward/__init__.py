"""flora.reward."""

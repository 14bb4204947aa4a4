"""flora.report: self-contained HTML reports per run and per episode."""

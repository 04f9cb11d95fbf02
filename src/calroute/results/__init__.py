"""What a run produces: the per-request record schema, run metrics (goodput, percentiles), tables."""

"""Workloads: seeded arrival processes, the synthetic workload families (the paper's, and the ones with prompt
reuse), the trace loaders, prompt token ids from block ids and the unbounded-cache reuse ceiling."""

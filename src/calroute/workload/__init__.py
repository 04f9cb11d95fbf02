"""Workloads: seeded arrival processes, the synthetic workload families and the trace loaders."""

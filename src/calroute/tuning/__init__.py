"""Tuning a policy's declared parameters on the calibrated simulator (`calroute tune`, docs/tuning.md).

config: what a study is (policy, workload, shape, seeds, rates, search space) and the key a stored study is
checked against; jobs: the picklable work items an executor runs (one simulated run, one saturation
search); study: the Optuna study, batch by batch through an executor, resumable; validation: hand-set
against tuned on held-out seeds and on every family; output: the params file and its report.
"""

"""`calroute calibrate`: measure a live cluster and fit the curves the router prices with.

``fit`` turns samples into curves (pure numpy), ``measure`` takes the samples from a running cluster
(async HTTP), ``run`` ties them together and applies the documented SLO rule (``derive_calibration``).
"""

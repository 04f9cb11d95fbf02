"""The router the simulator and the proxy share: predictor, policy, ledger, decision log, build."""

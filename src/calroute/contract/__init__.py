"""The contract with vLLM: what calroute sends a vLLM engine and reads from it.

The NixlConnector handoff bodies (handoff.py), KV events on the wire (kv_events.py), vLLM's blocks and the
translation of its block hashes (blocks.py), the metric names the proxy and the calibration read
(metrics.py), and the interface through which the proxy gets a prompt's token ids (tokenizer.py). The
proxy stands on this package and never on the emulator, which implements the same contract as a test
double.
"""

"""A vLLM-compatible engine emulator: a test double and a demo. The proxy never imports it; what both share
is the contract with vLLM (contract/)."""

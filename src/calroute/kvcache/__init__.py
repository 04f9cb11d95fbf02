"""An engine's KV cache as vLLM's block pool keeps it: the simulator's and the emulator's one model."""

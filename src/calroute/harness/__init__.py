"""The live harness: deterministic token-id prompts, the open-loop load generator, and the correctness gates
(token-count contract, greedy equivalence, warm-up of every prefill x decode pair, prefix-cache reset) that
the paper's protocol runs before any measurement."""

"""Tests of the live harness: prompts, the load generator, the correctness gates."""

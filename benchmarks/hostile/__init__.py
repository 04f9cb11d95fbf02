"""The parts of benchmarks/attack.py, whose docstring describes the run: the attacking clients (clients.py,
the attacker process) and the engine that answers badly (engine.py)."""

"""The parts of benchmarks/proxy_overhead.py, whose docstring describes the method: its parameters
(method), the client, the statistics, the CPU accounting, the processes under test (bench), the phases
and the report."""

"""The calroute command line (app.py assembles the commands; one module per command group)."""

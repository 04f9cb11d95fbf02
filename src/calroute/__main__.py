"""`python -m calroute` runs the command line (how launchers start emulated engines)."""

from calroute.cli.app import main

main()

"""`python -m calroute` runs the command line (how launchers start emulated engines)."""

from calroute.cli.app import main

if __name__ == "__main__":
    main()

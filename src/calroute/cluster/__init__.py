"""The cluster file (the engines a proxy routes to) and the launchers of emulated or real vLLM engines."""

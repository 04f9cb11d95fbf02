"""Launchers for real and emulated inference engines, stopped by process group."""

"""One seed per run, from which every random stream derives by name (stable across processes and runs)."""

from __future__ import annotations

import zlib


def derive_seed(seed: int, stream: str) -> int:
    """A 32-bit seed for the named stream of a run; unlike hash(), stable across interpreter runs."""
    return zlib.crc32(f"{seed}:{stream}".encode())

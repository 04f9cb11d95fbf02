"""One seed per run, from which every random stream derives by name (stable across processes and runs)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass


def derive_seed(seed: int, stream: str) -> int:
    """A 32-bit seed for the named stream of a run; unlike hash(), stable across interpreter runs."""
    return zlib.crc32(f"{seed}:{stream}".encode())


@dataclass(frozen=True)
class RouterSeeds:
    """The seeds of the router's random streams: the seeded policies' (random, power_of_two; None leaves
    them their own default) and the injected prediction error's."""

    policy: int | None = None
    predictor: int = 0

    @classmethod
    def of_run(cls, seed: int) -> RouterSeeds:
        """A run's streams, derived from its seed: the simulator's runs, and the proxy of a live run (given
        the predictor's seed on its command line)."""
        return cls(policy=derive_seed(seed, "policy"), predictor=derive_seed(seed, "predictor"))

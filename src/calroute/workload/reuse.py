"""How much of a workload's prompts an unbounded prefix cache could serve: the ceiling on prefix hits.

One engine, a cache that never evicts, blocks as ``RequestSpec.prefix_blocks`` names them: a request hits the
longest leading run of its blocks that some earlier request (by arrival) already had. Unlike a real engine
(and the simulator's BlockCache) the last prompt token need not be computed, and a request hits blocks an
earlier one is still prefilling. A routing policy's prefix hit ratio on a cluster is at most this.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from calroute.types import PREFIX_BLOCK_TOKENS, RequestSpec


@dataclass(frozen=True)
class ReuseStats:
    requests: int
    prompt_tokens: int
    blocks: int  # named (full) blocks over all requests
    hit_blocks: int  # of them, leading blocks an earlier request had

    @property
    def hit_ratio(self) -> float:
        """Share of all prompt tokens in hit blocks."""
        return self.hit_blocks * PREFIX_BLOCK_TOKENS / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def block_hit_ratio(self) -> float:
        """Share of the named blocks that hit (the tokens past the last full block left out)."""
        return self.hit_blocks / self.blocks if self.blocks else 0.0


def unbounded_reuse(requests: Iterable[RequestSpec]) -> ReuseStats:
    """Prefix reuse of ``requests`` on one engine with an unbounded cache (see the module docstring)."""
    seen: set[int] = set()
    n = prompt_tokens = blocks = hit_blocks = 0
    for r in sorted(requests, key=lambda r: r.arrival_s):
        run = 0
        for b in r.prefix_blocks:
            if b not in seen:
                break
            run += 1
        seen.update(r.prefix_blocks)
        n += 1
        prompt_tokens += r.prompt_tokens
        blocks += len(r.prefix_blocks)
        hit_blocks += run
    return ReuseStats(n, prompt_tokens, blocks, hit_blocks)


def unbounded_hit_ratio(requests: Iterable[RequestSpec]) -> float:
    """The share of all prompt tokens an unbounded cache on one engine would serve (``unbounded_reuse``)."""
    return unbounded_reuse(requests).hit_ratio

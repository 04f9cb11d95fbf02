"""Prompt length at admission: exact for ids, learnt for text."""

from __future__ import annotations

from calroute.proxy.prompt_length import PromptLength


def test_prompt_length_counts_ids_exactly_and_learns_the_text_ratio() -> None:
    pl = PromptLength(chars_per_token=4.0, decay=0.5)
    assert pl.estimate({"prompt": [5, 6, 7]}) == (3, None)
    assert pl.estimate({"prompt": "x" * 400}) == (100, 400)
    for _ in range(20):
        pl.learn(400, 200)  # the engine says 2 characters per token
    assert pl.estimate({"prompt": "x" * 400})[0] == 200
    tokens, chars = pl.estimate({"messages": [{"role": "user", "content": "hello"}]})
    assert tokens >= 1 and chars is not None and chars > 5

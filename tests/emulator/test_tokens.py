"""The emulator's model: its greedy tokens and prompt texts are pinned (every emulated run's output is)."""

from __future__ import annotations

from calroute.emulator import tokens


def test_fixed_values_do_not_drift() -> None:
    assert [tokens.next_token(12345, i) for i in range(6)] == [2358, 1633, 1224, 3934, 249, 2599]
    assert tokens.text_of_tokens(3, salt=1) == " viv bab jej"


def test_a_text_of_n_tokens_encodes_to_n_tokens() -> None:
    for n in (0, 1, 17, 300):
        assert len(tokens.encode(tokens.text_of_tokens(n, salt=n))) == n + 1  # and the BOS

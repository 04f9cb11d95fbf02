"""The emulator's model: its greedy tokens and prompt texts are pinned (every emulated run's output is), and
its tokenizer is what it serves."""

from __future__ import annotations

import aiohttp

from calroute.contract.tokenizer import TokenizeError
from calroute.emulator import tokens
from calroute.emulator.api import EmulatorTokenizer
from calroute.emulator.group import RunningEngine
from calroute.types import Role
from tests.emulator.emulated import run_group
from tests.tokenizer.corpus import corpus


def test_fixed_values_do_not_drift() -> None:
    assert [tokens.next_token(12345, i) for i in range(6)] == [2358, 1633, 1224, 3934, 249, 2599]
    assert tokens.text_of_tokens(3, salt=1) == " viv bab jej"


def test_a_text_of_n_tokens_encodes_to_n_tokens() -> None:
    for n in (0, 1, 17, 300):
        assert len(tokens.encode(tokens.text_of_tokens(n, salt=n))) == n + 1  # and the BOS


def test_the_emulators_tokenizer_is_what_it_serves_on_the_parity_corpus() -> None:
    """The corpus of tests/tokenizer (every form of text and chat): EmulatorTokenizer's ids are the emulator's
    /tokenize ids and its ``usage.prompt_tokens``, for every body it reads; the bodies it does not read
    (content forms the emulator does not know) the emulator refuses too."""
    tok = EmulatorTokenizer()

    async def test(engines: list[RunningEngine], s: aiohttp.ClientSession) -> None:
        (e,) = engines
        wrong: list[str] = []
        read = 0
        for case_id, case in corpus():
            chat = "messages" in case
            body = {**case, "model": "emulated", "max_tokens": 1}
            try:
                ids: list[int] | None = tok.prompt_ids(body, chat)
            except TokenizeError:  # a content form the emulator does not read: it refuses the body too
                ids = None
            async with s.post(f"{e.url}/tokenize", json=body) as r:
                served = (await r.json()).get("tokens") if r.status == 200 else None
            async with s.post(f"{e.url}/v1/{'chat/completions' if chat else 'completions'}", json=body) as r:
                out = await r.json()
                usage = out["usage"]["prompt_tokens"] if r.status == 200 else None
            if ids is None:
                if served is not None or usage is not None:
                    wrong.append(f"{case_id}: refused by the tokenizer, not by the engine")
            else:
                read += 1
                if not (ids == served and usage == len(ids)):
                    wrong.append(case_id)
        assert wrong == []
        assert read >= 150

    run_group(test, roles=(Role.DECODE,))

"""The prefix store (tokenizer/prefix_store.py): a text sharing a prefix with one encoded before gets exactly
the ids the whole text's encode gives, with and without special tokens, on the tiny model (conftest.py) and on
pipelines laid out as real models' are; the store keeps to its memory bound, its valve turns it off on a
difference, it refuses pipelines its cut is not proven for, and truncation does not use it."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from calroute.tokenizer import HfTokenizer
from calroute.tokenizer.prefix_store import PrefixStore
from tests.tokenizer.conftest import CORPUS, MakeModel

# Llama 3's split (Qwen 2's is the same but for \p{N}): a Split then ByteLevel without its own regex
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
WORDS = (
    "the cache block prefill decode router engine token prompt model latency system user assistant "
    "tool call hash index café naïve Straße 中文 русский 😀 🚀 don't we'll 123 4567 x1 <s> </s> <pad> "
    "<|user|> <|assistant|> </s <s"
).split()
SEPARATORS = (" ", " ", " ", "  ", "\n", "\n\n", "\t", ", ", ". ", ".\n", "   \n  ", "")


def prose(rng: random.Random, words: int) -> str:
    return "".join(rng.choice(WORDS) + rng.choice(SEPARATORS) for _ in range(words))


def rust_tokenizer(
    pre: Any, post: Any, normalizer: Any = None, added: list[AddedToken] | None = None
) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    if added:
        tok.add_special_tokens(added)
    if post is not None:
        tok.post_processor = post
    return tok


BOS_EOS = processors.TemplateProcessing(
    single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1", special_tokens=[("<s>", 0), ("</s>", 1)]
)
PIPELINES: dict[str, Callable[[Tokenizer], Tokenizer]] = {
    "tiny model (ByteLevel, <s> first)": lambda rust: rust,
    "a suffix special token": lambda rust: rust_tokenizer(
        pre_tokenizers.ByteLevel(add_prefix_space=False), BOS_EOS
    ),
    "Llama 3's layout (Split, ByteLevel trimming offsets)": lambda rust: rust_tokenizer(
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        ),
        processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=True),
                processors.TemplateProcessing(
                    single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", 0)]
                ),
            ]
        ),
        added=[AddedToken("<|user|>", special=True), AddedToken("<|assistant|>", special=True)],
    ),
}


@pytest.fixture(params=list(PIPELINES), scope="module")
def pipeline(request: pytest.FixtureRequest, rust: Tokenizer) -> Tokenizer:
    return PIPELINES[request.param](rust)


def expected(tok: Tokenizer, text: str, add_special: bool) -> list[int]:
    return list(tok.encode_batch([text], add_special_tokens=add_special)[0].ids)


# ---- the ids are the whole text's -----------------------------------------------------------------------

BASE = prose(random.Random(7), 600)
# how the shared prefix P ends: the store has seen P + something else, then encodes P + S
ENDINGS = {
    "mid-word": "the cache blo",
    "mid-whitespace-run": "the cache   ",
    "a newline": "the cache\n",
    "mid-newline-run": "the cache\n\n\n",
    "a half special token": "the cache <",
    "a nearly whole special token": "the cache </s",
    "a special token": "the cache <s>",
    "an emoji": "the cache 😀",
    "mid-number": "the cache 12",
    "an apostrophe": "the cache don'",
    "a long whitespace run": "the cache" + " " * 300,
    "a long word": "the cache " + "x" * 300,
}
SUFFIXES = {
    "a word": "k prefill",
    "a space": " prefill decode",
    "spaces": "     decode\n",
    "newlines": "\n\n\nrouter",
    "punctuation": "., ; (token)",
    "unicode": "café naïve Straße 中文",
    "emoji": "😀🚀👩‍👩‍👧",
    "<s>": "<s> router",
    "s>": "s> router",
    "/s>": "/s><pad>",
    "<|user|>": "<|user|>hello</s>",
    "nothing": "",
    "long": prose(random.Random(3), 300),
}


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
@pytest.mark.parametrize("add_special", [True, False], ids=["special", "plain"])
def test_a_text_sharing_a_stored_prefix_gets_the_whole_texts_ids(
    pipeline: Tokenizer, ending: str, add_special: bool
) -> None:
    prefix = BASE + ending
    for name, suffix in SUFFIXES.items():
        store = PrefixStore(pipeline, check_every=0)  # compared here
        for seen in (prefix + "zz other tail", prefix + "\n<|assistant|>", prefix + " prefill" * 50):
            assert store.encode(seen, add_special) == expected(pipeline, seen, add_special)
        text = prefix + suffix
        assert store.encode(text, add_special) == expected(pipeline, text, add_special), name
        assert store.hits == 3, name  # served by the store (the two other tails too)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    cut=st.integers(300, 3000),
    suffix=st.lists(
        st.sampled_from(
            [*"ab x.,;!?'\n\t ", "  ", "\n\n", "é", "中", "😀", "<s>", "</s>", "<", "s>", "<|user|>", "12"]
        ),
        max_size=20,
    ).map("".join),
    add_special=st.booleans(),
)
def test_random_prefixes_and_suffixes_get_the_whole_texts_ids(
    pipeline: Tokenizer, seed: int, cut: int, suffix: str, add_special: bool
) -> None:
    rng = random.Random(seed)
    seen = prose(rng, 500)
    prefix = seen[: min(cut, len(seen))]
    store = PrefixStore(pipeline, check_every=1)
    store.encode(seen, add_special)
    for text in (prefix + suffix, prefix + suffix + prose(rng, 20), seen + suffix):
        assert store.encode(text, add_special) == expected(pipeline, text, add_special)
    assert store.mismatches == 0
    assert store.hits >= (2 if len(prefix) >= 1000 else 1)  # a short shared prefix is too short to cut


def test_conversations_growing_turn_by_turn_hit_and_match(pipeline: Tokenizer) -> None:
    rng = random.Random(11)
    store = PrefixStore(pipeline, check_every=1)
    system = "<s><|system|>" + prose(rng, 400) + "</s>\n"
    for _ in range(3):  # three conversations on one system prompt
        text = system
        for _ in range(6):
            text += "<|user|>" + prose(rng, rng.randint(1, 80)) + "</s>\n<|assistant|>"
            assert store.encode(text, False) == expected(pipeline, text, False)
            text += prose(rng, rng.randint(1, 80)) + "</s>\n"
    assert store.misses == 1
    assert store.hits == 17
    assert store.mismatches == 0


def test_the_same_text_again_is_its_stored_ids(rust: Tokenizer) -> None:
    store = PrefixStore(rust, check_every=0)
    text = BASE
    first = store.encode(text, True)
    again = store.encode(text, True)
    assert first == again == expected(rust, text, True)
    assert (store.misses, store.hits) == (1, 1)
    again.append(5)  # a caller's list is its own
    assert store.encode(text, True) == first


def test_threads_sharing_a_store_get_the_whole_texts_ids(rust: Tokenizer) -> None:
    store = PrefixStore(rust, check_every=1)
    rng = random.Random(5)
    system = prose(rng, 400)
    texts = [system + prose(rng, 50) for _ in range(80)]
    wrong: list[str] = []

    def work(part: list[str]) -> None:
        for text in part:
            if store.encode(text, True) != expected(rust, text, True):
                wrong.append(text)

    threads = [threading.Thread(target=work, args=(texts[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
    assert store.mismatches == 0
    assert store.hits >= 70


# ---- memory, the valve, what is refused -----------------------------------------------------------------


def test_the_store_keeps_to_its_characters_evicting_the_least_recently_used(rust: Tokenizer) -> None:
    rng = random.Random(2)
    texts = [f"{i:04d} " + prose(rng, 200) for i in range(30)]  # a key of its own each
    limit = 5 * max(map(len, texts))
    store = PrefixStore(rust, max_chars=limit, check_every=0)
    for text in texts:
        store.encode(text, False)
        assert store.chars <= limit
    assert store.evictions >= 30 - 5
    assert 0 < len(store) <= 5
    store.encode(texts[-1] + " again", False)  # the most recent is still there
    assert store.hits == 1
    store.encode(texts[0] + " again", False)  # the first is not
    assert store.hits == 1


def test_a_bucket_keeps_its_most_recently_used_entries(rust: Tokenizer) -> None:
    rng = random.Random(4)
    system = prose(rng, 300)
    store = PrefixStore(rust, check_every=0)
    for _ in range(20):
        store.encode(system + prose(rng, 30), False)
    assert len(store) == 8


def test_the_valve_turns_the_store_off_on_a_difference(rust: Tokenizer) -> None:
    store = PrefixStore(rust, check_every=2)
    text = BASE + " the end"
    store.encode(text, True)
    entry = next(iter(store._entries.values()))
    entry.ids[10] = (entry.ids[10] + 1) % 300  # a stored id gone wrong
    good = expected(rust, BASE + " another end", True)
    assert store.encode(BASE + " another end", True) != good  # hit 1: not checked
    assert store.encode(BASE + " a third end", True) == expected(rust, BASE + " a third end", True)  # checked
    assert (store.enabled, store.mismatches, store.checks, len(store)) == (False, 1, 1, 0)
    assert store.encode(BASE + " another end", True) == good  # whole from now on
    assert store.hits == 2 and len(store) == 0


def test_a_valve_check_that_agrees_leaves_the_store_on(rust: Tokenizer) -> None:
    store = PrefixStore(rust, check_every=1)
    for tail in ("a", "b", "c"):
        store.encode(BASE + tail, False)
    assert (store.enabled, store.checks, store.mismatches) == (True, 2, 0)


REFUSED: dict[str, Any] = {
    "a normalizer": dict(
        pre=pre_tokenizers.ByteLevel(add_prefix_space=False), post=None, normalizer=normalizers.NFC()
    ),
    "Metaspace": dict(pre=pre_tokenizers.Metaspace(), post=None),
    "ByteLevel with a prefix space": dict(pre=pre_tokenizers.ByteLevel(add_prefix_space=True), post=None),
    "an added token stripping": dict(
        pre=pre_tokenizers.ByteLevel(add_prefix_space=False),
        post=None,
        added=[AddedToken("<mask>", lstrip=True, special=True)],
    ),
}


@pytest.mark.parametrize("kw", REFUSED.values(), ids=REFUSED.keys())
def test_a_pipeline_the_cut_is_not_proven_for_is_encoded_whole(kw: dict[str, Any]) -> None:
    tok = rust_tokenizer(**kw)
    store = PrefixStore(tok)
    assert not store.supported and store.reason
    for tail in ("a", "b"):
        assert store.encode(BASE + tail, True) == expected(tok, BASE + tail, True)
    assert (store.hits, store.misses, len(store)) == (0, 0, 0)


def test_a_post_processor_with_ids_inside_the_sequence_keeps_special_texts_whole(rust: Tokenizer) -> None:
    tok = rust_tokenizer(pre_tokenizers.ByteLevel(add_prefix_space=False), None)
    tok.post_processor = processors.BertProcessing(("</s>", 1), ("<s>", 0))
    store = PrefixStore(tok)
    assert store.supported
    for tail in ("a", "b"):
        assert store.encode(BASE + tail, True) == expected(tok, BASE + tail, True)
        assert store.encode(BASE + tail + "c", False) == expected(tok, BASE + tail + "c", False)


def test_short_texts_are_not_stored(rust: Tokenizer) -> None:
    store = PrefixStore(rust)
    assert store.encode("the cache", True) == expected(rust, "the cache", True)
    assert len(store) == 0


# ---- through HfTokenizer --------------------------------------------------------------------------------


def chat(system: str, user: str, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        **extra,
    }


def test_hf_chats_on_one_system_prompt_hit_the_store_with_the_same_ids(model_dir: Path) -> None:
    tok, plain = (
        HfTokenizer(model_dir, prefix_store_check_every=1),
        HfTokenizer(model_dir, prefix_store_chars=0),
    )
    assert plain.prefix_store is None
    store = tok.prefix_store
    assert store is not None and store.supported
    rng = random.Random(9)
    system = prose(rng, 300)
    for special in (False, True, False, True):
        body = chat(system, prose(rng, 40), add_special_tokens=special)
        assert tok.prompt_ids(body, chat=True) == plain.prompt_ids(body, chat=True)
        completion = {"prompt": system + prose(rng, 10)}
        assert tok.prompt_ids(completion, chat=False) == plain.prompt_ids(completion, chat=False)
    assert store.hits >= 6 and store.mismatches == 0


def test_hf_truncation_does_not_use_the_store(make_tok: MakeModel) -> None:
    tok = make_tok()
    store = tok.prefix_store
    assert store is not None
    rng = random.Random(1)
    system = prose(rng, 300)
    for side in (None, "left", "right"):
        body = chat(system, prose(rng, 20), truncate_prompt_tokens=50)
        if side is not None:
            body["truncation_side"] = side
        assert len(tok.prompt_ids(body, chat=True)) == 50
    assert (store.hits, store.misses, len(store)) == (0, 0, 0)


def test_hf_refuses_a_negative_store_size(make_tok: MakeModel) -> None:
    from calroute.errors import ConfigError

    with pytest.raises(ConfigError):
        make_tok(prefix_store_chars=-1)

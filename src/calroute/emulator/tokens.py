"""The emulator's tokenizer and its "model": deterministic, so greedy output is identical on every engine.

Text is split into pieces of at most four characters (a leading space stays with its word, as in BPE
vocabularies), and each piece hashes to a token id: about one token per 3-4 characters of English. Chat
messages go through a fixed template first. The model's next token at output position i is a hash of the
prompt's token ids and i, and the end-of-sequence token comes out at a fixed rate; both depend only on the
prompt, never on the engine, the batch or the time.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence

from calroute.splitmix import hash64

VOCAB_SIZE = 4096
BOS_ID = 0
EOS_ID = 1
PAD_ID = 2
_FIRST_ID = 3
# One in EOS_EVERY positions yields EOS (without ignore_eos, outputs average a few hundred tokens).
EOS_EVERY = 512

_PIECE = re.compile(r"\s?[^\s]{1,4}|\s+")
_SYLLABLES = tuple(c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou")


def _piece_text(token_id: int) -> str:
    """A readable piece for an output token: a space and one or two syllables."""
    n = token_id - _FIRST_ID
    s = len(_SYLLABLES)
    return " " + _SYLLABLES[n % s] + ("" if n < s else _SYLLABLES[(n // s) % s])


_VOCAB: tuple[str, ...] = ("<s>", "</s>", "<pad>", *(_piece_text(i) for i in range(_FIRST_ID, VOCAB_SIZE)))


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@functools.lru_cache(maxsize=1 << 16)
def _piece_id(piece: str) -> int:
    # Memoised: text repeats its pieces (words of at most four characters), and the proxy tokenizes every
    # text prompt on its event loop to hash its blocks (proxy/generate.py).
    return _FIRST_ID + _hash64(piece.encode()) % (VOCAB_SIZE - _FIRST_ID)


def encode(text: str, add_bos: bool = True) -> list[int]:
    ids = [BOS_ID] if add_bos else []
    ids.extend(map(_piece_id, _PIECE.findall(text)))
    return ids


def decode(ids: Sequence[int]) -> str:
    return "".join(_VOCAB[i] for i in ids if i >= _FIRST_ID)


def token_str(token_id: int) -> str:
    return _VOCAB[token_id]


def chat_prompt(messages: Sequence[tuple[str, str]]) -> str:
    """The chat template: one "role: content" line per message, then the assistant's turn."""
    return "".join(f"{role}: {content}\n" for role, content in messages) + "assistant:"


def prompt_seed(prompt_ids: Sequence[int]) -> int:
    return _hash64(b"".join(i.to_bytes(4, "little") for i in prompt_ids))


def next_token(seed: int, position: int) -> int:
    """The greedy token at output ``position`` of the prompt with ``seed``."""
    x = hash64(position, state=seed)
    if x % EOS_EVERY == 0:
        return EOS_ID
    return _FIRST_ID + (x >> 16) % (VOCAB_SIZE - _FIRST_ID)


def text_of_tokens(n_tokens: int, salt: int = 0) -> str:
    """A text that encodes to exactly ``n_tokens`` tokens after the BOS (a prompt of a given length)."""
    words = []
    for i in range(n_tokens):
        syl = _SYLLABLES[hash64(i, state=salt) % len(_SYLLABLES)]
        words.append(" " + syl + syl[0])  # " xyz": a space and three letters, one piece
    return "".join(words)

"""A store of encoded prompt texts, so that a prompt sharing a long prefix with one seen before (a repeated
system prompt, a conversation's earlier turns) encodes only what is new.

Each entry is a whole text the tokenizer encoded (without special tokens): its ids and the points where a cut
is safe (the starts of its pre-tokens, in characters). A new text looks up the entries whose first
``key_chars`` characters are its own (a dict on them), takes the one sharing the longest prefix with it (L
characters) and cuts back from L: at least ``backoff_words`` pre-tokens, ``backoff_tokens`` tokens and
``margin`` characters (the longest added token's length, at least 64) before L, at a pre-token's start. The
ids are the entry's before the cut and a fresh encode of the text from the cut, then the special tokens the
post-processor puts around one sequence. The cut points of a text's part encoded from a cut are found only
when that part repeats more than ``INDEX_GAP_CHARS`` of the shared prefix (a conversation's turns grow by
more, a new user turn after a system prompt by less); without them the encode skips the offsets
(``encode_batch_fast``, the same ids a third faster). Each text encoded is stored, the least recently used
evicted past ``max_chars`` characters of text in all (the ids held beside them cost about 9 bytes a
character more).

Why the cut is safe: the tokenizer splits the text at its added tokens, then into pre-tokens by a regex (or
at whitespace, digits, punctuation), then encodes each pre-token alone (BPE). A pre-token is decided by the
characters up to the end of the run that follows it (a regex's greedy match and lookahead read one character
past the match, at most through the next run of whitespace), so the pre-tokens ending several pre-tokens
and ``margin`` characters before L are the same in the new text as in the entry; no added token spans such a
cut (``margin`` is longer than any); and a regex split restarted at a pre-token's start splits the rest as
the whole text's split does (no lookbehind). What that argument does not cover is refused (``reason``): a
normalizer, a pre-tokenizer other than regex splits, ByteLevel without a prefix space, and whitespace,
digit or punctuation splits (a Metaspace, say, prepends to the first piece only), a model other than BPE
without dropout, added tokens that strip whitespace beside them, and (for special tokens) a post-processor
that does more than put the same ids around every sequence. A valve checks it in use: every
``check_every``-th hit also encodes the whole text and compares; on a difference the store turns itself off
for good (``mismatches`` counts it) and that call returns the whole text's ids.

Thread-safe: the proxy calls it from a worker thread and from its event loop's. A lock guards the entries;
the encodes run outside it (``encode_batch`` releases the GIL).
"""

from __future__ import annotations

import json
import threading
from bisect import bisect_left
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from tokenizers import Encoding
from tokenizers import Tokenizer as RustTokenizer

DEFAULT_MAX_CHARS = 8_000_000  # about 2M tokens of text (25-90 MB with the ids held beside it as Python ints)
DEFAULT_CHECK_EVERY = 256  # 1 hit in 64 would be 1.6 % of calls at a whole encode's cost: the p99 itself
DEFAULT_KEY_CHARS = 256
DEFAULT_BACKOFF_TOKENS = 16
DEFAULT_BACKOFF_WORDS = 4
DEFAULT_MIN_HIT_TOKENS = 64  # a shorter shared prefix is not worth a lookup's bookkeeping
CUT_STRIDE = 16  # a cut point about every 16 tokens: at most that many more encoded again
# a hit encoding more than this much of the shared prefix again finds the cut points in what it encodes (which
# takes the offsets, a third of an encode's time); one encoding less does not, so its entry has no cut
# points past its own cut
INDEX_GAP_CHARS = 1024
BUCKET_ENTRIES = 8  # entries kept per key: the most recently used
MIN_MARGIN = 64

_SAFE_PRE_TOKENIZERS = frozenset({"Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit"})


@dataclass(frozen=True, slots=True)
class _Entry:
    key: str
    text: str
    ids: list[int]
    cut_tokens: list[int]  # token indices where a pre-token starts (ascending) ...
    cut_chars: list[int]  # ... and the character offsets they start at


class PrefixStore:
    """Encodes texts as ``tokenizer.encode_batch([text], add_special_tokens=...)`` does, reusing the ids of
    the longest prefix shared with a text encoded before. ``supported`` is False (with ``reason``) for a
    tokenizer whose pipeline the cut is not proven for: then ``encode`` encodes every text whole."""

    def __init__(
        self,
        tokenizer: RustTokenizer,
        *,
        max_chars: int = DEFAULT_MAX_CHARS,
        check_every: int = DEFAULT_CHECK_EVERY,
        key_chars: int = DEFAULT_KEY_CHARS,
        backoff_tokens: int = DEFAULT_BACKOFF_TOKENS,
        backoff_words: int = DEFAULT_BACKOFF_WORDS,
        min_hit_tokens: int = DEFAULT_MIN_HIT_TOKENS,
    ) -> None:
        if max_chars <= 0 or check_every < 0 or key_chars <= 0:
            raise ValueError("max_chars and key_chars must be positive, check_every at least 0")
        if backoff_tokens < 1 or backoff_words < 1 or min_hit_tokens < 0:
            raise ValueError("backoff_tokens and backoff_words must be at least 1")
        self._tokenizer = tokenizer
        self.max_chars = max_chars
        self.check_every = check_every
        self._key_chars = key_chars
        self._backoff_tokens = backoff_tokens
        self._backoff_words = backoff_words
        self._min_hit_tokens = min_hit_tokens
        self.reason = _unsupported(tokenizer)
        self.supported = self.reason is None
        self.enabled = self.supported
        self._margin = max(MIN_MARGIN, 1 + max((len(t.content) for t in _added(tokenizer)), default=0))
        self._specials = _special_ids(tokenizer) if self.supported else None
        self._lock = threading.Lock()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._buckets: dict[str, list[int]] = {}
        self._next_id = 0
        self.chars = 0
        # counters, for the proxy to export
        self.hits = 0
        self.misses = 0
        self.checks = 0
        self.mismatches = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if not self.enabled or len(text) < self._key_chars or len(text) > self.max_chars:
            return self._whole(text, add_special_tokens)
        pre, post = self._specials or ((), ())
        if add_special_tokens and self._specials is None:
            return self._whole(text, add_special_tokens)
        key = text[: self._key_chars]
        with self._lock:
            found = self._lookup(key, text)
        if found is None:
            enc = self._tokenizer.encode_batch([text], add_special_tokens=False)[0]
            ids = enc.ids
            with self._lock:
                self.misses += 1
                self._insert(key, text, ids, *_cuts(enc, 0, 0))
        else:
            entry, common, w = found
            if w < 0:
                ids = entry.ids  # the same text again
                with self._lock:
                    self.hits += 1
                    hit = self.hits
            else:
                k, o = entry.cut_tokens[w], entry.cut_chars[w]
                if common - o > INDEX_GAP_CHARS:
                    # much of the shared prefix encoded again: find the cut points in it this time
                    enc = self._tokenizer.encode_batch([text[o:]], add_special_tokens=False)[0]
                    ids = entry.ids[:k] + enc.ids
                    fresh_tokens, fresh_chars = _cuts(enc, k, o)
                else:  # the same ids without the offsets (a third faster): no cut points past o
                    fresh = self._tokenizer.encode_batch_fast([text[o:]], add_special_tokens=False)[0]
                    ids = entry.ids[:k] + fresh.ids
                    fresh_tokens, fresh_chars = [], []
                with self._lock:
                    self.hits += 1
                    hit = self.hits
                    self._insert(
                        key,
                        text,
                        ids,
                        entry.cut_tokens[:w] + fresh_tokens,
                        entry.cut_chars[:w] + fresh_chars,
                    )
            if self.check_every and hit % self.check_every == 0:
                return self._checked(text, add_special_tokens, ids)
        return [*pre, *ids, *post] if add_special_tokens else list(ids)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._buckets.clear()
            self.chars = 0

    def _whole(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)

    def _checked(self, text: str, add_special_tokens: bool, ids: list[int]) -> list[int]:
        """The valve: the whole text's ids; a difference from the store's turns the store off."""
        whole = self._whole(text, add_special_tokens)
        pre, post = self._specials or ((), ())
        mine = [*pre, *ids, *post] if add_special_tokens else list(ids)
        with self._lock:
            self.checks += 1
            if mine != whole:
                self.mismatches += 1
                self.enabled = False
                self._entries.clear()
                self._buckets.clear()
                self.chars = 0
        return whole

    def _lookup(self, key: str, text: str) -> tuple[_Entry, int, int] | None:
        """The entry to cut ``text`` from (the one keeping most of it), the length of the prefix they share,
        and the index of the cut in its cut points (-1: the same text); None when no cut is far enough in."""
        bucket = self._buckets.get(key)
        if not bucket:
            return None
        best: tuple[int, int, _Entry, int, int] | None = None  # cut offset, id, entry, shared, cut index
        for entry_id in reversed(bucket):  # the most recently used first
            entry = self._entries[entry_id]
            if best is not None:
                shared = best[3]
                last = entry.cut_chars[-1] if entry.cut_chars else -1
                if last <= best[0] and (
                    shared >= min(len(entry.text), len(text)) or entry.text[shared] != text[shared]
                ):
                    continue  # it shares no more and has no later cut point: it cannot keep more
            common = _common_prefix(entry.text, text)
            if common == len(text) == len(entry.text):
                self._touch(entry_id, bucket)
                return entry, common, -1
            w = self._cut(entry, common)
            if w is not None and (best is None or entry.cut_chars[w] > best[0]):
                best = (entry.cut_chars[w], entry_id, entry, common, w)
        if best is None:
            return None
        self._touch(best[1], bucket)
        return best[2], best[3], best[4]

    def _cut(self, entry: _Entry, common: int) -> int | None:
        """The index of the last cut point at least backoff_words pre-tokens, backoff_tokens tokens and margin
        characters before the end of the prefix shared (``common`` characters), if far enough in."""
        j = bisect_left(entry.cut_chars, common) - 1
        if j < 0:
            return None
        chars, tokens = common - self._margin, entry.cut_tokens[j] - self._backoff_tokens
        w = j - self._backoff_words
        while w >= 0 and (entry.cut_chars[w] > chars or entry.cut_tokens[w] > tokens):
            w -= 1
        if w < 0 or entry.cut_tokens[w] < self._min_hit_tokens:
            return None
        return w

    def _touch(self, entry_id: int, bucket: list[int]) -> None:
        self._entries.move_to_end(entry_id)
        bucket.remove(entry_id)
        bucket.append(entry_id)  # a bucket is in the order of use too

    def _insert(
        self, key: str, text: str, ids: list[int], cut_tokens: list[int], cut_chars: list[int]
    ) -> None:
        if not self.enabled:
            return
        bucket = self._buckets.setdefault(key, [])
        for entry_id in bucket:
            if self._entries[entry_id].text == text:
                return
        entry_id = self._next_id
        self._next_id += 1
        self._entries[entry_id] = _Entry(key, text, ids, cut_tokens, cut_chars)
        bucket.append(entry_id)
        self.chars += len(text)
        if len(bucket) > BUCKET_ENTRIES:
            self._evict(bucket[0])
        while self.chars > self.max_chars and self._entries:
            self._evict(next(iter(self._entries)))

    def _evict(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        bucket = self._buckets[entry.key]
        bucket.remove(entry_id)
        if not bucket:
            del self._buckets[entry.key]
        self.chars -= len(entry.text)
        self.evictions += 1


def _cuts(enc: Encoding, token_base: int, char_base: int) -> tuple[list[int], list[int]]:
    """Where a cut is safe in an encoding, about every CUT_STRIDE tokens: the first token at or after each
    stride's start that starts a pre-token (a word) where the previous token ends (no offset was trimmed at
    that junction), as token indices and character offsets shifted by the bases. The encoding's first token is
    never one (what precedes it is not known here)."""
    words = enc.word_ids
    n = len(words)
    tokens: list[int] = []
    chars: list[int] = []
    for t in range(1, n, CUT_STRIDE):
        for i in range(t, min(t + CUT_STRIDE, n)):
            w = words[i]
            if w is not None and w != words[i - 1]:
                start = enc.token_to_chars(i)
                before = enc.token_to_chars(i - 1)
                if start is not None and before is not None and before[1] == start[0]:
                    tokens.append(token_base + i)
                    chars.append(char_base + start[0])
                    break
    return tokens, chars


def _common_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of a and b: block by block, then a binary search."""
    n = min(len(a), len(b))
    i = 0
    step = 4096
    while i < n:
        j = min(i + step, n)
        if a[i:j] != b[i:j]:
            lo, hi = i, j  # a[:lo] == b[:lo], a[:hi] != b[:hi]
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if a[i:mid] == b[i:mid]:
                    lo = mid
                else:
                    hi = mid
            return lo
        i = j
    return n


def _added(tokenizer: RustTokenizer) -> list[Any]:
    return list(tokenizer.get_added_tokens_decoder().values())


def _unsupported(tokenizer: RustTokenizer) -> str | None:
    """Why a cut is not proven safe for this tokenizer's pipeline, or None when it is."""
    try:
        spec = json.loads(tokenizer.to_str())
    except ValueError as e:  # pragma: no cover - tokenizers writes its own JSON
        return f"unreadable tokenizer: {e}"
    if spec.get("normalizer") is not None:
        return f"a normalizer ({spec['normalizer'].get('type')})"
    if spec.get("truncation") is not None or spec.get("padding") is not None:
        return "truncation or padding set"
    reason = _pre_tokenizer_unsupported(spec.get("pre_tokenizer"))
    if reason is not None:
        return reason
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout") not in (None, 0, 0.0):
        return f"a model of type {model.get('type')} (dropout {model.get('dropout')})"
    for token in _added(tokenizer):
        if token.lstrip or token.rstrip:
            return f"added token {token.content!r} strips whitespace beside it"
    return None


def _pre_tokenizer_unsupported(spec: Any) -> str | None:
    if spec is None:
        return "no pre-tokenizer"
    kind = spec.get("type")
    if kind == "Sequence":
        for part in spec.get("pretokenizers") or []:
            reason = _pre_tokenizer_unsupported(part)
            if reason is not None:
                return reason
        return None
    if kind == "ByteLevel":
        return "ByteLevel with add_prefix_space" if spec.get("add_prefix_space") else None
    if kind in _SAFE_PRE_TOKENIZERS:
        return None
    return f"a pre-tokenizer of type {kind}"


def _special_ids(tokenizer: RustTokenizer) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The ids the post-processor puts before and after a single sequence, if they are the same whatever the
    sequence (checked on two texts); None otherwise."""
    found: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    for probe in ("the", "cache block 123 ."):
        plain = tokenizer.encode(probe, add_special_tokens=False).ids
        full = tokenizer.encode(probe, add_special_tokens=True).ids
        starts = [i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain]
        if len(starts) != 1 or not plain:
            return None
        i = starts[0]
        found.add((tuple(full[:i]), tuple(full[i + len(plain) :])))
    return found.pop() if len(found) == 1 else None

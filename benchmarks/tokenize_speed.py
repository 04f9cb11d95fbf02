"""What tokenizing a chat prompt costs the proxy, against a prompt sent as token ids.

A proxy routing by prefix needs a chat prompt's token ids (proxy/prefix.py): it renders the messages with the
model's chat template and encodes the text (tokenizer/hf.py, HfTokenizer.prompt_ids), where a completions
prompt of token ids is only converted to machine integers (routing/block_hash.machine_token_ids, which is
also its check). Cases, each timed call by call (`--calls`, after `--warmup` calls), interleaved call by
call so that the machine's load falls on all of them alike:

  (a) chat_8k: an ~8k-token chat, a ~7k-token system prompt that is the same on every call and a ~1k-token
      user turn that differs on every call, through HfTokenizer.prompt_ids(body, chat=True), with its prefix
      store (tokenizer/prefix_store.py) as configured by default (empty before the first warm-up call; its
      valve checks 1 hit in 256); also without a store (chat_8k_no_store, the code before the store) and with
      the valve checking 1 hit in 64 (chat_8k_check_64);
  (b) ids_8k, the baseline: the same prompt's ids as a completions body, through machine_token_ids (what
      the proxy does with a token-id prompt); also with each body's ids converted once untimed first
      (ids_8k_hot: in the CPU's cache, as just after the proxy decoded the body's JSON);
  (c) chat_short: a ~100-token chat (a different one each call) through HfTokenizer.prompt_ids;
  (d) emulator_8k: the chat of (a) through the emulator's tokenizer (emulator/api.EmulatorTokenizer), whose
      tokens are its own (the count is reported).

Also timed, on (a)'s bodies without a store, its two parts: render_chat alone and the `tokenizers` encode of
the rendered text alone. Reported: p50, p99 and mean of each case in microseconds, the ratio (a)/(b) at p50,
and what (a) adds over (b) at p50 and p99; the stores' counters ((a)'s store also holds (c)'s chats), the
store's effect on (a) at p50, and whether (a)'s ids equal the ids without a store on every body.
Budget (issue 35): an 8k-token chat prompt whose 7k-token system prompt repeats adds p50 <= 1 ms and
p99 <= 5 ms over the same prompt as token ids on this machine; token-id prompts pay nothing new.

GIL: two threads each encoding the 8k prompt's rendered text `--gil-repeats` times, against one thread
encoding it twice as many times (median of `--gil-rounds`); the ratio of wall times is about 1 when
`tokenizers`' encode holds the GIL (the threads take turns) and about 0.5 when it releases it and 2 cores
are free. The process's CPU time over the wall time (cores used) is reported beside it, and the same test
on work that releases the GIL (sha256 of 4 MiB) as a control: on a machine shared with other jobs, the
control's ratio says how many cores the test had. Then a check the load does not blur: a Python thread's
longest waits for the GIL while another thread encodes a 65k-token text (about 0.1 s a call), against the
same while it hashes 32 MiB.

The tokenizer: the tiny model's files (`.venv-vllm/tiny-model`, built by `make vllm`) when they are there,
else a byte-level BPE trained here in a temporary folder the way tests/tokenizer/conftest.py builds one
(`--build` forces that); the JSON says which. Writes benchmarks/results/tokenize_speed_DATE.json (a letter
after the date when that exists; `--out` for another path, `--no-write` for none).
Usage: python benchmarks/tokenize_speed.py [--calls N] [--json]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from calroute.emulator.api import EmulatorTokenizer
from calroute.routing.block_hash import machine_token_ids
from calroute.tokenizer.hf import HfTokenizer

if __package__ in (None, ""):  # run as a script (python benchmarks/NAME.py): the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.machine import machine, report_head, save_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TINY_MODEL = ROOT / ".venv-vllm" / "tiny-model"

SYSTEM_TOKENS = 7 * 1024
USER_TOKENS = 1024
SHORT_TOKENS = 100
BUDGET_P50_US = 1000.0
BUDGET_P99_US = 5000.0

WORDS = (
    "the a of to and in is for on with as by at from that this it be are was not or an can will "
    "cache block prefill decode router engine token prompt model latency system user assistant tool "
    "call hash index shard queue scheduler budget request response stream batch memory transfer "
    "policy instance cluster workload arrival rate service level objective deadline tail median "
    "throughput capacity profile calibration predictor ledger placement eviction reuse prefix "
    "answer question summary document section table figure value number result error warning "
    "always never please must should may only every each some other first last next before after "
    "customer order account invoice payment refund shipping address product price discount policy"
).split()
PUNCT = (" ", " ", " ", " ", " ", " ", " ", ", ", ". ", ".\n", ": ", "; ", " (", ") ", " - ", "\n\n")

# the template tests/tokenizer/conftest.py uses, in the "string" content format
TEMPLATE = """{{ bos_token }}
{%- for message in messages %}
<|{{ message.role }}|>{{ message.content }}</s>
{% endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}"""


def build_model(directory: Path) -> Path:
    """A byte-level BPE trained in a second or so on this script's own words, with the config and chat
    template of tests/tokenizer/conftest.py's tiny model (a larger vocabulary: 2,048, the tiny model's)."""
    rng = random.Random(1)
    corpus = [text(rng, 400) for _ in range(200)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)]
    )
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "tokenizer_class": "TokenizersBackend",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "chat_template.jinja").write_text(TEMPLATE)
    return directory


def text(rng: random.Random, words: int) -> str:
    return "".join(rng.choice(WORDS) + rng.choice(PUNCT) for _ in range(words)).strip()


def text_of_tokens(raw: Tokenizer, rng: random.Random, tokens: int) -> str:
    """Made-up prose that encodes to about ``tokens`` tokens (cut at the word boundary past that)."""
    words = tokens
    while True:
        t = text(rng, words)
        enc = raw.encode(t, add_special_tokens=False)
        if len(enc.ids) > tokens:
            cut = enc.offsets[tokens][0]
            return t[:cut].rstrip()
        words *= 2


def percentiles(us: list[float]) -> dict[str, float]:
    q = statistics.quantiles(us, n=100, method="inclusive")
    return {
        "p50_us": statistics.median(us),
        "p99_us": q[98],
        "mean_us": statistics.fmean(us),
        "calls": len(us),
    }


def timed(fn: Callable[[int], object], i: int) -> float:
    t0 = time.perf_counter_ns()
    fn(i)
    return (time.perf_counter_ns() - t0) / 1e3


def gil_ratio(work: Callable[[], object], repeats: int, rounds: int) -> dict[str, Any]:
    """Wall time of 2 threads doing ``work`` ``repeats`` times each over 1 thread doing it 2 x ``repeats``
    times, the median of ``rounds`` rounds, and the cores each used (process CPU time over wall time)."""

    def encode(n: int) -> None:
        for _ in range(n):
            work()

    def run(threads: int) -> tuple[float, float]:
        workers = [threading.Thread(target=encode, args=(2 * repeats // threads,)) for _ in range(threads)]
        c0, t0 = time.process_time(), time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        wall = time.perf_counter() - t0
        return wall, (time.process_time() - c0) / wall

    encode(5)
    ones, twos = [], []
    for _ in range(rounds):
        ones.append(run(1))
        twos.append(run(2))
    one = statistics.median(w for w, _ in ones)
    two = statistics.median(w for w, _ in twos)
    return {
        "encodes_per_thread_2": repeats,
        "encodes_1_thread": 2 * repeats,
        "rounds": rounds,
        "one_thread_wall_s": one,
        "two_threads_wall_s": two,
        "ratio_two_over_one": two / one,
        "one_thread_cores_used": statistics.median(c for _, c in ones),
        "two_threads_cores_used": statistics.median(c for _, c in twos),
        "one_thread_walls_s": [w for w, _ in ones],
        "two_threads_walls_s": [w for w, _ in twos],
    }


def gil_wait(work: Callable[[], object], calls: int) -> dict[str, Any]:
    """Whether ``work`` holds the GIL, whatever the machine's load: a Python thread loops reading the clock
    while another thread calls ``work`` ``calls`` times. Work that holds the GIL stops the loop for a whole
    call, so the loop's ``calls`` - 1 longest gaps last about a call each; work that releases it leaves gaps
    of the OS's scheduling slices (a few ms) at most."""
    durations: list[float] = []
    done = threading.Event()

    def worker() -> None:
        for _ in range(calls):
            t = time.perf_counter()
            work()
            durations.append(time.perf_counter() - t)
        done.set()

    gaps: list[float] = []
    thread = threading.Thread(target=worker)
    thread.start()
    last = time.perf_counter()
    while not done.is_set():
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    thread.join()
    longest = sorted(gaps)[-(calls - 1) :]
    call_ms = statistics.fmean(durations) * 1e3
    gap_ms = statistics.median(longest) * 1e3
    return {
        "calls": calls,
        "call_ms": call_ms,
        "longest_gaps_median_ms": gap_ms,
        "holds_gil": gap_ms >= call_ms / 2,
    }


def chat(system: str | None, user: str) -> dict[str, Any]:
    messages = [{"role": "user", "content": user}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return {"model": "m", "messages": messages, "max_tokens": 16}


def run(args: argparse.Namespace, model_dir: Path, source: str) -> dict[str, Any]:
    hf = HfTokenizer(model_dir)  # the prefix store as configured by default
    plain = HfTokenizer(model_dir, prefix_store_chars=0)
    check_64 = HfTokenizer(model_dir, prefix_store_check_every=64)
    emu = EmulatorTokenizer()
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    rng = random.Random(0)
    system = text_of_tokens(raw, rng, SYSTEM_TOKENS)
    n = args.warmup + args.calls
    bodies = [chat(system, text_of_tokens(raw, rng, USER_TOKENS)) for _ in range(n)]
    shorts = [chat(None, text_of_tokens(raw, rng, SHORT_TOKENS)) for _ in range(n)]
    # (b)'s bodies: the same prompts' ids as completions bodies (as a client would send them, JSON ints)
    # (through the tokenizer without a store: the stores see each body first in the timed loop)
    id_lists = [plain.prompt_ids(b, True) for b in bodies]
    id_bodies = [{"model": "m", "prompt": ids, "max_tokens": 16} for ids in id_lists]
    rendered = [plain.render_chat(b) for b in bodies]
    cases: dict[str, Callable[[int], object]] = {
        "chat_8k": lambda i: hf.prompt_ids(bodies[i], True),
        "chat_8k_no_store": lambda i: plain.prompt_ids(bodies[i], True),
        "chat_8k_check_64": lambda i: check_64.prompt_ids(bodies[i], True),
        "ids_8k": lambda i: machine_token_ids(id_bodies[i].get("prompt")),
        "ids_8k_hot": lambda i: machine_token_ids(id_bodies[i].get("prompt")),  # converted once untimed first
        "chat_short": lambda i: hf.prompt_ids(shorts[i], True),
        "emulator_8k": lambda i: emu.prompt_ids(bodies[i], True),
        "chat_8k_render_only": lambda i: plain.render_chat(bodies[i]),
        "chat_8k_encode_only": lambda i: raw.encode(rendered[i], add_special_tokens=False),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    gc.collect()
    for i in range(n):
        for name, fn in cases.items():
            if name == "ids_8k_hot":
                fn(i)  # its ids in the cache, as just after the proxy decoded the body's JSON
            us = timed(fn, i)
            if i >= args.warmup:
                times[name].append(us)
    result: dict[str, Any] = {name: percentiles(us) for name, us in times.items()}
    result["chat_8k"]["tokens"] = statistics.median(len(ids) for ids in id_lists)
    # (a) and (c) share hf's store: its counters count both
    result["prefix_store"] = {"chat_8k": store_counters(hf), "chat_8k_check_64": store_counters(check_64)}
    result["chat_8k"]["ids_equal_no_store"] = all(
        hf.prompt_ids(b, True) == ids and check_64.prompt_ids(b, True) == ids
        for b, ids in zip(bodies, id_lists, strict=True)
    )
    result["store_effect_p50"] = {
        "no_store_us": result["chat_8k_no_store"]["p50_us"],
        "store_us": result["chat_8k"]["p50_us"],
        "speedup": result["chat_8k_no_store"]["p50_us"] / result["chat_8k"]["p50_us"],
    }
    result["chat_8k"]["system_tokens"] = len(raw.encode(system, add_special_tokens=False).ids)
    result["chat_short"]["tokens"] = statistics.median(len(hf.prompt_ids(b, True)) for b in shorts)
    result["emulator_8k"]["tokens"] = statistics.median(len(emu.prompt_ids(b, True)) for b in bodies[:20])
    a, b = result["chat_8k"], result["ids_8k"]
    added_p50 = a["p50_us"] - b["p50_us"]
    added_p99 = a["p99_us"] - b["p99_us"]
    result["ratio_chat_over_ids_p50"] = a["p50_us"] / b["p50_us"]
    result["ratio_chat_over_ids_mean"] = a["mean_us"] / b["mean_us"]
    result["ratio_chat_over_ids_hot_p50"] = a["p50_us"] / result["ids_8k_hot"]["p50_us"]
    result["budget"] = {
        "p50_added_us_max": BUDGET_P50_US,
        "p99_added_us_max": BUDGET_P99_US,
        "p50_added_us": added_p50,
        "p99_added_us": added_p99,
        "met": added_p50 <= BUDGET_P50_US and added_p99 <= BUDGET_P99_US,
    }
    result["gil"] = gil_ratio(
        lambda: raw.encode(rendered[0], add_special_tokens=True), args.gil_repeats, args.gil_rounds
    )
    # what HfTokenizer calls: encode_batch releases the GIL where encode does not
    result["gil_encode_batch"] = gil_ratio(
        lambda: raw.encode_batch([rendered[0]], add_special_tokens=True), args.gil_repeats, args.gil_rounds
    )
    # the control: hashlib releases the GIL while it hashes a large buffer; its ratio is what 2 threads get on
    # this machine right now when they do run in parallel
    block = bytes(range(256)) * 16384  # 4 MiB, about 7 ms of sha256 like one 8k encode
    result["gil_control_sha256"] = gil_ratio(
        lambda: hashlib.sha256(block).digest(), args.gil_repeats, args.gil_rounds
    )
    big, big_block = rendered[0] * 8, block * 8  # 65k tokens, 32 MiB: calls long beside the OS's time slices
    result["gil_wait"] = {
        "encode": gil_wait(lambda: raw.encode(big, add_special_tokens=True), 10),
        "encode_batch": gil_wait(lambda: raw.encode_batch([big], add_special_tokens=True), 10),
        # what the prefix store's hits call for the new part of a prompt
        "encode_batch_fast": gil_wait(lambda: raw.encode_batch_fast([big], add_special_tokens=True), 10),
        "control_sha256": gil_wait(lambda: hashlib.sha256(big_block).digest(), 10),
    }
    result["tokenizer"] = {"source": source, "vocab": raw.get_vocab_size(with_added_tokens=True)}
    return result


def store_counters(tok: HfTokenizer) -> dict[str, Any]:
    store = tok.prefix_store
    if store is None:
        return {"enabled": False}
    return {
        "supported": store.supported,
        "reason": store.reason,
        "enabled": store.enabled,
        "max_chars": store.max_chars,
        "check_every": store.check_every,
        "hits": store.hits,
        "misses": store.misses,
        "checks": store.checks,
        "mismatches": store.mismatches,
        "evictions": store.evictions,
        "entries": len(store),
        "chars": store.chars,
    }


def report_text(r: Mapping[str, Any]) -> str:
    lines = [f"tokenizer: {r['tokenizer']['source']} (vocabulary {r['tokenizer']['vocab']})"]
    for name in (
        "chat_8k",
        "chat_8k_no_store",
        "chat_8k_check_64",
        "ids_8k",
        "ids_8k_hot",
        "chat_short",
        "emulator_8k",
        "chat_8k_render_only",
        "chat_8k_encode_only",
    ):
        c = r[name]
        tokens = f", {c['tokens']:.0f} tokens" if "tokens" in c else ""
        lines.append(
            f"{name:>20}: p50 {c['p50_us']:9.1f} us, p99 {c['p99_us']:9.1f} us, "
            f"mean {c['mean_us']:9.1f} us{tokens}"
        )
    bud = r["budget"]
    lines.append(
        f"chat_8k / ids_8k at p50: {r['ratio_chat_over_ids_p50']:.0f}x; added over ids: p50 "
        f"{bud['p50_added_us'] / 1e3:.2f} ms (budget 1 ms), p99 {bud['p99_added_us'] / 1e3:.2f} ms "
        "(budget 5 ms): " + ("met" if bud["met"] else "NOT met")
    )
    for name, st in r["prefix_store"].items():
        lines.append(
            f"prefix store of {name}: {st['hits']} hits, {st['misses']} misses, {st['checks']} checks "
            f"(1 hit in {st['check_every']}), {st['mismatches']} mismatches, {st['entries']} entries, "
            f"{st['chars']} chars, {st['evictions']} evictions"
        )
    eff = r["store_effect_p50"]
    lines.append(
        f"store's effect at p50: {eff['no_store_us']:.0f} us without, {eff['store_us']:.0f} us with "
        f"({eff['speedup']:.1f}x); ids equal to the store-less ones on every body: "
        f"{r['chat_8k']['ids_equal_no_store']}"
    )
    c = r["gil_control_sha256"]
    for key, call in (("gil", "encode"), ("gil_encode_batch", "encode_batch")):
        g = r[key]
        lines.append(
            f"GIL, {call}: 2 threads x {g['encodes_per_thread_2']} calls {g['two_threads_wall_s']:.2f} s "
            f"against 1 thread x {g['encodes_1_thread']} {g['one_thread_wall_s']:.2f} s: "
            f"ratio {g['ratio_two_over_one']:.2f} "
            f"(cores used {g['two_threads_cores_used']:.2f} against {g['one_thread_cores_used']:.2f})"
        )
    lines.append(
        f"GIL control (sha256, which releases it): ratio {c['ratio_two_over_one']:.2f}, "
        f"cores used {c['two_threads_cores_used']:.2f}"
    )
    for name, w in r["gil_wait"].items():
        lines.append(
            f"GIL wait, {name}: a call {w['call_ms']:.1f} ms, a Python thread's longest waits meanwhile "
            f"{w['longest_gaps_median_ms']:.1f} ms (median of {w['calls'] - 1}): "
            + ("holds the GIL" if w["holds_gil"] else "releases the GIL")
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200, help="timed calls per case (default 200)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed calls per case first (default 20)")
    ap.add_argument("--gil-repeats", type=int, default=100, help="encodes per thread with 2 threads")
    ap.add_argument("--gil-rounds", type=int, default=3)
    ap.add_argument(
        "--model", type=Path, default=TINY_MODEL, help="a tokenizer folder (default: the tiny model)"
    )
    ap.add_argument("--build", action="store_true", help="train a small BPE here even if --model exists")
    ap.add_argument("--out", type=Path, help="write the JSON here instead of benchmarks/results/")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.calls < 2 or args.warmup < 0:
        raise SystemExit("--calls must be at least 2 and --warmup at least 0")
    load_before = machine()["load_1m"]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.build and (args.model / "tokenizer.json").exists():
            model_dir = args.model
            try:
                source = str(model_dir.resolve().relative_to(ROOT))
            except ValueError:
                source = model_dir.name
        else:
            model_dir = build_model(Path(tmp) / "bpe")
            source = "built: a byte-level BPE trained here (tests/tokenizer/conftest.py's way)"
        result = run(args, model_dir, source)
    report = {
        **report_head("tokenize_speed", load_1m_before=load_before),
        "calls": args.calls,
        "warmup": args.warmup,
        "wall_s": time.perf_counter() - t0,
        **result,
    }
    if not args.no_write:
        save_report(report, RESULTS, args.out)
    print(json.dumps(report) if args.json else report_text(report))


if __name__ == "__main__":
    main()

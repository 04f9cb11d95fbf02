"""The proxy end to end on real vLLM engines (2 prefill + 1 decode, NIXL KV transfer)."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from calroute.cluster.file import ClusterFile
from calroute.cluster.procs import stop_process_group
from calroute.proxy.config import ProxyConfig
from calroute.results.records import RequestRecord, read_records
from calroute.routing.block_hash import block_hashes
from calroute.tokenizer.hf import HfTokenizer
from calroute.types import RequestStatus
from tests.emulator.http import metric, request, stream
from tests.faults.test_clients_that_leave import client as leaving_client
from tests.faults.test_clients_that_leave import where_they_left
from tests.proxy.conftest import CAL
from tests.proxy.harness import RunningProxy

EXTERNAL_KV_TOKENS = (
    'vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="external_kv_transfer"}'
)
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PROMPT = "".join(f"def handler_{i}(request):\n    return respond(request, {i})\n" for i in range(12))


@pytest.fixture
def real_cluster(real_vllm_cluster: ClusterFile) -> ClusterFile:
    """The session's shared real-vLLM 2P+1D cluster (tests/conftest.py): these tests run after every other
    one that uses it, so the last one here may kill its decode engine."""
    return real_vllm_cluster


def test_proxy_on_real_vllm(real_cluster: ClusterFile, tmp_path: Path) -> None:
    c = real_cluster
    body = {"model": c.model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    _, direct = request(f"{c.decode[0].url}/v1/completions", body)
    external_before = metric(c.decode[0].url, EXTERNAL_KV_TOKENS)
    with RunningProxy(ProxyConfig(cluster=c, calibration=CAL, log_path=tmp_path / "log.jsonl")) as p:
        status, via = request(f"{p.url}/v1/completions", body)
        assert status == 200 and via["choices"][0]["text"] == direct["choices"][0]["text"]
        status, events = stream(
            f"{p.url}/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}
        )
        assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 24
        assert "".join(e["choices"][0]["text"] for e in events[:-2]) == direct["choices"][0]["text"]
        # the decode engine really received the prompt's KV from the prefill engine over NIXL (through this
        # proxy: the shared engines may have received some before)
        assert metric(c.decode[0].url, EXTERNAL_KV_TOKENS) > external_before
        chat = {
            "model": c.model,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 8,
            "temperature": 0,
            "ignore_eos": True,
        }
        _, direct_chat = request(f"{c.decode[0].url}/v1/chat/completions", chat)
        _, via_chat = request(f"{p.url}/v1/chat/completions", chat)
        assert via_chat["choices"][0]["message"]["content"] == direct_chat["choices"][0]["message"]["content"]
        assert request(f"{p.url}/v1/completions", {**body, "max_tokens": 10**6})[0] == 400
    *recs, refused = list(read_records(tmp_path / "log.jsonl"))
    assert refused.status is RequestStatus.REJECTED and refused.prefill_id is None  # the client's error
    assert [r.status for r in recs] == [RequestStatus.OK] * 3
    assert all(r.prefill_id in {e.id for e in c.prefill} and r.decode_id == "decode-0" for r in recs)
    assert all(r.first_token_s is not None and r.prefill_done_s is not None for r in recs)


def _completion(c: ClusterFile, prompt: list[int]) -> dict[str, object]:
    return {"model": c.model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True}


def _reset_prefix_caches(c: ClusterFile) -> None:
    for e in c.engines:  # earlier tests' prompts must not count
        assert request(f"{e.url}/reset_prefix_cache", {})[0] == 200


def test_a_shared_prefix_goes_to_the_real_engine_that_holds_it(
    real_cluster: ClusterFile, tmp_path: Path
) -> None:
    """Prefix caching on real vLLM without KV events (docs/prefix.md): the proxy's index, fed by its own
    placements and hashing token ids in the engines' 128-token blocks, predicts to the block what the
    engine serves."""
    c = replace(
        real_cluster, engines=tuple(replace(e, kv_events_endpoint=None) for e in real_cluster.engines)
    )
    assert len(c.prefill) >= 2 and c.block_tokens == 128
    _reset_prefix_caches(c)
    shared = [100 + (i * 37) % 800 for i in range(300)]  # two full 128-token blocks and 44 tokens more
    cfg = ProxyConfig(
        cluster=c, calibration=CAL, log_path=tmp_path / "log.jsonl", policy="marginal_cost", prefix_index=True
    )
    with RunningProxy(cfg) as p:
        assert p.proxy.kv_events is None  # the router's own placements only
        assert request(f"{p.url}/v1/completions", _completion(c, shared + [11] * 5))[0] == 200
        first = next(read_records(tmp_path / "log.jsonl")).prefill_id
        assert first is not None
        holder = next(e for e in c.prefill if e.id == first)
        hits_before = metric(holder.url, PREFIX_HITS)
        assert request(f"{p.url}/v1/completions", _completion(c, shared + [12] * 40))[0] == 200
        # the hit the router predicted for it (the first request's was 0: nothing was placed yet)
        predicted = metric(p.url, "calroute_prefix_predicted_cached_tokens_total")
    second = list(read_records(tmp_path / "log.jsonl"))[-1]
    assert second.prefill_id == first  # the engine that holds the prefix
    assert predicted == 256  # the two shared full blocks
    assert metric(holder.url, PREFIX_HITS) - hits_before == predicted  # what the engine served from cache
    assert second.cached_tokens == predicted  # and what it said it did (usage.prompt_tokens_details)


def test_the_precise_prefix_index_learns_from_real_vllms_kv_events(
    real_cluster: ClusterFile, tmp_path: Path
) -> None:
    """The engines publish KV events (--kv-events-config), the proxy subscribes and translates vLLM's block
    hashes into its own (contract/blocks.py): the index knows what each engine caches, including a
    prompt the proxy never routed, and its prediction is what the engine serves, to the block."""
    c = real_cluster
    assert len(c.prefill) == 2 and c.block_tokens == 128
    assert all(e.kv_events_endpoint is not None for e in c.engines)
    _reset_prefix_caches(c)
    shared = [100 + (i * 41) % 900 for i in range(4 * 128 + 44)]  # four full blocks and 44 tokens more
    unrouted = [200 + (i * 43) % 700 for i in range(3 * 128 + 10)]  # three full blocks and 10 more
    cfg = ProxyConfig(
        cluster=c, calibration=CAL, log_path=tmp_path / "log.jsonl", policy="marginal_cost", prefix_index=True
    )
    with RunningProxy(cfg) as p:
        subscriber, index = p.proxy.kv_events, p.proxy.prefix
        assert subscriber is not None and index is not None

        def until(cond: Callable[[], bool], what: str) -> None:
            deadline = time.monotonic() + 20
            while not cond():
                assert time.monotonic() < deadline, what
                time.sleep(0.05)

        until(lambda: all(subscriber.is_live(e.id) for e in c.engines), "KV event streams not live")
        time.sleep(0.3)  # PUB/SUB: the subscription reaches the publisher after the connection

        def predicted_tokens() -> float:
            return metric(p.url, "calroute_prefix_predicted_cached_tokens_total")

        # 1. A prompt, then the same prompt with a new suffix: the second goes where the first went.
        assert request(f"{p.url}/v1/completions", _completion(c, shared + [11] * 5))[0] == 200
        first = next(read_records(tmp_path / "log.jsonl")).prefill_id
        assert first is not None
        holder = next(e for e in c.prefill if e.id == first)
        # the engine's BlockStored arrives a moment after its answer
        until(
            lambda: index.match(block_hashes(shared, 128)).get(first) == 512, "no BlockStored for the prompt"
        )
        hits_before, predicted_before = metric(holder.url, PREFIX_HITS), predicted_tokens()
        assert request(f"{p.url}/v1/completions", _completion(c, shared + [12] * 40))[0] == 200
        second = list(read_records(tmp_path / "log.jsonl"))[-1]
        assert second.prefill_id == first  # the engine that holds the prefix
        predicted = predicted_tokens() - predicted_before
        assert predicted == 512  # the four shared full blocks, as the engine's events said
        assert metric(holder.url, PREFIX_HITS) - hits_before == predicted  # what the engine served from cache
        assert second.cached_tokens == predicted  # and what it said it did (usage.prompt_tokens_details)

        # 2. A prompt the proxy never saw, cached straight on the other prefill engine: only its events
        # can tell the router, and the extended prompt follows it there.
        other = next(e for e in c.prefill if e.id != first)
        assert request(f"{other.url}/v1/completions", _completion(c, unrouted))[0] == 200
        until(lambda: index.match(block_hashes(unrouted, 128)).get(other.id) == 384, "no BlockStored")
        assert request(f"{p.url}/v1/completions", _completion(c, unrouted + [13] * 20))[0] == 200
        third = list(read_records(tmp_path / "log.jsonl"))[-1]
        assert third.prefill_id == other.id and third.cached_tokens == 384

        # every message read and every stored block translated: the events' layout and block size are what
        # the subscriber expects
        assert not _has(p.url, "calroute_kv_events_errors_total")
        assert not _has(p.url, "calroute_kv_events_skipped_blocks_total")
        assert all(subscriber.is_live(e.id) for e in c.engines)


def test_chat_prompts_match_real_vllms_cache_through_the_models_tokenizer(
    real_cluster: ClusterFile, tmp_path: Path
) -> None:
    """Chat, the traffic clients send: the proxy renders and tokenizes it with the served model's own files
    (the cluster file's tokenizer), so its block hashes are those of the ids vLLM caches and publishes. A
    chat sharing a system prompt, a conversation's next turn, and a system prompt cached on the other
    engine behind the proxy's back each go to the engine that holds them, and the hit the router predicts
    is what the engine serves, to the block."""
    c = real_cluster
    assert c.tokenizer is not None and c.tokenizer != "emulator"
    _reset_prefix_caches(c)
    system = "".join(f"Rule {i}: answer in the style of handler_{i}, briefly.\n" for i in range(40))
    other_system = "".join(f"Policy {i}: quote section {i * 7} of the manual first.\n" for i in range(40))

    def chat(system_prompt: str, *turns: tuple[str, str]) -> dict[str, object]:
        messages = [{"role": "system", "content": system_prompt}]
        messages += [{"role": r, "content": text} for r, text in turns]
        return {"model": c.model, "messages": messages, "max_tokens": 4, "temperature": 0, "ignore_eos": True}

    cfg = ProxyConfig(
        cluster=c, calibration=CAL, log_path=tmp_path / "log.jsonl", policy="marginal_cost", prefix_index=True
    )
    with RunningProxy(cfg) as p:
        subscriber, index, tokenizer = p.proxy.kv_events, p.proxy.prefix, p.proxy.generation.tokenizer
        assert subscriber is not None and index is not None and tokenizer is not None
        assert tokenizer.name.startswith("hf:")

        def until(cond: Callable[[], bool], what: str) -> None:
            deadline = time.monotonic() + 20
            while not cond():
                assert time.monotonic() < deadline, what
                time.sleep(0.05)

        def cached_on(engine_id: str, body: dict[str, object]) -> Callable[[], bool]:
            assert isinstance(tokenizer, HfTokenizer)
            ids = tokenizer.prompt_ids(body, True)
            full = len(ids) // 128 * 128
            return lambda: index.match(block_hashes(ids, 128)).get(engine_id, 0) == full

        def predicted_tokens() -> float:
            return metric(p.url, "calroute_prefix_predicted_cached_tokens_total")

        def last() -> RequestRecord:
            return list(read_records(tmp_path / "log.jsonl"))[-1]

        until(lambda: all(subscriber.is_live(e.id) for e in c.engines), "KV event streams not live")
        time.sleep(0.3)
        first_turn = chat(system, ("user", "How do I add a handler?"))
        assert request(f"{p.url}/v1/chat/completions", first_turn)[0] == 200
        holder = last().prefill_id
        assert holder is not None
        until(cached_on(holder, first_turn), "no BlockStored for the first chat")
        checks = [
            chat(system, ("user", "And how do I remove one, keeping the others?")),  # the same system prompt
            chat(  # the conversation's next turn extends the last
                system,
                ("user", "How do I add a handler?"),
                ("assistant", "Register it with the router."),
                ("user", "Where is the router?"),
            ),
        ]
        for body in checks:
            before = predicted_tokens()
            assert request(f"{p.url}/v1/chat/completions", body)[0] == 200
            record, predicted = last(), predicted_tokens() - before
            assert record.prefill_id == holder
            assert predicted >= 128 and predicted % 128 == 0
            assert record.cached_tokens == predicted  # what the engine said it served from its cache
            until(cached_on(holder, body), "no BlockStored for the chat")
        # a system prompt cached on the other prefill engine, sent to it directly: its events tell the router
        other = next(e for e in c.prefill if e.id != holder)
        seed = chat(other_system, ("user", "What comes first?"))
        assert request(f"{other.url}/v1/chat/completions", seed)[0] == 200
        until(cached_on(other.id, seed), "no BlockStored for the chat sent to the other engine")
        before = predicted_tokens()
        assert request(f"{p.url}/v1/chat/completions", chat(other_system, ("user", "What next?")))[0] == 200
        record, predicted = last(), predicted_tokens() - before
        assert record.prefill_id == other.id and predicted >= 128 and record.cached_tokens == predicted
        # every priced length was the engine's own count
        assert not _has(p.url, "calroute_prompt_tokens_mismatch_total")
        assert not _has(p.url, "calroute_kv_events_skipped_blocks_total")


def _has(base_url: str, name: str) -> bool:
    """Whether any sample of ``name`` is exported (a labelled counter has none before its first inc)."""
    status, text = request(f"{base_url}/metrics")
    assert status == 200
    return any(line.startswith(name + "{") for line in str(text).splitlines())


# The subset of the fault matrix (docs/faults.md) real engines can show. They run last: the second one kills
# the module's decode engine.


@pytest.mark.faults
def test_a_real_engine_4xx_goes_back_to_the_client_and_the_engine_stays_in(
    real_cluster: ClusterFile, tmp_path: Path
) -> None:
    c = real_cluster
    too_long = {"model": c.model, "prompt": PROMPT * 12, "max_tokens": 4}  # ~3,000 tokens, max_model_len 2048
    with RunningProxy(ProxyConfig(cluster=c, calibration=CAL, log_path=tmp_path / "log.jsonl")) as p:
        status, out = request(f"{p.url}/v1/completions", too_long)
        assert status == 400 and "error" in out, out
        assert all(p.proxy.signals.healthy[e.id] for e in c.engines)
        ok = {"model": c.model, "prompt": "hello", "max_tokens": 4, "ignore_eos": True}
        assert request(f"{p.url}/v1/completions", ok)[0] == 200
    recs = list(read_records(tmp_path / "log.jsonl"))
    assert [r.status for r in recs] == [RequestStatus.REJECTED, RequestStatus.OK]


@pytest.mark.faults
def test_fifty_clients_that_leave_at_random_points_leave_no_kv_on_real_vllm(
    real_cluster: ClusterFile, tmp_path: Path
) -> None:
    """As tests/faults/test_clients_that_leave.py on the emulator: clients leave before their prefill
    answers, between prefill and decode, mid-stream (how many at each point depends on how fast the engines
    run). Every lease that expires is one whose client left before its prefill answered (vLLM ran the
    prefill's last step while the abort was on its way: it ends the request and holds the blocks to the
    lease): the proxy's releases free every other; with none expired, the prefill engines' KV usage is back
    to idle (0) within ``idle_bound_s`` of the last client leaving, far inside vLLM's 30 s lease."""
    c = real_cluster
    idle_bound_s = 3.0
    rng = random.Random(35)
    log = tmp_path / "log.jsonl"
    expired_before = sum(metric(e.url, "vllm:nixl_num_kv_expired_reqs_total") for e in c.prefill)
    with RunningProxy(ProxyConfig(cluster=c, calibration=CAL, log_path=log, stall_timeout_s=20.0)) as p:
        port = int(p.url.rsplit(":", 1)[1])
        jobs = []
        for i in range(50):
            common = {"model": c.model, "max_tokens": 200, "ignore_eos": True, "stream": rng.random() < 0.5}
            if rng.random() < 0.5:
                text = f"client {i}: " + PROMPT * rng.randrange(1, 4)
                path, body = (
                    "/v1/chat/completions",
                    {**common, "messages": [{"role": "user", "content": text}]},
                )
            else:
                ids = [rng.randrange(100, 1900) for _ in range(rng.randrange(200, 1200))]
                path, body = "/v1/completions", {**common, "prompt": ids}
            jobs.append(leaving_client(port, path, body, i * 0.03, rng.uniform(0.0, 2.0)))

        async def run_all() -> list[float]:
            return list(await asyncio.gather(*jobs))

        last_left_s = max(asyncio.run(run_all()))
        deadline = last_left_s + 40
        while sum(metric(e.url, "vllm:kv_cache_usage_perc") for e in c.prefill) > 0:
            assert time.monotonic() < deadline, "the prefill engines' KV never came back to idle"
            time.sleep(0.05)
        idle_after_s = time.monotonic() - last_left_s
        deadline = time.monotonic() + 20
        while len(list(read_records(log))) < 50:
            assert time.monotonic() < deadline, "a request has no record"
            time.sleep(0.05)
    recs = list(read_records(log))
    expired = sum(metric(e.url, "vllm:nixl_num_kv_expired_reqs_total") for e in c.prefill) - expired_before
    where = where_they_left(recs)
    # vLLM logs the request it frees at the lease's end: "Releasing expired KV blocks for request ID",
    # its id being "cmpl-" or "chatcmpl-", the proxy's X-Request-Id, then suffixes of its own.
    lapsed = {
        m.group(1)
        for log_path in c.logs
        for m in re.finditer(
            r"Releasing expired KV blocks for request \S*?cmpl-([0-9a-f]{32})",
            Path(log_path).read_text(errors="replace"),
        )
    }
    left_in_prefill = {
        r.request_id for r in recs if r.status is RequestStatus.CANCELLED and r.prefill_done_s is None
    }
    print(
        f"real vLLM: clients left {dict(where)}; KV idle {idle_after_s:.2f} s after the last left; "
        f"{expired:g} leases expired, of clients that left in their prefill: {len(lapsed & left_in_prefill)}"
    )
    assert len(recs) == 50 and len({r.request_id for r in recs}) == 50
    assert all(r.status in (RequestStatus.OK, RequestStatus.CANCELLED) for r in recs), recs
    ours = lapsed & {r.request_id for r in recs}
    assert len(ours) == expired and ours <= left_in_prefill, (ours, left_in_prefill)
    assert expired > 0 or idle_after_s <= idle_bound_s, (expired, idle_after_s)


@pytest.mark.faults
def test_a_real_decode_engine_killed_mid_stream(real_cluster: ClusterFile, tmp_path: Path) -> None:
    c = real_cluster
    body = {"model": c.model, "prompt": PROMPT, "max_tokens": 1500, "ignore_eos": True, "stream": True}
    cfg = ProxyConfig(cluster=c, calibration=CAL, log_path=tmp_path / "log.jsonl", stall_timeout_s=5.0)
    with RunningProxy(cfg) as p:
        req = urllib.request.Request(
            f"{p.url}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            first = r.readline()
            stop_process_group(c.pgids[[e.id for e in c.engines].index("decode-0")])
            text = (first + r.read()).decode()
        # As its engine core dies, vLLM's API server sends an error event, or ends the request with
        # finish_reason "abort" (seen in CI); either way the stream ends with [DONE], never a silent cut.
        # Unless the stream was already whole: a stalled API server can deliver all 1,500 tokens at once
        # (its engine core kept generating), and then the kill comes after the end. The tiny model's text
        # itself can contain "error", so the test looks for an error *event*.
        mid_stream = 'data: {"error"' in text or '"finish_reason":"abort"' in text
        assert mid_stream or '"finish_reason":"length"' in text, text[-500:]
        assert text.rstrip().endswith("data: [DONE]"), text[-500:]
        deadline = time.monotonic() + 15
        while p.proxy.signals.healthy["decode-0"]:  # the health probe takes it out
            assert time.monotonic() < deadline, "decode-0 still in routing"
            time.sleep(0.1)
        # no decode engine left: tried anyway (panic mode), then a clear 502 rather than a hang
        status, out = request(
            f"{p.url}/v1/completions", {**body, "stream": False, "max_tokens": 4}, timeout_s=60
        )
        assert status == 502 and "error" in out, out
    recs = list(read_records(tmp_path / "log.jsonl"))
    first = RequestStatus.FAILED if mid_stream else RequestStatus.OK
    assert [r.status for r in recs] == [first, RequestStatus.FAILED]

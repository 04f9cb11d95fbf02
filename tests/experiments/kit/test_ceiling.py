"""The idle perfect-cache ceiling: above every policy's goodput on the same requests, request by request;
requests past the engines' length limit counted apart; the prefill engine holding what earlier requests
named, and nothing that only later ones name; the decode engine holding what two requests name."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from calroute.costmodel.profiles import HardwareProfile, get_profile
from calroute.experiments.kit.ceiling import perfect_cache_ceiling, run_ceiling
from calroute.experiments.kit.sim_backend import SimSetup, simulate_run
from calroute.policies import SIM_ONLY_POLICIES, expand_policy_list
from calroute.results.metrics import is_good
from calroute.results.records import RequestRecord, read_records
from calroute.sim.simulator import ClusterShape
from calroute.types import RequestSpec, RequestStatus, SloClass
from calroute.workload.source import workload_source

PROFILE = get_profile("a40-qwen2.5-3b")
# Records on disk keep microseconds: a TTFT read back is within 1e-6 s of the simulated one.
ROUNDING_S = 2e-6


def _ceiling_records(
    profile: HardwareProfile, reqs: list[RequestSpec], paths: tuple[str, ...] = ("remote", "local")
) -> dict[str, RequestRecord]:
    out: dict[str, RequestRecord] = {}
    perfect_cache_ceiling(profile, reqs, lambda r: out.__setitem__(r.request_id, r), paths)
    return out


@pytest.mark.parametrize("shape", [ClusterShape(2, 4), ClusterShape(1, 2)])
def test_no_policy_beats_it_on_a_loaded_prefix_workload(shape: ClusterShape, tmp_path: Path) -> None:
    # shared prefixes at a rate where round_robin on 2P+4D keeps about 0.6 of them
    reqs = workload_source("shared-prefix", 300).requests(8.0, 0)
    ceiling = perfect_cache_ceiling(PROFILE, reqs)
    alone = _ceiling_records(PROFILE, reqs)
    assert ceiling.requests == 300 and ceiling.inadmissible == 0
    setup = SimSetup(PROFILE, shape, PROFILE.calibration)
    slo = PROFILE.calibration.slo
    goodputs = {}
    for policy in [*expand_policy_list("all"), *sorted(SIM_ONLY_POLICIES)]:
        path = tmp_path / f"{policy}.jsonl"
        goodputs[policy] = simulate_run(setup, policy, reqs, 0, 8.0, records_path=path).summary.goodput
        for rec in read_records(path):
            best = alone[rec.request_id]
            # request by request: whatever is good on the cluster is good alone, and no faster
            assert not is_good(rec, slo) or is_good(best, slo), (policy, rec.request_id)
            if rec.status is RequestStatus.OK:
                assert best.ttft_s is not None and rec.ttft_s is not None
                assert best.ttft_s <= rec.ttft_s + ROUNDING_S, (policy, rec.request_id)
                assert best.tpot_s is not None and rec.tpot_s is not None
                assert best.tpot_s <= rec.tpot_s + ROUNDING_S, (policy, rec.request_id)
    assert all(g <= ceiling.goodput for g in goodputs.values()), (ceiling, goodputs)
    assert min(goodputs.values()) < ceiling.goodput  # the load told


def test_a_request_past_the_engines_length_limit_is_inadmissible() -> None:
    limit = PROFILE.limits.max_request_tokens
    reqs = [
        RequestSpec("fits", 0.0, 1000, 50, SloClass.LOOSE),
        RequestSpec("too-long", 0.0, limit - 10, 11, SloClass.LOOSE),
        RequestSpec("fits-too", 0.0, 800, 40, SloClass.LOOSE),
    ]
    records = _ceiling_records(PROFILE, reqs)
    assert records["too-long"].status is RequestStatus.REJECTED
    c = perfect_cache_ceiling(PROFILE, reqs)
    assert (c.requests, c.inadmissible) == (3, 1)
    assert c.goodput == pytest.approx(2 / 3) and c.admissible_goodput == 1.0


def test_its_engines_refuse_what_the_profiles_refuse_though_their_kv_is_unbounded() -> None:
    # KV smaller than the model length: the engines' limit is the KV capacity, and the ceiling keeps it
    small = replace(PROFILE, limits=replace(PROFILE.limits, kv_capacity_tokens=16_000))
    reqs = [
        RequestSpec("r0", 0.0, 15_000, 1_500, SloClass.LOOSE),
        RequestSpec("r1", 0.0, 900, 9, SloClass.LOOSE),
    ]
    assert perfect_cache_ceiling(small, reqs).inadmissible == 1
    assert perfect_cache_ceiling(PROFILE, reqs).inadmissible == 0


def test_a_request_hits_what_earlier_requests_named_and_nothing_only_later_ones_name() -> None:
    reqs = [
        RequestSpec("a", 0.0, 2000, 20, SloClass.LOOSE, (1, 2, 3)),
        RequestSpec("b", 0.0, 2600, 20, SloClass.LOOSE, (1, 2, 3, 4)),  # a's three blocks are cached
        RequestSpec("c", 0.0, 1200, 20, SloClass.LOOSE, (7, 8)),  # only d names them after it
        RequestSpec("d", 0.0, 1200, 20, SloClass.LOOSE, (7, 8)),
        # a hit leaves the prompt's last token to compute (vLLM): 1024 tokens hold at most one block
        RequestSpec("e", 0.0, 1024, 20, SloClass.LOOSE, (7, 8)),
    ]
    records = _ceiling_records(PROFILE, reqs, ("remote",))
    assert {k: r.cached_tokens for k, r in records.items()} == {
        "a": 0,
        "b": 1536,
        "c": 0,
        "d": 1024,
        "e": 512,
    }
    # all five arrived at once, the ceiling ran them one after the other
    ordered = [records[r.request_id] for r in reqs]
    for before, after in zip(ordered, ordered[1:], strict=False):
        assert before.last_token_s is not None and before.last_token_s < after.arrival_s


def test_its_decode_engine_holds_what_another_request_names_even_a_later_one() -> None:
    # On a cluster a later request sharing c's blocks can be pulled to c's decode engine first and spare c
    # their pull; a block no other request names can only be pulled (transfer_s of the prompt past the hit).
    c = RequestSpec("c", 0.0, 1200, 20, SloClass.LOOSE, (7, 8))
    alone = _ceiling_records(PROFILE, [c], ("remote",))["c"]
    d = RequestSpec("d", 0.0, 1300, 20, SloClass.LOOSE, (7, 8))
    shared = _ceiling_records(PROFILE, [c, d], ("remote",))["c"]
    assert alone.cached_tokens == shared.cached_tokens == 0  # no prefill hit: d came later
    assert alone.ttft_s is not None and shared.ttft_s is not None
    spared = PROFILE.calibration.transfer_s(1200) - PROFILE.calibration.transfer_s(1200 - 1024)
    assert alone.ttft_s - shared.ttft_s == pytest.approx(spared, rel=1e-9, abs=1e-12)
    assert spared > 0


def test_a_run_ceiling_is_that_of_the_runs_requests() -> None:
    reqs = workload_source("multi-turn", 120).requests(2.0, 3)
    assert run_ceiling(PROFILE, "multi-turn", 120, 2.0, 3) == perfect_cache_ceiling(PROFILE, reqs)


def test_its_local_path_holds_answers_and_beats_the_remote_one_alone() -> None:
    """Alone, the decode engine prefilling a prompt pays no pull and no prefill iteration's base; its cache
    holds what two requests name, an answer's blocks among them: the ceiling keeps the better path."""
    a = RequestSpec("a", 0.0, 2 * 512 + 100, 1000, SloClass.LOOSE, (1, 2), (3, 4))
    b = RequestSpec("b", 0.0, 5 * 512 + 10, 20, SloClass.LOOSE, (1, 2, 3, 4, 5))
    local = _ceiling_records(PROFILE, [a, b], ("local",))
    remote = _ceiling_records(PROFILE, [a, b], ("remote",))
    both = _ceiling_records(PROFILE, [a, b])
    assert local["b"].local_prefill and local["b"].cached_tokens == 4 * 512
    assert remote["b"].cached_tokens == 2 * 512  # a prefill engine never saw a's answer
    for k in ("a", "b"):
        ttfts = (local[k].ttft_s, remote[k].ttft_s, both[k].ttft_s)
        assert None not in ttfts
        assert both[k].ttft_s == min(local[k].ttft_s or 0.0, remote[k].ttft_s or 0.0)
    assert (local["b"].ttft_s or 0.0) < (remote["b"].ttft_s or 0.0)

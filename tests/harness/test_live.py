"""The live runner's proxy command line: what a variant asks for reaches `calroute serve` and parses there."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from calroute.cli.app import app
from calroute.costmodel.profiles import get_profile
from calroute.harness.live import LiveSetup, _proxy_argv, with_routing
from calroute.results.records import RecordWriter, RequestRecord
from calroute.routing.seeds import derive_seed
from calroute.routing.variant import Variant
from calroute.types import RequestStatus, SloClass
from tests.conftest import unreachable_cluster

CAL = get_profile("a40-qwen2.5-3b").calibration


def _setup(tmp_path: Path) -> LiveSetup:
    cluster = unreachable_cluster(1, 1)
    path = tmp_path / "cluster.yaml"
    cluster.save(path)
    return LiveSetup(cluster, path, CAL)


@pytest.mark.parametrize(
    ("variant", "seed", "want"),
    [
        (Variant("marginal_cost", "marginal_cost"), 0, ["--predictor", "bucket", "--predictor-noise", "0.0"]),
        (
            Variant("mc", "marginal_cost", predictor="oracle", predictor_noise=0.5),
            2,
            [
                "--predictor",
                "oracle",
                "--predictor-noise",
                "0.5",
                "--predictor-seed",
                str(derive_seed(2, "predictor")),
            ],
        ),
        (
            Variant("step", "marginal_cost", params={"step_curve": True}),
            0,
            ["--param", "step_curve=True"],
        ),
    ],
)
def test_the_variant_reaches_the_proxy_and_its_cli_accepts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variant: Variant, seed: int, want: list[str]
) -> None:
    argv = _proxy_argv(_setup(tmp_path), variant, tmp_path, 8123, seed)
    assert any(argv[i : i + len(want)] == want for i in range(len(argv)))
    # The serve command parses the whole line; only starting the server is replaced.
    started: list[object] = []
    monkeypatch.setattr("calroute.aio.run_until_signalled", lambda *a, **kw: started.append(a))
    result = CliRunner().invoke(app, argv[argv.index("serve") :])
    assert result.exit_code == 0, result.output
    assert len(started) == 1


def test_a_reused_run_is_judged_by_the_targets_of_the_call(tmp_path: Path) -> None:
    import json
    from dataclasses import asdict

    from calroute.costmodel.slo import LONG_CONTEXT, with_slo
    from calroute.harness.live import run_definition, run_variant
    from calroute.results.metrics import summarize
    from calroute.results.records import RecordWriter, RequestRecord
    from calroute.types import RequestSpec, RequestStatus, SloClass

    # one request of 4,000 prompt tokens, first token at 0.5 s: late for the paper's 0.2 s, in time for
    # long-context (0.2 s + twice what 4,000 tokens add to an idle TTFT: about 0.8 s)
    spec = RequestSpec("r0", 0.0, 4000, 8, SloClass.TIGHT)
    rec = RequestRecord(
        request_id="r0",
        slo_class=SloClass.TIGHT,
        prompt_tokens=4000,
        target_output_tokens=8,
        predicted_output_tokens=8,
        output_tokens=8,
        policy="round_robin",
        prefill_id="p0",
        decode_id="d0",
        arrival_s=0.0,
        prefill_done_s=0.45,
        first_token_s=0.5,
        last_token_s=0.57,
        status=RequestStatus.OK,
    )
    variant = Variant("round_robin", "round_robin")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with (run_dir / "records.jsonl").open("w") as f:
        RecordWriter(f).write(rec)
    saved = {
        "summary": asdict(summarize([rec], CAL.slo)),
        "valid": True,
        "lateness_p99_s": 0.0,
        "definition": run_definition(variant, [spec]),
    }
    (run_dir / "summary.json").write_text(json.dumps(saved))
    setup = _setup(tmp_path)  # an unreachable cluster: a run that were not reused would fail
    assert run_variant(setup, variant, [spec], run_dir).summary.good == 0
    judged = LiveSetup(setup.cluster, setup.cluster_path, with_slo(CAL, LONG_CONTEXT))
    assert run_variant(judged, variant, [spec], run_dir).summary.good == 1


def _record(request_id: str, **kw: object) -> RequestRecord:
    fields: dict[str, object] = {
        "request_id": request_id,
        "slo_class": SloClass.TIGHT,
        "prompt_tokens": 100,
        "target_output_tokens": 8,
        "predicted_output_tokens": 0,
        "output_tokens": 8,
        "policy": "p",
        "prefill_id": None,
        "decode_id": None,
        "arrival_s": 0.5,
        "prefill_done_s": None,
        "first_token_s": 0.6,
        "last_token_s": 0.7,
        "status": RequestStatus.OK,
        "cached_tokens": 32,
    }
    return RequestRecord(**{**fields, **kw})  # type: ignore[arg-type]


def test_the_clients_records_learn_the_routing_from_the_proxys_by_the_answers_id(tmp_path: Path) -> None:
    client = [_record("r0"), _record("r1"), _record("r2")]
    proxy = [
        # r0 went remote: its engines and prediction come over, the client's cached tokens (the prefill
        # engine's, from the proxy's header) and times stay
        _record("aa", prefill_id="prefill-0", decode_id="decode-1", predicted_output_tokens=9, arrival_s=9.0),
        # r1 stayed local: the decode engine's own count of cached tokens comes over with the path
        _record(
            "bb",
            prefill_id="decode-0",
            decode_id="decode-0",
            local_prefill=True,
            path_reason="cheaper_local",
            cached_tokens=64,
            predicted_cached_tokens=48,
        ),
    ]
    log = tmp_path / "proxy.jsonl"
    with log.open("w") as f:
        writer = RecordWriter(f)
        for rec in proxy:
            writer.write(rec)
        writer.flush()
    # r2's answer named no id the proxy logged: its record stays the client's
    out = with_routing(client, {"r0": "aa", "r1": "bb", "r2": "zz"}, log)
    assert [r.request_id for r in out] == ["r0", "r1", "r2"]
    assert (out[0].prefill_id, out[0].decode_id, out[0].predicted_output_tokens) == (
        "prefill-0",
        "decode-1",
        9,
    )
    assert out[0].arrival_s == 0.5 and out[0].cached_tokens == 32 and not out[0].local_prefill
    assert out[1].local_prefill and out[1].path_reason == "cheaper_local"
    assert (out[1].cached_tokens, out[1].predicted_cached_tokens) == (64, 48)
    assert out[2] == client[2]
    assert (
        with_routing(client, {}, log) == client
        and with_routing(client, {"r0": "aa"}, tmp_path / "x") == client
    )

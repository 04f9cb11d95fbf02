"""SLO specs (costmodel/slo.py) and the per-token targets they set (SloTargets): presets, files, errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from calroute.costmodel.calibration import Calibration, SloTargets
from calroute.costmodel.slo import (
    LONG_CONTEXT,
    LONG_CONTEXT_IDLE_FACTOR,
    PAPER,
    PRESETS,
    ClassSpec,
    SloSpec,
    describe_slo,
    idle_allowance,
    parse_slo,
    resolve_slo,
    with_slo,
)
from calroute.errors import CalibrationError, ConfigError
from calroute.types import SloClass

TIGHT, LOOSE = SloClass.TIGHT, SloClass.LOOSE


def test_paper_is_the_calibrations_own_targets(calibration: Calibration) -> None:
    assert resolve_slo(PAPER, calibration) == calibration.slo
    assert not calibration.slo.per_token


def test_long_context_keeps_the_fixed_parts_and_adds_twice_the_idle_prompts_cost(
    calibration: Calibration,
) -> None:
    slo = resolve_slo(LONG_CONTEXT, calibration)
    paper = calibration.slo
    # what a prompt adds to an idle TTFT: prefill per token and its attention, and the KV transfer
    per_token, per_token2 = idle_allowance(calibration)
    c = calibration
    assert per_token2 == pytest.approx(c.prefill.attn_s_per_token2 / 2)
    assert per_token * 1000 == pytest.approx(
        c.prefill.per_token_s * 1000 + c.transfer_s(1000) - c.transfer_s(0)
    )
    f = LONG_CONTEXT_IDLE_FACTOR

    def tight(p: int) -> float:
        return paper.tight_ttft_s + f * (per_token * p + per_token2 * p * p)

    # (class, prompt tokens, TTFT target): the fixed part is the paper's, loose is loose_factor x tight
    for cls, prompt, want in [
        (TIGHT, 0, paper.tight_ttft_s),
        (TIGHT, 1000, tight(1000)),
        (TIGHT, 30_000, tight(30_000)),
        (LOOSE, 0, 3 * paper.tight_ttft_s),
        (LOOSE, 1000, 3 * tight(1000)),
    ]:
        assert slo.ttft_target_s(cls, prompt) == pytest.approx(want)
    assert (slo.tpot_s(TIGHT), slo.tpot_s(LOOSE)) == (paper.tpot_s(TIGHT), paper.tpot_s(LOOSE))


@pytest.mark.parametrize("prompt_tokens", [1024, 4096, 16384, 32768, 131072])
def test_long_context_passes_a_lone_prompt_with_the_papers_headroom(
    calibration: Calibration, prompt_tokens: int
) -> None:
    # The preset's reason: a prompt alone on an idle cluster (prefill, transfer, one step) meets the tight
    # target with at least the paper's factor 2 to spare, at any length (the allowance grows with the square
    # of the prompt, as the prefill does); the paper's fixed target fails it from about 2k tokens on.
    p = prompt_tokens
    unloaded_s = calibration.prefill.single_s(p) + calibration.transfer_s(p) + calibration.decode.step_s(1, p)
    assert resolve_slo(LONG_CONTEXT, calibration).ttft_target_s(TIGHT, p) >= 2 * unloaded_s


def test_long_context_passes_a_million_token_prompt_alone(calibration: Calibration) -> None:
    # an A40's whole cache in one prompt: the first decode step over a million tokens eats into the fixed
    # part's headroom, and the target is still met alone
    p = 1_000_000
    unloaded_s = calibration.prefill.single_s(p) + calibration.transfer_s(p) + calibration.decode.step_s(1, p)
    assert resolve_slo(LONG_CONTEXT, calibration).ttft_target_s(TIGHT, p) >= unloaded_s
    assert (calibration.slo.ttft_target_s(TIGHT, p) >= unloaded_s) is (p <= 2048)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


YAML_FILE = """
tight:
  ttft_s: 0.5
  ttft_per_token_tau_pre: 2
  tpot_s: 0.05
loose:
  tpot_s: 0.5
  ttft_s_per_token: 0.001
loose_factor: 4
"""


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("slo.yaml", YAML_FILE),
        (
            "slo.json",
            json.dumps(
                {
                    "tight": {"ttft_s": 0.5, "ttft_per_token_tau_pre": 2, "tpot_s": 0.05},
                    "loose": {"tpot_s": 0.5, "ttft_s_per_token": 0.001},
                    "loose_factor": 4,
                }
            ),
        ),
    ],
)
def test_an_slo_file_sets_per_class_targets(
    calibration: Calibration, tmp_path: Path, name: str, text: str
) -> None:
    slo = resolve_slo(write(tmp_path, name, text), calibration)
    tau = calibration.tau_pre_s
    # (class, TTFT fixed part, TTFT per token, TPOT): what the file leaves out of loose is 4 x tight
    assert (slo.ttft_s(TIGHT), slo.ttft_s_per_token(TIGHT), slo.tpot_s(TIGHT)) == pytest.approx(
        (0.5, 2 * tau, 0.05)
    )
    assert (slo.ttft_s(LOOSE), slo.ttft_s_per_token(LOOSE), slo.tpot_s(LOOSE)) == pytest.approx(
        (2.0, 0.001, 0.5)
    )


def test_what_a_file_leaves_out_is_the_calibrations(calibration: Calibration, tmp_path: Path) -> None:
    slo = resolve_slo(write(tmp_path, "s.yaml", "tight: {ttft_per_token_tau_pre: 1}\n"), calibration)
    assert slo == replace(calibration.slo, tight_ttft_s_per_token=calibration.tau_pre_s)
    assert resolve_slo(write(tmp_path, "empty.yaml", "{}\n"), calibration) == calibration.slo


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.yaml", "tight: {ttft_ms: 200}\n", "unknown field tight.ttft_ms"),
        ("b.yaml", "medium: {ttft_s: 1}\n", "unknown field 'medium'"),
        ("c.yaml", "tight: {ttft_s: fast}\n", "'tight.ttft_s' must be a number"),
        ("d.yaml", "tight: {ttft_s_per_token: 1e-4}\n", "write 1.0e-4"),
        ("e.yaml", "loose: {tpot_s: 0}\n", r"'loose.tpot_s' must be a finite number > 0"),
        (
            "f.yaml",
            "loose: {ttft_s_per_token: -1.0}\n",
            r"'loose.ttft_s_per_token' must be a finite number >= 0",
        ),
        ("g.yaml", "tight: {ttft_s: true}\n", "'tight.ttft_s' must be a number"),
        ("h.yaml", "loose_factor: 0.5\n", "'loose_factor' must be >= 1"),
        ("i.yaml", "tight: 3\n", "field 'tight' must be a mapping"),
        ("j.yaml", "- 1\n", "holds a mapping"),
        ("k.yaml", "tight: {ttft_s: [1\n", "is not YAML"),
        ("l.json", "{'tight': 1}", "is not JSON"),
        (
            "m.yaml",
            "tight: {ttft_s_per_token: 0.001, ttft_per_token_tau_pre: 2}\n",
            "at most one of tight.ttft_s_per_token and tight.ttft_per_token_tau_pre",
        ),
        (
            "n.yaml",
            "loose: {ttft_idle_factor: 2, ttft_s_per_token2: 1.0e-9}\n",
            "at most one of loose.ttft_idle_factor and loose.ttft_s_per_token2",
        ),
        ("o.yaml", "tight: {ttft_idle_factor: 0}\n", r"'tight.ttft_idle_factor' must be a finite number > 0"),
    ],
)
def test_a_bad_file_is_refused_naming_the_field(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError, match=message) as e:
        parse_slo(path)
    assert path in str(e.value)


def test_an_unknown_preset_names_the_presets() -> None:
    with pytest.raises(ConfigError, match="not a preset \\(paper, long-context\\) nor a file"):
        parse_slo("long-contex")


def test_a_loose_target_below_the_tight_one_is_refused_on_resolution(
    calibration: Calibration, tmp_path: Path
) -> None:
    spec = parse_slo(write(tmp_path, "s.yaml", "loose: {ttft_s: 0.01}\n"))
    with pytest.raises(ConfigError, match="slo.loose_ttft_s must be >= slo.tight_ttft_s"):
        spec.resolve(calibration)


@pytest.mark.parametrize("spec", [*PRESETS, "file"])
def test_a_spec_survives_its_definition(calibration: Calibration, tmp_path: Path, spec: str) -> None:
    # experiments save the definition in their manifest and resolve it again for the report
    parsed = parse_slo(write(tmp_path, "s.yaml", YAML_FILE) if spec == "file" else spec)
    again = SloSpec.from_definition(json.loads(json.dumps(parsed.definition())))
    assert again == parsed and again.resolve(calibration) == parsed.resolve(calibration)
    if spec == "file":
        assert parsed.key.startswith("file-")
    elif spec == PAPER:
        assert parsed.key == PAPER
    else:
        assert parsed.key.startswith(f"{spec}-") and len(parsed.key) == len(spec) + 11


def test_a_preset_whose_definition_changes_keys_apart() -> None:
    # long-context was 4 x tau_pre per token before 2026-12-05: its saved results must not pass for the new
    old = SloSpec(LONG_CONTEXT, tight=ClassSpec(ttft_per_token_tau_pre=4.0))
    assert old.key != PRESETS[LONG_CONTEXT].key and old.key.startswith("long-context-")


def test_per_token_targets_round_trip_and_paper_files_are_unchanged(
    calibration: Calibration, tmp_path: Path
) -> None:
    # a calibration with the paper's targets writes the three fields it always wrote
    assert set(json.loads(calibration.to_json())["slo"]) == {"tight_ttft_s", "tight_tpot_s", "loose_factor"}
    judged = with_slo(calibration, PRESETS[LONG_CONTEXT])
    explicit = replace(judged, slo=replace(judged.slo, loose_ttft_s=1.0, loose_tpot_s=0.5))
    for cal in (judged, explicit):
        path = tmp_path / "cal.json"
        cal.save(path)
        assert Calibration.load(path) == cal
    assert (judged.tau_pre_s, judged.prefill) == (calibration.tau_pre_s, calibration.prefill)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tight_ttft_s_per_token": -1e-4}, "slo.tight_ttft_s_per_token must be >= 0"),
        ({"tight_ttft_s_per_token": float("nan")}, "slo.tight_ttft_s_per_token must be >= 0"),
        ({"loose_tpot_s": 0.01}, "slo.loose_tpot_s must be >= slo.tight_tpot_s"),
        ({"loose_ttft_s_per_token": 0.0, "tight_ttft_s_per_token": 1e-4}, "slo.loose_ttft_s_per_token"),
    ],
)
def test_slo_targets_refuse_bad_values_by_name(fields: dict[str, float], message: str) -> None:
    with pytest.raises(CalibrationError, match=message):
        SloTargets(tight_ttft_s=0.2, tight_tpot_s=0.04, **fields)


def test_describe_names_the_per_token_part(calibration: Calibration) -> None:
    assert "per prompt token" not in describe_slo(calibration.slo)
    text = describe_slo(resolve_slo(LONG_CONTEXT, calibration))
    assert text.startswith("tight TTFT 200 ms + 0.127 ms per prompt token + 4.93 ns per squared prompt token")
    assert "loose TTFT 601 ms" in text


def test_a_file_sets_the_squared_allowance_or_the_idle_factor(
    calibration: Calibration, tmp_path: Path
) -> None:
    text = "tight: {ttft_s_per_token2: 2.0e-9}\nloose: {ttft_idle_factor: 3}\n"
    slo = resolve_slo(write(tmp_path, "q.yaml", text), calibration)
    per_token, per_token2 = idle_allowance(calibration)
    assert slo.ttft_s_per_token2(TIGHT) == 2e-9 and slo.ttft_s_per_token(TIGHT) == 0.0
    assert slo.ttft_s_per_token2(LOOSE) == pytest.approx(3 * per_token2)
    assert slo.ttft_s_per_token(LOOSE) == pytest.approx(3 * per_token)
    assert SloTargets(**slo.to_dict()) == slo
    # a calibration file keeps them
    path = tmp_path / "cal.json"
    replace(calibration, slo=slo).save(path)
    assert Calibration.load(path).slo == slo


def test_long_context_is_met_by_every_lone_request_on_the_simulated_cluster(calibration: Calibration) -> None:
    # the spec's promise, on the simulator: requests of every length up to the model's, each alone (spaced
    # far apart), both classes, all good
    from calroute.costmodel.profiles import HardwareProfile, get_profile
    from calroute.experiments.kit.sim_backend import SimSetup, simulate_run
    from calroute.sim.simulator import ClusterShape
    from calroute.types import RequestSpec

    profile = get_profile("a40-qwen2.5-3b")
    judged = HardwareProfile(profile.name, with_slo(profile.calibration, LONG_CONTEXT), profile.limits)
    lengths = [64, 1024, 4096, 8192, 16384, 24000, 32000]
    requests = [
        RequestSpec(f"r{i}", 100.0 * i, p, 64, cls)
        for i, (p, cls) in enumerate((p, cls) for p in lengths for cls in (TIGHT, LOOSE))
    ]
    setup = SimSetup(judged, ClusterShape(2, 4), judged.calibration)
    result = simulate_run(setup, "least_loaded", requests, seed=0)
    assert result.summary.good == len(requests)

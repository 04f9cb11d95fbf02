"""The clairvoyant marginal_cost: marginal_cost's prices on the simulator's truth, refused wherever the truth
is not there; its old name, oracle, answered with the new one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from calroute.cli.app import app
from calroute.costmodel.calibration import Calibration
from calroute.costmodel.predictors import OraclePredictor, make_predictor
from calroute.costmodel.profiles import get_profile
from calroute.errors import ConfigError
from calroute.experiments.kit.params_files import TUNING_DIR
from calroute.policies import check_live_policy, expand_policy_list, make_policy, params_class, registered
from calroute.policies.params_file import load_params_file
from calroute.proxy.app import Proxy
from calroute.proxy.config import ProxyConfig
from calroute.results.records import RequestRecord
from calroute.routing.build import build_router
from calroute.routing.ledger import Ledger
from calroute.routing.router import Router
from calroute.routing.seeds import RouterSeeds
from calroute.sim.simulator import ClusterShape, ClusterSim
from calroute.types import Admission, ClusterView, RequestSpec, RequestStatus, SloClass
from tests.conftest import make_admission, make_view, unreachable_cluster


def test_it_prices_as_marginal_cost_on_the_view_it_is_given(calibration: Calibration) -> None:
    view = make_view(prefill=[{"backlog_s": 0.3}, {"cached_tokens": 2048}], decode=[{"in_flight": 4}, {}])
    adm = make_admission(prompt_tokens=4096)
    assert make_policy("clairvoyant", {}, calibration).route(adm, view) == make_policy(
        "marginal_cost", {}, calibration
    ).route(adm, view)


_PROFILE = get_profile("a40-qwen2.5-3b")


def _run_clairvoyant(
    shape: ClusterShape, reqs: list[RequestSpec]
) -> tuple[Router, list[tuple[Admission, ClusterView]], list[RequestRecord]]:
    """Simulate ``reqs`` routed by the clairvoyant: its router, every decision's (admission, view), the
    records."""
    specs = shape.instances(_PROFILE.limits.kv_capacity_tokens)
    views: list[tuple[Admission, ClusterView]] = []
    router = build_router(
        "clairvoyant",
        {},
        _PROFILE.calibration,
        Ledger(specs, _PROFILE.calibration),
        seeds=RouterSeeds(),
        on_decision=lambda d: views.append((d.admission, d.view)),
    )
    records: list[RequestRecord] = []
    ClusterSim(_PROFILE, shape, router, "clairvoyant").run(reqs, records.append)
    return router, views, records


def test_the_simulator_shows_it_the_true_lengths_and_state() -> None:
    reqs = [RequestSpec(f"r{i}", 0.01 * i, 3000, 50 + i, SloClass.LOOSE) for i in range(6)]
    router, views, records = _run_clairvoyant(ClusterShape(2, 4), reqs)
    assert isinstance(router.predictor, OraclePredictor)
    assert all(r.status is RequestStatus.OK for r in records)
    assert [adm.predicted_output_tokens for adm, _ in views] == [r.output_tokens for r in reqs]
    # no sampling delay in the truth, and the prompts queued before each arrival are seen at once
    assert all(s.metrics_age_s == 0.0 for _, v in views for s in (*v.prefill, *v.decode))
    assert sum(s.in_flight for s in views[1][1].prefill) == 1


def test_a_decode_engines_true_backlog_is_every_streams_time_left() -> None:
    # the quantity the ledger estimates (routing/ledger.py): the time left summed over the streams, not the
    # longest stream's; two 400-token streams on one decode engine, a third request while both run
    reqs = [
        RequestSpec("r0", 0.0, 200, 400, SloClass.LOOSE),
        RequestSpec("r1", 0.01, 200, 400, SloClass.LOOSE),
        RequestSpec("r2", 1.0, 200, 10, SloClass.LOOSE),
    ]
    _, views, _ = _run_clairvoyant(ClusterShape(1, 1), reqs)
    decode = views[2][1].decode[0]
    tau = _PROFILE.calibration.tau_dec_s
    assert decode.running == 2
    # both streams have most of their 400 tokens left: more than one stream could have
    assert 600 * tau < decode.backlog_s < 800 * tau


def test_live_routers_refuse_it_by_name(calibration: Calibration) -> None:
    with pytest.raises(ConfigError, match="simulator only"):
        check_live_policy("clairvoyant")
    check_live_policy("marginal_cost")
    cfg = ProxyConfig(cluster=unreachable_cluster(1, 1), calibration=calibration, policy="clairvoyant")
    with pytest.raises(ConfigError, match="'clairvoyant' runs on the simulator only"):
        Proxy(cfg, None)


RENAMED = "policy 'oracle' was renamed 'clairvoyant'"


def test_asking_for_the_oracle_policy_names_its_new_name(calibration: Calibration) -> None:
    # the predictor keeps the name: the true output lengths, a different thing
    assert make_predictor("oracle").name == "oracle"
    for ask in (
        lambda: registered("oracle"),
        lambda: make_policy("oracle", {}, calibration),
        lambda: params_class("oracle"),
        lambda: expand_policy_list("marginal_cost,oracle"),
        lambda: check_live_policy("oracle"),
    ):
        with pytest.raises(ConfigError, match=RENAMED):
            ask()
    with pytest.raises(ConfigError, match="unknown policy 'oracles'"):
        registered("oracles")
    cfg = ProxyConfig(cluster=unreachable_cluster(1, 1), calibration=calibration, policy="oracle")
    with pytest.raises(ConfigError, match=RENAMED):
        Proxy(cfg, None)


@pytest.mark.parametrize("option", ["--policies", "--saturate-on"])
def test_simulate_names_the_new_name(option: str) -> None:
    args = ["simulate", "--workload", "chat", "--requests", "20", "--rate", "1", option, "oracle"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert "was renamed 'clairvoyant'" in result.output


def test_a_params_file_for_the_oracle_names_the_new_name(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": "calroute-params/1", "policy": "oracle", "params": {"w_b": 1.0}}))
    with pytest.raises(ConfigError, match=f"old.json: {RENAMED}"):
        load_params_file(path)


def test_the_renamed_params_files_load_for_the_clairvoyant() -> None:
    files = sorted(TUNING_DIR.glob("clairvoyant-*.json"))
    assert files
    for path in files:
        assert load_params_file(path).policy == "clairvoyant"
    assert not list(TUNING_DIR.glob("oracle-*.json"))

"""The live runner's proxy command line: what a variant asks for reaches `calroute serve` and parses there."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from calroute.cli.app import app
from calroute.costmodel.profiles import get_profile
from calroute.harness.live import LiveSetup, _proxy_argv
from calroute.routing.seeds import derive_seed
from calroute.routing.variant import Variant
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

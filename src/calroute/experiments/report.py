"""`calroute report DIR`: every experiment's section, regenerated from its saved results, in one file (and
in each experiment's own report.md, so the two never disagree)."""

from __future__ import annotations

import json
from pathlib import Path

from calroute.costmodel.slo import describe_slo
from calroute.errors import ConfigError
from calroute.experiments import EXPERIMENTS
from calroute.experiments.base import judged_slo
from calroute.experiments.cells import CellResult
from calroute.experiments.runner import scale_for

PAIRED_NOTE = (
    '"vs best, paired": the variant minus the cell\'s best variant in goodput points, paired by seed '
    "(the same arrival trace): the mean, its 95 % bootstrap interval, n, and a win or loss only where the "
    'interval excludes zero, else "within noise"; there, "needs n = K" is how many traces would give an '
    "interval narrower than a gap of that size and spread (results/stats.py). With 3 seeds the interval is "
    "the range of the three differences: a loss means behind on every trace."
)


def write_report(directory: Path) -> Path:
    if not directory.is_dir():
        raise ConfigError(f"no results directory {directory}")
    sections = []
    for name, exp in EXPERIMENTS.items():
        exp_dir = directory / name
        results_path = exp_dir / "results.json"
        if not results_path.exists():
            continue
        results = [CellResult.from_dict(d) for d in json.loads(results_path.read_text())]
        manifest = json.loads((exp_dir / "manifest.json").read_text())
        backend = manifest["backend"]
        command = f"calroute experiment {name} --backend {backend}{' --quick' if manifest['quick'] else ''}"
        default = scale_for(backend, manifest["quick"])
        if manifest["scale"]["requests"] != default.requests:
            command += f" --requests {manifest['scale']['requests']}"
        if len(manifest["scale"]["seeds"]) != len(default.seeds):
            command += f" --seeds {len(manifest['scale']['seeds'])}"
        if manifest.get("time_scale", 1.0) != 1.0:
            command += f" --time-scale {manifest['time_scale']:g}"
        if manifest.get("saturation", "live") != "live":
            command += f" --saturation {manifest['saturation']}"
        slo_name = (manifest.get("slo") or {}).get("name", "paper")
        slo_note = ""
        if slo_name != "paper":
            command += f" --slo {slo_name}"
            # on a live backend each shape's calibration resolves the spec: the first cell's is shown
            first = manifest["cells"][0]
            shape = f"{first['prefill']}P{first['decode']}D"
            slo_note = f"SLO `{slo_name}` ({shape}): {describe_slo(judged_slo(exp_dir, shape))}.\n"
        section = exp.report(results, exp_dir)
        (exp_dir / "report.md").write_text(section)
        sections.append(
            section + f"\n{slo_note}Command: `{command} --out {manifest.get('out', directory.parent)}`; "
            f"commit {manifest.get('git_commit') or '-'}; "
            f"{manifest['scale']['requests']} requests per run, seeds {manifest['scale']['seeds']}.\n"
        )
    if not sections:
        raise ConfigError(f"no experiment results under {directory}")
    path = directory / "report.md"
    path.write_text(
        f"# calroute experiments ({directory.name})\n\nThe paper's experiments (shared/reference/"
        "paper-notes.md section 4) with the paper's figures beside ours where it gives them. Goodput: the "
        "fraction of requests meeting both SLO targets of their class; the best mean per cell is in bold. "
        + PAIRED_NOTE
        + "\n\n"
        + "\n".join(sections)
    )
    return path

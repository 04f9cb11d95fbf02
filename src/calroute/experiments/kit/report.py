"""The report: the Markdown tables and plots every experiment's section is made of, and `calroute report
DIR`, every experiment's section regenerated from its saved results in one file (and in each experiment's
own report.md, so the two never disagree)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from calroute.costmodel.calibration import Calibration, SloTargets
from calroute.costmodel.profiles import DEFAULT_PROFILE, get_profile
from calroute.costmodel.slo import SloSpec, describe_slo
from calroute.errors import ConfigError
from calroute.experiments.kit.cells import CellResult, Experiment
from calroute.experiments.kit.runner import scale_for
from calroute.report import plots
from calroute.results.records import read_records
from calroute.results.stats import paired_difference
from calroute.types import RequestStatus, SloClass


def fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None or x != x else f"{x:.{digits}f}"


def mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.fmean(vals) if vals else None


def paired_gap(cell: CellResult, label: str, best: str) -> str:
    """``label`` minus ``best`` in goodput points, paired by seed (the same arrival trace): the mean, its
    95 % bootstrap interval, n, and the verdict (results/stats.py: a loss only where the interval excludes
    zero, else "within noise"); within noise, how many traces would resolve a gap of this size and spread.

    The seeds' spread mixes how hard each trace is with run-to-run noise; the paired difference removes the
    first, so a gap that changes sign across traces reads as the tie it is.
    """
    mine = {r.seed: r.summary.goodput for r in cell.runs if r.label == label}
    theirs = {r.seed: r.summary.goodput for r in cell.runs if r.label == best}
    diffs = [100 * (mine[s] - theirs[s]) for s in sorted(mine.keys() & theirs.keys())]
    if label == best or not diffs:
        return "-"
    if len(diffs) == 1:
        return f"{diffs[0]:+.1f} (n = 1)"
    d = paired_difference(diffs, [0.0] * len(diffs))
    needed = d.to_resolve if d.verdict not in ("win", "loss") else None
    return d.describe(digits=1) + ("" if needed is None else f"; needs n = {needed:,}")


def goodput_table(
    results: Sequence[CellResult], row_name: str, paper: dict[tuple[str, str], float] | None = None
) -> str:
    """One row per cell and variant: goodput per seed, mean, spread, the gap to the cell's best variant paired
    by seed, P99 TTFT and TPOT (means over seeds), and the paper's figure when it has one, keyed by
    (cell key, variant label)."""
    seeds = sorted({r.seed for c in results for r in c.runs})
    head = [
        row_name,
        "variant",
        *[f"seed {s}" for s in seeds],
        "mean goodput",
        "spread",
        "vs best, paired (pts)",
        "P99 TTFT (s)",
        "P99 TPOT (s)",
        "req/s",
    ]
    if paper:
        head.append("paper")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in results:
        best_label = max(c.labels(), key=c.mean_goodput)
        best = c.mean_goodput(best_label)
        for label in c.labels():
            runs = sorted((r for r in c.runs if r.label == label), key=lambda r: r.seed)
            g = [r.summary.goodput for r in runs]
            m = c.mean_goodput(label)  # the same arithmetic as `best`, so the best row is found exactly
            cells = [
                c.cell_key,
                label,
                *[fmt(x) for x in g],
                f"**{fmt(m)}**" if m == best else fmt(m),
                fmt(max(g) - min(g)),
                paired_gap(c, label, best_label),
                fmt(mean([r.summary.ttft_p99_s for r in runs])),
                fmt(mean([r.summary.tpot_p99_s for r in runs]), 4),
                fmt(c.rate_rps, 2),
            ]
            if paper:
                cells.append(fmt(paper.get((c.cell_key, label))))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def bars_by_cell(results: Sequence[CellResult], exp_dir: Path, name: str, title: str) -> str:
    groups = [c.cell_key for c in results]
    labels = list(dict.fromkeys(label for c in results for label in c.labels()))
    series = {label: [c.mean_goodput(label) for c in results] for label in labels}
    errors = {
        label: [(max(g) - min(g)) / 2 if (g := c.goodputs(label)) else 0.0 for c in results]
        for label in labels
    }
    return plots.grouped_bars(
        exp_dir / f"{name}.png", groups, series, errors, "goodput (mean over seeds)", title
    )


def judged_slo(exp_dir: Path, shape: str) -> SloTargets:
    """The targets an experiment's runs were judged by: its manifest's SLO spec (the paper's when it names
    none) on the calibration of the live cluster of this shape it ran on, else on the default profile, the
    simulator backend's."""
    manifest = exp_dir / "manifest.json"
    d = json.loads(manifest.read_text()).get("slo") if manifest.exists() else None
    cal_path = exp_dir.parent / "_clusters" / shape / "calibration.json"
    cal = Calibration.load(cal_path) if cal_path.exists() else get_profile(DEFAULT_PROFILE).calibration
    return cal.slo if d is None else SloSpec.from_definition(d).resolve(cal)


def latency_cdfs(cell: CellResult, exp_dir: Path, slo: SloTargets) -> list[str]:
    """CDFs of TTFT and TPOT per variant, from the cell's per-request records (seed 0), with the tight
    targets dashed. A TTFT target that grows with the prompt is no one line: the line is its fixed part, and
    the title says it grows (describe_slo gives the allowances).

    Without records (results copied without them, as under docs/results/) plots already drawn are kept and
    none are drawn empty."""
    ttft: dict[str, list[float]] = {}
    tpot: dict[str, list[float]] = {}
    for label in cell.labels():
        path = exp_dir / "records" / cell.cell_key / f"{label}-seed0.jsonl"
        if not path.exists():
            continue
        recs = [r for r in read_records(path) if r.status is RequestStatus.OK]
        ttft[label] = [r.ttft_s for r in recs if r.ttft_s is not None and r.ttft_s > 0]
        tpot[label] = [r.tpot_s for r in recs if r.tpot_s is not None and r.tpot_s > 0]
    base = f"{cell.cell_key}"
    if not ttft:
        return [
            p.name for p in (exp_dir / f"{base}-ttft-cdf.png", exp_dir / f"{base}-tpot-cdf.png") if p.exists()
        ]
    return [
        plots.cdfs(
            exp_dir / f"{base}-ttft-cdf.png",
            ttft,
            "TTFT (s)",
            f"TTFT, {cell.cell_key} (tight target dashed)"
            if not slo.per_token
            else f"TTFT, {cell.cell_key} (dashed: tight target's fixed part;\nit grows with the prompt)",
            slo.ttft_s(SloClass.TIGHT),
        ),
        plots.cdfs(
            exp_dir / f"{base}-tpot-cdf.png",
            tpot,
            "TPOT (s)",
            f"TPOT, {cell.cell_key} (tight target dashed)",
            slo.tpot_s(SloClass.TIGHT),
        ),
    ]


PAIRED_NOTE = (
    '"vs best, paired": the variant minus the cell\'s best variant in goodput points, paired by seed '
    "(the same arrival trace): the mean, its 95 % bootstrap interval, n, and a win or loss only where the "
    'interval excludes zero, else "within noise"; there, "needs n = K" is how many traces would give an '
    "interval narrower than a gap of that size and spread (results/stats.py). With 3 seeds the interval is "
    "the range of the three differences: a loss means behind on every trace."
)


def write_report(directory: Path, experiments: Mapping[str, Experiment]) -> Path:
    """The report of every experiment of ``experiments`` (the catalogue's registry) with results under
    ``directory``."""
    if not directory.is_dir():
        raise ConfigError(f"no results directory {directory}")
    sections = []
    for name, exp in experiments.items():
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
        for limit, value in (manifest.get("engine_limits") or {}).items():
            command += f" --{limit.replace('_', '-')} {value}"
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
        # The --out given, as typed; one given as an absolute path is recorded relative to the experiment's
        # folder (kit/paths.py), so the command names where the results are now.
        out = manifest.get("out")
        if out is None or out.startswith(".."):
            out = directory.parent
        sections.append(
            section + f"\n{slo_note}Command: `{command} --out {out}`; "
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

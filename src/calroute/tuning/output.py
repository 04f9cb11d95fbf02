"""What `calroute tune` writes: the params file (policies/params_file.py reads its ``policy`` and ``params``;
the rest says how they were trained and validated) and a Markdown report beside it. Both are written
whole or not at all."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from calroute.errors import ConfigError
from calroute.policies.params_file import FORMAT
from calroute.results.stats import PairedDiff
from calroute.tuning.validation import FamilyResult


def check_out(path: Path, policy: str) -> None:
    """A ConfigError when ``path`` exists and is not a params file for ``policy`` (a tune never overwrites
    another policy's parameters, or a file that is not a params file)."""
    if not path.exists():
        return
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"--out {path}: exists and is not a params file ({e}); move it or give another"
        ) from e
    other = doc.get("policy") if isinstance(doc, dict) else None
    if other != policy:
        raise ConfigError(
            f"--out {path}: exists and holds parameters of policy {other!r}, not {policy!r}; "
            "move it or give another --out"
        )


def report_path(out: Path) -> Path:
    return out.with_suffix(".md")


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # a kill leaves the old file or the new one, never half of one


def json_text(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"


def document(
    policy: str,
    params: Mapping[str, Any],
    handset: Mapping[str, Any],
    training: Mapping[str, Any],
    validation: Mapping[str, Any] | None,
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "policy": policy,
        "params": dict(params),
        "handset": dict(handset),
        "training": dict(training),
        "validation": None if validation is None else dict(validation),
    }


def validation_section(
    seeds: Sequence[int], rate_factors: Sequence[float], families: Sequence[FamilyResult]
) -> dict[str, Any]:
    return {
        "seeds": list(seeds),
        "rate_factors": list(rate_factors),
        "statistic": "tuned minus hand-set goodput, paired by seed (a seed's value: its mean over the "
        "rate factors), mean and 95 % bootstrap interval",
        "workloads": [f.to_dict() for f in families],
    }


def _pts(d: PairedDiff) -> str:
    """A paired difference in goodput points, as the project states comparisons (results/stats.py)."""
    scaled = PairedDiff(100 * d.mean, 100 * d.low, 100 * d.high, d.n)
    return scaled.describe(digits=1)


def markdown(doc: Mapping[str, Any], families: Sequence[FamilyResult]) -> str:
    t = doc["training"]
    lines = [
        f"# Tuned {doc['policy']}",
        "",
        *_training(t),
        "",
        "| parameter | hand-set | tuned | searched |",
        "|---|---|---|---|",
    ]
    for name, r in t["space"].items():
        scale = ", log" if r["log"] else ""
        lines.append(
            f"| {name} | {_num(doc['handset'][name])} | {_num(doc['params'][name])} | "
            f"[{_num(r['low'])}, {_num(r['high'])}]{scale} |"
        )
    v = doc.get("validation")
    if v is None or not families:
        lines += ["", "No validation was run (--validation-seeds 0)."]
        return "\n".join(lines) + "\n"
    lines += [
        "",
        f"## Validation: seeds {v['seeds'][0]}..{v['seeds'][-1]}, never trained on",
        "",
        "Each workload at its own saturation rate for the hand-set parameters, times "
        f"{', '.join(f'{f:g}' for f in v['rate_factors'])}; goodput is a seed's mean over those rates. "
        "tuned - hand-set is paired by seed, in goodput points, with its 95 % bootstrap interval; a win or a "
        "loss only where the interval excludes zero.",
        "",
        "| workload | req/s | hand-set | tuned | tuned - hand-set (pts) |",
        "|---|---|---|---|---|",
    ]
    for f in families:
        name = f"{f.workload} (trained on)" if f.trained_on else f.workload
        d = f.diff
        if d is None:
            lines.append(f"| {name} | - | - | - | not run: {f.note} |")
            continue
        lines.append(
            f"| {name} | {f.saturation_rps:.2f} | {sum(f.handset) / len(f.handset):.3f} | "
            f"{sum(f.tuned) / len(f.tuned):.3f} | {_pts(d)} |"
        )
    return "\n".join(lines) + "\n"


def _training(t: Mapping[str, Any]) -> list[str]:
    """What the study trained on and its objective: one workload in a sentence; several named, then a
    table of each one's rates and the hand-set and tuned trials' goodput there."""
    factors = ", ".join(f"{f:g}" for f in t["rate_factors"])
    trials = f"{t['complete_trials']} trials (study seed {t['study_seed']}), hardware: {t['calibration']}."
    shape = f"{t['prefill']}P+{t['decode']}D, {t['requests']} requests per run, seeds {t['seeds']}"
    hand, best = _num(t["handset_objective"]), _num(t["best_objective"])
    objective = f"hand-set {hand}, tuned {best} (trial {t['best_trial']})."
    if "workloads" not in t:
        return [
            f"Trained on {t['workload']}, {shape}, rates {', '.join(f'{r:.2f}' for r in t['rates_rps'])} "
            f"req/s ({factors} x the hand-set saturation rate {t['saturation']['rate_rps']:.2f}), {trials}",
            "",
            f"Training objective (mean goodput over those runs): {objective}",
        ]
    lines = [
        f"Trained on {len(t['workloads'])} workloads at once: {', '.join(t['workloads'])}; {shape}; each at "
        f"{factors} x its own hand-set saturation rate; {trials}",
        "",
        "Training objective (each workload's mean goodput over its runs, then their mean, every workload "
        f"weighing the same): {objective}",
        "",
        "| trained on | saturation req/s | hand-set | tuned |",
        "|---|---|---|---|",
    ]
    for name, w in t["per_workload"].items():
        lines.append(
            f"| {name} | {w['saturation']['rate_rps']:.2f} | {_num(w['handset_objective'])} | "
            f"{_num(w['best_objective'])} |"
        )
    return lines


def _num(x: Any) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, int):
        return str(x)
    return f"{x:.4g}"

"""What every command shares: the consoles, errors, the progress bar, tables, --param parsing and the
hardware profile a command falls back to."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from calroute.cluster.file import EMULATOR_TOKENIZER, ENGINE_TOKENIZER, ClusterFile
from calroute.contract.tokenizer import AsyncTokenizer, Tokenizer
from calroute.costmodel.calibration import Calibration
from calroute.costmodel.profiles import (
    DEFAULT_PROFILE,
    HardwareProfile,
    get_profile,
    profile_from_calibration,
)
from calroute.costmodel.slo import PAPER, PRESETS, SloSpec, parse_slo, with_slo
from calroute.errors import CalrouteError, ConfigError
from calroute.experiments.kit.cells import Run
from calroute.policies.params_file import check_runs_policy, load_params_file, merged_params
from calroute.results.tables import RunRow, by_policy, reference_policy, versus

err = Console(stderr=True)
# Piped output (logs, CI) would otherwise be cut at 80 columns, which truncates the comparison table.
out = Console() if Console().is_terminal else Console(width=120)


@contextmanager
def exit_on_error() -> Iterator[None]:
    """A CalrouteError raised inside becomes the command's error line on stderr and exit code 2."""
    try:
        yield
    except CalrouteError as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from e


def parse_param_options(
    items: list[str], policies: list[str], *, qualified: bool = True
) -> dict[str, dict[str, str]]:
    """--param values by policy. ``qualified``: POLICY.NAME=VALUE, POLICY one of ``policies``; otherwise
    NAME=VALUE, all for the one policy given (`serve`)."""
    params: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not qualified:
            if not sep:
                raise ConfigError(f"--param {item!r}: expected NAME=VALUE")
            (policy,) = policies
            params.setdefault(policy, {})[key] = value
            continue
        policy, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise ConfigError(f"--param {item!r}: expected POLICY.NAME=VALUE, e.g. marginal_cost.rho=2")
        if policy not in policies:
            raise ConfigError(
                f"--param {item!r}: policy {policy!r} is not in --policies ({','.join(policies)})"
            )
        params.setdefault(policy, {})[name] = value
    return params


PARAMS_HELP = (
    "a params file (calroute tune --out): its policy's parameters; a --param for the same policy overrides "
    "the file's value (docs/tuning.md)"
)


def policy_params(
    items: list[str], policies: list[str], params_file: Path | None, *, qualified: bool = True
) -> dict[str, dict[str, Any]]:
    """--params FILE, then --param over it, by policy; every value checked before anything runs. The file
    must be for one of ``policies``."""
    pf = None
    if params_file is not None:
        pf = load_params_file(params_file)
        check_runs_policy(pf, policies)
    return merged_params(pf, parse_param_options(items, policies, qualified=qualified))


def progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )


def print_table(runs: Sequence[Run], title: str) -> None:
    rows = [RunRow(r.label, r.seed, r.summary) for r in runs]
    policies = by_policy(rows)
    seeds = sorted({r.seed for r in rows})
    ref = reference_policy(policies)
    hits = any(p.prefix_hit_ratio > 0 for p in policies)
    caption = (
        "goodput per seed, mean, spread (max - min); P99 latencies: mean over seeds; "
        f"vs {ref.policy}: paired difference in goodput over seeds, 95 % bootstrap interval"
    )
    table = Table(title=title, caption=caption)
    table.add_column("policy", no_wrap=True)
    for s in seeds:
        table.add_column(f"s{s}", justify="right", no_wrap=True, min_width=5)
    for col in ("mean", "spread", "P99 TTFT s", "P99 TPOT s", f"vs {ref.policy}"):
        table.add_column(col, justify="right", no_wrap=True)
    if hits:
        table.add_column("prefix hits", justify="right", no_wrap=True)
    local = any(p.local_share > 0 for p in policies)
    if local:
        table.add_column("local", justify="right", no_wrap=True)
    best = max(p.mean_goodput for p in policies)
    for p in policies:
        mean = f"{p.mean_goodput:.3f}"
        diff = versus(p, ref)
        table.add_row(
            p.policy,
            *[f"{g:.3f}" for g in p.goodputs],
            f"[bold green]{mean}[/]" if p.mean_goodput == best else mean,
            f"{p.spread:.3f}",
            "-" if p.ttft_p99_s is None else f"{p.ttft_p99_s:.3f}",
            "-" if p.tpot_p99_s is None else f"{p.tpot_p99_s:.4f}",
            "-" if diff is None else diff.describe(),
            *([f"{p.prefix_hit_ratio:.3f}"] if hits else []),
            *([f"{100 * p.local_share:.0f} %"] if local else []),
        )
    out.print(table)


# `--slo` of simulate, run, serve, experiment and bench: one option, one help, one parser (costmodel/slo.py).
SLO_DEFAULT = PAPER
SLO_HELP = (
    f"SLO targets that judge goodput: {PAPER} (the calibration's), "
    f"{', '.join(p for p in PRESETS if p != PAPER)} (plus a TTFT allowance per prompt token), "
    "or an SLO file, YAML or JSON (docs/calibration.md)"
)


def slo_option(spec: str) -> SloSpec:
    """--slo, parsed before anything runs; a bad value is an error naming the option and the field."""
    try:
        return parse_slo(spec)
    except ConfigError as e:
        raise ConfigError(f"--slo: {e}") from e


def load_profile(
    profile: str | None = None,
    calibration: Path | Calibration | None = None,
    slo: SloSpec | None = None,
    limits: Mapping[str, int] | None = None,
) -> HardwareProfile:
    """The hardware a command models: the named profile (default: DEFAULT_PROFILE), or with a calibration
    (a file, or one at hand) that calibration's curves and constants under the profile's engine limits;
    ``limits`` (limit_overrides) in place of those; with ``slo``, judged by that spec's targets (resolved on
    this hardware's calibration)."""
    base = get_profile(profile or DEFAULT_PROFILE)
    if calibration is not None:
        cal = Calibration.load(calibration) if isinstance(calibration, Path) else calibration
        hw = profile_from_calibration(cal, base.limits)
    else:
        hw = base
    if limits:
        hw = replace(hw, limits=replace(hw.limits, **limits))
    if slo is None or slo.is_paper:
        return hw
    return replace(hw, calibration=with_slo(hw.calibration, slo))


def load_tokenizer(
    cluster: ClusterFile, engine_api_key: str | None = None
) -> Tokenizer | AsyncTokenizer | None:
    """The tokenizer the cluster file names (its ``tokenizer`` field): the emulator's, the engines' own
    /tokenize, or the served model's from its Hugging Face files; None when it names none. A ConfigError
    names a folder it cannot read."""
    if cluster.tokenizer is None:
        return None
    if cluster.tokenizer == ENGINE_TOKENIZER:
        from calroute.proxy.engine_tokenizer import engine_tokenizer

        headers = {"Authorization": f"Bearer {engine_api_key}"} if engine_api_key else None
        pools = [*cluster.prefill, *cluster.decode]
        return engine_tokenizer([(e.id, e.url) for e in pools], cluster.max_model_len, headers)
    if cluster.tokenizer == EMULATOR_TOKENIZER:
        from calroute.emulator.api import EmulatorTokenizer

        return EmulatorTokenizer()
    from calroute.tokenizer.hf import HfTokenizer

    return HfTokenizer(Path(cluster.tokenizer), max_model_len=cluster.max_model_len)

"""`calroute calibrate`: measure a live cluster and write the calibration file the router prices with."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from calroute.cli.common import err, exit_on_error
from calroute.cluster.file import ClusterFile
from calroute.errors import CalibrationError


def _seconds(value: float) -> str:
    """A duration in the unit that keeps 3-4 significant digits readable."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")):
        if abs(value) >= scale or unit == "ns":
            return f"{value / scale:.4g} {unit}"
    return f"{value:.4g} s"  # pragma: no cover (the loop always returns)


def _value(name: str, value: float) -> str:
    if name.endswith("bandwidth_bytes_per_s"):
        return f"{value / 1e9:.4g} GB/s"
    if name.endswith("per_token2"):
        return f"{value * 1e9:.4g} ns/token^2"
    return _seconds(value)


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.2f} %" if pct else f"{x:.4f}"


def _tables(report: dict[str, Any]) -> tuple[Table, Table]:
    time_scale = float(report["cluster"]["time_scale"])
    constants = Table(title="calibrated constants (as measured: the hardware the router talks to)")
    constants.add_column("constant")
    constants.add_column("value", justify="right")
    if time_scale != 1.0:
        constants.add_column("at time scale 1", justify="right")
    for name, value in report["constants"].items():
        row = [name, _value(name, value)]
        if time_scale != 1.0:
            row.append(_value(name, report["constants_at_time_scale_1"][name]))
        constants.add_row(*row)
    quality = Table(title="fit quality (every 4th sample held out)")
    for column in (
        "curve",
        "fit / rejected / held out",
        "R^2 fit",
        "R^2 held out",
        "held-out |res| median",
        "max",
    ):
        quality.add_column(column, justify="left" if column == "curve" else "right")
    quality.add_column("notes")
    for name, fit in report["fits"].items():
        quality.add_row(
            name,
            f"{fit['n_fit']} / {fit['n_rejected']} / {fit['n_held_out']}",
            _fmt(fit["r2_fit"]),
            _fmt(fit["r2_held_out"]),
            _fmt(fit["held_out_median_rel_residual"], pct=True),
            _fmt(fit["held_out_max_rel_residual"], pct=True),
            "; ".join(fit["notes"]),
        )
    return constants, quality


def calibrate(
    cluster: Annotated[Path, typer.Option(help="cluster file (calroute engines up)")],
    duration: Annotated[
        float, typer.Option(min=5.0, help="time budget of the whole calibration, in seconds")
    ] = 60.0,
    out: Annotated[Path, typer.Option(help="the calibration JSON to write")] = Path("calibration.json"),
    report: Annotated[
        Path | None, typer.Option(help="also write the full report (raw samples, residuals) as JSON")
    ] = None,
) -> None:
    """Measure a cluster (prefill latency curve, decode step under concurrency, KV transfer), fit the
    curves and write tau_pre, tau_dec and the SLO targets (engines' API key from CALROUTE_ENGINE_API_KEY)."""
    from calroute.calibrate.run import calibrate_cluster

    started = time.perf_counter()

    def progress(message: str) -> None:
        err.print(
            f"[dim]{time.perf_counter() - started:6.1f} s[/] {escape(message)}",
            highlight=False,
            soft_wrap=True,
        )

    with exit_on_error():
        c = ClusterFile.load(cluster)
        cal, rep = calibrate_cluster(
            c,
            duration,
            progress,
            cluster_path=cluster,
            api_key=os.environ.get("CALROUTE_ENGINE_API_KEY") or None,
        )
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            cal.save(out)
            if report is not None:
                report.parent.mkdir(parents=True, exist_ok=True)
                report.write_text(json.dumps(rep, indent=1) + "\n")
        except OSError as e:
            raise CalibrationError(f"cannot write {e.filename}: {e.strerror}") from e
    stdout = Console() if Console().is_terminal else Console(width=140)
    for table in _tables(rep):
        stdout.print(table)
    err.print(f"wrote {out} in {rep['wall_s']:.1f} s")

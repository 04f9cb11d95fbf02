"""The only module that imports matplotlib. Each function writes one PNG and returns its file name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def grouped_bars(
    path: Path,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    errors: Mapping[str, Sequence[float]],
    ylabel: str,
    title: str,
) -> str:
    """One group of bars per x label, one bar per series; error bars (e.g. the spread across seeds)."""
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(groups) + 2), 3.8))
    width = 0.8 / max(1, len(series))
    x = np.arange(len(groups))
    for i, (name, values) in enumerate(series.items()):
        ax.bar(
            x + (i - (len(series) - 1) / 2) * width,
            values,
            width,
            label=name,
            color=_COLORS[i % len(_COLORS)],
            yerr=errors.get(name),
            capsize=2,
        )
    ax.set_xticks(x, groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    lo = min((min(v) for v in series.values() if len(v)), default=0.0)
    ax.set_ylim(max(0.0, lo - 0.1), 1.0 if ylabel.startswith("goodput") else None)
    ax.legend(fontsize=8, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def lines(
    path: Path,
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    xlabel: str,
    ylabel: str,
    title: str,
    hline: float | None = None,
) -> str:
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for i, (name, values) in enumerate(series.items()):
        ax.plot(x, values, marker="o", label=name, color=_COLORS[i % len(_COLORS)])
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def cdfs(
    path: Path, samples: Mapping[str, Sequence[float]], xlabel: str, title: str, xline: float | None = None
) -> str:
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for i, (name, values) in enumerate(samples.items()):
        if not values:
            continue
        v = np.sort(np.asarray(values))
        ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=name, color=_COLORS[i % len(_COLORS)])
    if xline is not None:
        ax.axvline(xline, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def scatter(
    path: Path,
    points: Mapping[str, tuple[float, float]],
    xlabel: str,
    ylabel: str,
    title: str,
    diagonal: bool = True,
) -> str:
    """One point per name, on [0, 1] x [0, 1]; ``diagonal`` draws y = x (for predicted against measured)."""
    fig, ax = plt.subplots(figsize=(4.8, 4.8))
    for i, (name, (x, y)) in enumerate(points.items()):
        ax.scatter([x], [y], label=name, color=_COLORS[i % len(_COLORS)])
    if diagonal:
        ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name

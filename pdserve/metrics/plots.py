"""PNG plots of a run: attainment vs rate, TTFT/TPOT CDFs, per-instance load over time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from pdserve.metrics.goodput import GoodputResult  # noqa: E402
from pdserve.metrics.summary import tpot_s, ttft_s  # noqa: E402
from pdserve.types import SLO, Request  # noqa: E402


def plot_attainment(path: Path, curves: dict[str, GoodputResult], title: str = "") -> None:
    """SLO attainment against request rate, one line per policy."""
    fig, ax = plt.subplots(figsize=(6, 4))
    target = 90.0
    for label, goodput in curves.items():
        rates = [p.rate_rps for p in goodput.points]
        attainment = [100 * p.summary.slo_attainment for p in goodput.points]
        ax.plot(rates, attainment, marker="o", label=f"{label} (goodput {goodput.rate_text})")
        target = 100 * goodput.target_attainment
    ax.axhline(target, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("SLO attainment (%)")
    ax.set_ylim(0, 102)
    ax.set_title(title or "SLO attainment vs request rate")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _cdf(ax: plt.Axes, values: np.ndarray, slo: float, xlabel: str) -> None:
    if len(values):
        ordered = np.sort(values)
        ax.plot(ordered, np.arange(1, len(ordered) + 1) / len(ordered))
    ax.axvline(slo, color="red", linestyle="--", linewidth=1, label=f"SLO {slo:g}s")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_latency_cdfs(path: Path, requests: Sequence[Request], slo: SLO, title: str = "") -> None:
    done = [r for r in requests if r.finished]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    _cdf(left, np.maximum(np.array([ttft_s(r) for r in done]), 1e-6), slo.ttft_s, "TTFT (s)")
    tpots = np.array([tpot_s(r) for r in done if r.output_tokens > 1])
    _cdf(right, np.maximum(tpots, 1e-6), slo.tpot_s, "TPOT (s)")
    fig.suptitle(title or "latency CDFs")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_instance_load(path: Path, times_s: Sequence[float], running_tokens: np.ndarray,
                       prefill_queue_tokens: np.ndarray, roles: Sequence[Sequence[str]],
                       title: str = "") -> None:
    """Per-instance decode load and prefill backlog over time; arrays are [time, instance]."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    last_roles = roles[-1] if roles else []
    for i in range(running_tokens.shape[1] if running_tokens.ndim == 2 else 0):
        label = f"#{i} ({last_roles[i]})" if i < len(last_roles) else f"#{i}"
        top.plot(times_s, running_tokens[:, i], linewidth=0.8, label=label)
        bottom.plot(times_s, prefill_queue_tokens[:, i], linewidth=0.8, label=label)
    top.set_ylabel("running decode tokens")
    bottom.set_ylabel("queued prefill tokens")
    bottom.set_xlabel("time (s)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(fontsize=7, ncol=4)
    fig.suptitle(title or "per-instance load")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_pool_sizes(path: Path, times_s: Sequence[float], roles: Sequence[Sequence[str]],
                    title: str = "") -> None:
    """How many instances are in each pool over time (one line per role)."""
    names = sorted({role for snapshot in roles for role in snapshot})
    fig, ax = plt.subplots(figsize=(10, 3.5))
    for name in names:
        ax.step(times_s, [sum(1 for r in snapshot if r == name) for snapshot in roles],
                where="post", linewidth=1, label=name)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("instances")
    ax.set_title(title or "pool sizes")
    ax.legend(fontsize=8, ncol=len(names))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_slo_sweep(path: Path, panels: dict[str, dict[str, list[tuple[float, float]]]],
                   xlabel: str = "TPOT SLO (ms)", ylabel: str = "goodput (req/s)") -> None:
    """One panel per workload: goodput against an SLO, one line per policy.
    `panels[workload][policy]` is a list of (SLO, goodput) points."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (title, curves) in zip(axes[0], panels.items(), strict=True):
        for label, points in curves.items():
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, ys, marker="o", label=label)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

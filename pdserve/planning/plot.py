"""The plan's Pareto plot (PNG): goodput per GPU against TTFT P90 and against TPOT P90, every
simulated candidate a point, each front a line. It draws `outcome.ParetoPoint`s and computes
nothing of its own, so another renderer can draw the same data."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pdserve.planning.outcome import ParetoPoint, pareto_front  # noqa: E402
from pdserve.types import SLO  # noqa: E402


def plot_pareto(path: Path, points: list[ParetoPoint], slo: SLO, title: str = "") -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    spaces = sorted({p.space for p in points})
    colours = {s: plt.get_cmap("tab20")(i % 20) for i, s in enumerate(spaces)}
    for ax, latency, limit, name in ((axes[0], "ttft_p90_s", slo.ttft_s, "TTFT P90 (s)"),
                                     (axes[1], "tpot_p90_s", slo.tpot_s, "TPOT P90 (s)")):
        for space in spaces:
            mine = [p for p in points if p.space == space]
            ax.scatter([getattr(p, latency) for p in mine], [p.goodput_per_gpu for p in mine],
                       s=[30 if p.fidelity == "long" else 12 for p in mine],
                       color=colours[space], label=space, alpha=0.8)
        front = pareto_front(points, latency)
        ax.step([getattr(p, latency) for p in front], [p.goodput_per_gpu for p in front],
                where="post", color="black", linewidth=1)
        ax.axvline(limit, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel(f"{name} at the goodput rate")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("goodput per GPU (req/s)")
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(title or "pdserve plan: goodput per GPU against latency (line: Pareto front)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

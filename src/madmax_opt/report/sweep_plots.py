"""Plots of a sweep's results: time vs cost Pareto front, throughput per GPU and vs cluster size, tokens per joule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from madmax_opt.core.units import SECONDS_PER_HOUR
from madmax_opt.report.sweep_report import (
    PLOTS,
    VIEW_SPAN,
    Point,
    _time_label,
    pareto_front,
    unique_points,
)

# ------------------------------------------------------------------------------------------ plots


def write_plots(points: list[Point], plot_dir: Path, has_budget: bool) -> dict[str, Path]:
    """The four PNG figures (matplotlib, Agg); {} when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    plot_dir.mkdir(parents=True, exist_ok=True)
    groups = sorted({p.group for p in points})
    if not groups:
        return {}
    systems = sorted({p.system for p in points})
    cmap = plt.get_cmap("tab20")
    color = {s: cmap(i % 20) for i, s in enumerate(systems)}
    marker = dict(zip(sorted({p.gpu for p in points}), "osD^v<>phX*", strict=False))
    t_label, c_label = _time_label(has_budget)
    out: dict[str, Path] = {}
    gpu_of = {p.system: p.gpu for p in points}
    handles = [
        plt.Line2D(
            [], [], color=color[s], marker=marker.get(gpu_of[s], "o"), ls="", label=f"{s} ({gpu_of[s]})"
        )
        for s in systems
    ]

    def figure(title: str) -> tuple[Any, Any]:
        fig, axes = plt.subplots(len(groups), 1, figsize=(10, 4.2 * len(groups)), squeeze=False)
        fig.suptitle(title)
        return fig, axes[:, 0]

    def save(fig: Any, key: str) -> None:
        fig.legend(handles=handles, loc="center right", fontsize=7, frameon=False)
        fig.tight_layout(rect=(0.0, 0.0, 0.75, 1.0))  # the right quarter holds the legend of systems
        path = plot_dir / PLOTS[key]
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out[key] = path

    fig, axes = figure(
        f"{t_label.split(' (')[0]} vs cost (Pareto front: black staircase, numbered as in the report)"
    )
    for ax, g in zip(axes, groups, strict=True):
        gp = [p for p in points if p.group == g]
        front = [gp[i] for i in pareto_front([(p.time_s, p.cost_usd) for p in gp])]
        # view: the front and everything within VIEW_SPAN of it (log axes); the rest is counted, not drawn
        x_max = max(p.time_s for p in front) * VIEW_SPAN
        y_max = max(p.cost_usd for p in front) * VIEW_SPAN
        shown = [p for p in gp if p.time_s <= x_max and p.cost_usd <= y_max]
        for p in shown:
            ax.scatter(
                p.time_s / SECONDS_PER_HOUR,
                p.cost_usd,
                color=color[p.system],
                marker=marker.get(p.gpu, "o"),
                s=22,
                alpha=0.8,
            )
        ax.plot(
            [p.time_s / SECONDS_PER_HOUR for p in front],
            [p.cost_usd for p in front],
            "k-",
            lw=1.2,
            zorder=3,
            drawstyle="steps-post",
        )
        for k, p in enumerate(front, start=1):
            ax.annotate(
                str(k),
                (p.time_s / SECONDS_PER_HOUR, p.cost_usd),
                fontsize=8,
                fontweight="bold",
                xytext=(-3, -11),
                textcoords="offset points",
            )
        if len(shown) < len(gp):
            ax.text(
                0.99,
                0.98,
                f"not shown: {len(gp) - len(shown)} point(s) beyond {VIEW_SPAN:g}x the front",
                transform=ax.transAxes,
                ha="right",
                va="top",
                fontsize=7,
            )
        ax.set(xscale="log", yscale="log", xlabel=t_label, ylabel=c_label, title=f"{g[0]} (task {g[1]})")
        ax.grid(True, which="both", alpha=0.3)
    save(fig, "pareto")

    unique = unique_points(points)
    for key, title, ylabel, value, logy in (
        (
            "throughput",
            "throughput vs GPUs (best plan per point)",
            "tokens/s",
            lambda p: p.tokens_per_s,
            True,
        ),
        (
            "per_gpu",
            "throughput per GPU vs cluster size",
            "tokens/s per GPU",
            lambda p: p.tokens_per_s_per_gpu,
            False,
        ),
        (
            "energy",
            "tokens per joule vs cluster size",
            "tokens/J (GPU + host wall power)",
            lambda p: p.tokens_per_joule,
            False,
        ),
    ):
        fig, axes = figure(title)
        for ax, g in zip(axes, groups, strict=True):
            for s in systems:
                sp = sorted((p for p in unique if p.group == g and p.system == s), key=lambda p: p.gpus)
                if sp:
                    ax.plot(
                        [p.gpus for p in sp],
                        [value(p) for p in sp],
                        marker=marker.get(sp[0].gpu, "o"),
                        ms=4,
                        color=color[s],
                        label=s,
                    )
            ax.set(xscale="log", xlabel="GPUs", ylabel=ylabel, title=f"{g[0]} (task {g[1]})")
            if logy:
                ax.set_yscale("log")
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
        save(fig, key)
    return out

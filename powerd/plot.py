"""`powerctl pareto --plot`: the predicted front, the measured modes, the pick and the budget."""

from __future__ import annotations

from typing import Any


def plot_pareto(reply: Any, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("powerctl: --plot needs matplotlib (pip install 'powerd[plot]')") from None
    rows = reply.rows
    extra = reply.extra
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.plot(
        [r["power_w"] for r in rows],
        [r["time_ms"] for r in rows],
        "-o",
        ms=3,
        color="tab:blue",
        label="predicted Pareto front",
    )
    profiled = extra.get("profiled") or []
    if profiled:
        ax.scatter(
            [r["power_w"] for r in profiled],
            [r["time_ms"] for r in profiled],
            s=18,
            color="tab:orange",
            zorder=3,
            label=f"measured ({len(profiled)} modes)",
        )
    chosen = extra.get("chosen")
    if chosen:
        ax.scatter(
            [chosen["power_w"]],
            [chosen["time_ms"]],
            s=120,
            marker="*",
            color="tab:red",
            zorder=4,
            label="pinned mode (measured)",
        )
    budget = extra.get("budget_w")
    if budget:
        ax.axvline(budget, color="tab:red", ls="--", lw=1, label=f"budget {budget:g} W")
    ax.set_xlabel("board power (W)")
    ax.set_ylabel("time per step (ms)")
    ax.set_yscale("log")
    ax.set_title(f"{reply.workload}: predicted time vs power")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

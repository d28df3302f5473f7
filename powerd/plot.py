"""`powerctl pareto --plot`: the predicted front, the measured modes, the pick and the budget."""

from __future__ import annotations

from typing import Any


def _plain_ms(value: float, _pos: object = None) -> str:
    """Tick labels in plain milliseconds (the log axis' default prints `8x10^-1`)."""
    if value <= 0:
        return ""
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def chosen_point(rows: list[dict[str, Any]], extra: dict[str, Any], budget_w: float | None):
    """(row, label) of the mode to mark: the daemon's pinned mode when it reports one, else
    the fastest predicted front mode within the budget; None when neither exists."""
    if extra.get("chosen"):
        return extra["chosen"], "pinned mode (measured)"
    if budget_w is None:
        return None
    within = [r for r in rows if r["power_w"] <= budget_w]
    if not within:
        return None
    return min(within, key=lambda r: r["time_ms"]), "predicted pick within the budget"


def pareto_figure(reply: Any, budget_w: float | None = None):  # noqa: ANN201 - a Figure
    """The figure for a `pareto` reply; `budget_w` when the reply carries no budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    rows = reply.rows
    extra = reply.extra or {}
    budget = extra.get("budget_w", budget_w)
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
    chosen = chosen_point(rows, extra, budget)
    if chosen is not None:
        row, label = chosen
        ax.scatter(
            [row["power_w"]],
            [row["time_ms"]],
            s=140,
            marker="*",
            color="tab:red",
            zorder=4,
            label=f"{label}: {row['time_ms']:.3g} ms at {row['power_w']:.1f} W",
        )
    if budget:
        ax.axvline(budget, color="tab:red", ls="--", lw=1, label=f"budget {budget:g} W")
    times = [r["time_ms"] for r in rows + profiled if r["time_ms"] > 0]
    ax.set_xlabel("board power (W)")
    ax.set_ylabel("time per step (ms)")
    if times and max(times) / min(times) > 10:
        # wide ranges read best on a log axis, labelled 1-2-5 in plain ms
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=8))
    ax.yaxis.set_major_formatter(FuncFormatter(_plain_ms))
    ax.set_title(f"{reply.workload}: predicted time vs power")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_pareto(reply: Any, path: str, budget_w: float | None = None) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("powerctl: --plot needs matplotlib (pip install 'powerd[plot]')") from None
    import matplotlib.pyplot as plt

    fig = pareto_figure(reply, budget_w)
    fig.savefig(path)
    plt.close(fig)

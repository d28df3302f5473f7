"""`powerctl pareto --plot`: the predicted front, the measured modes, the pick and the budget;
for an inference workload, the latency/power front per batch size at a rate."""

from __future__ import annotations

from typing import Any


def _plain_ms(value: float, _pos: object = None) -> str:
    """Tick labels in plain milliseconds (the log axis' default prints `8x10^-1`)."""
    if value <= 0:
        return ""
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def tick_decimals(values: list[float], most: int = 4) -> int:
    """The fewest decimals (up to `most`) that write every tick value exactly: a flat front
    spans a fraction of a millisecond, and at 3 significant digits its ticks 20.08, 20.10
    and 20.12 all read 20.1."""
    for d in range(most + 1):
        if all(abs(float(f"{v:.{d}f}") - v) <= 1e-9 * max(1.0, abs(v)) for v in values):
            return d
    return most


def _linear_ms_formatter() -> Any:
    """Plain-ms tick labels, all with the decimals the finest tick needs."""
    from matplotlib.ticker import Formatter

    class LinearMs(Formatter):
        decimals = 1

        def format_ticks(self, values: Any) -> list[str]:
            self.decimals = tick_decimals([v for v in values if v > 0])
            return [self(v) for v in values]

        def __call__(self, x: float, pos: Any = None) -> str:
            return f"{x:.{self.decimals}f}" if x > 0 else ""

    return LinearMs()


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


def time_axis(ax: Any, values: list[float]) -> None:
    """Plain-ms ticks; a log axis (1-2-5) when the values span more than a decade, else a
    linear one whose labels carry the decimals that tell its ticks apart."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    values = [v for v in values if v > 0]
    if values and max(values) / min(values) > 10:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(FuncFormatter(_plain_ms))
    else:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=8))
        ax.yaxis.set_major_formatter(_linear_ms_formatter())


def new_figure(nrows: int = 1, height: float = 4.5, **subplots: Any) -> tuple[Any, Any]:
    """(figure, axes) drawn off-screen (Agg: no display needed); one axes, or an array of
    `nrows` stacked ones."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(nrows, 1, figsize=(7, height), dpi=120, **subplots)


def finished(fig: Any, *axes: Any) -> Any:
    """The common finish: a light grid and a small legend on each axes, a tight layout."""
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def pareto_figure(reply: Any, budget_w: float | None = None):  # noqa: ANN201 - a Figure
    """The figure for a `pareto` reply; `budget_w` when the reply carries no budget."""
    rows = reply.rows
    extra = reply.extra or {}
    budget = extra.get("budget_w", budget_w)
    fig, ax = new_figure()
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
    time_axis(ax, times)
    ax.set_title(f"{reply.workload}: predicted time vs power")
    return finished(fig, ax)


def inference_front_figure(  # noqa: ANN201 - a Figure
    reply: Any, budget_w: float | None = None, latency_ms: float | None = None
):
    """The figure for an inference `pareto` reply (`--kind inference --rate R`): per batch
    size, the predicted worst-case latency against power of its front; pairs whose queue
    would not drain at R as crosses; the measured pairs at R; the budget and latency lines."""
    extra = reply.extra or {}
    rate = float(extra.get("rate_hz") or 0.0)
    fig, ax = new_figure()
    sizes = sorted({int(r["batch_size"]) for r in reply.rows})
    from matplotlib import rcParams

    colors = rcParams["axes.prop_cycle"].by_key()["color"]
    color = {b: colors[i % len(colors)] for i, b in enumerate(sizes)}
    lats: list[float] = []
    stuck = False
    for b in sizes:
        rows = sorted((r for r in reply.rows if r["batch_size"] == b), key=lambda r: r["power_w"])
        ok = [r for r in rows if r["drains"]]
        bad = [r for r in rows if not r["drains"]]
        if ok:
            ax.plot(
                [r["power_w"] for r in ok],
                [r["latency_ms"] for r in ok],
                "-o",
                ms=3,
                color=color[b],
                label=f"b={b}",
            )
        if bad:
            ax.scatter(
                [r["power_w"] for r in bad],
                [r["latency_ms"] for r in bad],
                marker="x",
                s=14,
                color=color[b],
                alpha=0.5,
                label=None if ok else f"b={b}",
            )
            stuck = True
        lats += [r["latency_ms"] for r in rows]
    measured = extra.get("profiled") or []
    if measured and rate > 0:
        from powerd.optimize.inference import worst_latency_ms

        # a measured pair's worst case at this rate, from its p99 batch time
        worst = [
            float(worst_latency_ms(m["batch_size"], rate, m.get("batch_p99_ms") or m["batch_ms"]))
            for m in measured
        ]
        ax.scatter(
            [m["power_w"] for m in measured],
            worst,
            s=30,
            facecolors="none",
            edgecolors="black",
            zorder=3,
            label=f"measured pairs ({len(measured)})",
        )
        lats += worst
    if stuck:
        ax.scatter([], [], marker="x", color="gray", label="queue does not drain at this rate")
    if budget_w:
        ax.axvline(budget_w, color="tab:red", ls="--", lw=1, label=f"budget {budget_w:g} W")
    if latency_ms:
        ax.axhline(latency_ms, color="tab:green", ls="--", lw=1, label=f"latency {latency_ms:g} ms")
    ax.set_xlabel("board power while a batch runs (W)")
    ax.set_ylabel("worst-case latency (ms)")
    time_axis(ax, lats + ([latency_ms] if latency_ms else []))
    ax.set_title(f"{reply.workload}: predicted latency vs power at {rate:g} requests/s")
    return finished(fig, ax)


def save(fig: Any, path: str) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path)
    plt.close(fig)


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("powerctl: --plot needs matplotlib (pip install 'powerd[plot]')") from None


def plot_pareto(reply: Any, path: str, budget_w: float | None = None) -> None:
    _need_matplotlib()
    save(pareto_figure(reply, budget_w), path)


def plot_inference_front(
    reply: Any, path: str, budget_w: float | None = None, latency_ms: float | None = None
) -> None:
    _need_matplotlib()
    save(inference_front_figure(reply, budget_w, latency_ms), path)

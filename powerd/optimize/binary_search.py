"""`binary-search`: find the fastest mode under a power budget from measurements alone.

No predictor: every decision is taken on measured (time, power) of probed modes. The search
works in index space (each axis' position in its ascending value list) and is a pure
function of the budget and the samples dict: each call replays the same path, reading the
samples it already has, and returns the first mode it lacks. A new budget therefore reuses
every earlier measurement that its path crosses, and a restarted daemon resumes.

The path, for one budget (at most `max_probes` distinct modes, cached ones included):

1. **Max mode.** If it fits, done.
2. **Frontier.** Search, along one monotone path from the min mode to the max mode, for the
   highest mode that fits. The path raises cores before CPU clock (more cores at a low clock
   feed the data loader for less power than fewer, faster cores) and EMC ahead of GPU clock
   (memory is cheap and a slow EMC starves the GPU). Power along the path is smooth, so the
   search interpolates on measured power (safeguarded by bisection): ~3 probes, not ~5.
3. **Raise.** Spend the headroom left at the frontier point: raise GPU+EMC, GPU, EMC, CPU,
   cores one step at a time while the mode still fits and gets faster. Raising a knob that
   is not the bottleneck costs little power (the unit idles more), so this often succeeds.
4. **Exchange.** Measure, per knob, the slowdown per watt saved by lowering it (always
   feasible, so the time is known). Buy a step of the knob (or GPU+EMC pair) that costs the
   most time per watt, then lower the cheapest knobs (binary search each) until it fits
   again; keep the exchange if it is faster. Repeat while it helps, then raise again.
5. **Commit** the fastest *measured* mode within the budget over all samples (other budgets'
   probes count too). If nothing fits, measure the min mode; if even that is over, commit
   the lowest-power mode measured with `feasible=False`.

Why this shape (measured with powerd_replay.training on the visible traces): coordinate
searches and golden-section searches along a fixed 2-D family both stall on the cliffs real
traces have (an EMC step halves step time; power depends on how busy each unit is), while
a frontier point plus local exchanges that always compare measured times keeps improving.
Measurements are noisy and rows are anomalous, so nothing assumes strict monotonicity:
every "fits" is a measurement, and a change is kept only if measured faster by a margin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from powerd.modes import FIELDS, PowerMode
from powerd.optimize.base import (
    Action,
    Measure,
    Measurement,
    Strategy,
    conclude,
    fits,
    needs_remeasure,
)

Index = tuple[int, int, int, int]

# Lowest board power as a share of the highest, the guess that places the first frontier
# probe (Orin AGX 0.23-0.45, Orin Nano 0.39 on the traces). Only a guess: bisection takes
# over when interpolation does not halve the bracket.
FLOOR_POWER_SHARE = 0.3
# One-step raises tried at the frontier, in this order: GPU+EMC together (they are
# complements: a faster GPU waits on a slow EMC and vice versa), GPU, EMC, CPU, cores.
RAISES: tuple[Index, ...] = ((0, 0, 1, 1), (0, 0, 1, 0), (0, 0, 0, 1), (0, 1, 0, 0), (1, 0, 0, 0))


class ModeSpaceLike(Protocol):
    cores: Sequence[int]
    cpu_khz: Sequence[int]
    gpu_hz: Sequence[int]
    emc_hz: Sequence[int]

    def as_array(self) -> Any: ...

    def modes(self) -> list[PowerMode]: ...


def axes_of(space: ModeSpaceLike) -> tuple[list[int], list[int], list[int], list[int]]:
    """The four ascending axes of a mode space."""
    axes = tuple(sorted({int(v) for v in getattr(space, f)}) for f in FIELDS)
    if not all(axes):
        raise ValueError("mode space has an empty axis")
    return axes  # type: ignore[return-value]


# --------------------------------------------------------------------------- paths


def cores_first_path(n_cores: int, n_cpu: int) -> list[tuple[int, int]]:
    """(cores, cpu) indices: all core counts at the lowest clock, then the clock."""
    return [(c, 0) for c in range(n_cores)] + [(n_cores - 1, f) for f in range(1, n_cpu)]


def skewed_path(n_lead: int, n_follow: int, power: float = 0.5) -> list[tuple[int, int]]:
    """(follow, lead) indices rising together, `lead` ahead (its share is s**power)."""
    k = 2 * max(n_lead, n_follow)
    out: list[tuple[int, int]] = []
    for i in range(k):
        s = i / (k - 1)
        pt = (round(s * (n_follow - 1)), round(s**power * (n_lead - 1)))
        if not out or out[-1] != pt:
            out.append(pt)
    return out


def frontier_path(n: Sequence[int]) -> list[Index]:
    """Monotone path of index tuples from the min mode to the max mode (both included)."""
    cpu = cores_first_path(n[0], n[1])
    gpu = skewed_path(n[3], n[2])  # (gpu, emc): EMC leads
    k = max(len(cpu), len(gpu))
    out: list[Index] = []
    for i in range(k):
        c = cpu[round(i * (len(cpu) - 1) / (k - 1))] if k > 1 else cpu[0]
        g = gpu[round(i * (len(gpu) - 1) / (k - 1))] if k > 1 else gpu[0]
        pt = (c[0], c[1], g[0], g[1])
        if not out or out[-1] != pt:
            out.append(pt)
    return out


# --------------------------------------------------------------------------- probing


class _NeedMeasure(Exception):
    def __init__(self, mode: PowerMode):
        self.mode = mode


class _OutOfProbes(Exception):
    pass


@dataclass(frozen=True)
class Probe:
    ok: bool  # measured within the budget, with a usable time
    time_ms: float  # inf when unknown (aborted, or failed)
    power_w: float


class Prober:
    """Reads the samples along a search path; raises _NeedMeasure at the first gap."""

    def __init__(
        self,
        axes: Sequence[Sequence[int]],
        samples: Mapping[PowerMode, Measurement],
        budget_w: float,
        max_probes: int,
    ):
        self.axes = axes
        self.samples = samples
        self.budget_w = budget_w
        self.max_probes = max_probes
        self.visited: dict[Index, Probe] = {}

    def mode(self, idx: Sequence[int]) -> PowerMode:
        return PowerMode(*(int(self.axes[j][idx[j]]) for j in range(4)))

    def __call__(self, idx: Sequence[int]) -> Probe:
        key: Index = (int(idx[0]), int(idx[1]), int(idx[2]), int(idx[3]))
        seen = self.visited.get(key)
        if seen is not None:
            return seen
        if len(self.visited) >= self.max_probes:
            raise _OutOfProbes
        mode = self.mode(key)
        m = self.samples.get(mode)
        if m is None or needs_remeasure(m, self.budget_w):
            raise _NeedMeasure(mode)
        t = m.time_ms if math.isfinite(m.time_ms) else math.inf
        probe = Probe(fits(m, self.budget_w) and math.isfinite(t), t, m.power_w)
        self.visited[key] = probe
        return probe


def search_frontier(probe: Prober, path: Sequence[Index], budget_w: float, p_top: float) -> int:
    """Index into `path` of the highest mode that fits (-1: none), for a path whose power
    rises along it and whose end (just past the path) draws `p_top`. Interpolation search on
    measured power, falling back to bisection whenever a step fails to halve the bracket."""
    lo, hi = -1, len(path)
    p_lo = FLOOR_POWER_SHARE * p_top if math.isfinite(p_top) else math.nan
    p_hi = p_top
    bisect = not math.isfinite(p_top)
    while hi - lo > 1:
        width = hi - lo
        if not bisect and math.isfinite(p_lo) and math.isfinite(p_hi) and p_hi > p_lo:
            frac = (budget_w - p_lo) / (p_hi - p_lo)
            mid = math.floor(lo + frac * (hi - lo))
        else:
            mid = (lo + hi) // 2
        mid = min(max(mid, lo + 1), hi - 1)
        r = probe(path[mid])
        if r.ok:
            lo, p_lo = mid, r.power_w
        else:
            hi, p_hi = mid, r.power_w
        bisect = (hi - lo) * 2 > width  # this step did not halve the bracket
    return lo


def shed_until_fits(probe: Prober, x: list[int], axis: int) -> Probe | None:
    """Lower `axis` of the (over-budget) mode x to the highest value that fits, by
    bisection; x is updated in place. None (x unchanged) if even the lowest value is over."""
    lo, hi = -1, x[axis]
    best: Probe | None = None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        y = list(x)
        y[axis] = mid
        r = probe(y)
        if r.ok:
            lo, best = mid, r
        else:
            hi = mid
    if best is None:
        return None
    x[axis] = lo
    return best


# --------------------------------------------------------------------------- strategy


class BinarySearch(Strategy):
    """Multi-dimensional binary search on measured power and time (see module docstring)."""

    name = "binary-search"

    def __init__(
        self,
        space: ModeSpaceLike,
        max_probes: int = 12,
        min_gain: float = 0.01,
        exchange_rounds: int = 4,
    ):
        self.space = space
        self.axes = axes_of(space)
        self.n = [len(a) for a in self.axes]
        self.max_probes = max(2, int(max_probes))
        self.min_gain = min_gain  # keep a move only if measured this much faster (noise)
        self.exchange_rounds = exchange_rounds
        self.path = frontier_path(self.n)
        self._axis_sets = [frozenset(a) for a in self.axes]
        self._floor_rechecked: set[float] = set()  # see powerd.optimize.base.conclude

    # -- the Strategy interface ------------------------------------------------------------
    def next_action(self, budget_w: float, samples: Mapping[PowerMode, Measurement]) -> Action:
        probe = Prober(self.axes, samples, budget_w, self.max_probes)
        try:
            self._search(probe, budget_w)
        except _NeedMeasure as need:
            return Measure(need.mode)
        except _OutOfProbes:
            pass
        return self.conclude(budget_w, samples)

    def conclude(self, budget_w: float, samples: Mapping[PowerMode, Measurement]) -> Action:
        """The end of the search (see powerd.optimize.base.conclude), over this space's modes."""
        own = {k: v for k, v in samples.items() if self.in_space(k)}
        lowest = PowerMode(*(a[0] for a in self.axes))
        return conclude(own, budget_w, lowest, self._floor_rechecked)

    def in_space(self, mode: PowerMode) -> bool:
        """Samples of modes outside the space (a narrowed config, an older store) are
        never committed."""
        return all(v in ax for v, ax in zip(mode.as_tuple(), self._axis_sets, strict=True))

    # -- the search ---------------------------------------------------------------------
    def _search(self, probe: Prober, budget_w: float) -> None:
        top = [k - 1 for k in self.n]
        p_top = self._expected_top_over(probe, budget_w)
        if p_top is None:
            r = probe(top)
            if r.ok:
                return
            p_top = r.power_w
        path = self.path[:-1] if list(self.path[-1]) == top else self.path
        k = search_frontier(probe, path, budget_w, p_top)
        if k < 0:
            return
        x = list(path[k])
        cur = probe(x)
        x, cur = self._raise(probe, x, cur)
        for _ in range(self.exchange_rounds):
            moved = self._exchange(probe, x, cur)
            if moved is None:
                return
            x, cur = self._raise(probe, *moved)

    def _expected_top_over(self, probe: Prober, budget_w: float) -> float | None:
        """The max mode's expected power when there is reason to expect it over the budget
        (then it is not probed first), else None. Like PowerTrain, never open with a probe
        expected to overshoot: the search first measures the min mode (on its path anyway,
        and the lowest power the board has) and expects the max mode at that power over the
        usual floor share. Only that one sample decides, so replaying the search on more
        samples keeps taking the same path."""
        top_mode = probe.mode([k - 1 for k in self.n])
        if top_mode in probe.samples:
            return None  # measured before: reuse it (or measure it again, if aborted)
        low = probe([0, 0, 0, 0])
        expected = low.power_w / FLOOR_POWER_SHARE
        return expected if expected > budget_w else None

    def _faster(self, new: Probe, old: Probe) -> bool:
        return new.ok and new.time_ms < old.time_ms * (1.0 - self.min_gain)

    def _raise(self, probe: Prober, x: list[int], cur: Probe) -> tuple[list[int], Probe]:
        for step in RAISES:
            while True:
                y = [min(self.n[j] - 1, x[j] + step[j]) for j in range(4)]
                if y == x:
                    break
                r = probe(y)
                if not self._faster(r, cur):
                    break
                x, cur = y, r
        return x, cur

    def _exchange(self, probe: Prober, x: list[int], cur: Probe) -> tuple[list[int], Probe] | None:
        # Slowdown per watt saved when lowering each knob (inf when nothing is saved).
        cost: dict[int, float] = {}
        for j in range(4):
            if x[j] == 0:
                continue
            y = list(x)
            y[j] = x[j] - max(1, x[j] // 3)
            r = probe(y)
            saved = cur.power_w - r.power_w
            slow = (r.time_ms - cur.time_ms) / cur.time_ms
            cost[j] = slow / saved if saved > 0.05 else math.inf

        def value(js: tuple[int, ...]) -> float:
            # what a step up buys, read off what a step down cost; unknown (at the floor) = high
            vs = [cost.get(j, math.inf) for j in js]
            return sum(vs) / len(vs)

        buys = [(j,) for j in range(4) if x[j] < self.n[j] - 1]
        if x[2] < self.n[2] - 1 and x[3] < self.n[3] - 1:
            buys.append((2, 3))
        buys.sort(key=value, reverse=True)
        for js in buys[:3]:
            sheds = sorted((j for j in cost if j not in js), key=lambda j: cost[j])
            if not sheds or value(js) <= cost[sheds[0]]:
                continue
            y = list(x)
            for j in js:
                y[j] += 1
            r = probe(y)
            for j in sheds:
                if r.ok:
                    break
                got = shed_until_fits(probe, y, j)
                if got is None:
                    y[j] = 0
                    r = probe(y)
                else:
                    r = got
            if self._faster(r, cur):
                return y, r
        return None

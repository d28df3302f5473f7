"""Board detection: which Jetson this is and where its knobs live, read off the file tree."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from powerd.device.boards import GPU_OF_NODE_NAMES, BoardSpec, find_board_spec
from powerd.device.errors import DeviceError, SysfsReadError
from powerd.device.sysfs import DeviceRoot, parse_cpu_list, read_int_list, read_text

log = logging.getLogger(__name__)

MODEL_FILES = ("/sys/firmware/devicetree/base/model", "/proc/device-tree/model")
COMPATIBLE_FILES = ("/proc/device-tree/compatible", "/sys/firmware/devicetree/base/compatible")
RELEASE_FILE = "/etc/nv_tegra_release"
CPU_DIR = "/sys/devices/system/cpu"

_RELEASE_RE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([0-9.]+)")


@dataclass(frozen=True)
class Cluster:
    """One cpufreq policy: its directory and the CPUs whose frequency it sets."""

    policy_dir: Path
    cpus: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.policy_dir.name


@dataclass(frozen=True)
class BoardInfo:
    """Everything the rest of powerd needs to know about the board, paths resolved under root."""

    root: Path
    model: str
    soc: str
    l4t: str | None  # "35.4.1"; None when /etc/nv_tegra_release is missing
    spec: BoardSpec | None  # None: an unlisted model on an unknown tegra SoC
    cpus: tuple[int, ...]
    clusters: tuple[Cluster, ...]
    gpu_dir: Path  # devfreq directory (min_freq, max_freq, cur_freq, available_frequencies)
    emc_dir: Path | None  # BPMP debugfs clk/emc (rate, mrq_rate_locked); None: EMC not driven
    emc_rates_file: Path | None  # possible_rates (kHz); None when absent

    @property
    def name(self) -> str:
        return self.spec.name if self.spec else self.soc

    @property
    def ncpu(self) -> int:
        return len(self.cpus)

    @property
    def key(self) -> str:
        """Stable id for stored profiles: fitted models only carry over on the same model and
        L4T release (the frequency tables change between releases)."""
        slug = re.sub(r"[^a-z0-9]+", "-", self.model.lower()).strip("-") or self.soc
        return f"{slug}-l4t{self.l4t or 'unknown'}"

    def cpu_dir(self, cpu: int) -> Path:
        return DeviceRoot(self.root).path(f"{CPU_DIR}/cpu{cpu}")

    @property
    def online_mask_file(self) -> Path:
        return DeviceRoot(self.root).path(f"{CPU_DIR}/online")

    def describe(self) -> dict[str, object]:
        """A JSON-friendly summary (for `powerctl status`)."""
        dev = DeviceRoot(self.root)
        return {
            "name": self.name,
            "model": self.model,
            "soc": self.soc,
            "l4t": self.l4t,
            "key": self.key,
            "cpus": len(self.cpus),
            "clusters": [list(c.cpus) for c in self.clusters],
            "gpu_devfreq": dev.rel(self.gpu_dir),
            "emc": dev.rel(self.emc_dir) if self.emc_dir else None,
        }


def _first_readable(dev: DeviceRoot, candidates: tuple[str, ...]) -> tuple[str, str] | None:
    for cand in candidates:
        path = dev.path(cand)
        if path.is_file():
            try:
                return cand, read_text(path)
            except SysfsReadError:
                continue
    return None


def read_model(dev: DeviceRoot) -> str:
    found = _first_readable(dev, MODEL_FILES)
    if found is None or not found[1]:
        raise DeviceError(
            f"not a Jetson (or wrong [device] root {dev.root}): no device-tree model in "
            + " or ".join(MODEL_FILES)
        )
    return found[1]


def read_soc(dev: DeviceRoot) -> str:
    """The SoC is the last (most generic) entry of the NUL-separated compatible list."""
    for cand in COMPATIBLE_FILES:
        path = dev.path(cand)
        if not path.is_file():
            continue
        entries = [e for e in path.read_bytes().split(b"\x00") if e.strip()]
        if entries:
            return entries[-1].decode(errors="replace").strip().split(",")[-1]
    raise DeviceError(f"no device-tree compatible string in {' or '.join(COMPATIBLE_FILES)}")


def read_l4t_release(dev: DeviceRoot) -> str | None:
    """`# R35 (release), REVISION: 4.1, ...` -> "35.4.1"."""
    path = dev.path(RELEASE_FILE)
    try:
        first = read_text(path).splitlines()[0]
    except (SysfsReadError, IndexError):
        log.warning("%s missing or empty: L4T release unknown", RELEASE_FILE)
        return None
    m = _RELEASE_RE.search(first)
    if not m:
        log.warning("cannot parse L4T release from %s: %r", RELEASE_FILE, first)
        return None
    return f"{m.group(1)}.{m.group(2)}"


def _natural_key(path: Path) -> tuple[str, int]:
    m = re.match(r"(\D*)(\d+)$", path.name)
    return (m.group(1), int(m.group(2))) if m else (path.name, -1)


def discover_cpus(dev: DeviceRoot) -> tuple[int, ...]:
    present = dev.path(f"{CPU_DIR}/present")
    if present.is_file():
        try:
            cpus = parse_cpu_list(read_text(present))
            if cpus:
                return tuple(cpus)
        except (SysfsReadError, ValueError):
            pass
    found = sorted(
        int(p.name[3:]) for p in dev.path(CPU_DIR).glob("cpu[0-9]*") if p.name[3:].isdigit()
    )
    if not found:
        raise DeviceError(f"no CPUs under {dev.path(CPU_DIR)}")
    return tuple(found)


def discover_clusters(
    dev: DeviceRoot, cpus: tuple[int, ...], spec: BoardSpec | None
) -> tuple[Cluster, ...]:
    """cpufreq policies and their CPUs from `related_cpus`; the board table if none are listed."""
    clusters: list[Cluster] = []
    for policy in sorted(dev.path(f"{CPU_DIR}/cpufreq").glob("policy[0-9]*"), key=_natural_key):
        try:
            related = tuple(read_int_list(policy / "related_cpus"))
        except SysfsReadError as exc:
            log.warning("skipping %s: %s", policy, exc)
            continue
        if related:
            clusters.append(Cluster(policy, related))
    if clusters:
        return tuple(clusters)
    if spec and spec.clusters:
        log.warning("no cpufreq policies listed: using the %s cluster table", spec.name)
        fallback = [Cluster(dev.path(f"{CPU_DIR}/cpu{c[0]}/cpufreq"), c) for c in spec.clusters]
        if all(c.policy_dir.is_dir() for c in fallback):
            return tuple(fallback)
    raise DeviceError(f"no cpufreq policies under {dev.path(CPU_DIR)}/cpufreq (is cpufreq on?)")


def _gpu_of_node_name(devfreq_dir: Path) -> str | None:
    try:
        return read_text(devfreq_dir / "device" / "of_node" / "name")
    except SysfsReadError:
        return None


def find_gpu_devfreq(
    dev: DeviceRoot,
    candidates: tuple[str, ...],
    of_node_names: tuple[str, ...] = GPU_OF_NODE_NAMES,
) -> Path:
    """The board's known GPU devfreq dirs first, then any /sys/class/devfreq entry whose
    device-tree node is a GPU (the directory name changed between JetPack 5 and 6)."""
    for cand in candidates:
        path = dev.path(cand)
        if (path / "available_frequencies").is_file():
            return path
    class_dir = dev.path("/sys/class/devfreq")
    for entry in sorted(class_dir.glob("*")):
        if (
            _gpu_of_node_name(entry) in of_node_names
            and (entry / "available_frequencies").is_file()
        ):
            return entry
    tried = ", ".join(candidates) or "(no known dirs)"
    raise DeviceError(
        f"GPU devfreq directory not found: tried {tried} and /sys/class/devfreq/* with "
        f"device/of_node/name in {list(of_node_names)}"
    )


def detect_board(root: Path | str) -> BoardInfo:
    """Identify the Jetson under `root` ("/" in production). Raises DeviceError naming what
    is missing when this is not a Jetson."""
    dev = DeviceRoot(root)
    model = read_model(dev)
    soc = read_soc(dev)
    if not soc.startswith("tegra"):
        raise DeviceError(f"not a Jetson: model {model!r}, SoC {soc!r} is not a tegra SoC")
    spec = find_board_spec(model, soc)
    if spec is None:
        log.warning("unknown Jetson %r (%s): relying on discovery only", model, soc)
    l4t = read_l4t_release(dev)
    cpus = discover_cpus(dev)
    clusters = discover_clusters(dev, cpus, spec)
    gpu_dir = find_gpu_devfreq(
        dev,
        spec.gpu_devfreq_dirs if spec else (),
        spec.gpu_of_node_names if spec else GPU_OF_NODE_NAMES,
    )
    emc_dir: Path | None = None
    for cand in spec.emc_dirs if spec else ():
        path = dev.path(cand)
        if (path / "rate").is_file() and (path / "mrq_rate_locked").is_file():
            emc_dir = path
            break
    if emc_dir is None:
        log.warning("EMC debugfs not found (is debugfs mounted?): memory frequency not driven")
    emc_rates_file: Path | None = None
    for cand in spec.emc_rates_files if spec else ():
        if dev.path(cand).is_file():
            emc_rates_file = dev.path(cand)
            break
    if spec and spec.clusters and spec.ncpu != len(cpus):
        log.info("%s: %d CPUs present (table says %d)", spec.name, len(cpus), spec.ncpu)
    info = BoardInfo(
        root=dev.root,
        model=model,
        soc=soc,
        l4t=l4t,
        spec=spec,
        cpus=cpus,
        clusters=clusters,
        gpu_dir=gpu_dir,
        emc_dir=emc_dir,
        emc_rates_file=emc_rates_file,
    )
    log.info("detected %s (%s, L4T %s), key %s", model, soc, l4t, info.key)
    return info

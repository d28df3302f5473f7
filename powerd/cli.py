"""Entry points: `powerd` (the daemon and its offline tools) and `powerctl` (users, admins)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from powerd import protocol as p
from powerd.config import (
    DEFAULT_ENDPOINT,
    ConfigError,
    config_path_from_env,
    dump_toml,
    load_config,
)


def _setup_logging(verbose: bool = False) -> None:
    # journald adds its own timestamps; a terminal user wants them
    fmt = "%(levelname)s %(name)s: %(message)s"
    if sys.stderr.isatty() or os.environ.get("POWERD_LOG_TIMES"):
        fmt = "%(asctime)s " + fmt
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format=fmt, stream=sys.stderr
    )


def _load(path: str | None):  # noqa: ANN202
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"powerd: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


# ---- powerd ------------------------------------------------------------------------------


def daemon_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="powerd", description="Jetson power-mode autotuning daemon")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the daemon (systemd Type=notify)")
    s.add_argument("--config", help="config file (default: $POWERD_CONFIG or /etc/powerd.toml)")
    s.add_argument("-v", "--verbose", action="store_true")
    c = sub.add_parser("check-config", help="validate a config file and print the effective one")
    c.add_argument("file")
    r = sub.add_parser("restore", help="put the baseline hardware state back (no daemon needed)")
    r.add_argument("--config")
    args = ap.parse_args(argv)

    if args.cmd == "check-config":
        try:
            cfg = load_config(args.file)
        except ConfigError as exc:
            for key, msg in exc.errors:
                print(f"{exc.path}: {key}: {msg}", file=sys.stderr)
            return 1
        print(dump_toml(cfg), end="")
        return 0

    if args.cmd == "restore":
        _setup_logging()
        return _restore_offline(args.config)

    _setup_logging(args.verbose)
    return _serve(args.config)


def _serve(config_path: str | None) -> int:
    from powerd.hardware import Hardware, HardwareError
    from powerd.server import Daemon, Server

    cfg = _load(config_path)
    log = logging.getLogger("powerd")
    problem = _strategy_problem(cfg)
    if problem:
        # refuse to start rather than run another strategy than the one configured
        log.error("strategy %s cannot run: %s", cfg.strategy.name, problem)
        return 1
    try:
        hw = Hardware.open(cfg)
    except HardwareError as exc:
        log.error("%s", exc)
        return 1
    daemon = Daemon(cfg, hw)
    server = Server(daemon)
    server.install_signal_handlers()
    try:
        server.serve()
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1
    return 0


def _strategy_problem(cfg: Any) -> str | None:
    """Why the configured strategy cannot run here (None: it can)."""
    if cfg.strategy.name != "powertrain":
        return None
    try:
        from powerd.predictor.reference import ReferenceModel

        ReferenceModel.load()
    except Exception as exc:  # noqa: BLE001 - any reason (missing files, no onnxruntime) stops start-up
        return f"{exc} (or set [strategy] name = \"binary-search\")"
    return None


def _restore_offline(config_path: str | None) -> int:
    """Ask a running daemon first (it also releases its jobs); else restore from the files."""
    from powerd.client import admin_endpoint, call_once
    from powerd.errors import PowerdError

    cfg = _load(config_path)
    try:
        reply = call_once(admin_endpoint(_endpoint_for(cfg)), p.Restore(), timeout_s=1.0)
        print(f"powerd: {getattr(reply, 'message', 'restored')}")
        return 0
    except PowerdError:
        pass
    from powerd.device.baseline import restore_baseline

    report = restore_baseline(cfg.device.root, cfg.state.dir)
    print(f"powerd: {report}")
    return 0 if report.ok else 1


# ---- powerctl ----------------------------------------------------------------------------


def _endpoint_for(cfg: Any) -> str:
    return os.environ.get("POWERD_ENDPOINT") or cfg.server.endpoint


def _ctl_endpoint(args: argparse.Namespace) -> str:
    if os.environ.get("POWERD_ENDPOINT"):
        return os.environ["POWERD_ENDPOINT"]
    path = args.config or config_path_from_env()
    if args.config or os.path.exists(path):
        return _load(path).server.endpoint
    return DEFAULT_ENDPOINT


def ctl_main(argv: list[str] | None = None) -> int:
    from powerd.client import admin_endpoint, call_once
    from powerd.errors import PowerdError

    ap = argparse.ArgumentParser(prog="powerctl", description="talk to the powerd daemon")
    ap.add_argument("--config", help="read the endpoint from this config file")
    sub = ap.add_subparsers(dest="cmd", required=True)
    st = sub.add_parser("status", help="board, mode, power, budget and jobs")
    st.add_argument("--json", action="store_true")
    for name in ("predict", "pareto"):
        sp = sub.add_parser(name, help=f"{name} from a workload's fitted predictor")
        sp.add_argument("--workload", required=True)
        sp.add_argument("--json", action="store_true")
        if name == "pareto":
            sp.add_argument("--plot", metavar="FILE.png")
    b = sub.add_parser("budget", help="set the default budget (admins)")
    b.add_argument("watts", type=float)
    sub.add_parser("restore", help="release every job and restore the baseline (admins)")
    args = ap.parse_args(argv)

    endpoint = _ctl_endpoint(args)
    try:
        if args.cmd == "status":
            reply = call_once(endpoint, p.Status())
            assert isinstance(reply, p.StatusReply)
            if args.json:
                print(json.dumps(reply.status, indent=2))
            else:
                print(format_status(reply.status))
        elif args.cmd in ("predict", "pareto"):
            msg = (
                p.Predict(workload=args.workload)
                if args.cmd == "predict"
                else p.Pareto(workload=args.workload)
            )
            reply = call_once(endpoint, msg, timeout_s=30)
            assert isinstance(reply, p.Predictions)
            if args.cmd == "pareto" and args.plot:
                from powerd.plot import plot_pareto

                plot_pareto(reply, args.plot)
                print(f"wrote {args.plot}", file=sys.stderr)
            if args.json:
                print(json.dumps(reply.rows))
            elif not (args.cmd == "pareto" and args.plot):
                print(format_rows(reply.rows))
        elif args.cmd == "budget":
            reply = call_once(admin_endpoint(endpoint), p.SetDefaultBudget(budget_w=args.watts))
            print(getattr(reply, "message", "ok"))
        elif args.cmd == "restore":
            try:
                reply = call_once(admin_endpoint(endpoint), p.Restore(), timeout_s=5)
                print(getattr(reply, "message", "restored"))
            except PowerdError as exc:
                if "not reachable" not in str(exc):
                    raise
                print(
                    "powerctl: no daemon answered; restoring from the saved baseline",
                    file=sys.stderr,
                )
                return _restore_offline(args.config)
    except PowerdError as exc:
        print(f"powerctl: {exc}", file=sys.stderr)
        return 1
    return 0


def format_status(s: dict[str, Any]) -> str:
    mode = s.get("mode")
    lines = [
        f"board     {s['board']} (L4T {s.get('l4t', '?')})",
        f"strategy  {s.get('strategy', '?')}, {s.get('mode_space_size', '?')} modes",
        f"mode      {_mode_str(mode) if mode else 'baseline (no job holds the board)'}",
        f"power     {s['power_w']:.2f} W" if s.get("power_w") is not None else "power     n/a",
        f"budget    {s['budget_w']:g} W "
        f"(limits {s['limits_w']['min']:g}-{s['limits_w']['max']:g} W)",
    ]
    jobs = s.get("jobs") or []
    lines.append(f"jobs      {len(jobs) or 'none'}")
    for j in jobs:
        fit = f", fit {j['fit_method']}" if j.get("fit_method") else ""
        lines.append(
            f"  {j['id']}  {j['workload']:<28} {j['phase']:<9} {j['budget_w']:g} W  "
            f"{j['steps']} steps, {j['profiled_modes']} modes profiled{fit}"
        )
        if j.get("message"):
            lines.append(f"      {j['message']}")
    return "\n".join(lines)


def _mode_str(m: dict[str, int]) -> str:
    return (
        f"{m['cores']} cores, CPU {m['cpu_khz'] / 1e3:.0f} MHz, GPU {m['gpu_hz'] / 1e6:.0f} MHz,"
        f" EMC {m['emc_hz'] / 1e6:.0f} MHz"
    )


def format_rows(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'cores':>5} {'cpu MHz':>8} {'gpu MHz':>8} {'emc MHz':>8} {'time ms':>9} {'power W':>8}"
    )
    out = [head]
    for r in rows:
        out.append(
            f"{r['cores']:>5} {r['cpu_khz'] / 1e3:>8.0f} {r['gpu_hz'] / 1e6:>8.0f} "
            f"{r['emc_hz'] / 1e6:>8.0f} {r['time_ms']:>9.1f} {r['power_w']:>8.2f}"
        )
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(daemon_main())

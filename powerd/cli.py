"""Entry points: `powerd` (the daemon and its offline tools) and `powerctl` (users, admins)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any

from powerd import protocol as p
from powerd.config import (
    DEFAULT_ENDPOINT,
    ConfigError,
    config_path_from_env,
    dump_toml,
    load_config,
)
from powerd.modes import PowerMode


def _setup_logging(verbose: bool = False) -> None:
    # journald adds its own timestamps; a terminal user wants them
    fmt = "%(levelname)s %(name)s: %(message)s"
    if sys.stderr.isatty() or os.environ.get("POWERD_LOG_TIMES"):
        fmt = "%(asctime)s " + fmt
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format=fmt, stream=sys.stderr
    )


def _load(path: str | None, prog: str = "powerd"):  # noqa: ANN202
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def _version() -> str:
    """The installed package's version (the source tree's when run from a checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("powerd")
    except PackageNotFoundError:  # the .deb ships the package without dist metadata
        from powerd import __version__

        return __version__


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds (got {text!r})") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0 seconds (got {text})")
    return value


# ---- powerd ------------------------------------------------------------------------------


def daemon_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="powerd", description="Jetson power-mode autotuning daemon")
    ap.add_argument("--version", action="version", version=f"powerd {_version()}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the daemon (systemd Type=notify)")
    s.add_argument("--config", help="config file (default: $POWERD_CONFIG or /etc/powerd.toml)")
    s.add_argument("-v", "--verbose", action="store_true")
    c = sub.add_parser("check-config", help="validate a config file and print the effective one")
    c.add_argument("file")
    r = sub.add_parser("restore", help="put the baseline hardware state back (no daemon needed)")
    r.add_argument(
        "--config",
        help="the daemon's config file: its [state] dir holds the saved baseline "
        "(default: $POWERD_CONFIG or /etc/powerd.toml)",
    )
    r.add_argument(
        "--wait",
        type=_positive_seconds,
        default=None,
        metavar="S",
        help="how long to wait for a running daemon to answer (default 30 s)",
    )
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
        return _restore_offline(args.config, args.wait)

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
        return f'{exc} (or set [strategy] name = "binary-search")'
    return None


# How long `powerd restore` waits for a daemon that holds the board (it may be in the middle
# of a mode switch with its read-back waits, or a fit) before it gives up.
RESTORE_WAIT_S = 30.0


def _listening(endpoint: str) -> bool:
    """Whether something accepts connections at a ZeroMQ endpoint: a stale ipc socket file
    refuses, a live daemon accepts even when it is too busy to answer."""
    from powerd.client import connect_endpoint, knock
    from powerd.errors import DaemonUnavailable

    try:
        endpoint = connect_endpoint(endpoint)  # a daemon bound to tcp://* listens on loopback
    except DaemonUnavailable:
        return False  # nothing can listen at a malformed endpoint
    try:
        knock(endpoint)
        return True
    except PermissionError:
        return True  # someone owns it; only they can say whether it is alive
    except (OSError, ValueError):
        return False


def _restore_offline(
    config_path: str | None,
    wait_s: float | None = None,
    endpoint: str | None = None,
    endpoint_source: str | None = None,
    prog: str = "powerd",
) -> int:
    """`powerd restore`: the one writer of the board is whoever holds the board lock. A
    running daemon is asked (and waited for); only without one does this process write.

    `endpoint` (default: $POWERD_ENDPOINT, else the config's) is where a daemon is asked;
    `endpoint_source` says where it came from. The saved baseline is looked for in the
    config's [state] dir: an endpoint that did not come from that config may belong to a
    daemon that kept its state elsewhere, so finding nothing there is then a failure."""
    from powerd.device.baseline import restore_baseline
    from powerd.device.lock import BoardLock
    from powerd.endpoints import admin_endpoint

    cfg = _load(config_path, prog)
    if endpoint is None:
        endpoint, endpoint_source = _endpoint_for(cfg), None
        if os.environ.get("POWERD_ENDPOINT"):
            endpoint_source = "POWERD_ENDPOINT"
    try:
        admin = admin_endpoint(endpoint)
    except ValueError:
        admin = endpoint  # malformed: nothing listens there (_listening says so)
    lock = BoardLock(cfg.state.dir)
    try:
        free = lock.acquire()
    except OSError as exc:
        print(f"{prog}: cannot take the board lock {lock.path}: {exc}", file=sys.stderr)
        return 1
    if free and not _listening(admin):
        try:
            report = restore_baseline(cfg.device.root, cfg.state.dir)
        finally:
            lock.release()
        if report.found:
            print(f"{prog}: {report}")
            return 0 if report.ok else 1
        print(
            f"{prog}: no saved baseline in {cfg.state.dir} ([state] dir of {cfg.source}): "
            "nothing to restore"
        )
        if endpoint_source is not None and endpoint != cfg.server.endpoint:
            # e.g. POWERD_ENDPOINT names a demo daemon: its baseline is in its own state dir
            print(
                f"{prog}: the endpoint {endpoint} came from {endpoint_source}, not from "
                f"{cfg.source}, so the daemon that used it may keep its baseline elsewhere: "
                "run `powerctl --config FILE restore` (or `sudo powerd restore --config "
                "FILE`) with that daemon's config file",
                file=sys.stderr,
            )
            return 1
        return 0
    if free:
        lock.release()  # a daemon listens without the lock (another version?): ask it
        holder = "a powerd daemon"
    else:
        holder = f"powerd (pid {lock.holder() or '?'})"
    return _restore_through_daemon(admin, holder, lock, wait_s or RESTORE_WAIT_S)


def _restore_through_daemon(endpoint: str, holder: str, lock: Any, wait_s: float) -> int:
    import time

    from powerd.client import STALE_SOCKET, call_once
    from powerd.errors import DaemonUnavailable, PowerdError

    deadline = time.monotonic() + wait_s
    print(f"powerd: the board is held by {holder}: asking it to restore", file=sys.stderr)
    while True:
        left = deadline - time.monotonic()
        try:
            reply = call_once(endpoint, p.Restore(), timeout_s=max(0.5, left))
            print(f"powerd: {getattr(reply, 'message', 'restored')}")
            return 0
        except DaemonUnavailable as exc:
            # Starting up (restoring a crash's baseline, socket not bound yet) or stuck.
            starting = "no socket" in str(exc) or STALE_SOCKET in str(exc)
            if time.monotonic() < deadline and starting:
                time.sleep(0.2)
                continue
            why = str(exc)
        except PowerdError as exc:
            print(f"powerd: the daemon could not restore the baseline: {exc}", file=sys.stderr)
            return 1
        break
    try:
        gone = lock.acquire()
    except OSError:
        gone = False
    if gone:  # it went away meanwhile: nobody else writes now
        lock.release()
        print(
            f"powerd: {holder} stopped while we waited; run `powerd restore` again",
            file=sys.stderr,
        )
        return 1
    print(
        f"powerd: {holder} did not answer a restore request within {wait_s:g} s "
        f"({why}); NOT writing sysfs behind its back. Stop it with `systemctl stop powerd` "
        "(it restores the board as it stops; ExecStopPost runs `powerd restore` if it "
        "cannot), then run `powerd restore` again if needed.",
        file=sys.stderr,
    )
    return 1


# ---- powerctl ----------------------------------------------------------------------------


def _endpoint_for(cfg: Any) -> str:
    return os.environ.get("POWERD_ENDPOINT") or cfg.server.endpoint


def _ctl_endpoint(args: argparse.Namespace) -> tuple[str, str | None]:
    """The endpoint powerctl talks to, and where it came from: "--endpoint",
    "POWERD_ENDPOINT", or None for the config's [server] endpoint (or the default)."""
    if args.endpoint:
        return args.endpoint, "--endpoint"
    if os.environ.get("POWERD_ENDPOINT"):
        return os.environ["POWERD_ENDPOINT"], "POWERD_ENDPOINT"
    if args.config or os.environ.get("POWERD_CONFIG") or os.path.exists(config_path_from_env()):
        return _load(args.config, "powerctl").server.endpoint, None
    return DEFAULT_ENDPOINT, None


# status and admin commands are answered at once by a live daemon (no hardware, no fit):
# a short wait. predict and pareto go through the control path (a fit may be running).
CTL_TIMEOUT_S = 3.0
PREDICT_TIMEOUT_S = 30.0
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def _plot_problem(path: str) -> str | None:
    """Why `--plot PATH` cannot be written (None: it can be tried)."""
    if path.endswith(os.sep) or os.path.isdir(path):
        return f"{path} is a directory: name the file, e.g. {os.path.join(path, 'front.png')}"
    if os.path.splitext(path)[1].lower() not in PLOT_SUFFIXES:
        return f"the file name must end in .png, .svg or .pdf (got {path})"
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        return f"the directory {parent} does not exist"
    return None


def _unreachable_message(exc: Exception, source: str | None) -> str:
    """A DaemonUnavailable as advice for a command-line user (the library's message tells a
    training script to pass required=False)."""
    endpoint = getattr(exc, "endpoint", None)
    reason = getattr(exc, "reason", None)
    if endpoint is None or reason is None:
        return str(exc)
    where = f" (from {source})" if source else ""
    kind = getattr(exc, "kind", "unreachable")
    if kind == "invalid":
        return f"invalid endpoint {endpoint!r}{where}: {reason}; e.g. --endpoint {DEFAULT_ENDPOINT}"
    if kind == "no_access":
        return f"cannot talk to powerd at {endpoint}{where}: {reason}"
    return (
        f"powerd is not reachable at {endpoint}{where}: {reason}. Is powerd running? "
        "See `systemctl status powerd` (start it with `sudo systemctl start powerd`). "
        "Another daemon: pass --endpoint ENDPOINT or --config FILE, or set POWERD_ENDPOINT."
    )


def ctl_main(argv: list[str] | None = None) -> int:
    try:
        rc = _ctl(argv)
        sys.stdout.flush()  # a closed pipe must surface here, not at interpreter exit
        return rc
    except BrokenPipeError:
        # `powerctl ... | head`: the reader has what it wanted; exit quietly like other
        # Unix tools (128 + SIGPIPE), with stdout pointed where the final flush cannot fail
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _protocol_arg(
    model: type[Any], field: str, parse: Callable[[str], Any] = float, what: str = "a number"
) -> Callable[[str], Any]:
    """An argparse type: `parse`, then the protocol's rule for model.field (the limits stay
    in one place), so a bad value is a one-line usage error (exit 2), not a traceback."""

    def check(text: str) -> Any:
        from pydantic import TypeAdapter, ValidationError

        from powerd.validation import rule_of

        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} (got {text!r})") from None
        info = model.model_fields[field]
        try:
            return TypeAdapter(Annotated[info.annotation, info]).validate_python(value)
        except ValidationError as exc:
            err = exc.errors()[0]
            each = "every value " if err["loc"] else ""  # an item of a list
            raise argparse.ArgumentTypeError(f"{each}{rule_of(err)} (got {text})") from None

    return check


def _ctl(argv: list[str] | None = None) -> int:
    from powerd.client import call_once, connect_endpoint
    from powerd.endpoints import admin_endpoint
    from powerd.errors import DaemonUnavailable, PowerdError

    ap = argparse.ArgumentParser(
        prog="powerctl",
        description="Talk to the powerd daemon: board and job status, a workload's "
        "predicted modes, and the admin commands (default budget, restore).",
        epilog="The daemon's endpoint: --endpoint, else $POWERD_ENDPOINT, else [server] "
        "endpoint of --config FILE ($POWERD_CONFIG, /etc/powerd.toml), else "
        f"{DEFAULT_ENDPOINT}.",
    )
    ap.add_argument("--version", action="version", version=f"powerctl (powerd) {_version()}")
    ap.add_argument(
        "--config",
        metavar="FILE",
        help="the daemon's config file: its [server] endpoint, and for `restore` without a "
        "daemon its [state] dir (default: $POWERD_CONFIG or /etc/powerd.toml)",
    )
    ap.add_argument(
        "--endpoint",
        metavar="ENDPOINT",
        help="the daemon's endpoint, e.g. ipc:///run/powerd/powerd.sock or tcp://HOST:PORT "
        "(default: $POWERD_ENDPOINT, else the config's)",
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    # --config and --endpoint also after the command (`powerctl status --endpoint X`);
    # SUPPRESS: not given there, the value given before the command stands
    placed_after = argparse.ArgumentParser(add_help=False)
    for flag, meta in (("--config", "FILE"), ("--endpoint", "ENDPOINT")):
        placed_after.add_argument(
            flag, metavar=meta, default=argparse.SUPPRESS, help="as before the command"
        )

    def command(name: str, **kw: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[placed_after], **kw)

    st = command("status", help="board, power mode, power draw (W), budget and jobs")
    st.add_argument("--json", action="store_true", help="the daemon's full status as JSON")
    helps = {
        "predict": "a workload's predicted step time (ms) and power (W) in every mode, "
        "from its fitted predictor",
        "pareto": "a workload's Pareto front from its fitted predictor: the fastest mode at "
        "each power (training: step time ms vs W; inference: latency ms vs W per batch size "
        "at an arrival rate)",
    }
    parsers: dict[str, argparse.ArgumentParser] = {}
    for name in ("predict", "pareto"):
        sp = command(name, help=helps[name], description=helps[name])
        parsers[name] = sp
        sp.add_argument(
            "--workload",
            required=True,
            metavar="NAME",
            help="the name a job registered with (powerd.request(workload=...)); "
            "`powerctl status` lists the known ones",
        )
        sp.add_argument("--json", action="store_true", help="the rows as JSON, not a table")
        if name == "pareto":
            sp.add_argument(
                "--kind",
                choices=("training", "inference"),
                default="training",
                help="which of the workload's fronts (default: training)",
            )
            sp.add_argument(
                "--rate",
                type=_protocol_arg(p.Pareto, "rate_hz"),
                metavar="R",
                help="inference (required there): arrival rate in requests/s",
            )
            sp.add_argument(
                "--batch-sizes",
                type=_protocol_arg(p.Pareto, "batch_sizes", _ints, "comma-separated integers"),
                metavar="B,B,...",
                help="inference: batch sizes to show (default: all)",
            )
            sp.add_argument(
                "--latency",
                type=_protocol_arg(p.Register, "latency_ms"),
                metavar="MS",
                help="inference --plot: a latency target line to draw (ms)",
            )
            sp.add_argument(
                "--plot",
                metavar="FILE",
                help="draw the front into FILE (.png, .svg or .pdf; needs matplotlib) "
                "instead of printing the table",
            )
            sp.add_argument(
                "--budget",
                type=_protocol_arg(p.SetBudget, "budget_w"),
                metavar="W",
                help="--plot: a budget line to draw, in watts, when no job of this workload "
                "holds the board (default: the daemon's current budget)",
            )
    b = command(
        "budget",
        help="set the default power budget, in watts, of jobs that ask for none (admins; "
        "kept across restarts)",
    )
    b.add_argument(
        "watts",
        type=_protocol_arg(p.SetDefaultBudget, "budget_w"),
        help="the new default budget in watts, within the config's [budget] min_w..max_w",
    )
    command(
        "restore",
        help="release every job and put the board's baseline clocks back (admins); "
        "with no daemon answering, from the saved baseline in the config's [state] dir",
    )
    args = ap.parse_args(argv)
    if args.cmd == "pareto":
        sp = parsers["pareto"]
        if args.kind == "inference" and args.rate is None:
            sp.error("--kind inference needs --rate R (the arrival rate in requests/s)")
        unused = [
            opt
            for opt, v in (
                ("--rate", args.rate),
                ("--batch-sizes", args.batch_sizes),
                ("--latency", args.latency),
            )
            if v is not None
        ]
        if args.kind == "training" and unused:
            sp.error(f"{', '.join(unused)}: only for --kind inference")
        lines = [
            opt
            for opt, v in (("--budget", args.budget), ("--latency", args.latency))
            if v is not None
        ]
        if args.plot is None and lines:
            # silently ignored otherwise: the table (and --json) lists the whole front
            sp.error(
                f"{', '.join(lines)}: only with --plot FILE (drawn as lines on the plot; "
                "the table lists the whole front)"
            )
        if args.plot is not None:
            problem = _plot_problem(args.plot)
            if problem:
                sp.error(f"argument --plot: {problem}")

    endpoint, source = _ctl_endpoint(args)
    try:
        connect_endpoint(endpoint)  # a malformed endpoint: said before anything is tried
        if args.cmd == "status":
            reply = call_once(endpoint, p.Status(), timeout_s=CTL_TIMEOUT_S)
            assert isinstance(reply, p.StatusReply)
            if args.json:
                print(json.dumps(reply.status, indent=2))
            else:
                print(format_status(reply.status))
        elif args.cmd in ("predict", "pareto"):
            msg = (
                p.Predict(workload=args.workload)
                if args.cmd == "predict"
                else p.Pareto(
                    workload=args.workload,
                    kind=args.kind,
                    rate_hz=args.rate,
                    batch_sizes=args.batch_sizes,
                )
            )
            reply = call_once(endpoint, msg, timeout_s=PREDICT_TIMEOUT_S)
            assert isinstance(reply, p.Predictions)
            if args.cmd == "pareto" and args.kind == "inference":
                if not reply.extra.get("profiled"):
                    # a typo in the name reads like a real front otherwise
                    print(
                        f"powerctl: no pairs measured for inference workload "
                        f"{args.workload!r}: this is the bundled prior's prediction",
                        file=sys.stderr,
                    )
                if args.plot:
                    from powerd.plot import plot_inference_front

                    if not _plot(plot_inference_front, reply, args.plot, args.budget, args.latency):
                        return 1
                if args.json:
                    print(json.dumps(reply.rows))
                elif not args.plot:
                    print(format_front(reply.rows))
                return 0
            if args.cmd == "pareto" and args.plot:
                from powerd.plot import plot_pareto

                budget = args.budget
                if budget is None and "budget_w" not in reply.extra:
                    status = call_once(endpoint, p.Status(), timeout_s=CTL_TIMEOUT_S)
                    assert isinstance(status, p.StatusReply)
                    budget = status.status.get("budget_w")
                if not _plot(plot_pareto, reply, args.plot, budget):
                    return 1
            if args.json:
                print(json.dumps(reply.rows))
            elif not (args.cmd == "pareto" and args.plot):
                print(format_rows(reply.rows))
        elif args.cmd == "budget":
            reply = call_once(
                admin_endpoint(endpoint),
                p.SetDefaultBudget(budget_w=args.watts),
                timeout_s=CTL_TIMEOUT_S,
            )
            print(getattr(reply, "message", "ok"))
        elif args.cmd == "restore":
            try:
                reply = call_once(admin_endpoint(endpoint), p.Restore(), timeout_s=5)
                print(getattr(reply, "message", "restored"))
            except DaemonUnavailable as exc:
                # No answer: `powerd restore` writes only if no daemon holds the board,
                # else asks it again and waits longer.
                why = getattr(exc, "reason", "no answer within 5 s")
                print(
                    f"powerctl: no daemon answered at {admin_endpoint(endpoint)} ({why})",
                    file=sys.stderr,
                )
                return _restore_offline(args.config, None, endpoint, source, prog="powerctl")
    except DaemonUnavailable as exc:
        print(f"powerctl: {_unreachable_message(exc, source)}", file=sys.stderr)
        return 1
    except PowerdError as exc:
        print(f"powerctl: {exc}", file=sys.stderr)
        return 1
    return 0


def _plot(draw: Callable[..., None], reply: Any, path: str, *args: Any) -> bool:
    """Draw into `path` and say so; False (said why) when the file cannot be written."""
    try:
        draw(reply, path, *args)
    except OSError as exc:
        print(f"powerctl: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return False
    print(f"wrote {path}", file=sys.stderr)
    return True


def format_status(s: dict[str, Any]) -> str:
    mode = s.get("mode")
    lines = [
        f"board     {s['board']} (L4T {s.get('l4t', '?')})",
        f"strategy  {s.get('strategy', '?')}, {s.get('mode_space_size', '?')} modes",
        f"mode      {_mode_str(mode) if mode else 'baseline (no job holds the board)'}",
        f"power     {s['power_w']:.2f} W" if s.get("power_w") is not None else "power     n/a",
        _budget_line(s),
    ]
    lines += _coexist_lines(s)
    jobs = s.get("jobs") or []
    lines.append(f"jobs      {len(jobs) or 'none'}")
    for j in jobs:
        fit = f", fit {j['fit_method']}" if j.get("fit_method") else ""
        # the objective in force: a power budget, or a step-time target within it
        goal = f"{j['budget_w']:g} W"
        if j.get("objective") == "step_time":
            goal = f"step time {j['step_time_ms']:g} ms within {goal}"
            if j.get("fastest_ms") is not None:
                # a measured time: to 0.1 ms like the other measured times here
                goal += f" (fastest measured {_ms(j['fastest_ms'])})"
        # an inference job's steps are its batches, and it profiles pairs (its detail line)
        work = (
            f"{j['steps']} batches"
            if j.get("kind") == "inference"
            else f"{j['steps']} steps, {j['profiled_modes']} modes profiled{fit}"
        )
        lines.append(f"  {j['id']}  {j['workload']:<28} {j['phase']:<9} {goal}  {work}")
        detail = _job_detail(j)
        if detail:
            lines.append(f"      {detail}")
        if j.get("message"):
            lines.append(f"      {j['message']}")
    lines += _workload_lines(s)
    return "\n".join(lines)


def _budget_line(s: dict[str, Any]) -> str:
    """The board's effective budget; the admin's default beside it when the jobs' lowest
    budget differs (a job that gives none gets the default)."""
    limits = f"limits {s['limits_w']['min']:g}-{s['limits_w']['max']:g} W"
    default = s.get("default_budget_w")
    if default is not None and default != s["budget_w"]:
        return f"budget    {s['budget_w']:g} W (lowest job budget; default {default:g} W, {limits})"
    return f"budget    {s['budget_w']:g} W ({limits})"


def _workload_lines(s: dict[str, Any]) -> list[str]:
    """Known workloads, training and inference side by side, with what was profiled/fitted."""
    state = s.get("workload_state") or {}
    names = s.get("workloads") or sorted(state)
    if not names:
        return []
    lines = [f"workloads {len(names)}"]
    for name in names:
        st = state.get(name) or {}
        parts = []
        tr = st.get("training")
        if tr is not None:
            if "profiled_modes" in tr:
                fit = f"fitted ({tr['fit_method']})" if tr.get("fitted") else "not fitted"
                parts.append(f"training: {tr['profiled_modes']} modes profiled, {fit}")
            else:
                parts.append("training: stored")
            parts[-1] += _cost_str((s.get("profiling") or {}).get(name))
        inf = st.get("inference")
        if inf is not None:
            sizes = ",".join(str(b) for b in inf.get("batch_sizes") or []) or "-"
            parts.append(f"inference: {inf['pairs_profiled']} pairs profiled (b {sizes})")
            parts[-1] += _cost_str((s.get("inference_profiling") or {}).get(name))
        lines.append(f"  {name:<36} {'; '.join(parts) or 'stored'}")
    return lines


def _cost_str(cost: dict[str, Any] | None) -> str:
    """What profiling cost since the daemon started: its time, and how much of it the board
    drew over the budget (a probe over the budget is stopped; a mode just over it is timed)."""
    if not cost or not cost.get("seconds"):
        return ""
    return (
        f", profiled for {cost['seconds']:.1f} s ({100 * cost['share_above_budget']:.0f} % "
        f"of it over the budget, {100 * cost['share_above_budget_1w']:.1f} % over it by > 1 W)"
    )


def _ms(v: Any) -> str:
    return "n/a" if v is None else f"{v:.1f} ms"


def _job_detail(j: dict[str, Any]) -> str:
    """Kind-specific status: inference b, latency target vs measured p99, feasibility;
    interleaved training steps/s against the bound."""
    parts = [j.get("kind", "training")]
    if j.get("interleaved"):
        parts.append("interleaved")
    if j.get("kind") == "inference":
        parts.append(f"b={j.get('batch_size') or '?'}")
        target = j.get("latency_ms")
        parts.append(f"latency target {_ms(target) if target else 'none'}")
        parts.append(f"measured p99 {_ms(j.get('p99_latency_ms'))}")
        if j.get("rate_hz") is not None:
            parts.append(f"rate {j['rate_hz']:g}/s")
        feas = j.get("feasible")
        if feas is False and j.get("phase") == "idle":
            # idle and infeasible: no measured pair stays within the power budget, and the
            # board holds the least-power one (its latency may well meet the target)
            parts.append(f"INFEASIBLE: no pair within the {j['budget_w']:g} W budget")
        elif feas is False:
            # a queue that cannot keep up has no bounded latency (the message says the rate)
            grows = j.get("queue_grows")
            best = j.get("best_latency_ms")
            parts.append("INFEASIBLE (queue grows)" if grows else f"INFEASIBLE (best {_ms(best)})")
        elif feas:
            parts.append("feasible")
        if j.get("draining_backlog"):
            parts.append("draining a backlog (fastest fit pair)")
        parts.append(f"{j.get('pairs_profiled', 0)} pairs profiled")
    elif j.get("steps_per_s") is not None:
        bound = j.get("throughput_bound_hz")
        parts.append(
            f"{j['steps_per_s']:.2f} steps/s"
            + (f" (bound {bound:.2f})" if bound is not None else "")
        )
    return ", ".join(parts)


def format_front(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'b':>4} {'cores':>5} {'cpu MHz':>8} {'gpu MHz':>8} {'emc MHz':>8} "
        f"{'batch ms':>9} {'latency ms':>11} {'power W':>8} {'drains':>6}"
    )
    out = [head]
    for r in rows:
        out.append(
            f"{r['batch_size']:>4} {_clock_cells(r)} {r['batch_ms']:>9.1f} "
            f"{r['latency_ms']:>11.1f} {r['power_w']:>8.2f} {'yes' if r['drains'] else 'no':>6}"
        )
    return "\n".join(out)


def _coexist_lines(s: dict[str, Any]) -> list[str]:
    """nvpmodel, jetson-stats, and what is wrong with the baseline (only when something is)."""
    lines = []
    base = s.get("baseline") or {}
    nvp = base.get("nvpmodel")
    if nvp:
        name = f" ({nvp['name']})" if nvp.get("name") else ""
        lines.append(f"nvpmodel  mode {nvp.get('id')}{name}")
    jt = s.get("jetson_stats")
    if jt:
        where = jt.get("socket") or jt.get("unit")
        lines.append(f"jtop      service {jt.get('service')}" + (f" ({where})" if where else ""))
    if base.get("restore_problem"):
        lines.append(f"baseline  RESTORE FAILED: {base['restore_problem']}")
        lines.append("          powerd retries while idle; see README Troubleshooting")
    elif base.get("partial"):
        lines.append("baseline  partial: not saved: " + ", ".join(base["partial"]))
    for f in s.get("faults") or []:
        if f.get("kind") == "external_change" and f.get("active"):
            lines.append(f"yielded   {f['message']}")
    return lines


def _mode_str(m: dict[str, int]) -> str:
    # the one format of a mode (job.mode, job messages, the daemon's log): 114.75 MHz reads
    # 114 everywhere, never 115 here
    return str(PowerMode.from_dict(m))


def _clock_cells(r: dict[str, Any]) -> str:
    """cores, cpu, gpu and emc MHz of a table row, in PowerMode's whole-MHz convention."""
    m = PowerMode.from_dict(r)
    return f"{m.cores:>5} {m.cpu_mhz:>8} {m.gpu_mhz:>8} {m.emc_mhz:>8}"


def format_rows(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'cores':>5} {'cpu MHz':>8} {'gpu MHz':>8} {'emc MHz':>8} {'time ms':>9} {'power W':>8}"
    )
    out = [head]
    for r in rows:
        out.append(f"{_clock_cells(r)} {r['time_ms']:>9.1f} {r['power_w']:>8.2f}")
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(daemon_main())

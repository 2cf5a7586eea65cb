"""`slurmagent dashboard [SWEEP]`: the sweep's report, live, on loopback (supervise/dashboard.py)."""

from __future__ import annotations

import argparse
import getpass
import socket
from pathlib import Path

from slurmagent.cli.args import NEWEST_HELP, sweep_of
from slurmagent.cli.exits import EXIT_BAD_INPUT, EXIT_OK


def dashboard_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("sweep_dir", type=Path, nargs="?", default=None, help=NEWEST_HELP)
    s.add_argument("--port", type=int, default=8050, help="port on 127.0.0.1 (default 8050; 0: any free one)")
    s.add_argument("--every", type=float, default=10.0, help="seconds between rewrites of the plots (default 10)")


def dashboard(args: argparse.Namespace) -> int:
    """Serves on 127.0.0.1 only, until Ctrl-C: each page load shows every task's state and
    progress now, and the report's plots and tables, written again at most every --every
    seconds; the page reloads itself. Prints the SSH tunnel that reaches it from a laptop."""
    from slurmagent.supervise.dashboard import Dashboard
    from slurmagent.supervise.views import load_trials

    if not 0 <= args.port <= 65535:
        print(f"slurmagent: --port={args.port}: a port number, 0 to 65535 (0: any free one)")
        return EXIT_BAD_INPUT
    if args.every <= 0:
        print(f"slurmagent: --every={args.every}: seconds, above 0")
        return EXIT_BAD_INPUT
    sweep = sweep_of(args)
    board = Dashboard(sweep, sweep / "report", args.every)
    board.page()  # the report written once before anyone asks, and any error in it said now
    try:
        server = board.server(args.port)
    except OSError as exc:
        print(f"slurmagent: cannot listen on 127.0.0.1:{args.port} ({exc.strerror}); choose another --port (0: any)")
        return EXIT_BAD_INPUT
    port = server.server_address[1]
    host = socket.gethostname()
    print(f"dashboard of {sweep}: http://127.0.0.1:{port}/ (this machine only)", flush=True)
    print(f"from your laptop: ssh -N -L {port}:127.0.0.1:{port} {getpass.getuser()}@{host}", flush=True)
    print(f"then open http://127.0.0.1:{port}/ there; Ctrl-C here stops it", flush=True)
    trials = load_trials(sweep)
    if trials is not None and trials.get("storage"):
        print(f"the search's study, trial by trial: optuna-dashboard {trials['storage']}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return EXIT_OK

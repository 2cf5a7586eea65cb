"""`slurmagent render`: a standalone sbatch script and its config, for a login node (slurmagent/render.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from slurmagent.cli.args import CONFIG_DIR_HELP, check_output_dir
from slurmagent.errors import ConfigError


def render_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +experiment=digits_mlp optim.lr=1e-3")
    r.add_argument("-o", "--output", type=Path, default=None, help="directory to write into (default: ./render/<name>)")
    r.add_argument("--config-dir", "-cd", type=Path, default=None, help=CONFIG_DIR_HELP)
    r.add_argument(
        "--mode",
        choices=("python", "command"),
        default=None,
        help="how the job starts: through slurmagent's runtime (python) or the task's command line",
    )


def render(args: argparse.Namespace) -> int:
    """Example: slurmagent render +experiment=digits_mlp optim.lr=1e-3 -o run1 && sbatch run1/job.sbatch"""

    from slurmagent.render import render_cli

    if args.output is not None:
        check_output_dir(args.output, "--output", ConfigError)
    return render_cli(args.output, args.overrides, args.mode, config_dir=args.config_dir)

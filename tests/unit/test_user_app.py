"""slurmagent's launcher inside a user's own Hydra app (hydra/launcher=slurmagent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

APP = """
import hydra
from omegaconf import DictConfig

from slurmagent.runtime import current


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    ctx = current()
    return {"x": cfg.x, "out": str(ctx.output_dir), "backend": ctx.backend, "index": ctx.task_index}


if __name__ == "__main__":
    main()
"""

CONFIG = """defaults:
  - override hydra/launcher: slurmagent
  - _self_
x: 0
"""


def test_launcher_in_users_own_app(tmp_path: Path) -> None:
    (tmp_path / "my_app.py").write_text(APP)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text(CONFIG)
    sweep = tmp_path / "sweep"
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    proc = subprocess.run(
        [sys.executable, "my_app.py", "-m", "x=1,2", f"hydra.sweep.dir={sweep}", "hydra.launcher.poll_interval_s=0.2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    state = json.loads((sweep / "sweep.json").read_text())
    results = sorted((t["result"] for t in state["tasks"]), key=lambda r: r["x"])
    assert results == [
        {"x": 1, "out": str(sweep / "0"), "backend": "local", "index": 0},
        {"x": 2, "out": str(sweep / "1"), "backend": "local", "index": 1},
    ]

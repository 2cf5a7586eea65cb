"""docs/hpo.md's offline example runs as written and does what the page says."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "hpo.md"


def test_the_offline_ask_tell_example_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    example = next(b for b in blocks if "opt.ask()" in b and "opt.tell(" in b)
    script = tmp_path / "example.py"
    script.write_text(example)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    best, spent = out.stdout.splitlines()
    found = re.match(r"best: trial \d+ (\{.*\}) accuracy (0\.\d+) after 27 epochs", best)
    assert found, best
    params = ast.literal_eval(found.group(1))
    assert params["width"] in (32, 64, 128, 256) and params["optim"] in ("sgd", "adam")
    assert ("momentum" in params) == (params["optim"] == "sgd")  # the condition
    assert params["lr"] == float(f"{params['lr']:.1g}")  # what ran: the rounded learning rate
    assert float(found.group(2)) > 0.9  # maximised
    trained = int(re.search(r"epochs trained: (\d+)", spent).group(1))  # type: ignore[union-attr]
    assert 0 < trained < 60 * 27  # stopping the losers early spends a fraction of the full trainings
    # deterministic given the seed: the same output again
    again = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert again.stdout == out.stdout

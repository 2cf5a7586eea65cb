"""How well each rung of a tabular HPO benchmark ranks its configurations: over every
configuration of the table, the Spearman correlation between the mean value after f fidelity
units (epochs; hgb: tens of boosting rounds) and the final one, the median percentile at f of the
best tenth by final value, and the best configuration's own percentile at f.

    bench/.venv-hpo/bin/python bench/hpo_rank_agreement.py [digits mlp8 cnn hgb rnn]

(bench/README.md, the issue-22 section: whether a study could tell from its own low rungs that
they mislead.)"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hpo_suite  # a sibling script: its benchmark loader

TABLES = ("digits", "mlp8", "cnn", "hgb", "rnn")


def main(names: list[str]) -> int:
    for name in names or TABLES:
        bench = hpo_suite.load_benchmark(name)
        final = bench.final_mean  # type: ignore[attr-defined]  # a table's
        val = bench.val  # type: ignore[attr-defined]
        ok = np.isfinite(final)
        best = int(np.nanargmin(final))
        best_tenth = np.argsort(np.where(ok, final, np.inf))[: max(1, len(final) // 10)]
        cells = []
        for f in (r for r in (1, 3, 9, 27) if r < bench.max_fidelity):
            at = np.nanmean(val[:, :, f - 1], axis=1)
            good = ok & np.isfinite(at)
            rho = spearmanr(at[good], final[good]).correlation
            order = np.argsort(np.where(good, at, np.inf))
            pct = np.empty(len(at))
            pct[order] = 100 * np.arange(len(at)) / len(at)
            tenth = np.median(pct[best_tenth])
            cells.append(f"f={f}: rho {rho:.2f}, best tenth at {tenth:.0f} %, best at {pct[best]:.0f} %")
        print(f"{name} (fidelity 1…{bench.max_fidelity}): " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

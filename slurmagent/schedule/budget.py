"""What a sweep will cost and what it has spent, against its budget (pure).

Every GPU-hour and cost figure slurmagent shows or checks — `plan`'s table and its summary,
the launcher's budget check, `status`'s spend — comes from `usage_of`, on one basis (`BASIS`):
GPUs × run time × the catalogue's price of the GPU type it runs on
(`site.gpus.TYPE.price_per_hour`). The run time is, before a job runs, its predicted run time
(the history's prediction × inflation, at most its --time; without history its --time: the
most it can use) on the type it would start on (an any-type request: the type Slurm names in
its start estimate); once it ran, sacct's elapsed time on the type of the node it ran on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from slurmagent.config import BudgetConf, SiteConf
from slurmagent.errors import BudgetExceeded

BASIS = "GPUs × predicted run time (history × inflation, at most --time; no history: --time) × the type's price/h"
SPENT_BASIS = "GPUs × elapsed (sacct) × the price/h of the type each run ran on"


@dataclass(frozen=True)
class Usage:
    gpu_hours: float = 0.0
    cost: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.gpu_hours + other.gpu_hours, self.cost + other.cost)

    def describe(self) -> str:
        return f"{self.gpu_hours:.3f} GPU-h, cost {self.cost:.2f}"


def usage_of(gpus: int, seconds: float, gpu_type: str | None, site: SiteConf) -> Usage:
    """The one place GPU-hours and cost are computed: `gpus` GPUs of `gpu_type` for `seconds`
    (a type not in the catalogue, or none, is not priced)."""
    hours = gpus * seconds / 3600
    gpu = site.gpu(gpu_type)
    return Usage(hours, hours * (gpu.price_per_hour if gpu is not None else 0.0))


def total(items: Iterable[Usage]) -> Usage:
    out = Usage()
    for u in items:
        out = out + u
    return out


def over(budget: BudgetConf, usage: Usage) -> str:
    """'' when within the sweep's budget, else what is over, with both numbers."""
    if budget.gpu_hours and usage.gpu_hours > budget.gpu_hours:
        return f"{usage.gpu_hours:.3f} GPU-h > budget.gpu_hours={budget.gpu_hours:g}"
    if budget.cost and usage.cost > budget.cost:
        return f"cost {usage.cost:.2f} > budget.cost={budget.cost:g}"
    return ""


def reached(budget: BudgetConf, spent: Usage) -> str:
    """'' while spend is under every cap of the sweep, else which cap it reached."""
    if budget.gpu_hours and spent.gpu_hours >= budget.gpu_hours:
        return f"spent {spent.gpu_hours:.3f} of budget.gpu_hours={budget.gpu_hours:g}"
    if budget.cost and spent.cost >= budget.cost:
        return f"spent {spent.cost:.2f} of budget.cost={budget.cost:g}"
    return ""


def check_prediction(budget: BudgetConf, predicted: Usage, month_spent: float | None = None) -> None:
    """Refuse a sweep whose predicted usage exceeds its budget (or the user's month)."""
    why = over(budget, predicted)
    if why:
        raise BudgetExceeded(
            f"the sweep's predicted use ({predicted.describe()}) exceeds its budget: {why}; nothing was submitted"
        )
    month = budget.user_month_gpu_hours
    if month and month_spent is not None and month_spent + predicted.gpu_hours > month:
        raise BudgetExceeded(
            f"this month you used {month_spent:.3f} GPU-h; with this sweep's predicted {predicted.gpu_hours:.3f} "
            f"that exceeds budget.user_month_gpu_hours={budget.user_month_gpu_hours:g}; nothing was submitted"
        )

"""What a sweep will cost and what it has spent, against its budget (pure).

GPU-hours are allocated GPUs × elapsed hours; cost is GPU-hours × the type's price in the
site's catalogue (`site.gpus.TYPE.price_per_hour`). Predictions use each task's predicted run
time (the history's, else its --time: the most it can use); spend comes from sacct.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from slurmagent.config import BudgetConf, SiteConf
from slurmagent.errors import BudgetExceeded


@dataclass(frozen=True)
class Usage:
    gpu_hours: float = 0.0
    cost: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.gpu_hours + other.gpu_hours, self.cost + other.cost)

    def describe(self) -> str:
        return f"{self.gpu_hours:.3f} GPU-h, cost {self.cost:.2f}"


def usage_of(gpus: int, seconds: float, gpu_type: str | None, site: SiteConf) -> Usage:
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

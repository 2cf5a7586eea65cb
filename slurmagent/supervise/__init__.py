"""Supervision from the login node: sweep state on disk and the batched poll loop."""

from slurmagent.supervise.state import Attempt, SweepState, SweepStore, TaskRecord
from slurmagent.supervise.supervisor import Supervisor
from slurmagent.supervise.views import sweep_table

__all__ = ["Attempt", "Supervisor", "SweepState", "SweepStore", "TaskRecord", "sweep_table"]

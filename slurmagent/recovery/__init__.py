"""Fault recovery: diagnosis of failed jobs and the plan for what to do next (both pure)."""

from slurmagent.recovery.diagnose import Diagnosis, diagnose
from slurmagent.recovery.plan import Resubmit, Stop, plan

__all__ = ["Diagnosis", "Resubmit", "Stop", "diagnose", "plan"]

"""Fault recovery: diagnosis of failed jobs and the plan for what to do next."""

from slurmagent.recovery.diagnose import Diagnosis, Evidence, diagnose
from slurmagent.recovery.plan import Resubmit, Stop, plan

__all__ = ["Diagnosis", "Evidence", "Resubmit", "Stop", "diagnose", "plan"]

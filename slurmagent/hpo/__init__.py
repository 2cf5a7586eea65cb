"""Hyperparameter search across Slurm jobs: the search space, the ask/tell optimiser
(explore, focus, asynchronous successive halving with promotions that resume their
checkpoint), its study storage. docs/hpo.md explains it."""

from slurmagent.hpo.core import Ask, Optimizer, TrialInfo
from slurmagent.hpo.space import Param, Space
from slurmagent.hpo.storage import open_storage

__all__ = ["Ask", "Optimizer", "Param", "Space", "TrialInfo", "open_storage"]

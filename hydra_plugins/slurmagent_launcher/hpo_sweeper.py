"""Thin shim: the adaptive-search sweeper Hydra instantiates (hydra/sweeper=slurmagent_hpo),
implemented in slurmagent.launch.hpo_sweeper and imported only when a search starts."""

from __future__ import annotations

from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class SlurmAgentHpoSweeper(Sweeper):
    """Explore, focus, promote: trials are tasks of a slurmagent sweep (docs/hpo.md)."""

    def __init__(self, **params: Any) -> None:
        from slurmagent.launch.hpo_sweeper import HpoSweeper

        self._impl = HpoSweeper(**params)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self._impl.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        return self._impl.sweep(arguments)

"""Thin shim: Hydra instantiates launchers only from classes defined in the hydra_plugins
namespace, so the launcher is declared here; its implementation (slurmagent.launch) is
imported when a sweep is launched, not when Hydra discovers plugins. Importing this module
registers slurmagent's configs (slurmagent.config: the one source of their defaults)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from slurmagent.config import register_configs


class SlurmAgentLauncher(Launcher):
    """Hydra launcher: a sweep becomes Slurm job arrays (or local processes), supervised."""

    def __init__(self, **params: Any) -> None:
        self.params = params
        self._impl: Any = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from slurmagent.launch.launcher import ArrayLauncher

        self._impl = ArrayLauncher(**self.params)
        self._impl.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    @property
    def array_launcher(self) -> Any:
        """The implementation (slurmagent.launch.launcher.ArrayLauncher) after setup(): what the
        search's sweeper drives (check, open_sweep, submit_and_supervise) — the launcher's API."""
        return self._impl

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self._impl is not None, "Hydra calls setup() before launch()"
        return self._impl.launch(job_overrides, initial_job_idx)  # type: ignore[no-any-return]


register_configs()

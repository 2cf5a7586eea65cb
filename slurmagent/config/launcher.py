"""The Hydra launcher's and sweepers' own options (hydra.launcher.*, hydra.sweeper.*)."""

from __future__ import annotations

from dataclasses import dataclass

from slurmagent.errors import ConfigError, choices


@dataclass(frozen=True)
class LauncherConf:
    """Options of the slurmagent Hydra launcher (hydra.launcher.*)."""

    _target_: str = "hydra_plugins.slurmagent_launcher.launcher.SlurmAgentLauncher"  # the class Hydra builds
    array_parallelism: int = 0  # at most N array tasks running at once (%N); 0 = no throttle
    max_array_size: int = 0  # split arrays above this many tasks; 0 = read MaxArraySize from Slurm
    poll_interval_s: float = 2.0  # seconds between status queries while supervising (grows when idle)
    max_poll_interval_s: float = 30.0  # back-off ceiling for the poll interval
    # when Slurm refuses part of a sweep for good (exit 2 either way): leave what it accepted
    # running and supervised to the end, or cancel it at once
    on_refusal: str = "leave"
    # submit, start the sweep's supervisor away from this shell, print how to follow it, return
    # (also: the --detach flag); where it runs: auto | job | process (supervise/detach.py)
    detach: bool = False
    supervisor: str = "auto"
    supervisor_partition: str = ""  # the supervisor job's partition; "" = the cluster's default
    supervisor_mem: str = "1G"
    supervisor_time: str = "02:00:00"  # at its limit it requeues itself and goes on
    # Ctrl-C while attached: leave the sweep to a detached supervisor, or cancel it (asked on a terminal)
    on_interrupt: str = "leave"


@dataclass(frozen=True)
class SweeperConf:
    """Options of the slurmagent Hydra sweeper (hydra.sweeper.*): Hydra's basic sweeper that
    composes one representative job per distinct job shape before launching."""

    _target_: str = "hydra_plugins.slurmagent_launcher.sweeper.SlurmAgentSweeper"  # the class Hydra builds
    max_batch_size: int | None = None  # jobs per launch batch; None = the whole sweep at once
    params: dict[str, str] | None = None  # sweep parameters in config, as for Hydra's basic sweeper


@dataclass(frozen=True)
class HpoSweeperConf:
    """`hydra/sweeper=slurmagent_hpo`: an adaptive search instead of a grid. Its settings are
    the `hpo` group (HpoConf), so that trials see them too."""

    _target_: str = "hydra_plugins.slurmagent_launcher.hpo_sweeper.SlurmAgentHpoSweeper"


ON_REFUSAL_CHOICES = ("leave", "cancel")


SUPERVISOR_CHOICES = ("auto", "job", "process")


def validate_launcher(conf: LauncherConf) -> None:
    for key, value, valid in (
        ("on_refusal", conf.on_refusal, ON_REFUSAL_CHOICES),
        ("on_interrupt", conf.on_interrupt, ON_REFUSAL_CHOICES),
        ("supervisor", conf.supervisor, SUPERVISOR_CHOICES),
    ):
        if value not in valid:
            raise ConfigError(f"hydra.launcher.{key}={value!r} is not one of {choices(valid)}; nothing was submitted")
    for key, num in (("array_parallelism", conf.array_parallelism), ("max_array_size", conf.max_array_size)):
        if num < 0:
            raise ConfigError(f"hydra.launcher.{key}={num} must be 0 (no limit) or positive; nothing was submitted")
    for key, sec in (("poll_interval_s", conf.poll_interval_s), ("max_poll_interval_s", conf.max_poll_interval_s)):
        if sec <= 0:
            raise ConfigError(f"hydra.launcher.{key}={sec} must be a positive number of seconds; nothing was submitted")

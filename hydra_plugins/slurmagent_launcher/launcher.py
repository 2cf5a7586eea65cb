"""Thin shim: Hydra instantiates launchers only from classes defined in the hydra_plugins
namespace, so the launcher is declared here and implemented in slurmagent.launch."""

from hydra.core.config_store import ConfigStore

from slurmagent.launch import launcher as _impl


class SlurmAgentLauncher(_impl.ArrayLauncher):
    """Hydra launcher: a sweep becomes Slurm job arrays (or local processes), supervised."""


ConfigStore.instance().store(
    group="hydra/launcher",
    name="slurmagent",
    node={
        "_target_": "hydra_plugins.slurmagent_launcher.launcher.SlurmAgentLauncher",
        "array_parallelism": 0,  # at most N array tasks at once (%N); 0 = no throttle
        "max_array_size": 0,  # split arrays above this; 0 = the cluster's MaxArraySize
        "poll_interval_s": 2.0,  # seconds between status queries (grows while nothing changes)
        "max_poll_interval_s": 30.0,  # back-off ceiling
    },
    provider="slurmagent",
)

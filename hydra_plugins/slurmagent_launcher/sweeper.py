"""Thin shim: the sweeper class Hydra instantiates, implemented in slurmagent.launch."""

from hydra.core.config_store import ConfigStore

from slurmagent.launch import sweeper as _impl


class SlurmAgentSweeper(_impl.RepresentativeSweeper):
    """Hydra's basic sweeper, validating one representative job per distinct job shape."""


ConfigStore.instance().store(
    group="hydra/sweeper",
    name="slurmagent",
    node={
        "_target_": "hydra_plugins.slurmagent_launcher.sweeper.SlurmAgentSweeper",
        "max_batch_size": None,  # jobs per launch batch; None = the whole sweep at once
        "params": None,  # sweep parameters in config, as for Hydra's basic sweeper
    },
    provider="slurmagent",
)

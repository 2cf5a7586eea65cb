"""Thin shim: the sweeper class Hydra instantiates, implemented in slurmagent.launch. Its
config (hydra/sweeper=slurmagent) is registered with the launcher's (slurmagent.config)."""

from slurmagent.launch import sweeper as _impl


class SlurmAgentSweeper(_impl.RepresentativeSweeper):
    """Hydra's basic sweeper, validating one representative job per distinct job shape."""

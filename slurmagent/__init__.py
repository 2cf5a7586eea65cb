"""slurmagent: a Slurm-native job wrapper for deep-learning training.

Hydra composes job specs, submitit sends them to Slurm as job arrays, the runtime
checkpoints and survives preemption, and the supervisor collects results.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]

"""Everything that talks to Slurm: the command seam, cluster facts, sbatch flags."""

from slurmagent.slurm.cluster import ClusterInfo, NodeInfo, PartitionInfo, check_fits
from slurmagent.slurm.sbatch import SBATCH_EXTRA_OPTIONS, sbatch_flags
from slurmagent.slurm.seam import SlurmCLI, TaskStatus

__all__ = [
    "SBATCH_EXTRA_OPTIONS",
    "ClusterInfo",
    "NodeInfo",
    "PartitionInfo",
    "SlurmCLI",
    "TaskStatus",
    "check_fits",
    "sbatch_flags",
]

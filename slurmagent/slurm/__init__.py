"""Everything that talks to Slurm: the one seam (`seam.py`: named verbs, argv only), cluster
facts and fit checks (`cluster.py`) and the sbatch flags (`sbatch.py`). Its stand-in for fast
tests is not shipped: tests/fake/fake_slurm.py.

Import the module you need (`from slurmagent.slurm.seam import SlurmCLI`): this package
imports nothing itself."""

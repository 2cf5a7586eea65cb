"""Everything that talks to Slurm: the one seam (`seam.py`: named verbs, argv only), its
in-memory stand-in for fast tests (`fake.py`), Slurm's value syntax (`syntax.py`), cluster
facts and fit checks (`cluster.py`) and the sbatch flags (`sbatch.py`).

Import the module you need (`from slurmagent.slurm.seam import SlurmCLI`): this package
imports nothing itself, so the pure syntax module stays importable from the config layer."""

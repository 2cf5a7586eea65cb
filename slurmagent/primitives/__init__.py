"""What the job, the skills and the supervisor share, below all of them: the checkpoint format
(`checkpoint`: atomic files and their manifest), the job's environment (`env`: the SLURMAGENT_*
variables and a task directory's files), the stop flag (`signals`), submitit's folder layout
(`submitit_layout`) and a job's "I have ended" to its supervisor (`wake`). Training code reaches
them through `slurmagent.runtime`."""

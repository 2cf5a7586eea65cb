"""What the job, the skills and the supervisor share, below all of them: the checkpoint format
(`checkpoint`: atomic files and their manifest), the job's environment (`env`: the SLURMAGENT_*
variables and a task directory's files) and the stop flag (`signals`). Training code reaches them
through `slurmagent.runtime`."""

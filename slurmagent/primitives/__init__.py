"""What the job, the skills and the supervisor share, below all of them: the checkpoint format
(`checkpoint`: atomic files and their manifest), the job's environment (`env`: the SLURMAGENT_*
variables and a task directory's files), the stop flag (`signals`), submitit's folder layout
(`submitit_layout`), a job's "I have ended" to its supervisor (`wake`) and the sweep's code
snapshot as the jobs read it (`code`). Training code reaches them through `slurmagent.runtime`."""

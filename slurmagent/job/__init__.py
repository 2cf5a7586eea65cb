"""What happens inside a job, on the compute node: the task entry (`task.py`: `run_task`,
`run_in_job`), a `task.command` program under the plain-script protocol (`command.py`), the
stop decision (`stop.py`: grace window, classification, requeue, moving off a sick node), the
host side of a containerised step (`host.py`) and the submitit callable that rebuilds a task's config
(`runner.py`). The training loop itself is `slurmagent.runtime`: it raises
`StopForRequeue(reason)` and knows neither Slurm nor the gate; this package decides.

Import the module you need (`from slurmagent.job.stop import handle_stop`)."""

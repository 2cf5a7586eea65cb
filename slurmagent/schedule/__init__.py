"""Resource scheduling: which GPU type and partition a job asks for, and how much time and
memory, decided from the site's catalogue, the job history and the cluster's state now.

- `history.py`: the job history store (SQLite) and the fingerprint of a task's work.
- `predict.py`: run time and memory from recent history (pure).
- `place.py`: the candidates (partition × GPU type) and the choice among them (pure).
- `budget.py`: predicted and measured GPU-hours and cost against a sweep's budget (pure).
- `plan.py`: the one owner of `auto` values: it asks the cluster and the history, calls the
  pure parts, and returns the resolved resources with every number it used.

Slurm still schedules; slurmagent only asks it for the right thing (docs/scheduling.md).
"""

"""Trackers: a task's metrics sent on to TensorBoard and MLflow (`track.*`), one tracker run per
task for its whole life. `forward.py` reads the task's metrics.jsonl and keeps what was sent;
`sinks.py` speaks to each tracker's library."""

"""What a job left on disk, read back for supervision, status and doctor: its result, its logs' tails
(the paths from primitives/submitit_layout.py, submitit's layout's one reader)."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmagent.primitives import submitit_layout
from slurmagent.primitives.env import TaskFile
from slurmagent.supervise.state import SweepState

if TYPE_CHECKING:
    from submitit.core.utils import JobPaths

    from slurmagent.slurm.seam import SlurmCLI

LOG_TAIL_BYTES = 200_000  # of a log, what is read to diagnose a failure
STDERR_TAIL = 15  # lines of a failed job's stderr kept in its error


def job_paths(state: SweepState, job_id: str) -> JobPaths:
    return submitit_layout.job_paths(state.submitit_folder, job_id)


def read_result(path: Path) -> tuple[str, Any] | None:
    """submitit's result pickle: ("success", value) or ("error", traceback text)."""
    if not path.exists():
        return None
    try:
        with open(path, "rb") as fh:
            out = pickle.load(fh)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None
    return out if isinstance(out, tuple) and len(out) == 2 else None


def unwrap_return(value: Any) -> tuple[bool, Any, str]:
    """(ok, return value, error text) from a Hydra JobReturn or a plain value."""
    try:
        from hydra.core.utils import JobReturn, JobStatus
    except ImportError:  # pragma: no cover - hydra is a dependency
        return True, value, ""
    if isinstance(value, JobReturn):
        if value.status == JobStatus.COMPLETED:
            return True, value._return_value, ""
        err = value._return_value
        return False, None, f"{type(err).__name__}: {err}"
    return True, value, ""


def stderr_tail(state: SweepState, job_id: str, lines: int = STDERR_TAIL) -> str:
    paths = job_paths(state, job_id)
    for path in (paths.stderr, paths.stdout):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if text.strip():
            return "\n".join(text.splitlines()[-lines:])
    return ""


def task_logs(state: SweepState, job_id: str) -> dict[str, str]:
    """The tail of a job's stderr and stdout (submitit's files), by path."""
    paths = job_paths(state, job_id)
    out: dict[str, str] = {}
    for path in (paths.stderr, paths.stdout):
        try:
            with open(path, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(0, size - LOG_TAIL_BYTES))
                out[str(path)] = fh.read().decode(errors="replace")
        except OSError:
            continue
    return out


def job_logs(slurm: SlurmCLI, job_id: str) -> dict[str, str]:
    """A job's batch log, its steps' logs beside it (submitit: <id>_<rank>_log.err) and
    slurmagent's own record of its failure."""
    logs: dict[str, str] = {}
    for key, value in slurm.job_fields(job_id).items():
        if key in ("StdErr", "StdOut") and value:
            for path in {Path(value), *Path(value).parent.glob(f"{job_id}_*log.*")}:
                if path.is_file():
                    logs[str(path)] = path.read_text(errors="replace")[-LOG_TAIL_BYTES:]
            logs.update(result_logs(Path(value).parent, job_id))
    return logs


def result_logs(folder: Path, job_id: str) -> dict[str, str]:
    """A slurmagent job's own record of its failure: the error in its result file and the
    logs in its output directory (Hydra's job log, a command's stderr)."""
    out: dict[str, str] = {}
    for pkl in folder.glob(f"{job_id}_*result.pkl"):
        res = read_result(pkl)
        if res is None:
            continue
        kind, value = res
        ok, _, err = unwrap_return(value) if kind == "success" else (False, None, str(value))
        if not ok:
            out[str(pkl)] = err
        output_dir = getattr(getattr(getattr(value, "hydra_cfg", None), "hydra", None), "runtime", None)
        if output_dir is not None:
            for name in (TaskFile.COMMAND_STDERR, "app.log"):
                path = Path(str(output_dir.output_dir)) / name
                if path.is_file():
                    out[str(path)] = path.read_text(errors="replace")[-LOG_TAIL_BYTES:]
    return out

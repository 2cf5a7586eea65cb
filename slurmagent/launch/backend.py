"""Choosing the backend (auto | slurm | local) and building submitit executors from the
one source of truth for sbatch flags."""

from __future__ import annotations

import os
import pickle
import shlex
import sys
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import DelayedSubmission
from submitit.slurm.slurm import SlurmJob

from slurmagent.config import JobSpec, LauncherConf, parse_conf
from slurmagent.errors import SlurmUnavailableError
from slurmagent.job.runner import SweepRunner, TaskPayload
from slurmagent.primitives.backends import BACKENDS, Backend
from slurmagent.primitives.submitit_layout import job_paths, place_pickle, staged_pickle, staging_folder
from slurmagent.safety.paths import state_dir
from slurmagent.slurm.container import python_words, wrap
from slurmagent.slurm.sbatch import env_lines, sbatch_flags, stop_flags
from slurmagent.slurm.seam import SlurmCLI
from slurmagent.supervise.state import SweepState, TaskRecord
from slurmagent.supervise.views import runs
from slurmagent.syntax import slurm_time_to_seconds, time_to_minutes

SUBMITIT_NAMED = {
    "partition",
    "nodes",
    "ntasks_per_node",
    "cpus_per_task",
    "mem",
    "gres",
    "qos",
    "account",
    "constraint",
    "exclude",
}


def resolve_backend(choice: str, slurm: SlurmCLI) -> Backend:
    """`cluster=auto|slurm|local` made a backend: auto is Slurm when its commands answer."""
    if choice == "local":
        return BACKENDS["local"]
    if slurm.available():
        return BACKENDS["slurm"]
    if choice == "slurm":
        raise SlurmUnavailableError(
            "cluster=slurm but Slurm does not answer (sinfo failed or is not installed); check SLURM_CONF and that "
            "slurmctld runs, or use cluster=local (or cluster=auto to fall back automatically)"
        )
    return BACKENDS["local"]


def slurm_parameters(
    spec: JobSpec,
    launcher: LauncherConf,
    array_size: int,
    job_name: str,
    comment: str = "",
    srun_flags: list[str] | None = None,
) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for one array of tasks sharing `spec`; `comment`
    marks the job for finding it again (supervise/submission.py) unless the user set one."""
    params: dict[str, Any] = {"job_name": job_name}
    # job steps (srun) get the signal: submitit runs the task under srun
    stop = stop_flags(spec.recovery, to_batch_script=False)
    additional: dict[str, Any] = {flag: True if value is None else value for flag, value in stop.items()}
    for flag, value in sbatch_flags(spec.resources).items():
        key = flag.replace("-", "_")
        if flag == "time":
            params["time"] = time_to_minutes(value)
        elif key in SUBMITIT_NAMED:
            params[key] = int(value) if key in ("nodes", "ntasks_per_node", "cpus_per_task") else value
        else:
            additional[flag] = value
    if comment and "comment" not in additional:
        additional["comment"] = comment
    setup = env_lines(spec.env)  # env.vars and env.setup: in the batch script, before srun starts the job's Python
    if setup:
        params["setup"] = setup
    if srun_flags:  # pyxis: the container is srun's (--container-image …)
        params["srun_args"] = list(srun_flags)
    params["array_parallelism"] = launcher.array_parallelism or array_size
    params["additional_parameters"] = additional
    return params


class SubmititSubmitter:
    """Sends tasks of a sweep to the backend as one submitit job or array: what
    supervise/submission.py calls (its `Submitter`), for first submissions and resubmissions."""

    def __init__(self, slurm: SlurmCLI | None = None) -> None:
        self.slurm = slurm or SlurmCLI()

    def __call__(
        self, state: SweepState, tasks: list[TaskRecord], spec: JobSpec, attempt: int, comment: str
    ) -> list[str]:
        conf = parse_conf(LauncherConf, state.launcher, "hydra.launcher")
        folder = Path(state.submitit_folder)
        executor = make_executor(
            state.where, folder, spec, conf, len(tasks), state.job_name, self.slurm, comment, Path(state.sweep_dir)
        )
        runner = SweepRunner(state.context_path, state.backend, state.sweep_dir)
        # a resubmission carries its adjusted resources, so the job's config says what it got; each
        # job starts as the task's next run (ctx.attempt: every earlier run, requeues included, counts)
        payloads = [
            TaskPayload(
                t.index,
                tuple(t.overrides),
                attempt=runs(t) + 1,
                resources=asdict(spec.resources) if t.attempts else None,
            )
            for t in tasks
        ]
        if isinstance(executor, SeamSlurmExecutor):  # ids only: no submitit Job object per task
            return executor.submit_tasks(runner, payloads)
        return [str(job.job_id) for job in executor.map_array(runner, payloads)]


class SeamSlurmExecutor(submitit.SlurmExecutor):
    """submitit's Slurm executor (its batch script, pickles and result files), with the
    submission itself a verb of our seam (`SlurmCLI.submit`): one place runs sbatch, and a
    test's fake Slurm answers it like the rest."""

    def __init__(self, folder: Path, slurm: SlurmCLI, max_num_timeout: int, python: str | None = None) -> None:
        super().__init__(folder=folder, max_num_timeout=max_num_timeout, python=python)
        self.slurm = slurm

    def _boot_command(self, staged: str) -> str:
        # job/boot.py holds Slurm's stop signals from the process's first line, puts the task's
        # staged pickle in place when the launcher did not, then runs submitit
        return f"{self.python} -u -m slurmagent.job.boot {shlex.quote(str(self.folder))} --staged {staged}"

    def _submit_command(self, command: str) -> submitit.Job[Any]:
        uid = uuid.uuid4().hex
        staging = staging_folder(self.folder)
        staging.mkdir(parents=True, exist_ok=True)
        script = staging / f".submission_file_{uid}.sh"
        script.write_text(self._make_submission_file_text(command, uid))
        try:
            job_id = self.slurm.submit(script)
        except BaseException:
            script.unlink(missing_ok=True)
            raise
        job: submitit.Job[Any] = self.job_class(folder=self.folder, job_id=job_id, tasks=list(range(self._num_tasks())))
        job.paths.move_temporary_file(script, "submission_file", keep_as_symlink=True)
        self._write_job_id(job.job_id, uid)
        self._set_job_permissions(job.paths.folder)
        return job

    def submit_tasks(self, fn: Any, args: list[Any]) -> list[str]:
        """`map_array(fn, args)`'s submission, returning the job ids in the tasks' order."""
        return self._submit([DelayedSubmission(fn, a) for a in args])

    def _internal_process_submissions(self, delayed: list[DelayedSubmission]) -> list[submitit.Job[Any]]:
        ids = self._submit(delayed)
        if len(ids) == 1:
            return [self.job_class(folder=self.folder, job_id=ids[0], tasks=list(range(self._num_tasks())))]
        tasks = list(range(self._num_tasks()))
        return [SlurmJob(folder=self.folder, job_id=job_id, tasks=tasks) for job_id in ids]

    def _submit(self, delayed: list[DelayedSubmission]) -> list[str]:
        """One sbatch for all (an array when more than one). Each task's pickle is staged under
        a name its job derives from the command line and its array index, and moved to the
        job's own name after sbatch answers — or by the job itself (job/boot.py) if the
        launcher died in between, so a submission found again by `reconcile` still runs.
        Per task: one pickle written, one rename (the cost of an array is linear in its tasks)."""
        staging = staging_folder(self.folder)
        staging.mkdir(parents=True, exist_ok=True)
        uid = uuid.uuid4().hex
        pickles = [staged_pickle(staging, uid, index) for index in range(len(delayed))]
        for d, path in zip(delayed, pickles, strict=True):
            d.set_timeout(self.parameters.get("time", 5), self.max_num_timeout)
            _dump(d, path)
        if len(delayed) > 1:
            self.parameters["map_count"] = len(delayed)
        try:
            first = self._submit_command(self._boot_command(uid))
        except BaseException:
            for path in pickles:  # refused: nothing of it stays behind
                path.unlink(missing_ok=True)
            raise
        finally:
            self.parameters.pop("map_count", None)
        own = str(first.job_id)
        ids = [own] if len(delayed) == 1 else [f"{own}_{i}" for i in range(len(delayed))]
        folders: set[Path] = set()
        for job_id, path in zip(ids, pickles, strict=True):
            submitted = job_paths(self.folder, job_id).submitted_pickle
            if submitted.parent not in folders:  # one folder for all, unless the folder names the job
                submitted.parent.mkdir(parents=True, exist_ok=True)
                folders.add(submitted.parent)
            place_pickle(path, submitted, make_folder=False)
        return ids


def _dump(delayed: DelayedSubmission, path: Path) -> None:
    """A task's pickle. A sweep's task (our runner, our payload: importable by reference) with
    the standard pickler — the bytes submitit's cloudpickle writes for it, at half the cost;
    anything else as submitit does (cloudpickle pickles what `__main__` defines by value)."""
    if not isinstance(delayed.function, SweepRunner):
        delayed.dump(path)
        return
    data = pickle.dumps(delayed, protocol=pickle.HIGHEST_PROTOCOL)
    with open(path, "wb") as fh:
        fh.write(data)


def job_binds(sweep_dir: Path, folder: Path, spec: JobSpec) -> list[str]:
    """The directories a job in a container must see at their own paths: the sweep (its
    tasks' outputs, checkpoints by default, the code snapshot), submitit's folder, the
    checkpoint dir when set elsewhere, and slurmagent's state (audit log, pause switch,
    approvals, the policy). Created now: a runtime refuses to bind a path that is not there."""
    paths = [sweep_dir, folder, state_dir()]
    if spec.checkpoint.dir:
        paths.append(Path(spec.checkpoint.dir).expanduser())
    if os.environ.get("SLURMAGENT_APPROVALS_DIR"):
        paths.append(Path(os.environ["SLURMAGENT_APPROVALS_DIR"]))
    out: list[str] = []
    for p in paths:
        p = p.absolute()
        p.mkdir(parents=True, exist_ok=True)
        out.append(str(p))
    if os.environ.get("SLURMAGENT_POLICY"):
        out.append(str(Path(os.environ["SLURMAGENT_POLICY"]).absolute().parent))
    return out


def make_executor(
    backend: Backend,
    folder: Path,
    spec: JobSpec,
    launcher: LauncherConf,
    array_size: int,
    job_name: str,
    slurm: SlurmCLI | None = None,
    comment: str = "",
    sweep_dir: Path | None = None,
) -> submitit.Executor:
    if backend.queued:
        wrapped = wrap(spec.env, job_binds(sweep_dir or folder, folder, spec), os.getcwd(), spec.resources.gpus)
        # submitit's own default: the launcher's interpreter; in a container, the job's host side (this
        # interpreter: it relays Slurm's commands through a socket in submitit's folder) and the runtime's argv
        words = python_words(wrapped, sys.executable, str(folder.absolute()))
        python = shlex.join(words) if words else None
        slurm_ex = SeamSlurmExecutor(folder, slurm or SlurmCLI(), spec.recovery.max_attempts, python)
        params = slurm_parameters(spec, launcher, array_size, job_name, comment, wrapped.srun_flags)
        slurm_ex.update_parameters(**params)
        return slurm_ex
    local = submitit.LocalExecutor(folder=folder, python=shlex.quote(spec.env.python) if spec.env.python else None)
    local.update_parameters(
        timeout_min=max(1, slurm_time_to_seconds(spec.resources.time) // 60),
        tasks_per_node=spec.resources.tasks_per_node,
        nodes=1,
    )
    return local

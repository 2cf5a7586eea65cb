"""A job's image (`env.container.*`; issue 20): validated before anything is submitted, and
turned by one function (slurm/container.wrap) into the runtime's argv — what the launcher's
jobs, `slurmagent render` and the pre-flight probe run.

Golden argv: apptainer and pyxis are not installable on this machine, so their argv is checked
here and NOT run on a real runtime (docs/containers.md says so). Podman runs for real on the
test cluster: tests/slurm/test_container_slurm.py."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slurmagent.config import ContainerConf, EnvConf, LauncherConf, job_spec
from slurmagent.errors import ConfigError
from slurmagent.launch.backend import make_executor, slurm_parameters
from slurmagent.launch.probe import probe_key, probe_script, wanted
from slurmagent.primitives.backends import SlurmBackend
from slurmagent.slurm.container import step_words, wrap

TASK = {"task": {"target": "slurmagent.examples.synthetic:run"}}
BINDS = ["/scratch/sweep", "/home/u/.local/state/slurmagent"]


def spec_with(container: dict[str, object], **env: object) -> object:
    return job_spec({**TASK, "env": {**env, "container": container}})


@pytest.mark.parametrize(
    ("container", "named"),
    [
        (
            {"image": "x.sif", "runtime": "docker"},
            "env.container.runtime='docker' is not one of apptainer, podman, pyxis",
        ),
        ({"image": "/img/x.sif"}, "env.container.runtime=None is not one of apptainer, podman, pyxis"),
        ({"runtime": "podman"}, "env.container.runtime=podman needs env.container.image"),
        (
            {"image": "/no/such/image.sif", "runtime": "apptainer"},
            "env.container.image='/no/such/image.sif': no such file",
        ),
        ({"image": "/no/such.sqsh", "runtime": "pyxis"}, "env.container.image='/no/such.sqsh': no such file"),
        ({"image": "images/x.sif", "runtime": "apptainer"}, "give the image file's absolute path"),
        ({"image": "/no/such/root", "runtime": "podman"}, "env.container.image='/no/such/root': no such file"),
        ({"image": "img\x00", "runtime": "podman"}, "env.container.image='img\\x00' holds a NUL byte"),
        ({"mounts": ["/data"]}, "env.container.mounts and env.container.args need env.container.image"),
        ({"image": "pytorch", "runtime": "podman", "mounts": ["data"]}, "env.container.mounts[0]='data': both paths"),
        ({"image": "pytorch", "runtime": "podman", "mounts": ["/no/such/data"]}, "/no/such/data does not exist"),
        ({"image": "pytorch", "runtime": "podman", "mounts": ["/tmp:/d:rx"]}, "the third part is ro or rw"),
        ({"image": "pytorch", "runtime": "podman", "mounts": ["/tmp,/usr"]}, "write SRC, SRC:DST or SRC:DST:ro"),
        ({"image": "pytorch", "runtime": "podman", "args": ["--a\nb"]}, "env.container.args[0]="),
        ({"image": "pytorch", "runtime": "podman", "bind": ["/tmp"]}, "unknown key env.container.bind"),
    ],
)
def test_bad_container_input_is_refused_naming_the_key(container: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError) as err:
        spec_with(container)
    assert named in str(err.value)


def test_a_podman_archive_is_refused_with_the_command_that_loads_it(tmp_path: Path) -> None:
    archive = tmp_path / "img.tar"
    archive.write_bytes(b"")
    with pytest.raises(ConfigError, match=rf"podman load -i {archive}"):
        spec_with({"image": str(archive), "runtime": "podman"})


def test_an_interpreter_inside_the_image_need_not_exist_here() -> None:
    spec = spec_with({"image": "docker://pytorch/pytorch", "runtime": "apptainer"}, python="/opt/conda/bin/python")
    assert spec.env.python == "/opt/conda/bin/python"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="no executable file there"):  # without an image it must
        job_spec({**TASK, "env": {"python": "/opt/conda/bin/python"}})


def test_apptainer_argv_binds_the_jobs_directories_and_passes_gpus(tmp_path: Path) -> None:
    sif = tmp_path / "train.sif"
    sif.write_bytes(b"")
    env = EnvConf(container=ContainerConf(image=str(sif), runtime="apptainer", mounts=["/tmp:/data:ro"]))
    w = wrap(env, BINDS, "/home/u/proj", gpus=2)
    assert w.prefix == [
        "apptainer",
        "exec",
        "--nv",
        "--bind",
        "/scratch/sweep:/scratch/sweep,/home/u/.local/state/slurmagent:/home/u/.local/state/slurmagent,"
        "/home/u/proj:/home/u/proj,/tmp:/data:ro",
        "--pwd",
        "/home/u/proj",
        str(sif),
    ]
    assert w.srun_flags == [] and w.python == "python"
    assert "--nv" not in wrap(env, BINDS, "/w", gpus=0).prefix


def test_pyxis_is_srun_flags_and_the_images_python() -> None:
    env = EnvConf(
        python="/usr/bin/python3", container=ContainerConf(image="nvcr.io#nvidia/pytorch:24.05-py3", runtime="pyxis")
    )
    w = wrap(env, BINDS[:1], "/w", gpus=8)
    assert w.prefix == [] and w.python == "/usr/bin/python3"
    assert w.srun_flags == [
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
        "--container-mounts=/scratch/sweep:/scratch/sweep,/w:/w",
        "--container-workdir=/w",
    ]
    assert step_words(w, ["python", "-c", "x"])[:3] == [
        "srun",
        "--ntasks=1",
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
    ]


def test_podman_argv_passes_the_jobs_variables_gpus_and_a_root_directory_as_an_overlay() -> None:
    env = EnvConf(vars={"HF_HOME": "/h"}, container=ContainerConf(image="/", runtime="podman", args=["--ulimit=host"]))
    w = wrap(env, BINDS[:1], "/w", gpus=1)
    assert w.prefix[:4] == ["podman", "run", "--rm", "--init"]
    assert "--volume=/scratch/sweep:/scratch/sweep" in w.prefix and "--workdir=/w" in w.prefix
    for name in ("SLURM_*", "SLURMAGENT_*", "SUBMITIT_*", "CUDA_VISIBLE_DEVICES", "RANK", "HF_HOME"):
        assert f"--env={name}" in w.prefix
    assert "--device=nvidia.com/gpu=all" in w.prefix
    assert w.prefix[-3:] == ["--ulimit=host", "--rootfs", "/:O"]
    named = wrap(EnvConf(container=ContainerConf(image="localhost/train:1", runtime="podman")), [], "/w", gpus=0)
    assert named.prefix[-1] == "localhost/train:1" and "--device=nvidia.com/gpu=all" not in named.prefix


def test_no_image_wraps_nothing() -> None:
    w = wrap(EnvConf(python="/p"), BINDS, "/w", gpus=1)
    assert (w.prefix, w.srun_flags, w.python) == ([], [], "/p")
    assert step_words(w, ["/p", "-c", "x"]) == ["/p", "-c", "x"]


def test_the_launchers_jobs_run_their_boot_in_the_image(tmp_path: Path) -> None:
    spec = spec_with({"image": "localhost/train:1", "runtime": "podman"})
    folder = tmp_path / "sweep" / ".submitit"
    ex = make_executor(SlurmBackend(), folder, spec, LauncherConf(), 1, "job", sweep_dir=tmp_path / "sweep")
    words = shlex.split(ex._boot_command("x"))  # type: ignore[attr-defined]
    # the host side first (it relays Slurm's commands through a socket in submitit's folder), then the runtime
    assert words[:7] == [sys.executable, "-u", "-m", "slurmagent.job.host", "--relay", str(folder), "--"]
    assert words[7:9] == ["podman", "run"] and words[words.index("localhost/train:1") + 1 :][:4] == [
        "python",
        "-u",
        "-m",
        "slurmagent.job.boot",
    ]
    assert f"--volume={tmp_path / 'sweep'}:{tmp_path / 'sweep'}" in words
    assert (tmp_path / "sweep").is_dir()  # bind sources exist before the runtime is asked to bind them
    pyxis = spec_with({"image": "nvcr.io#nvidia/pytorch:24.05-py3", "runtime": "pyxis"})
    params = slurm_parameters(pyxis, LauncherConf(), 1, "job", srun_flags=["--container-image=i"])  # type: ignore[arg-type]
    assert params["srun_args"] == ["--container-image=i"]


def test_render_wraps_the_step_in_the_image(tmp_path: Path) -> None:
    from slurmagent.render import render

    sif = tmp_path / "train.sif"
    sif.write_bytes(b"")
    out = render(
        ["+experiment=synthetic", f"env.container.image={sif}", "env.container.runtime=apptainer"],
        tmp_path / "out",
        check_cluster=False,
    )
    srun = next(line for line in out.script.read_text().splitlines() if line.startswith("srun "))
    words = shlex.split(srun)
    host = [sys.executable, "-u", "-m", "slurmagent.job.host", "--relay", str(out.run_dir), "--"]
    assert words[:9] == ["srun", "--kill-on-bad-exit=1", *host] and words[9:11] == ["apptainer", "exec"]
    assert str(out.run_dir) in words[words.index("--bind") + 1].split(",")[0]  # the relay's folder is bound
    assert words[words.index(str(sif)) + 1 :][:3] == ["python", "-m", "slurmagent"]
    proc = subprocess.run(["bash", "-n", str(out.script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_probe_runs_in_the_image_and_an_image_is_part_of_its_key(tmp_path: Path) -> None:
    spec = spec_with({"image": "localhost/train:1", "runtime": "podman"})
    assert wanted("auto", spec)  # type: ignore[arg-type]
    script = probe_script(spec, "python", tmp_path / "probe.out", "s")  # type: ignore[arg-type]
    last = shlex.split(script[script.index("\nexec ") + 1 :])  # the gatherer's source spans lines
    assert last[:3] == ["exec", "podman", "run"] and last[last.index("localhost/train:1") + 1 :][:2] == ["python", "-c"]
    other = spec_with({"image": "localhost/train:2", "runtime": "podman"})
    assert probe_key(spec, "python") != probe_key(other, "python")  # type: ignore[arg-type]


def test_the_local_backend_refuses_an_image_and_submits_nothing(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmagent",
            "+experiment=synthetic",
            "cluster=local",
            "env.container.image=localhost/train:1",
            "env.container.runtime=podman",
            f"hydra.sweep.dir={sweep}",
            "-m",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 2, out.stderr
    assert "env.container.image='localhost/train:1': containers run on Slurm" in out.stderr
    assert not (sweep / "sweep.json").exists()


def test_the_readmes_apptainer_site_renders_as_written(tmp_path: Path, project_root: Path) -> None:
    from slurmagent.render import render

    readme = (project_root / "README.md").read_text()
    section = readme[readme.index("**In a container image.**") :]
    start = section.index("```yaml\n") + 8
    block = section[start : section.index("```\n", start)]
    sif, data = tmp_path / "pytorch.sif", tmp_path / "imagenet"
    sif.write_bytes(b"")
    data.mkdir()
    # the two paths a reader replaces with their own must exist here
    text = block.replace("/shared/images/pytorch-24.05.sif", str(sif)).replace("/datasets/imagenet", str(data))
    assert text != block and str(sif) in text and str(data) in text
    (tmp_path / "conf" / "env").mkdir(parents=True)
    (tmp_path / "conf" / "env" / "apptainer.yaml").write_text(text)
    out = render(
        ["+experiment=synthetic", "+env=apptainer"], tmp_path / "out", check_cluster=False, config_dir=tmp_path / "conf"
    )
    srun = next(line for line in out.script.read_text().splitlines() if line.startswith("srun "))
    words = shlex.split(srun)
    assert words[9:11] == ["apptainer", "exec"] and f"{data}:/data:ro" in words[words.index("--bind") + 1]
    assert words[words.index(str(sif)) + 1 : words.index(str(sif)) + 4] == ["python", "-m", "slurmagent"]


def test_doctor_takes_one_target_unless_it_probes_an_environment(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "slurmagent", "doctor"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 2 and "doctor takes one sweep directory or job id" in run.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "slurmagent", "doctor", "--env", "env.container.runtime=docker"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "env.container.runtime='docker' is not one of" in bad.stderr, bad.stderr

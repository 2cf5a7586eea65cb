from __future__ import annotations

import pytest

from slurmagent.config import (
    CheckpointConf,
    ResourcesConf,
    job_spec,
    parse_conf,
)
from slurmagent.errors import ConfigError
from slurmagent.slurm.sbatch import sbatch_flags, signal_flag
from slurmagent.slurm.syntax import mem_to_mb, slurm_time_to_seconds, time_to_minutes

BASE = {"task": {"target": "slurmagent.examples.synthetic:run"}}


def test_unknown_resource_key_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as err:
        job_spec({**BASE, "resources": {"gpu": 1}})
    msg = str(err.value)
    assert "resources.gpu" in msg and "gpus" in msg and "gpu_type" in msg and "partition" in msg


def test_wrong_type_names_key_and_expected_type() -> None:
    with pytest.raises(ConfigError, match=r"resources.nodes='two' has the wrong type; expected int"):
        parse_conf(ResourcesConf, {"nodes": "two"}, "resources")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800),
        ("1:30", 90),
        ("02:00:00", 7200),
        ("1-00:00:00", 86400),
        ("2-3", 2 * 86400 + 3 * 3600),
        ("1-02:03", 86400 + 2 * 3600 + 180),
    ],
)
def test_slurm_time_syntax(text: str, seconds: int) -> None:
    assert slurm_time_to_seconds(text) == seconds


def test_bad_time_and_memory_are_explained() -> None:
    with pytest.raises(ConfigError, match="not Slurm syntax"):
        slurm_time_to_seconds("half an hour")
    with pytest.raises(ConfigError, match="500M, 4G"):
        mem_to_mb("lots")
    assert mem_to_mb("4G") == 4096 and mem_to_mb("500M") == 500 and mem_to_mb("2048") == 2048


def test_cluster_choice_and_task_exclusivity() -> None:
    with pytest.raises(ConfigError, match="auto, local, slurm"):
        job_spec({**BASE, "cluster": "kubernetes"})
    with pytest.raises(ConfigError, match=r"exactly one of task\.target"):
        job_spec({"task": {"target": "a:b", "command": ["python", "x.py"]}})
    with pytest.raises(ConfigError, match="gpu_type"):
        job_spec({**BASE, "resources": {"gpu_type": "a100"}})


def test_checkpoint_and_recovery_ranges() -> None:
    with pytest.raises(ConfigError, match="keep_last"):
        job_spec({**BASE, "checkpoint": {"keep_last": 0}})
    with pytest.raises(ConfigError, match="USR1, USR2"):
        job_spec({**BASE, "recovery": {"signal": "KILL"}})
    assert parse_conf(CheckpointConf, {"every_steps": 10.0}, "checkpoint").every_steps == 10


def test_sbatch_flags_single_source_of_truth() -> None:
    res = ResourcesConf(
        partition="gpu",
        nodes=2,
        tasks_per_node=2,
        cpus_per_task=3,
        mem="8G",
        gpus=2,
        gpu_type="a100",
        time="01:00:00",
        qos="high",
        constraint="a100",
        extra={"mail_type": "END", "reservation": "r1"},
    )
    flags = sbatch_flags(res)
    assert flags == {
        "partition": "gpu",
        "nodes": "2",
        "ntasks-per-node": "2",
        "cpus-per-task": "3",
        "mem": "8G",
        "gres": "gpu:a100:2",
        "time": "01:00:00",
        "qos": "high",
        "constraint": "a100",
        "mail-type": "END",
        "reservation": "r1",
    }
    assert time_to_minutes("00:00:30") == 1


def test_extra_flags_refused_when_unknown_or_owned() -> None:
    with pytest.raises(ConfigError, match=r"unknown sbatch option resources\.extra\.frobnicate; valid keys: .*begin"):
        sbatch_flags(ResourcesConf(extra={"frobnicate": "1"}))
    with pytest.raises(ConfigError, match="duplicates a setting slurmagent owns"):
        sbatch_flags(ResourcesConf(extra={"partition": "x"}))


def test_signal_flag_forms() -> None:
    from slurmagent.config import RecoveryConf

    assert signal_flag(RecoveryConf(signal="USR2", signal_delay_s=90), batch_shell=True) == "B:USR2@90"
    assert signal_flag(RecoveryConf(signal="USR2", signal_delay_s=90), batch_shell=False) == "USR2@90"

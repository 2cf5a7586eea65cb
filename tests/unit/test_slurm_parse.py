"""Parsers of the Slurm seam, on output recorded from the test cluster (Slurm 22.05.8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmagent.config import ResourcesConf
from slurmagent.errors import ConfigError, SlurmCommandError
from slurmagent.slurm.cluster import check_fits, parse_cluster
from slurmagent.slurm.seam import PendingJob, SlurmCLI, parse_pending, parse_sacct, parse_scontrol_config
from slurmagent.syntax import expand_array_id, parse_gres
from tests.fake.fake_slurm import FakeSlurm

SINFO_NODES = """a100-1|low|4|4000|gpu:a100:2|a100,gpu|idle
a100-1|high|4|4000|gpu:a100:2|a100,gpu|idle
a100-1|gpu|4|4000|gpu:a100:2|a100,gpu|idle
cpu-1|low|4|3000|(null)|cpu|idle
cpu-1|high|4|3000|(null)|cpu|idle
cpu-2|low|4|3000|(null)|cpu|idle
cpu-2|high|4|3000|(null)|cpu|idle
t4-1|low|4|3000|gpu:t4:2|t4,gpu|idle
t4-1|high|4|3000|gpu:t4:2|t4,gpu|idle
t4-1|gpu|4|3000|gpu:t4:2|t4,gpu|idle
t4-2|low|4|3000|gpu:t4:2|t4,gpu|mixed
t4-2|high|4|3000|gpu:t4:2|t4,gpu|mixed
t4-2|gpu|4|3000|gpu:t4:2|t4,gpu|mixed
"""
SINFO_PARTS = "low|2:00:00|low*\nhigh|1:00:00|high\ngpu|4:00:00|gpu\n"
CONFIG = (
    "Configuration data as of 2026-11-30T08:42:40\nMaxArraySize            = 1001\nMaxJobCount             = 20000\n"
)
SACCT = """7_0|COMPLETED|0:0|None|cpu-1
7_1|PREEMPTED|0:15|None|cpu-2
7_1|RUNNING|0:0|None|cpu-2
7_2|OUT_OF_MEMORY|0:125|None|t4-1
7_3|CANCELLED by 0|0:0|None|t4-2
7_[4-6,9%2]|PENDING|0:0|BeginTime|None assigned
8|FAILED|1:0|None|cpu-1
8.batch|FAILED|1:0||cpu-1
8.0|OUT_OF_MEMORY|0:125||cpu-1
9|PREEMPTED|0:15|None|cpu-2
9.0|OUT_OF_MEMORY|0:125||cpu-2
9|COMPLETED|0:0|None|cpu-2
9.0|COMPLETED|0:0||cpu-2
"""

CLUSTER = parse_cluster(SINFO_NODES, SINFO_PARTS, parse_scontrol_config(CONFIG))


def test_parse_cluster() -> None:
    assert CLUSTER.default_partition == "low"
    assert CLUSTER.max_array_size == 1001
    assert CLUSTER.partitions["gpu"].nodes == ("a100-1", "t4-1", "t4-2")
    assert CLUSTER.partitions["low"].max_time_s == 7200
    assert CLUSTER.nodes["a100-1"].gpus == {"a100": 2}
    assert CLUSTER.nodes["cpu-1"].gpus == {}
    assert parse_gres("gpu:a100:2(S:0-1),gpu:t4:1") == {"a100": 2, "t4": 1}


def test_parse_sacct_keeps_last_row_and_expands_pending_ranges() -> None:
    st = parse_sacct(SACCT)
    assert st["7_0"].state == "COMPLETED"
    assert st["7_1"].state == "RUNNING" and st["7_1"].restarts == 1  # --duplicates: the last row is current
    assert st["7_2"].state == "OUT_OF_MEMORY" and st["7_2"].exit_code == "0:125"
    assert st["7_3"].state == "CANCELLED"
    assert [k for k in st if st[k].state == "PENDING"] == ["7_4", "7_5", "7_6", "7_9"]
    # a pending job has no nodes: sacct's "None assigned" is not a node name
    assert {st[k].nodes for k in ("7_4", "7_9")} == {""}
    assert st["7_1"].nodes == "cpu-2"
    assert expand_array_id("12") == ["12"]
    # a step the cgroup OOM-killed turns a FAILED allocation into OUT_OF_MEMORY…
    assert st["8"].state == "OUT_OF_MEMORY" and st["8"].exit_code == "1:0"
    # …but not when it belongs to an earlier run of a requeued job
    assert st["9"].state == "COMPLETED" and st["9"].restarts == 1


@pytest.mark.parametrize(
    ("res", "match"),
    [
        (
            ResourcesConf(partition="nope"),
            r"resources.partition='nope' does not exist; valid partitions: gpu, high, low",
        ),
        (ResourcesConf(partition="gpu", gpus=1, gpu_type="h100"), r"gpu_type='h100' is on no node .* a100, t4"),
        (ResourcesConf(partition="low", gpus=3, gpu_type="t4"), r"gpus=3 per node"),
        (ResourcesConf(cpus_per_task=8), r"8 CPUs per node, but nodes of partition 'low' have at most 4"),
        (ResourcesConf(mem="64G"), r"exceeds the largest node"),
        (ResourcesConf(time="03:00:00"), r"exceeds the limit of partition 'low' \(02:00:00\)"),
        (ResourcesConf(partition="gpu", nodes=4), r"nodes=4 but partition 'gpu' has only 3"),
    ],
)
def test_check_fits_refuses_with_valid_values(res: ResourcesConf, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_fits(res, CLUSTER)


def test_check_fits_accepts_a_fitting_spec() -> None:
    check_fits(ResourcesConf(partition="gpu", gpus=2, gpu_type="a100", mem="3G", time="01:00:00"), CLUSTER)
    check_fits(ResourcesConf(nodes=2, constraint="cpu"), CLUSTER)


def test_seam_refuses_non_slurm_commands_and_counts_calls(tmp_path: Path) -> None:
    fake = FakeSlurm(tmp_path / "fake")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --array=0-2\n#SBATCH --begin=now+3600\nsrun true\n")
    cli = SlurmCLI(runner=fake)
    with pytest.raises(SlurmCommandError, match="not a Slurm command"):
        cli.run(["rm", "-rf", "/"])
    assert fake.calls == []  # refused before any runner saw it
    array = cli.submit(script)
    statuses = cli.statuses([array, array])
    assert cli.calls == {"sbatch": 1, "sacct": 1} and sorted(statuses) == [f"{array}_{i}" for i in range(3)]
    assert fake.calls[-1][0] == "sacct" and fake.calls[-1][fake.calls[-1].index("-j") + 1] == array


def test_the_queues_waiting_gpu_jobs_are_read_with_their_gpus_and_limits() -> None:
    """`squeue -h -r -t PD -o PENDING_FORMAT` of the test cluster (22.05 writes `gres:`, later
    versions `gres/`): held, dependent, CPU and unlimited jobs do not wait for GPUs now; one
    the scheduler has not looked at yet (reason None) does."""
    out = """gpu|PENDING|Resources|gres:gpu:a100:2|1|4:00
gpu,low|PENDING|Priority|gres/gpu:2|2|1:00:00
gpu|PENDING|None|gres:tmpfs:10,gres:gpu:t4:1(S:0)|1|1-00:00:00
gpu|PENDING|Dependency|gres:gpu:2|1|1:00:00
gpu|PENDING|JobHeldUser|gres:gpu:t4:1|1|5:00
low|PENDING|Resources|N/A|1|1:00:00
gpu|PENDING|Resources|gres:gpu:t4:1|1|UNLIMITED
gpu|RUNNING|None|gres:gpu:t4:1|1|5:00
"""
    assert parse_pending(out) == [
        PendingJob(("gpu",), "a100", 2, 240),
        PendingJob(("gpu", "low"), None, 4, 3600),
        PendingJob(("gpu",), "t4", 1, 86400),  # just submitted: the scheduler has not given it a reason yet
    ]

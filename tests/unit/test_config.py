from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slurmagent.config as config_module
from slurmagent.config import (
    CheckpointConf,
    ResourcesConf,
    job_spec,
    notify_conf,
    parse_conf,
    track_conf,
)
from slurmagent.errors import ConfigError
from slurmagent.slurm.sbatch import sbatch_flags, signal_flag
from slurmagent.syntax import mem_to_mb, slurm_time_to_seconds, time_to_minutes

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

    assert signal_flag(RecoveryConf(signal="USR2", signal_delay_s=90), to_batch_script=True) == "B:USR2@90"
    assert signal_flag(RecoveryConf(signal="USR2", signal_delay_s=90), to_batch_script=False) == "USR2@90"


# -- every numeric key of the typed groups: nan, inf, -inf, negative, huge --------------------------
# The keys are found, not listed: every int or float field of a slurmagent *Conf dataclass that
# the packaged config composes (the job-spec groups, site and its catalogue entries, budget, hpo,
# adapt, hydra.launcher, hydra.sweeper). A value is either accepted because it is valid (finite,
# in range) or refused in one line naming the key — at composition or by the check the launch
# path runs on its group — and a refused sweep leaves nothing behind.


HUGE_INT = str(10**30)
HOSTILE_NUMBERS = ("nan", "inf", "-inf", "-1", "HUGE")
# negative values a key means something by
NEGATIVE_OK = {"hpo.trial": "-1 is 'not a trial', the default"}
HPO_BASE = ["hpo.budget.wall_time=1:00:00"]  # a search needs some budget; the other hpo keys are tested on top


def _compose(overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="slurmagent.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


def _numeric(annotation: Any) -> type | None:
    """int or float for a field of that type (or that type or None); None otherwise."""
    import types

    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    kinds = [a for a in (typing.get_args(annotation) if union else (annotation,)) if a in (int, float)]
    return kinds[0] if kinds else None


def numeric_keys() -> tuple[dict[str, type], set[type]]:
    """{override key: int or float} of every numeric field of the typed nodes of the packaged
    config, and the dataclasses reached. A mapping of dataclasses (site.gpus) is entered once
    (its first entry); a mapping of numbers gets a new entry (`+…max_jobs_per_partition.p`)."""
    from omegaconf import DictConfig, OmegaConf

    found: dict[str, type] = {}
    reached: set[type] = set()

    def walk(node: Any, path: str, first_only: bool = False) -> None:
        cls = OmegaConf.get_type(node)
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        if hints and cls.__module__.startswith(f"{config_module.__name__}."):  # a module of slurmagent.config
            reached.add(cls)
            for f in dataclasses.fields(cls):
                hint = hints[f.name]
                if kind := _numeric(hint):
                    found[f"{path}{f.name}"] = kind
                elif typing.get_origin(hint) is dict and (kind := _numeric(typing.get_args(hint)[1])):
                    found[f"+{path}{f.name}.p"] = kind
        children = [k for k in node if isinstance(node._get_node(k), DictConfig)]
        for key in children[:1] if first_only else children:
            hint = hints.get(str(key))
            of_dataclasses = typing.get_origin(hint) is dict and dataclasses.is_dataclass(typing.get_args(hint)[1])
            walk(node._get_node(key), f"{path}{key}.", first_only=of_dataclasses)

    walk(_compose([]), "")
    return found, reached


NUMERIC_KEYS, REACHED = numeric_keys()


def test_the_numeric_keys_are_every_typed_groups() -> None:
    """Every dataclass of slurmagent.config with a numeric field is reached from the composed config
    (a *Conf not registered with Hydra would not be: register it, or say here why not)."""
    with_numbers = {
        c
        for c in vars(config_module).values()
        if isinstance(c, type)
        and dataclasses.is_dataclass(c)
        and any(_numeric(h) for h in typing.get_type_hints(c).values())
    }
    assert with_numbers <= REACHED, with_numbers - REACHED
    assert len(NUMERIC_KEYS) >= 40
    expected = {"budget.gpu_hours", "hydra.launcher.poll_interval_s", "+site.scheduling.max_jobs_per_partition.p"}
    assert expected <= set(NUMERIC_KEYS)


def check_group(cfg: Any, key: str) -> None:
    """The checks the launch path runs on `key`'s group before it submits anything."""
    from omegaconf import OmegaConf

    from slurmagent.config import (
        SPEC_GROUPS,
        LauncherConf,
        adapt_conf,
        budget_conf,
        code_conf,
        site_conf,
        spec_dict,
        validate_launcher,
    )

    def plain(where: str) -> dict[str, Any]:
        data = OmegaConf.to_container(OmegaConf.select(cfg, where), resolve=True)
        assert isinstance(data, dict)
        return {str(k): v for k, v in data.items() if k != "_target_"}

    root = key.lstrip("+").split(".")[0]
    if root in SPEC_GROUPS:
        job_spec(spec_dict(cfg))
    elif root == "site":
        site_conf(plain("site"))
    elif root == "budget":
        budget_conf(plain("budget"))
    elif root == "adapt":
        adapt_conf(plain("adapt"))
    elif root == "code":
        code_conf(plain("code"))
    elif root == "track":
        track_conf(plain("track"))
    elif root == "notify":
        notify_conf(plain("notify"))
    elif root == "hpo":  # the search sweeper's own check of its group
        from slurmagent.launch.hpo_sweeper import HpoSweeper

        sweeper = HpoSweeper()
        sweeper.config = cfg
        sweeper._conf()
    elif key.startswith("hydra.launcher."):
        validate_launcher(parse_conf(LauncherConf, plain("hydra.launcher"), "hydra.launcher"))
    elif key.startswith("hydra.sweeper."):
        from slurmagent.launch.sweeper import RepresentativeSweeper

        RepresentativeSweeper(**plain("hydra.sweeper"))
    else:
        raise AssertionError(f"{key}: which check does its group go through before a launch? add it here")


def outcome(key: str, value: str) -> tuple[str, Any]:
    """("refused", the one-line message) or ("accepted", the value the group holds)."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from slurmagent.config import config_error

    base = HPO_BASE if key.startswith("hpo.") else []
    try:
        cfg = _compose([*base, f"{key}={value}"])
        check_group(cfg, key)
    except ConfigError as exc:
        return "refused", str(exc)
    except (HydraException, OmegaConfBaseException) as exc:
        error = config_error(exc)
        assert error is not None, f"{key}={value}: not explained: {exc}"
        return "refused", str(error)
    return "accepted", OmegaConf.select(cfg, key.lstrip("+"))


def names_the_key(message: str, key: str) -> bool:
    key = key.lstrip("+")
    group, _, leaf = key.rpartition(".")
    return key in message or (group in message and leaf in message)


def hostile(kind: type, word: str) -> str:
    return (HUGE_INT if kind is int else "1e300") if word == "HUGE" else word


@pytest.mark.parametrize("key", sorted(NUMERIC_KEYS))
def test_every_numeric_key_refuses_nan_inf_and_negatives_in_one_line(key: str) -> None:
    for word in HOSTILE_NUMBERS:
        value = hostile(NUMERIC_KEYS[key], word)
        verdict, held = outcome(key, value)
        if verdict == "refused":
            assert "\n" not in held and names_the_key(held, key), f"{key}={value}: {held}"
            continue
        assert isinstance(held, (int, float)) and math.isfinite(held), f"{key}={value} accepted as {held!r}"
        assert held >= 0 or key in NEGATIVE_OK, f"{key}={value} accepted: negative"


NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(sorted(NUMERIC_KEYS)), value=NUMBERS)
def test_any_number_for_any_numeric_key_is_accepted_finite_or_refused_naming_it(key: str, value: str) -> None:
    verdict, held = outcome(key, value)
    if verdict == "refused":
        assert "\n" not in held and names_the_key(held, key), f"{key}={value}: {held}"
    else:
        assert math.isfinite(held) and (held >= 0 or key in NEGATIVE_OK), f"{key}={value} accepted as {held!r}"


# end to end: the launch (cluster=local, one task) refuses in one line, exit 2, and writes nothing
SEARCH = ["hydra/sweeper=slurmagent_hpo", "synthetic.x=interval(0,1)", "hpo.fidelity.key=synthetic.epochs"]


@pytest.fixture()
def launch_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    import sys

    box = tmp_path / "box"
    box.mkdir()
    monkeypatch.chdir(box)
    monkeypatch.setenv("SLURMAGENT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(sys, "argv", ["slurmagent"])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    yield box


@pytest.mark.parametrize("key", sorted(NUMERIC_KEYS))
def test_a_launch_with_a_refused_number_writes_nothing(
    launch_box: Path, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from slurmagent.cli import main

    kind = NUMERIC_KEYS[key]
    value = next((v for v in ("-1", "nan") if kind is int and outcome(key, v)[0] == "refused"), "nan")
    sweep = launch_box / "sweep"
    base = [*SEARCH, *HPO_BASE] if key.startswith("hpo.") else []
    before = sorted(launch_box.parent.rglob("*"))
    code = main(["cluster=local", *base, "-m", f"{key}={value}", f"hydra.sweep.dir={sweep}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("slurmagent: error:"), err
    assert names_the_key(err, key), err
    assert sorted(launch_box.parent.rglob("*")) == before and not sweep.exists()

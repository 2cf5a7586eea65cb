"""config_validator: keys/types/ranges, experience rules as data, the meta-device memory
estimate against a GPU type, and the launcher refusing a broken sweep with nothing submitted."""

from __future__ import annotations

import copy
import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from slurmagent.errors import ConfigError
from slurmagent.examples.digits import build_model
from slurmagent.skills import Status
from slurmagent.skills.config_validator import (
    MAX_COMPOSED,
    ConfigValidator,
    check_override_values,
    check_rules,
    compose_packaged,
    config_dict,
    covering_tasks,
    estimate_memory,
    memory_issues,
    validate,
    validate_sweep,
    validator_data,
)


@functools.cache
def _base() -> dict[str, Any]:
    return config_dict(compose_packaged(["+experiment=digits_mlp"]))


def cfg_of(*overrides: str) -> dict[str, Any]:
    """The composed digits_mlp config with `key=value` set (`~key` removed): one Hydra
    composition for the whole module, the rest on plain copies."""
    cfg = copy.deepcopy(_base())
    for o in overrides:
        key, _, raw = o.lstrip("+").partition("=")
        *parents, last = key.lstrip("~").split(".")
        node = cfg
        for p in parents:
            node = node.setdefault(p, {})
        if key.startswith("~"):
            node.pop(last)
        else:
            node[last] = yaml_value(raw)
    return cfg


def yaml_value(raw: str) -> Any:
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def test_digits_config_is_valid_and_its_parameter_count_is_the_real_models() -> None:
    issues, est = validate(cfg_of("model.width=96", "model.depth=3"))
    assert issues == [] and est is not None
    real = sum(p.numel() for p in build_model(96, 3).parameters())
    assert est.params == real == 64 * 96 + 96 + 2 * (96 * 96 + 96) + 96 * 10 + 10
    assert est.weights_bytes == est.grads_bytes == 4 * real and est.optimiser_bytes == 8 * real  # fp32 Adam
    # activations from the meta forward pass: input + each Linear/ReLU output, batch 64, fp32
    assert est.activation_bytes == 4 * 64 * (64 + 6 * 96 + 10)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("optim.lr=20", "optim.lr=20 is out of range; valid: > 0.0 and <= 10.0"),
        ("optim.lr=0", "optim.lr=0 is out of range; valid: > 0.0 and <= 10.0"),
        ("train.batch_size=0", "train.batch_size=0 is out of range; valid: >= 1 and <= 1048576"),
        ("optim.lr=fast", "optim.lr='fast' has the wrong type; expected float"),
        ("~model.width", "model.width is required by task.target='slurmagent.examples.digits:train' but missing"),
        ("+train.precision=fp8", "train.precision='fp8' is not one of bf16, bf16-mixed, fp16, fp16-mixed, fp32, tf32"),
        ("resources.cpus_per_task=0", "resources.cpus_per_task=0 must be at least 1"),
    ],
)
def test_errors_name_the_key_and_valid_range(override: str, expected: str) -> None:
    issues, _ = validate(cfg_of(override), memory=False)
    assert expected in [i.message for i in issues if i.status == Status.CRITICAL], issues


def test_experience_rules_warn_with_suggestions() -> None:
    # through the skill: composed by Hydra from the packaged config and these overrides
    res = ConfigValidator().run(
        overrides=["+experiment=digits_mlp", "optim.lr=0.5", "checkpoint.every_steps=300"], memory=False
    )
    assert res.status == Status.WARNING
    rules = {i["rule"]: i for i in res.findings["issues"]}
    assert set(rules) == {"adam_high_lr", "no_checkpoint_before_end"}
    assert "high for Adam-family" in rules["adam_high_lr"]["message"] and "1e-4" in rules["adam_high_lr"]["suggestion"]
    assert "train.steps=300" in rules["no_checkpoint_before_end"]["message"]


def test_rules_are_data() -> None:
    rule = {
        "id": "wide",
        "all": [{"key": "model.width", "op": ">=", "value_key": "model.depth"}],
        "message": "width {model.width}",
        "suggestion": "fine",
    }
    (issue,) = check_rules({"model": {"width": 8, "depth": 2}}, [rule])
    assert issue.message == "width 8" and issue.status == Status.WARNING and issue.key == "model.width"
    assert check_rules({"model": {"width": 1, "depth": 2}}, [rule]) == []
    assert check_rules({"model": {"depth": 2}}, [rule]) == []  # absent key: the rule does not apply


def test_activation_bound_config_gets_a_micro_batch_suggestion() -> None:
    res = ConfigValidator().run(
        overrides=["+experiment=digits_mlp", "model.width=8192", "train.batch_size=400000"], gpu_type="t4"
    )
    assert res.status == Status.WARNING
    (reason,) = res.reasons
    assert (
        "exceeds a t4's 15.00 GiB" in reason and "train.micro_batch_size=" in reason and "grad_accum_steps=" in reason
    )
    mem = res.findings["memory"]
    micro = int(reason.split("train.micro_batch_size=")[1].split()[0])
    per_sample = mem["activation_bytes"] / mem["batch_size"]
    states = mem["weights_bytes"] + mem["grads_bytes"] + mem["optimiser_bytes"]
    assert states + micro * per_sample <= mem["gpu_bytes"] < states + (micro + 1) * per_sample


def test_model_too_big_for_any_micro_batch_suggests_a_gpu_type() -> None:
    est = estimate_memory(cfg_of("model.width=32768", "model.depth=8", "resources.gpus=1", "resources.gpu_type=t4"))
    assert est is not None and est.params == 64 * 32768 + 32768 + 7 * (32768**2 + 32768) + 32768 * 10 + 10
    (issue,) = memory_issues(est)
    assert issue.status == Status.WARNING and "model states alone need" in issue.suggestion
    assert "(h200)" in issue.suggestion
    # mixed precision halves the activations only; bf16 halves weights and gradients
    bf16 = estimate_memory(cfg_of("model.width=32768", "model.depth=8", "+train.precision=bf16"))
    assert bf16 is not None and bf16.weights_bytes * 2 == est.weights_bytes


def test_meta_device_allocates_nothing() -> None:
    before = torch.zeros(1).untyped_storage().nbytes()
    est = estimate_memory(cfg_of("model.width=65536", "model.depth=16"))  # ~64 G parameters: would not fit here
    assert est is not None and est.params > 6.4e10 and before == 4


def test_covering_tasks_validate_each_override_once() -> None:
    grid = [[f"optim.lr={lr}", f"model.width={w}"] for lr in (1, 2, 3) for w in (8, 16)]
    picked = covering_tasks(grid)
    assert len(picked) == 4 < len(grid) and {o for t in picked for o in t} == {o for t in grid for o in t}


def test_launcher_refuses_a_broken_sweep_and_submits_nothing(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurmagent",
            "+experiment=digits_mlp",
            "-m",
            "optim.lr=1e-3,20",
            "cluster=local",
            f"hydra.sweep.dir={sweep}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        "optim.lr=20 is out of range; valid: > 0.0 and <= 10.0" in proc.stderr
        and "nothing was submitted" in proc.stderr
    )
    # Hydra's sweeper writes multirun.yaml first; no sweep state, no submitit folder, no job
    assert not (sweep / "sweep.json").exists() and not (sweep / ".submitit").exists()


def test_every_override_value_is_checked_even_beyond_the_composed_tasks() -> None:
    sweep = [[f"train.seed={i}", "optim.lr=1e-3"] for i in range(500)] + [["train.seed=1", "optim.lr=20"]]
    composed: list[list[str]] = []
    base = OmegaConf.create(_base())

    def compose(overrides: list[str]) -> Any:
        composed.append(overrides)
        return base  # one composition stands for all: only the override values differ here

    with pytest.raises(
        ConfigError, match=r"optim.lr=20 is out of range; valid: > 0.0 and <= 10.0 \(override optim.lr\)"
    ):
        validate_sweep(compose, sweep, memory=False)
    assert len(composed) == MAX_COMPOSED  # not 501
    assert check_override_values(
        [["optim.lr='fast'", "+train.precision=fp8", "train.steps=[1,2]"]], validator_data()["keys"]
    )

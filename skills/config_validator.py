"""config_validator: a composed experiment config checked before anything is submitted.

Three layers, all driven by data in conf/skills/config_validator.yaml:
1. keys, types and ranges (errors, naming the key and the valid range or choices), plus
   slurmagent's own job spec (resources, checkpoint, recovery, task);
2. rules that encode experience (warnings, each with a suggestion);
3. a memory estimate from the real model: instantiated on torch's meta device (no memory,
   no compute), parameters × bytes for weights, gradients and optimiser states by
   optimiser and precision, plus activations from one forward pass on the meta device —
   compared with the target GPU type's memory; over it → a warning with a micro-batch and
   gradient-accumulation suggestion, or a GPU type that fits.

The launcher calls `validate_sweep` before submitting (errors: nothing is submitted); the
skill runs it on a YAML file or on Hydra overrides of the packaged config.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from slurmagent.config import site_conf
from slurmagent.errors import ConfigError, choices
from slurmagent.skills._base import SkillResult, Status, TypedSkill, worst

GIB = 1024**3
_MISSING = object()


@dataclass(frozen=True)
class Issue:
    status: Status  # CRITICAL = an error (refused), WARNING = advice
    key: str  # the config key it is about ("" for the whole config)
    message: str
    suggestion: str = ""
    rule: str = ""  # rule id for experience rules


@dataclass(frozen=True)
class MemoryEstimate:
    params: int
    batch_size: int
    precision: str
    optimiser: str
    weights_bytes: int
    grads_bytes: int
    optimiser_bytes: int
    activation_bytes: int  # saved activations for backward, from a meta-device forward pass
    total_bytes: int
    gpu_type: str | None
    gpu_bytes: int | None  # usable memory of the target GPU type (minus headroom)
    catalogue: dict[str, float] = field(default_factory=dict)  # GPU type → GiB (site.gpus), for suggestions

    def gib(self, n: int) -> str:
        return f"{n / GIB:.2f} GiB"


@cache
def validator_data() -> dict[str, Any]:
    from omegaconf import OmegaConf

    text = resources.files("slurmagent.conf").joinpath("skills/config_validator.yaml").read_text()
    data = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    assert isinstance(data, dict)
    return data  # type: ignore[return-value]


def lookup(cfg: Mapping[str, Any], dotted: str, default: Any = _MISSING) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


# -- 1: keys, types, ranges ---------------------------------------------------------------------
_TYPES: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
}


def check_keys(cfg: Mapping[str, Any], schema: Mapping[str, Mapping[str, Any]]) -> list[Issue]:
    target = str(lookup(cfg, "task.target", "") or "")
    out: list[Issue] = []
    for key, rule in schema.items():
        value = lookup(cfg, key)
        if value is _MISSING or value is None:
            if target and target in rule.get("required_by", []):
                out.append(Issue(Status.CRITICAL, key, f"{key} is required by task.target={target!r} but missing"))
            continue
        kind = rule.get("type", "str")
        if not _TYPES[kind](value):
            out.append(Issue(Status.CRITICAL, key, f"{key}={value!r} has the wrong type; expected {kind}"))
            continue
        if "choices" in rule and value not in rule["choices"]:
            out.append(Issue(Status.CRITICAL, key, f"{key}={value!r} is not one of {choices(rule['choices'])}"))
            continue
        lo, hi = rule.get("min"), rule.get("max")
        if ("exclusive_min" in rule and value <= rule["exclusive_min"]) or (
            (lo is not None and value < lo) or (hi is not None and value > hi)
        ):
            out.append(Issue(Status.CRITICAL, key, f"{key}={value!r} is out of range; valid: {_range_text(rule)}"))
    return out


def _range_text(rule: Mapping[str, Any]) -> str:
    lo = f"> {rule['exclusive_min']}" if "exclusive_min" in rule else f">= {rule.get('min')}"
    return f"{lo} and <= {rule.get('max')}" if rule.get("max") is not None else lo


def check_spec(cfg: Mapping[str, Any]) -> list[Issue]:
    """slurmagent's own groups, through the same strict parser the launcher uses."""
    from slurmagent.config import job_spec

    try:
        job_spec(cfg, require_task="task" in cfg)
    except ConfigError as exc:
        key = re.match(r"[^\w]*(?:unknown key )?([\w.]+)", str(exc))
        return [Issue(Status.CRITICAL, key.group(1) if key else "", str(exc))]
    return []


# -- 2: experience rules --------------------------------------------------------------------------
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    "in": lambda a, b: a in b,
    "not_in": lambda a, b: a not in b,
}


def _condition(cfg: Mapping[str, Any], cond: Mapping[str, Any]) -> bool:
    value = lookup(cfg, cond["key"], cond.get("default", _MISSING))
    other = lookup(cfg, cond["value_key"]) if "value_key" in cond else cond.get("value")
    if value is _MISSING or value is None or other is _MISSING:
        return False
    if isinstance(value, str) and cond["op"] in ("in", "not_in", "==", "!="):
        value = value.lower()
    try:
        return bool(_OPS[cond["op"]](value, other))
    except TypeError:
        return False  # wrong types are reported by check_keys


def _fill(text: str, cfg: Mapping[str, Any]) -> str:
    return re.sub(r"\{([\w.]+)\}", lambda m: str(lookup(cfg, m.group(1), m.group(0))), text)


def check_rules(cfg: Mapping[str, Any], rules: Iterable[Mapping[str, Any]]) -> list[Issue]:
    out: list[Issue] = []
    for rule in rules:
        if all(_condition(cfg, c) for c in rule["all"]):
            sev = Status.CRITICAL if rule.get("severity") == "error" else Status.WARNING
            key = rule["all"][-1]["key"]
            out.append(Issue(sev, key, _fill(rule["message"], cfg), _fill(rule.get("suggestion", ""), cfg), rule["id"]))
    return out


# -- 3: memory -------------------------------------------------------------------------------------
def _resolve(ref: str) -> Callable[..., Any]:
    from slurmagent.config import resolve_target

    return resolve_target(ref)


def _precision_bytes(precision: str) -> tuple[int, int, int]:
    """(weight, gradient, activation) bytes per element."""
    if precision in ("bf16", "fp16"):
        return 2, 2, 2
    if precision.endswith("-mixed"):
        return 4, 4, 2  # autocast: fp32 parameters and gradients, half-precision activations
    return 4, 4, 4


def estimate_memory(cfg: Mapping[str, Any], gpu_type: str | None = None) -> MemoryEstimate | None:
    """None when no model recipe is known for the task (nothing to estimate from)."""
    data = validator_data()
    target = str(lookup(cfg, "task.target", "") or "")
    recipe = data["models"].get(target)
    if recipe is None:
        return None
    import torch

    args = {k: lookup(cfg, v, v) if isinstance(v, str) else v for k, v in recipe["args"].items()}
    with torch.device("meta"):
        model = _resolve(recipe["builder"])(**args)
    params = sum(p.numel() for p in model.parameters())
    precision = str(lookup(cfg, "train.precision", "fp32"))
    optimiser = str(lookup(cfg, "optim.name", recipe.get("optimiser", "adam"))).lower()
    if optimiser == "sgd" and float(lookup(cfg, "optim.momentum", 0.0) or 0.0) > 0:
        optimiser = "sgd_momentum"
    w, g, a = _precision_bytes(precision)
    batch = int(lookup(cfg, "train.micro_batch_size", None) or lookup(cfg, "train.batch_size", 1))
    activation = 0

    def hook(_m: Any, _i: Any, out: Any) -> None:
        nonlocal activation
        if isinstance(out, torch.Tensor):
            activation += out.numel() * a

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        model(torch.empty(batch, *recipe["input_shape"], device="meta"))
    finally:
        for h in handles:
            h.remove()
    activation += batch * math.prod(recipe["input_shape"]) * a
    opt_bytes = int(data["optimiser_state_bytes"].get(optimiser, 8)) * params
    total = params * (w + g) + opt_bytes + activation
    gpu_type = gpu_type or lookup(cfg, "resources.gpu_type", None)
    site = site_conf(lookup(cfg, "site", None))
    mem = site.memory_gib(gpu_type)
    gpu_bytes = int((mem - data["headroom_gib"]) * GIB) if mem else None
    return MemoryEstimate(
        params,
        batch,
        precision,
        optimiser,
        params * w,
        params * g,
        opt_bytes,
        activation,
        total,
        gpu_type,
        gpu_bytes,
        {name: gpu.memory_gib for name, gpu in site.gpus.items()},
    )


def memory_need_gib(cfg: Any) -> float | None:
    """The GPU memory a composed job config needs, GiB (what placement fits GPU types to);
    None when no model recipe is known for its task. The `hydra` node is left out."""
    from slurmagent.config import spec_dict

    est = estimate_memory(spec_dict(cfg, tuple(str(k) for k in cfg if k != "hydra")))
    return est.total_bytes / GIB if est is not None else None


def memory_issues(est: MemoryEstimate) -> list[Issue]:
    if est.gpu_bytes is None or est.total_bytes <= est.gpu_bytes:
        return []
    states = est.weights_bytes + est.grads_bytes + est.optimiser_bytes
    need = est.gib(est.total_bytes)
    fits = sorted(
        (gib, name)
        for name, gib in est.catalogue.items()
        if (gib - validator_data()["headroom_gib"]) * GIB >= est.total_bytes
    )
    other = f"a GPU type with at least {need} ({fits[0][1]})" if fits else "sharding the model (FSDP/ZeRO) over GPUs"
    key = "resources.gpu_type"
    head = (
        f"estimated {need} per GPU (weights {est.gib(est.weights_bytes)}, gradients {est.gib(est.grads_bytes)}, "
        f"{est.optimiser} states {est.gib(est.optimiser_bytes)}, activations {est.gib(est.activation_bytes)} at "
        f"batch {est.batch_size}, {est.precision}) exceeds a {est.gpu_type}'s {est.gib(est.gpu_bytes)}"
    )
    if states < est.gpu_bytes and est.activation_bytes > 0:
        per_sample = est.activation_bytes / est.batch_size
        micro = max(1, int((est.gpu_bytes - states) // per_sample))
        if micro < est.batch_size:
            accum = math.ceil(est.batch_size / micro)
            return [
                Issue(
                    Status.WARNING,
                    key,
                    head,
                    f"train.micro_batch_size={micro} with train.grad_accum_steps={accum} keeps the effective batch; "
                    f"or use {other}",
                )
            ]
    return [Issue(Status.WARNING, key, head, f"model states alone need {est.gib(states)}: use {other}")]


# -- 4: keys added with + that look like typos --------------------------------------------------------
def _one_edit(a: str, b: str) -> bool:
    """Whether `a` becomes `b` by one insertion, deletion, substitution or swap of neighbours."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        swapped = len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]
        return len(diff) == 1 or swapped
    short, long_ = sorted((a, b), key=len)
    return any(long_[:i] + long_[i + 1 :] == short for i in range(len(long_)))


def check_appended(cfg: Mapping[str, Any], overrides: Sequence[str]) -> list[Issue]:
    """`+optim.lrr=0.1` adds a key the config does not have; one edit from an existing key
    (optim.lr), it is almost surely a typo that would run silently with the default value.
    `++optim.lrr=0.1` (Hydra's add-or-override) says it is meant."""
    out: list[Issue] = []
    for override in overrides:
        if not override.startswith("+") or override.startswith("++") or "=" not in override:
            continue
        key, _, value = override[1:].partition("=")
        parent, _, leaf = key.rpartition(".")
        node = lookup(cfg, parent) if parent else cfg
        if not isinstance(node, Mapping) or len(leaf) < 2:
            continue
        close = sorted(str(k) for k in node if str(k) != leaf and _one_edit(leaf, str(k)))
        if close:
            known = f"{parent}.{close[0]}" if parent else close[0]
            out.append(
                Issue(
                    Status.CRITICAL,
                    key,
                    f"{override} adds {key}, which the config does not have; did you mean {known}?",
                    f"{known}={value}; to add {key} anyway: ++{key}={value}",
                    "appended_typo",
                )
            )
    return out


# -- together ----------------------------------------------------------------------------------------
def validate(
    cfg: Mapping[str, Any], memory: bool = True, gpu_type: str | None = None
) -> tuple[list[Issue], MemoryEstimate | None]:
    data = validator_data()
    issues = check_spec(cfg) + check_keys(cfg, data["keys"])
    issues += check_rules(cfg, data["rules"])
    est = None
    errors = [i for i in issues if i.status == Status.CRITICAL]
    if memory and not errors:
        est = estimate_memory(cfg, gpu_type)
        if est is not None:
            issues += memory_issues(est)
    return issues, est


def config_dict(cfg: Any) -> dict[str, Any]:
    """A composed DictConfig as plain data, without Hydra's own node; interpolations that
    cannot resolve outside a job (e.g. ${hydra:…}) are kept as text."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    out: dict[str, Any] = {}
    for key in cfg:
        if key == "hydra":
            continue
        node = cfg._get_node(key)
        try:
            out[str(key)] = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else cfg[key]
        except OmegaConfBaseException:
            out[str(key)] = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else str(node)
    return out


MAX_COMPOSED = 32  # full compositions per sweep; beyond, each override value is checked alone


def covering_tasks(job_overrides: Sequence[Sequence[str]]) -> list[Sequence[str]]:
    """The fewest tasks (greedy) in which every override of the sweep appears once: each
    value is validated without composing every task of a large sweep."""
    seen: set[str] = set()
    picked: list[Sequence[str]] = []
    for overrides in job_overrides:
        if not set(overrides) <= seen or not picked:
            picked.append(overrides)
            seen.update(overrides)
    return picked


_SIMPLE = re.compile(r"[A-Za-z_][\w\-./]*")


def _plain_value(raw: str) -> Any:
    """The value of a plain override the way Hydra reads it (int, float, bool, null, bare
    word), without its grammar; _MISSING for anything richer (lists, quotes, functions)."""
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "null":
        return None
    return raw if _SIMPLE.fullmatch(raw) else _MISSING


def check_override_values(job_overrides: Sequence[Sequence[str]], schema: Mapping[str, Any]) -> list[Issue]:
    """Every distinct `key=value` override of a schema key, checked on its own (cheap: no
    composition), so a sweep too large to compose task by task still has every value checked."""
    out: list[Issue] = []
    for text in dict.fromkeys(o for ov in job_overrides for o in ov):
        key = text.split("=", 1)[0].lstrip("+")
        if key not in schema or text.startswith("~") or "=" not in text:
            continue
        value = _plain_value(text.split("=", 1)[1])
        if value is _MISSING:
            from hydra.core.override_parser.overrides_parser import OverridesParser

            value = OverridesParser.create().parse_override(text).value()
        nested: dict[str, Any] = {}
        node = nested
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
        rule = {k: v for k, v in schema[key].items() if k != "required_by"}
        out += check_keys(nested, {key: rule})
    return out


def validate_sweep(
    compose: Callable[[list[str]], Any], job_overrides: Sequence[Sequence[str]], memory: bool = True
) -> list[str]:
    """Validate a sweep before submission: raise ConfigError listing every error (nothing
    may be submitted), return the warnings as printable lines. The tasks that cover every
    override are composed (at most MAX_COMPOSED); every override value is range-checked."""
    warnings: list[str] = []
    errors = [f"{i.message} (override {i.key})" for i in check_override_values(job_overrides, validator_data()["keys"])]
    estimated: set[str] = set()
    for overrides in covering_tasks(job_overrides)[:MAX_COMPOSED]:
        cfg = config_dict(compose(list(overrides)))
        model_key = repr([lookup(cfg, k, None) for k in ("model", "train", "optim", "resources", "task")])
        issues, _ = validate(cfg, memory=memory and model_key not in estimated)
        issues += check_appended(cfg, overrides)
        estimated.add(model_key)
        where = f" (task overrides: {' '.join(overrides) or 'none'})"
        for i in issues:
            line = i.message + (f"; suggestion: {i.suggestion}" if i.suggestion else "") + where
            (errors if i.status == Status.CRITICAL else warnings).append(line)
    if errors:
        raise ConfigError("config_validator: " + "; ".join(dict.fromkeys(errors)) + "; nothing was submitted")
    return list(dict.fromkeys(warnings))


def validate_run(cfg: Any, overrides: Sequence[str]) -> list[str]:
    """A single run (no -m) is checked like each task of a sweep before anything runs:
    ConfigError for an error, the warnings returned."""
    plain = config_dict(cfg)
    memory = bool(lookup(plain, "resources.gpus", 0))
    issues, _ = validate(plain, memory=memory)
    issues += check_appended(plain, overrides)
    lines = [i.message + (f"; suggestion: {i.suggestion}" if i.suggestion else "") for i in issues]
    errors = [line for line, i in zip(lines, issues, strict=True) if i.status == Status.CRITICAL]
    if errors:
        raise ConfigError("config_validator: " + "; ".join(dict.fromkeys(errors)) + "; nothing was run")
    return lines


# -- the skill -----------------------------------------------------------------------------------------
def compose_packaged(overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="slurmagent.conf", version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@dataclass(frozen=True)
class ValidatorInput:
    overrides: list[str] | None = field(
        default=None, metadata={"help": "Hydra overrides of the packaged config (+experiment=digits_mlp optim.lr=1)"}
    )
    config: Path | None = field(default=None, metadata={"help": "a composed config as YAML (e.g. from --cfg job)"})
    gpu_type: str | None = field(default=None, metadata={"help": "target GPU type (default: resources.gpu_type)"})
    memory: bool = field(default=True, metadata={"help": "estimate memory from the model on the meta device"})


class ConfigValidator(TypedSkill[ValidatorInput]):
    name = "config_validator"
    description = "keys, types and ranges; experience rules with suggestions; meta-device memory estimate vs the GPU"
    Input = ValidatorInput
    positional = ("overrides",)

    def check(self, inp: ValidatorInput) -> SkillResult:
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        try:
            if inp.config is not None:
                raw = OmegaConf.load(inp.config)
                cfg = config_dict(raw)
            else:
                cfg = config_dict(compose_packaged(list(inp.overrides or [])))
        except (OSError, OmegaConfBaseException, ValueError) as exc:
            return self.unknown(f"cannot read the config: {exc}")
        except Exception as exc:  # Hydra's compose errors (unknown group, bad override)
            return self.unknown(f"cannot compose the config: {type(exc).__name__}: {exc}")
        issues, est = validate(cfg, memory=inp.memory, gpu_type=inp.gpu_type)
        status = worst(i.status for i in issues)
        reasons = [i.message + (f"; suggestion: {i.suggestion}" if i.suggestion else "") for i in issues]
        findings: dict[str, Any] = {"issues": [dict(asdict(i), status=i.status.name) for i in issues]}
        if est is not None:
            findings["memory"] = asdict(est)
        return SkillResult(self.name, status, reasons, findings)

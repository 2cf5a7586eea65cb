"""Hydra's structured configs (the dataclasses are the one source of every default) and Hydra's errors
turned into one-line ConfigErrors."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from slurmagent.config.adapt import AdaptConf
from slurmagent.config.code import CodeConf
from slurmagent.config.hpo import HpoConf
from slurmagent.config.launcher import HpoSweeperConf, LauncherConf, SweeperConf
from slurmagent.config.notify import NotifyConf
from slurmagent.config.parse import unknown_key
from slurmagent.config.site import BudgetConf, SiteConf
from slurmagent.config.spec import CheckpointConf, EnvConf, HealthConf, RecoveryConf, ResourcesConf, TaskConf
from slurmagent.config.track import TrackConf
from slurmagent.errors import ConfigError, choices

# -- Hydra structured configs: the dataclasses above are the one source of every default --
SPEC_NODE = "slurmagent/spec"  # put `- slurmagent/spec` in a defaults list to get the typed groups


def _typed(cls: type[Any]) -> Any:
    """A dataclass as a Hydra config node: typed and closed to unknown keys, but writable
    (OmegaConf makes frozen dataclasses read-only, which would refuse every override)."""
    from omegaconf import DictConfig, OmegaConf

    def writable(n: Any) -> None:  # nested frozen dataclasses (hpo.budget, hpo.fidelity) carry their own flag
        OmegaConf.set_readonly(n, False)
        if isinstance(n, DictConfig):
            for key in n:
                child = n._get_node(key)
                if isinstance(child, DictConfig):
                    writable(child)
                    if child._metadata.object_type in (dict, None):  # a free mapping (hpo.conditions): open to keys
                        OmegaConf.set_struct(child, False)

    node = OmegaConf.structured(cls)
    writable(node)
    return node


def register_configs() -> None:
    """Register the job-spec groups (`slurmagent/spec`, package _global_), the launcher
    (`hydra/launcher=slurmagent`) and the sweeper (`hydra/sweeper=slurmagent`) with Hydra's
    ConfigStore. Called when Hydra discovers the plugins (hydra_plugins/slurmagent_launcher)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    groups = {"resources": ResourcesConf, "checkpoint": CheckpointConf, "recovery": RecoveryConf}
    spec: dict[str, Any] = {"cluster": "auto", **{k: _typed(v) for k, v in groups.items()}}
    spec["probe"] = "auto"  # the pre-flight probe (launch/probe.py): auto | on | recheck | off
    spec.update(
        task=_typed(TaskConf),
        health=_typed(HealthConf),
        env=_typed(EnvConf),
        site=_typed(SiteConf),
        hpo=_typed(HpoConf),
    )
    spec["budget"] = _typed(BudgetConf)  # the sweep's spending limits (schedule/budget.py)
    spec["code"] = _typed(CodeConf)  # the sweep's code snapshot (launch/snapshot.py): per sweep, not a job-spec group
    spec["adapt"] = _typed(AdaptConf)  # the in-loop controller (runtime/adapt.py): typed, not a job-spec group
    spec["track"] = _typed(TrackConf)  # the trackers metrics also go to (track/): typed, read by the job
    spec["notify"] = _typed(NotifyConf)  # who is told what happens (notify/): per sweep, read by its supervisor
    group, name = SPEC_NODE.split("/")
    store.store(group=group, name=name, node=spec, package="_global_", provider="slurmagent")
    store.store(group="hydra/launcher", name="slurmagent", node=_typed(LauncherConf), provider="slurmagent")
    store.store(group="hydra/sweeper", name="slurmagent", node=_typed(SweeperConf), provider="slurmagent")
    store.store(group="hydra/sweeper", name="slurmagent_hpo", node=_typed(HpoSweeperConf), provider="slurmagent")


def config_error(exc: BaseException) -> ConfigError | None:
    """An error Hydra or OmegaConf raised about a key of a typed group, as a ConfigError that
    names the key, the valid keys and the closest one (`resources.gpu` → did you mean
    resources.gpus?); None when the error is about something else."""
    from omegaconf import DictConfig
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    seen: BaseException | None = exc
    while seen is not None:
        full_key = str(getattr(seen, "full_key", "") or "")
        owner = getattr(seen, "object_type", None)
        missing = isinstance(seen, (ConfigKeyError, ConfigAttributeError))
        if missing and full_key and owner is not None and dataclasses.is_dataclass(owner):
            group, _, leaf = full_key.rpartition(".")
            return unknown_key(group, leaf, [f.name for f in dataclasses.fields(owner) if f.name != "_target_"])
        if missing and full_key and isinstance(getattr(seen, "parent_node", None), DictConfig):
            return _free_key_error(full_key, seen.parent_node, str(exc))  # type: ignore[attr-defined]
        if isinstance(seen, ValidationError) and full_key:
            reason = str(seen).splitlines()[0]
            return ConfigError(f"{full_key}: {reason}")
        seen = seen.__cause__ or seen.__context__
    return None


def _free_key_error(full_key: str, parent: Any, hydra_message: str) -> ConfigError:
    """A key the (free-form) config does not have, overridden without `+` (`optim.lrr=0.01`):
    the keys at its level and the closest one (`optim.lr`); for a top-level key, else the
    closest key of that name in a group (`lrr=0.01` → `optim.lr`); and how to add it when meant."""
    import difflib

    from omegaconf import OmegaConf

    group, _, leaf = full_key.rpartition(".")
    siblings = [str(k) for k in parent]
    close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
    guess = f"{group}.{close[0]}" if close and group else (close[0] if close else "")
    if not guess and not group:  # a key of a group, given without the group
        root = OmegaConf.to_container(parent._get_root(), resolve=False)
        nested: dict[str, str] = {}  # leaf name → its first dotted path
        stack = [(f"{k!s}.", v) for k, v in (root.items() if isinstance(root, dict) else ()) if k != "hydra"]
        while stack:
            prefix, node = stack.pop(0)
            if isinstance(node, dict):
                for k, v in node.items():
                    nested.setdefault(str(k), f"{prefix}{k}")
                    stack.append((f"{prefix}{k}.", v))
        close = difflib.get_close_matches(leaf, sorted(nested), n=1, cutoff=0.6)
        guess = nested[close[0]] if close else ""
    where = f"valid keys of {group}" if group else "valid top-level keys"
    add = re.search(r"use (\+\S.*)$", hydra_message)
    return ConfigError(
        f"unknown key {full_key}; {where}: {choices(siblings)}"
        + (f"; did you mean {guess}?" if guess else "")
        + (f" (to add a new key: {add.group(1)})" if add else "")
    )

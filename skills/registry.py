"""The skill registry: built-in skills of this package plus third-party skills that
sites register through the `slurmagent.skills` entry-point group.

A third-party entry point names a BaseSkill subclass (`mypkg.checks:DiskSkill`). One that
does not import, is not a BaseSkill subclass, lacks a name or clashes with a built-in is
logged and skipped: a broken plugin never takes the others down.
"""

from __future__ import annotations

import importlib
import logging
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from slurmagent.errors import SkillError, choices
from slurmagent.skills._base import BaseSkill, SkillResult, Status

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "slurmagent.skills"

# name → "module:Class" inside this package; imported only when used (the hooks run as
# root in a prolog and must start fast: no torch unless a skill needs it)
BUILTIN: dict[str, str] = {
    "gpu_health_check": "slurmagent.skills.gpu_health:GpuHealthCheck",
    "xid_scan": "slurmagent.skills.gpu_health:XidScan",
    "config_validator": "slurmagent.skills.config_validator:ConfigValidator",
    "auto_resume": "slurmagent.skills.auto_resume:AutoResume",
    "data_config_generator": "slurmagent.skills.data_config:DataConfigGenerator",
    "data_prep": "slurmagent.skills.data_prep:DataPrep",
    "env_check": "slurmagent.skills.env_check:EnvCheck",
}


def _load(ref: str) -> type[BaseSkill]:
    module, _, attr = ref.partition(":")
    obj: Any = getattr(importlib.import_module(module), attr)
    if not (isinstance(obj, type) and issubclass(obj, BaseSkill)):
        raise TypeError(f"{ref} is not a BaseSkill subclass")
    if not getattr(obj, "name", None) or not getattr(obj, "description", None):
        raise TypeError(f"{ref} has no name or description")
    return obj


def plugin_entry_points() -> list[EntryPoint]:
    return list(entry_points(group=ENTRY_POINT_GROUP))


def load_plugins(eps: list[EntryPoint] | None = None) -> tuple[dict[str, type[BaseSkill]], dict[str, str]]:
    """Third-party skills: ({name: class}, {entry point: why it was skipped})."""
    found: dict[str, type[BaseSkill]] = {}
    skipped: dict[str, str] = {}
    for ep in plugin_entry_points() if eps is None else eps:
        try:
            cls = _load(ep.value)
        except Exception as exc:  # a broken plugin: any import-time error
            skipped[ep.name] = f"{type(exc).__name__}: {exc}"
            log.warning("skill plugin %s (%s) skipped: %s", ep.name, ep.value, skipped[ep.name])
            continue
        if cls.name in BUILTIN or cls.name in found:
            skipped[ep.name] = f"skill name {cls.name!r} is already registered"
            log.warning("skill plugin %s (%s) skipped: %s", ep.name, ep.value, skipped[ep.name])
            continue
        found[cls.name] = cls
    return found, skipped


def all_skills() -> dict[str, type[BaseSkill]]:
    """Every registered skill by name: built-ins first, then plugins."""
    skills = {name: _load(ref) for name, ref in BUILTIN.items()}
    skills.update(load_plugins()[0])
    return skills


def get_skill(name: str) -> type[BaseSkill]:
    if name in BUILTIN:
        return _load(BUILTIN[name])
    plugins = load_plugins()[0]
    if name not in plugins:
        raise SkillError(f"unknown skill {name!r}; skills: {choices([*BUILTIN, *plugins])}")
    return plugins[name]


def run_skill(name: str, **inputs: Any) -> SkillResult:
    """Run a skill by name from Python. A skill that raises gives UNKNOWN with the error."""
    skill = get_skill(name)()
    try:
        result = skill.run(**inputs)
    except Exception as exc:
        log.exception("skill %s raised", name)
        return SkillResult(name, Status.UNKNOWN, [f"skill {name} failed: {type(exc).__name__}: {exc}"])
    if not isinstance(result, SkillResult):
        return SkillResult(name, Status.UNKNOWN, [f"skill {name} returned {type(result).__name__}, not a SkillResult"])
    return result

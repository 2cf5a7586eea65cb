"""Skills: small units with typed input and output, built in here or registered by sites
through the `slurmagent.skills` entry-point group. See _base.py for the interface and
registry.py for discovery; `slurmagent skill --list` shows them all."""

from slurmagent.skills._base import BaseSkill, SkillResult, Status, TypedSkill, worst

__all__ = ["BaseSkill", "SkillResult", "Status", "TypedSkill", "worst"]

"""Skills: small units with typed input and output, built in here or registered by sites
through the `slurmagent.skills` entry-point group. See _base.py for the interface."""

from slurmagent.skills._base import BaseSkill, SkillResult, Status

__all__ = ["BaseSkill", "SkillResult", "Status"]

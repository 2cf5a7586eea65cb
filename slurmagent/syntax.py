"""Slurm's value syntax, pure: time limits, memory sizes, host lists, array ids, GRES.

Every module that reads or writes a Slurm time, size or node list uses these, so one
spelling is understood the same way everywhere."""

from __future__ import annotations

import re

from slurmagent.errors import ConfigError

__all__ = [
    "expand_array_id",
    "format_mb",
    "mem_to_mb",
    "parse_gres",
    "parse_time_limit",
    "seconds_to_slurm_time",
    "slurm_time_to_seconds",
    "split_hostlist",
    "time_to_minutes",
]

_MEM_RE = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)B?$", re.IGNORECASE)
_MEM_FACTOR = {"": 1.0, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024}


def mem_to_mb(text: str) -> int:
    """Slurm memory size ('500M', '4G', '2048' = MB) → megabytes."""
    m = _MEM_RE.match(text.strip())
    if not m:
        raise ConfigError(f"memory size {text!r} is not Slurm syntax; use e.g. 500M, 4G or a number of megabytes")
    return int(float(m.group(1)) * _MEM_FACTOR[m.group(2).upper()])


def format_mb(mb: int) -> str:
    """Megabytes → the shortest exact Slurm size: 2048 → '2G', 384 → '384M'."""
    return f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M"


def slurm_time_to_seconds(text: str) -> int:
    """Slurm time syntax → seconds: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    t = text.strip()
    try:
        days = 0
        if "-" in t:
            d, t = t.split("-", 1)
            days = int(d)
            parts = [int(p) for p in t.split(":")]
            while len(parts) < 3:
                parts.append(0)
            h, m, s = parts
        else:
            parts = [int(p) for p in t.split(":")]
            if len(parts) == 1:
                h, m, s = 0, parts[0], 0
            elif len(parts) == 2:
                h, m, s = 0, parts[0], parts[1]
            elif len(parts) == 3:
                h, m, s = parts
            else:
                raise ValueError(t)
    except ValueError:
        raise ConfigError(
            f"time {text!r} is not Slurm syntax; use minutes, HH:MM:SS or D-HH:MM:SS (e.g. 30, 02:00:00, 1-00:00:00)"
        ) from None
    if min(days, h, m, s) < 0:
        raise ConfigError(f"time {text!r} is negative")
    return ((days * 24 + h) * 60 + m) * 60 + s


def seconds_to_slurm_time(seconds: int | None) -> str:
    """Seconds → Slurm time syntax (HH:MM:SS, or D-HH:MM:SS past a day); None → "infinite"."""
    if seconds is None:
        return "infinite"
    d, rem = divmod(seconds, 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


def time_to_minutes(text: str) -> int:
    """Slurm time → whole minutes (rounded up), the unit submitit takes."""
    return -(-slurm_time_to_seconds(text) // 60)


def parse_time_limit(text: str) -> int | None:
    """A limit as sinfo/squeue print it; None for infinite, unlimited, not set or invalid."""
    t = text.strip().lower()
    if t in ("infinite", "unlimited", "n/a", "", "not_set", "invalid"):
        return None
    try:
        return slurm_time_to_seconds(t)
    except ConfigError:
        return None


def split_hostlist(text: str | None) -> list[str]:
    """`a100-1,t4-[1,2]` → ['a100-1', 't4-[1,2]']: commas inside brackets stay."""
    parts, depth, cur = [], 0, ""
    for ch in text or "":
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip() and p.strip() not in ("None", "(null)")]


def expand_array_id(job_id: str) -> list[str]:
    """`123_[0-3,7%2]` → ['123_0', …, '123_3', '123_7']; other ids unchanged."""
    if "_[" not in job_id:
        return [job_id]
    base, _, rng = job_id.partition("_[")
    rng = rng.rstrip("]").split("%")[0]
    ids: list[str] = []
    for part in rng.split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            ids.extend(f"{base}_{i}" for i in range(int(lo), int(hi) + 1))
        elif part:
            ids.append(f"{base}_{part}")
    return ids


_GRES_RE = re.compile(r"gpu(?::([\w.-]+))?:(\d+)")


def parse_gres(text: str) -> dict[str, int]:
    """`gpu:a100:2(S:0-1),gpu:t4:1` → {'a100': 2, 't4': 1}; `gpu:2` → {'': 2}."""
    gpus: dict[str, int] = {}
    for item in re.sub(r"\([^)]*\)", "", text).split(","):
        m = _GRES_RE.fullmatch(item.strip())
        if m:
            gpus[m.group(1) or ""] = gpus.get(m.group(1) or "", 0) + int(m.group(2))
    return gpus

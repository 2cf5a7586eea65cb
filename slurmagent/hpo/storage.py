"""Where a study lives: `hpo.storage`.

- `""` (the default): an Optuna journal file in the sweep directory, `SWEEP/hpo/study.journal`,
  locked with an open(O_CREAT|O_EXCL) lock file — the lock Optuna offers for network file
  systems (NFS, Lustre), where `flock` may not work (optuna#3328, #5125). No server needed.
- `journal:PATH`: a journal file elsewhere (shared by several sweeps, say).
- an SQLAlchemy URL (`postgresql+psycopg2://user:pass@host/db`, `sqlite:///…`): Optuna's RDB
  storage, for sites that outgrow a file.

`optuna-dashboard SWEEP/hpo/study.journal` (or the URL) opens either.
"""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage

from slurmagent.errors import ConfigError

JOURNAL = "hpo/study.journal"
URL_SCHEMES = ("postgresql", "mysql", "sqlite", "oracle", "mssql")


def open_storage(spec: str, sweep_dir: str | Path) -> optuna.storages.BaseStorage:
    if not spec or spec.startswith("journal:"):
        path = Path(spec.removeprefix("journal:")) if spec else Path(sweep_dir) / JOURNAL
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = JournalFileOpenLock(str(path) + ".lock")
        return JournalStorage(JournalFileBackend(str(path), lock_obj=lock))
    if spec.split(":", 1)[0].split("+", 1)[0] in URL_SCHEMES:
        try:
            return optuna.storages.RDBStorage(spec, engine_kwargs={"pool_pre_ping": True})
        except Exception as exc:  # SQLAlchemy's and the driver's errors: say which storage and why
            raise ConfigError(f"hpo.storage={_redact(spec)}: {type(exc).__name__}: {exc}") from None
    raise ConfigError(
        f"hpo.storage={spec!r}: use '' (a journal file in the sweep directory), 'journal:PATH', or a database URL "
        f"({', '.join(s + '://…' for s in URL_SCHEMES)})"
    )


def describe(spec: str, sweep_dir: str | Path) -> str:
    """Where the study is, for people (a URL's password hidden)."""
    if not spec:
        return str(Path(sweep_dir) / JOURNAL)
    return spec.removeprefix("journal:") if spec.startswith("journal:") else _redact(spec)


def _redact(url: str) -> str:
    head, sep, tail = url.partition("://")
    if not sep or "@" not in tail:
        return url
    creds, _, host = tail.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{head}://{user}:***@{host}"

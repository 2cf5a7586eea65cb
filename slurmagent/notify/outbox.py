"""Each event told once, per channel: the sweep's ledger of messages (`.slurmagent/notify.json`)
holds every event offered, with, per channel, whether it was sent, how often it was tried and
when it is tried next (2 s, doubling to 5 min, `notify.max_tries` tries). The ledger is on disk,
so a successor (a supervisor job requeued, a `watch` that took over) derives the same event ids
and sends only what is not marked sent. A message is marked `sending` before its try and `sent`
after: only a crash between a receiver's answer and that mark repeats one, with the same id
(the webhook's `Idempotency-Key`, the e-mail's `X-Slurmagent-Event`). Errors are kept redacted:
no secret of a channel is ever written."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from slurmagent.config.notify import NotifyConf
from slurmagent.errors import brief
from slurmagent.files import atomic_write
from slurmagent.notify.channels import Channel, channels
from slurmagent.notify.message import Event

log = logging.getLogger(__name__)

LEDGER = ".slurmagent/notify.json"
FIRST_RETRY_S, MAX_RETRY_S = 2.0, 300.0
SENT, PENDING, SENDING, GIVEN_UP = "sent", "pending", "sending", "given_up"


def retry_after(tries: int) -> float:
    """Seconds before the next try of a message tried `tries` times."""
    return float(min(FIRST_RETRY_S * 2.0 ** max(tries - 1, 0), MAX_RETRY_S))


@dataclass(frozen=True)
class Unsent:
    event: str
    channel: str
    state: str  # pending | sending | given_up
    tries: int
    error: str


def read_ledger(sweep_dir: str | Path) -> dict[str, Any]:
    """The sweep's ledger of messages: event id → the event and, per channel, its sending."""
    try:
        raw = json.loads((Path(sweep_dir) / LEDGER).read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def unsent(ledger: dict[str, Any]) -> list[Unsent]:
    """Each message a channel has not taken (yet, or ever: given_up)."""
    return [
        Unsent(event_id, name, st.get("state", ""), st.get("tries", 0), st.get("error", ""))
        for event_id, entry in ledger.items()
        for name, st in entry.get("channels", {}).items()
        if st.get("state") != SENT
    ]


class Outbox:
    def __init__(
        self,
        sweep_dir: str | Path,
        conf: NotifyConf,
        send_to: list[Channel] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(sweep_dir) / LEDGER
        self.conf = conf
        self.channels = send_to if send_to is not None else channels(conf)
        self.clock = clock

    # -- the ledger ---------------------------------------------------------------------------
    def read(self) -> dict[str, Any]:
        return read_ledger(self.path.parent.parent)

    def _write(self, ledger: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(ledger, indent=1).encode())

    def known(self) -> set[str]:
        return set(self.read())

    # -- offering and sending -----------------------------------------------------------------
    def offer(self, events: Iterable[Event]) -> int:
        """Add the events not in the ledger (of the kinds `notify.events` names); the number added."""
        offered = [e for e in events if e.kind in self.conf.events]
        if not self.channels or not offered:  # nothing to add: the ledger is neither locked nor read
            return 0
        with FileLock(str(self.path) + ".lock"):
            ledger = self.read()
            added = 0
            for event in offered:
                if event.id in ledger:
                    continue
                now = self.clock()
                ledger[event.id] = {
                    "event": event.to_json(),
                    "seen": now,
                    "channels": {
                        c.name: {"state": PENDING, "tries": 0, "next": now, "error": ""} for c in self.channels
                    },
                }
                added += 1
            if added:
                self._write(ledger)
        return added

    def send_due(self) -> int:
        """Try every message whose time has come, once; the number sent. Never raises for a
        channel's failure: it is recorded (redacted) and tried again later."""
        sent = 0
        with FileLock(str(self.path) + ".lock"):
            ledger = self.read()
            for entry in ledger.values():
                for channel in self.channels:
                    st = entry["channels"].get(channel.name)
                    if st is None or st["state"] in (SENT, GIVEN_UP) or st["next"] > self.clock():
                        continue
                    st["state"], st["tries"] = SENDING, st["tries"] + 1
                    self._write(ledger)  # a crash from here on repeats this message, with the same id
                    event = Event.from_json(entry["event"])
                    try:
                        channel.send(event, self.conf.timeout_s)
                    except Exception as exc:
                        st["error"] = brief(exc, channel.secrets())
                        done = st["tries"] >= self.conf.max_tries
                        st["state"] = GIVEN_UP if done else PENDING
                        st["next"] = self.clock() + retry_after(st["tries"])
                        log.warning(
                            "notify: %s of %s %s (try %d of %d): %s",
                            channel.name,
                            event.id,
                            "given up" if done else "not sent",
                            st["tries"],
                            self.conf.max_tries,
                            st["error"],
                        )
                    else:
                        st.update(state=SENT, sent=self.clock(), error="")
                        sent += 1
                    self._write(ledger)
        return sent

    def unsent(self) -> list[Unsent]:
        return unsent(self.read())

    def flush(self, timeout_s: float, sleep: Callable[[float], None] = time.sleep) -> list[Unsent]:
        """Keep trying what is unsent until all is sent or given up, or `timeout_s` passed; what
        is left."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.send_due()
            left = [u for u in self.unsent() if u.state != GIVEN_UP]
            if not left or time.monotonic() >= deadline:
                return self.unsent()
            due = min(
                (st["next"] for e in self.read().values() for st in e["channels"].values() if st["state"] == PENDING),
                default=self.clock(),
            )
            sleep(max(0.05, min(due - self.clock(), deadline - time.monotonic())))

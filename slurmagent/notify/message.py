"""What an event says, and its form in each channel: Slack-compatible text, a generic JSON
body, an e-mail. Pure: no I/O."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from email.message import EmailMessage
from typing import Any


@dataclass(frozen=True)
class Event:
    """One happening of a sweep that people are told about, once."""

    id: str  # stable: whoever sees the happening (a supervisor, its successor after a requeue) derives the same id
    kind: str  # one of config.notify.EVENTS
    sweep: str  # the sweep directory
    title: str  # one line
    lines: list[str] = field(default_factory=list)  # the body, one fact per line; commands as they are to be run
    data: dict[str, Any] = field(default_factory=dict)  # the same facts as fields (the JSON form)
    to: list[str] = field(default_factory=list)  # addressed to (an approval: the policy's approvers)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Event:
        return cls(**{k: raw[k] for k in ("id", "kind", "sweep", "title", "lines", "data", "to") if k in raw})

    @property
    def text(self) -> str:
        people = f"for {', '.join(self.to)}: " if self.to else ""
        return "\n".join([f"{people}{self.title}", *self.lines])


def slack_body(event: Event) -> dict[str, Any]:
    """Slack's incoming-webhook form (also taken by Mattermost, Rocket.Chat, Discord's /slack)."""
    people = f"for {', '.join(event.to)}: " if event.to else ""
    lines = [f"`{line[2:]}`" if line.startswith("$ ") else line for line in event.lines]
    return {"text": "\n".join([f"{people}*{event.title}*", *lines])}


def json_body(event: Event) -> dict[str, Any]:
    """Every field, for a receiver of one's own: `id` is the same on a repeat (drop it there)."""
    return {"id": event.id, "event": event.kind, "sweep": event.sweep, "title": event.title, "text": event.text,
            "to": event.to, **event.data}  # fmt: skip


def email(event: Event, sender: str, to: list[str]) -> EmailMessage:
    msg = EmailMessage()
    msg["Subject"] = f"[slurmagent] {event.title}"
    msg["From"] = sender
    msg["To"] = ", ".join(to)
    msg["X-Slurmagent-Event"] = event.id
    msg.set_content(event.text + f"\n\nsweep: {event.sweep}\n")
    return msg

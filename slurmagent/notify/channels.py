"""Where messages go: a webhook (an HTTP POST of JSON) and e-mail (the site's sendmail, or an
SMTP server). The only code here that sends anything; argv only, no shell. A channel raises on
failure; the outbox retries it. Its secrets are read when it sends, never kept."""

from __future__ import annotations

import json
import os
import smtplib
import socket
import subprocess
import urllib.error
import urllib.request
from typing import Protocol

from slurmagent.config.notify import EmailConf, NotifyConf, WebhookConf, webhook_url
from slurmagent.errors import SlurmAgentError
from slurmagent.notify.message import Event, email, json_body, slack_body


class SendError(SlurmAgentError, RuntimeError):
    """A channel did not take a message (the receiver's answer, or why there was none)."""


class Channel(Protocol):
    name: str

    def secrets(self) -> list[str]:
        """What must never be written down (an error is redacted with these)."""
        ...

    def send(self, event: Event, timeout_s: float) -> None: ...


class Webhook:
    name = "webhook"

    def __init__(self, conf: WebhookConf) -> None:
        self.conf = conf

    def secrets(self) -> list[str]:
        try:
            return [webhook_url(self.conf)]
        except SlurmAgentError:
            return []

    def send(self, event: Event, timeout_s: float) -> None:
        body = slack_body(event) if self.conf.format == "slack" else json_body(event)
        request = urllib.request.Request(
            webhook_url(self.conf),
            data=json.dumps(body).encode(),
            # a receiver that keeps ids drops a repeat (one can follow a crash between its answer and our ledger)
            headers={"Content-Type": "application/json", "Idempotency-Key": event.id, "User-Agent": "slurmagent"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                answer.read(1024)
        except urllib.error.HTTPError as exc:  # its str() holds the status, not the URL
            raise SendError(f"the webhook answered HTTP {exc.code} {exc.reason}") from None


class Email:
    name = "email"

    def __init__(self, conf: EmailConf) -> None:
        self.conf = conf

    def secrets(self) -> list[str]:
        password = os.environ.get(self.conf.password_env or "", "") if self.conf.password_env else ""
        return [password] if password else []

    def recipients(self, event: Event) -> list[str]:
        return list(dict.fromkeys([*self.conf.to, *(a for a in event.to if "@" in a)]))

    def send(self, event: Event, timeout_s: float) -> None:
        to = self.recipients(event)
        sender = self.conf.sender or f"slurmagent@{socket.getfqdn()}"
        msg = email(event, sender, to)
        if self.conf.via == "sendmail":
            out = subprocess.run(
                [self.conf.sendmail, "-t", "-oi"], input=msg.as_bytes(), capture_output=True, timeout=timeout_s
            )
            if out.returncode != 0:
                why = out.stderr.decode(errors="replace").strip()[-300:]
                raise SendError(f"{self.conf.sendmail} exited {out.returncode}: {why}")
            return
        with smtplib.SMTP(self.conf.smtp_host, self.conf.smtp_port, timeout=timeout_s) as smtp:
            if self.conf.starttls:
                smtp.starttls()
            if self.conf.smtp_user:
                smtp.login(self.conf.smtp_user, os.environ.get(self.conf.password_env or "", ""))
            smtp.send_message(msg)


def channels(conf: NotifyConf) -> list[Channel]:
    out: list[Channel] = []
    if conf.webhook.on:
        out.append(Webhook(conf.webhook))
    if conf.email.on:
        out.append(Email(conf.email))
    return out

"""The `notify` group: who is told what happens to a sweep, without running a command — a
webhook (Slack-compatible text, or a generic JSON form), e-mail (the site's sendmail, or an
SMTP server). Off unless a channel is configured. Secrets (the webhook URL, an SMTP password)
come from the environment or a file, named here by the variable or the path: a config (and so
sweep.json, the logs, the audit trail) never holds them. Sent by slurmagent/notify/ from the
sweep's supervisor (supervise/notices.py decides the events)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmagent.config.parse import parse_conf, parse_part
from slurmagent.errors import ConfigError, choices

# what a sweep tells: a task failed (diagnosed; its recovery goes on), a task given up (no retry
# follows: the cause and the fix), an approval needed (to the policy's approvers, with the
# command), the sweep's budget reached, the sweep finished (counts, best result, report)
EVENTS = ("task_failed", "task_given_up", "approval_needed", "budget_reached", "sweep_finished")
WEBHOOK_FORMATS = ("slack", "json")
EMAIL_VIA = ("sendmail", "smtp")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class WebhookConf:
    """An HTTP(S) endpoint each message is POSTed to as JSON."""

    url_env: str | None = None  # the environment variable holding the URL (e.g. SLACK_WEBHOOK_URL)
    url_file: str | None = None  # or a file holding it (one line; keep it mode 600)
    format: str = "slack"  # slack: {"text": …} (Slack, Mattermost, Rocket.Chat, Teams' Slack form); json: every field

    @property
    def on(self) -> bool:
        return bool(self.url_env or self.url_file)


@dataclass(frozen=True)
class EmailConf:
    """E-mail through the site's sendmail (the default) or an SMTP server."""

    to: list[str] = field(default_factory=list)  # addresses; empty: off (approvals also go to the policy's approvers)
    via: str = "sendmail"  # sendmail | smtp
    sendmail: str = "/usr/sbin/sendmail"  # run as `sendmail -t -oi`, the message on its stdin
    smtp_host: str = "localhost"
    smtp_port: int = 25
    starttls: bool = False
    smtp_user: str | None = None
    password_env: str | None = None  # the environment variable holding the SMTP password
    sender: str | None = None  # From:; None = slurmagent@<this host>

    @property
    def on(self) -> bool:
        return bool(self.to)


@dataclass(frozen=True)
class NotifyConf:
    """Where a sweep's events go, which ones, and how hard each message is tried."""

    events: list[str] = field(default_factory=lambda: list(EVENTS))
    webhook: WebhookConf = field(default_factory=WebhookConf)
    email: EmailConf = field(default_factory=EmailConf)
    timeout_s: float = 10.0  # one try's limit (the supervisor's poll waits at most this long per message)
    max_tries: int = 8  # tries per message and channel, 2 s apart, doubling up to 5 min; then given up (in status)
    flush_timeout_s: float = 60.0  # at the sweep's end: how long its supervisor keeps trying what is unsent

    @property
    def channels(self) -> list[str]:
        return [name for name, on in (("webhook", self.webhook.on), ("email", self.email.on)) if on]


def notify_conf(data: Mapping[str, Any] | None, check_secrets: bool = False) -> NotifyConf:
    """The `notify` group from plain data, checked: errors name the key and the valid values.
    `check_secrets` (at submission) also refuses a webhook whose variable is unset or whose file
    cannot be read, and a URL that is not http(s) — before anything is submitted."""
    raw = dict(data or {})
    hook = raw.pop("webhook", None)
    if isinstance(hook, Mapping) and "url" in hook:
        raise ConfigError(
            "notify.webhook.url: a webhook URL is a secret and is never written in a config (sweep.json, the logs "
            "and the audit trail would hold it); export it and set notify.webhook.url_env=NAME, or put it in a "
            "file and set notify.webhook.url_file=PATH"
        )
    mail = raw.pop("email", None)
    if isinstance(mail, Mapping) and "password" in mail:
        raise ConfigError(
            "notify.email.password: a password is never written in a config; export it and set "
            "notify.email.password_env=NAME"
        )
    wh = parse_part(WebhookConf, hook, "notify.webhook")
    em = parse_part(EmailConf, mail, "notify.email")
    conf = dataclasses.replace(parse_conf(NotifyConf, raw, "notify"), webhook=wh, email=em)
    for event in conf.events:
        if event not in EVENTS:
            raise ConfigError(f"notify.events: {event!r} is not an event; valid events: {choices(EVENTS)}")
    if wh.format not in WEBHOOK_FORMATS:
        raise ConfigError(f"notify.webhook.format={wh.format!r} is not one of {choices(WEBHOOK_FORMATS)}")
    for key, name in (("notify.webhook.url_env", wh.url_env), ("notify.email.password_env", em.password_env)):
        if name is not None and not _ENV_NAME.fullmatch(name):
            raise ConfigError(f"{key}={name!r} is not an environment variable's name (the variable holds the secret)")
    if em.via not in EMAIL_VIA:
        raise ConfigError(f"notify.email.via={em.via!r} is not one of {choices(EMAIL_VIA)}")
    for address in em.to:
        if "@" not in address or any(c.isspace() for c in address):
            raise ConfigError(f"notify.email.to: {address!r} is not an e-mail address")
    if not 0 < em.smtp_port < 65536:
        raise ConfigError(f"notify.email.smtp_port={em.smtp_port} is not a port (1 to 65535)")
    if conf.timeout_s <= 0 or conf.flush_timeout_s < 0 or conf.max_tries < 1:
        raise ConfigError(
            f"notify.timeout_s={conf.timeout_s} must be above 0, notify.flush_timeout_s={conf.flush_timeout_s} "
            f"0 or more, notify.max_tries={conf.max_tries} at least 1"
        )
    if check_secrets and wh.on:
        webhook_url(wh)
    if check_secrets and em.on and em.via == "sendmail" and not os.access(em.sendmail, os.X_OK):
        raise ConfigError(
            f"notify.email.sendmail={em.sendmail!r} is not an executable here; set notify.email.via=smtp "
            "(with notify.email.smtp_host) or the site's sendmail path"
        )
    if check_secrets and em.password_env and not os.environ.get(em.password_env):
        raise ConfigError(f"notify.email.password_env={em.password_env}: ${em.password_env} is not set here")
    return conf


def webhook_url(conf: WebhookConf) -> str:
    """The webhook's URL, read now from its variable or its file (never stored by slurmagent)."""
    if conf.url_env:
        url = os.environ.get(conf.url_env, "").strip()
        if not url:
            raise ConfigError(
                f"notify.webhook.url_env={conf.url_env}: ${conf.url_env} is not set (or empty) here; export the "
                "webhook's URL in it before launching"
            )
    else:
        assert conf.url_file is not None
        try:
            url = Path(conf.url_file).expanduser().read_text().strip()
        except OSError as exc:
            raise ConfigError(f"notify.webhook.url_file={conf.url_file!r} cannot be read: {exc.strerror}") from None
    if not re.match(r"https?://[^\s/]+", url):
        where = f"${conf.url_env}" if conf.url_env else conf.url_file
        raise ConfigError(f"the webhook URL in {where} is not an http(s) URL")  # the value itself is not shown
    return url

"""Sending one message through one alert channel, with apprise (ntfy, Telegram, Pushover, mail,
Matrix and the rest, each named by a URL). Blocking: the alert sender calls it off the loop."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from holdover import events


@dataclass(frozen=True)
class Sent:
    ok: bool
    error: str = ""


def send(url: str, title: str, body: str, severity: str = events.WARNING) -> Sent:
    """One message; on failure the reason apprise gave (its log line), not just False."""
    import apprise  # a large import: only where alerts are configured

    kind = {
        events.INFO: apprise.NotifyType.INFO,
        events.WARNING: apprise.NotifyType.WARNING,
        events.CRITICAL: apprise.NotifyType.FAILURE,
    }[severity]
    a = apprise.Apprise()
    if not a.add(url):
        return Sent(False, "apprise cannot use this URL")
    with apprise.LogCapture(level=logging.WARNING) as logs:
        ok = bool(a.notify(title=title, body=body, notify_type=kind))
    if ok:
        return Sent(True)
    lines = [line.split(" - ", 2)[-1] for line in logs.getvalue().splitlines() if line.strip()]
    return Sent(False, lines[-1] if lines else "apprise reported a failure and said nothing more")

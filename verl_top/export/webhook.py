"""``export-metrics --webhook URL``: push the verdict to a team's chat or pager, without
Alertmanager.

One message per change of the job's state (the status word and the lead rule: "waiting" ->
"step 3 bottleneck: flow.train_bound" -> "healthy"), in order, each POSTed as JSON with retries
and exponential backoff. The payload has a top-level ``text`` (what Slack-style incoming
webhooks display) and the structured fields of docs/alerting.md; every string in it is redacted.
The URL itself may hold a secret (a Slack webhook path): it is never printed, only its host.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from verl_top.assessment import Assessment
from verl_top.export.redact import redact_text

SCHEMA = "verl-top.webhook/1"
MAX_QUEUE = 100  # changes waiting to be sent; the oldest are dropped (and counted) beyond it
# (status code or None for a network error) -> retry? 5xx and 429 are worth another try.
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})

Post = Callable[[str, bytes, float], Awaitable[int]]


class WebhookError(ValueError):
    """The --webhook URL cannot be used."""


def check_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host, else WebhookError."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookError(f"--webhook: expected an http:// or https:// URL, got {show_url(url)!r}")
    return url


def show_url(url: str) -> str:
    """The URL without its path, query or credentials (they may be the secret)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}/…" if parts.scheme else "(not a URL)"


async def urllib_post(url: str, body: bytes, timeout: float) -> int:
    """POST ``body`` as JSON; the HTTP status (a network failure raises OSError)."""

    def send() -> int:
        request = urllib.request.Request(
            url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310 - user's URL
                resp.read(65536)
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    return await asyncio.wait_for(asyncio.to_thread(send), timeout + 1.0)


def state_key(a: Assessment) -> tuple[str, int | None, str | None]:
    """What counts as a change: the status word and the lead (step, rule)."""
    return a.status.state, a.bottleneck_step, a.bottleneck_rule


def payload(a: Assessment, previous: tuple[str, int | None, str | None] | None) -> dict[str, Any]:
    """The JSON sent for one change (every string redacted)."""
    lead = a.lead
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "text": redact_text(f"verl-top: {a.status.text}"),
        "state": a.status.state,
        "label": a.status.label,
        "step": a.bottleneck_step,
        "rule": a.bottleneck_rule,
        "title": redact_text(lead.title) if lead is not None else None,
        "advice": redact_text(lead.advice) if lead is not None and lead.advice else None,
        "save_s_per_step": lead.save_s if lead is not None else None,
        "window": redact_text(a.window),
        "data_time": a.t,
        "sent_at": time.time(),
        "previous": None
        if previous is None
        else {"state": previous[0], "step": previous[1], "rule": previous[2]},
    }
    return doc


@dataclass
class WebhookNotifier:
    """Queues a message per state change and sends them in order with retries."""

    url: str
    attempts: int = 5
    backoff_s: float = 1.0  # 1, 2, 4, 8 s between the attempts
    timeout_s: float = 10.0
    post: Post = urllib_post
    sent: int = 0
    failed: int = 0
    dropped: int = 0
    notes: list[str] = field(default_factory=list)
    _last: tuple[str, int | None, str | None] | None = None
    _queue: deque[dict[str, Any]] = field(default_factory=deque)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    def observe(self, a: Assessment) -> None:
        """Queue a message when the job's state differs from the last one queued."""
        if a.verdict is None:
            return
        key = state_key(a)
        if key == self._last:
            return
        if len(self._queue) >= MAX_QUEUE:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append(payload(a, self._last))
        self._last = key
        self._wake.set()

    @property
    def pending(self) -> int:
        """Messages not sent yet."""
        return len(self._queue)

    async def run(self) -> None:
        """Send queued messages until cancelled."""
        while True:
            while self._queue:
                await self._deliver(self._queue.popleft())
            self._wake.clear()
            await self._wake.wait()

    async def drain(self, within_s: float) -> None:
        """Send what is queued, for at most ``within_s`` seconds (at shutdown)."""
        deadline = time.monotonic() + within_s
        while self._queue and time.monotonic() < deadline:
            await self._deliver(self._queue.popleft())

    async def _deliver(self, doc: dict[str, Any]) -> bool:
        body = json.dumps(doc, allow_nan=False, default=str).encode()
        delay = self.backoff_s
        why = ""
        for attempt in range(1, self.attempts + 1):
            try:
                status = await self.post(self.url, body, self.timeout_s)
            except (OSError, asyncio.TimeoutError) as exc:
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                status, why = None, type(reason).__name__
            else:
                if 200 <= status < 300:
                    self.sent += 1
                    return True
                why = f"HTTP {status}"
                if status not in RETRY_STATUS:
                    break
            if attempt < self.attempts:
                await asyncio.sleep(delay)
                delay *= 2
        self.failed += 1
        self.notes.append(
            f"webhook {show_url(self.url)}: a message was not delivered ({why}, "
            f"{self.attempts} attempts at most)"
        )
        return False

"""``verl-top doctor HOST...``: every step from name to first sample, the first failure and its fix.

For each host the steps run in order, each only when the one before passed, like ``ssh -v``
for humans: config (the effective ``user@host:port``, jump chain, known_hosts files, keys),
resolve, TCP (and the SSH banner), host key, auth, python3, agent start, NVML, first sample.
Everything it connects with is exactly what the live monitor uses (sources/ssh.py). Text that
comes from the node (banner, versions, errors) goes through verl_top.untrusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import asyncssh

from verl_top.protocol import Decoder
from verl_top.sources.hosts import HostSpec
from verl_top.sources.ssh import (
    DEFAULT_TIMEOUT,
    Route,
    SshSettings,
    SshShared,
    _HostFailure,
    agent_command,
    classify,
    connect_host,
    make_client,
)
from verl_top.untrusted import clean_text

STEPS = ("config", "resolve", "tcp", "host key", "auth", "python3", "agent", "nvml", "sample")
MIN_PYTHON = (3, 8)


@dataclass
class Step:
    """One step's outcome: ok True/False, or None when it was not tried."""

    name: str
    ok: bool | None = None
    detail: str = ""
    fix: str = ""


@dataclass
class HostReport:
    """All steps of one host, in order."""

    name: str
    target: str = ""
    steps: list[Step] = field(default_factory=lambda: [Step(n) for n in STEPS])

    def step(self, name: str) -> Step:
        """The step called ``name``."""
        return next(s for s in self.steps if s.name == name)

    def passed(self, name: str, detail: str) -> None:
        """Mark ``name`` passed."""
        s = self.step(name)
        s.ok, s.detail = True, detail

    def failed(self, name: str, detail: str, fix: str) -> None:
        """Mark ``name`` failed with the fix to apply."""
        s = self.step(name)
        s.ok, s.detail, s.fix = False, detail, fix

    @property
    def first_failure(self) -> Step | None:
        """The first step that failed, if any."""
        return next((s for s in self.steps if s.ok is False), None)

    @property
    def ok(self) -> bool:
        """True when every step passed."""
        return all(s.ok for s in self.steps)


class _Stop(Exception):
    """A step failed; the later ones are not tried."""


def _timeout(route: Route) -> float:
    t = route.hc.connect_timeout
    return t if t is not None else DEFAULT_TIMEOUT


async def _banner(host: str, port: int, timeout: float) -> str:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        line = await asyncio.wait_for(reader.readline(), timeout)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return line.decode("ascii", "replace").strip()


class Doctor:
    """Runs the steps for one host with the settings the monitor would use."""

    def __init__(
        self, settings: SshSettings, spec: HostSpec, agent_args: Sequence[str], wait_s: float
    ) -> None:
        self.settings = settings
        self.shared: SshShared = settings.shared()
        self.spec = spec
        self.agent_args = list(agent_args)
        self.wait_s = wait_s
        self.report = HostReport(spec.name)

    async def run(self) -> HostReport:
        """Every step until the first failure."""
        conn: asyncssh.SSHClientConnection | None = None
        try:
            route = self._config()
            await self._network(route)
            conn = await self._login(route)
            await self._agent(conn)
        except _Stop:
            pass
        finally:
            if conn is not None:
                conn.close()
            await self.shared.close()
        return self.report

    def _config(self) -> Route:
        r = self.report
        try:
            route = self.shared.route(self.spec)
        except _HostFailure as exc:
            r.failed("config", exc.reason, "fix the ssh config file at the line shown")
            raise _Stop from None
        hc = route.hc
        r.target = route.text
        keys = ", ".join(hc.identity_files) or "none found"
        if hc.identities_missing:
            keys += f" (missing: {', '.join(hc.identities_missing)})"
        r.passed(
            "config",
            f"{route.text}; config {', '.join(hc.config_files) or 'none'}; known_hosts "
            f"{', '.join(hc.known_hosts_files) or 'none'}; keys {keys}; "
            f"StrictHostKeyChecking {hc.strict}",
        )
        return route

    async def _network(self, route: Route) -> None:
        r, hc = self.report, route.hc
        if route.chain or hc.proxy_command:
            how = "the jump host" if route.chain else "the ProxyCommand"
            r.passed("resolve", f"{hc.hostname} is resolved by {how}")
            r.passed("tcp", f"checked through {how} at login")
            return
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(hc.hostname, hc.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            r.failed(
                "resolve",
                f"{hc.hostname!r}: {exc.strerror}",
                f"check the name; or give the address with HostName in the ssh config for "
                f"Host {hc.name}",
            )
            raise _Stop from None
        addrs = sorted({str(i[4][0]) for i in infos})
        r.passed("resolve", f"{hc.hostname} -> {', '.join(addrs)}")
        t0 = time.monotonic()
        try:
            banner = clean_text(await _banner(hc.hostname, hc.port, _timeout(route)))
        except ConnectionRefusedError:
            r.failed(
                "tcp",
                f"connection refused by {hc.hostname}:{hc.port}",
                f"sshd is not listening on port {hc.port}: start it, or fix the port (Port in "
                "the ssh config, host:port in the hosts file)",
            )
            raise _Stop from None
        except (asyncio.TimeoutError, TimeoutError):
            r.failed(
                "tcp",
                f"no answer from {hc.hostname}:{hc.port} within {_timeout(route):g} s",
                "the node is off, the address is wrong or a firewall drops the packets; on "
                "slow links raise --connect-timeout",
            )
            raise _Stop from None
        except OSError as exc:
            r.failed("tcp", f"{hc.hostname}:{hc.port}: {exc.strerror or exc}", "check the network")
            raise _Stop from None
        if not banner.startswith("SSH-"):
            r.failed(
                "tcp",
                f"{hc.hostname}:{hc.port} answers, but not with SSH: {banner[:80]!r}",
                "another service listens on that port; use sshd's port",
            )
            raise _Stop from None
        ms = (time.monotonic() - t0) * 1000
        r.passed("tcp", f"{hc.hostname}:{hc.port} answers {banner[:60]} ({ms:.0f} ms)")

    async def _login(self, route: Route) -> asyncssh.SSHClientConnection:
        r, hc = self.report, route.hc
        tunnel = None
        try:
            if route.chain:
                tunnel = await self.shared.bastion(route.chain).get()
        except _HostFailure as exc:
            r.failed("host key" if "host key" in exc.reason else "tcp", exc.reason, _fix(exc))
            raise _Stop from None
        client = make_client(hc, tunnel, self.shared)
        try:
            conn = await connect_host(self.shared, hc, tunnel, client)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a step's message
            fail = classify(exc, client, route, self.shared)
            step = {"hostkey_changed": "host key", "auth_failed": "auth"}.get(fail.state)
            if step is None:
                # After a good TCP check a failure here belongs to the SSH login itself.
                direct_ok = r.step("tcp").ok and not route.chain and not hc.proxy_command
                step = "host key" if client.problem else ("auth" if direct_ok else "tcp")
            if step == "auth":
                r.passed("host key", f"'{client.policy.name}' known")
            r.failed(step, fail.reason, _fix(fail))
            raise _Stop from None
        key = conn.get_server_host_key()
        fp = f"{key.get_algorithm()} {key.get_fingerprint()}" if key else "?"
        how = (
            "accepted and remembered in " + client.policy.added_to
            if client.policy.added_to
            else "known"
        )
        detail = f"{fp} for '{client.policy.name}' {how}"
        if client.policy.warning:
            detail += f"; {client.policy.warning}"
        r.passed("host key", detail)
        r.passed("auth", f"logged in as {hc.user}")
        return conn

    async def _agent(self, conn: asyncssh.SSHClientConnection) -> None:
        from verl_top.agent.ship import BOOTSTRAP, agent_payload

        r, python = self.report, self.settings.python
        q = shlex.quote(python)
        probe = f"command -v {q} && {q} -c 'import sys; print(sys.version.split()[0])'"
        res = await conn.run(probe, check=False, timeout=self.wait_s)
        out = [clean_text(x) for x in str(res.stdout or "").splitlines() if x.strip()]
        if res.exit_status != 0 or len(out) < 2:
            r.failed(
                "python3",
                f"{python} not found on the login PATH of {r.target}",
                "install Python >= 3.8 on the node, or pass --python /path/to/python3",
            )
            raise _Stop
        version = tuple(int(p) for p in out[-1].split(".")[:2] if p.isdigit())
        if version < MIN_PYTHON:
            r.failed("python3", f"{out[0]} is Python {out[-1]}", "the agent needs Python >= 3.8")
            raise _Stop
        r.passed("python3", f"Python {out[-1]} ({out[0]})")
        await self._first_sample(
            conn, agent_command(python, BOOTSTRAP, self._args()), agent_payload(self._args())
        )

    def _args(self) -> list[str]:
        return ["--host", self.spec.name, "--once", "--no-procs", *self.agent_args]

    async def _first_sample(
        self, conn: asyncssh.SSHClientConnection, cmd: str, payload: str
    ) -> None:
        r = self.report
        t0 = time.monotonic()
        proc = await conn.create_process(cmd, encoding="utf-8", errors="replace")
        proc.stdin.write(payload)
        proc.stdin.write_eof()
        decoder = Decoder()
        seen: list = []

        async def read() -> None:
            async for line in proc.stdout:
                rec = decoder.decode(line)
                if rec is not None:
                    seen.append(rec)

        try:
            await asyncio.wait_for(read(), self.wait_s)
        except (asyncio.TimeoutError, TimeoutError):
            with contextlib.suppress(Exception):
                proc.send_signal("KILL")
        hello = next((x for x in seen if x.TYPE == "hello"), None)
        gpus = sum(1 for x in seen if x.TYPE == "gpu")
        try:
            done = await proc.wait(check=False, timeout=5)
        except (asyncssh.Error, asyncio.TimeoutError, TimeoutError):
            done = None
        status = done.exit_status if done is not None else None
        stderr = str(done.stderr or "") if done is not None else ""
        took = time.monotonic() - t0
        err = " | ".join(clean_text(x) for x in stderr.splitlines()[-4:])
        if hello is None:
            r.failed(
                "agent",
                f"the agent did not start (exit {status}){': ' + err if err else ''}",
                "the agent's stderr above says why; please report it with `verl-top --version`",
            )
            raise _Stop
        r.passed(
            "agent",
            f"started (pid {hello.pid}, Python {clean_text(hello.python)}, "
            f"backend {clean_text(hello.backend)})",
        )
        if not hello.gpus:
            why = clean_text(hello.error) or "no GPU found"
            r.failed(
                "nvml",
                f"backend {clean_text(hello.backend)}: {why}",
                "check `nvidia-smi` on the node (driver loaded? GPUs visible to this user?); "
                "without GPUs verl-top still shows CPU and memory",
            )
            raise _Stop
        driver = f", driver {clean_text(hello.driver)}" if hello.driver else ""
        r.passed("nvml", f"{len(hello.gpus)} GPUs via {clean_text(hello.backend)}{driver}")
        if gpus == 0:
            r.failed(
                "sample",
                f"no GPU sample within {self.wait_s:g} s",
                "the agent started but could not sample; run it by hand on the node to see why",
            )
            raise _Stop
        r.passed("sample", f"{gpus} GPU samples after {took:.1f} s")


def _fix(fail: _HostFailure) -> str:
    text = fail.reason
    if fail.state == "auth_failed":
        return (
            "add your public key to the node's authorized_keys, or pass -i KEY / --ssh-user "
            "(or IdentityFile / User in the ssh config)"
        )
    if fail.state == "hostkey_changed":
        return "verify the new key with the node's admin, then run the ssh-keygen -R command above"
    if "not in known_hosts" in text:
        return "`ssh` to the node once and check its key, or pass --accept-new-hosts"
    if "refused" in text:
        return "start sshd on the node, or fix the port"
    if "timed out" in text:
        return "the node is off, unreachable or firewalled; on slow links raise --connect-timeout"
    return "see the message"


async def doctor_hosts(
    settings: SshSettings,
    specs: Sequence[HostSpec],
    agent_args: Sequence[str] = (),
    wait_s: float = 15.0,
) -> list[HostReport]:
    """Run the doctor on every host (concurrently, within --max-handshakes)."""
    sem = asyncio.Semaphore(settings.max_handshakes)

    async def one(spec: HostSpec) -> HostReport:
        async with sem:
            own = SshSettings(**{f: getattr(settings, f) for f in _FIELDS})
            return await Doctor(own, spec, agent_args, wait_s).run()

    return list(await asyncio.gather(*(one(s) for s in specs)))


_FIELDS = [f for f in SshSettings.__dataclass_fields__ if not f.startswith("_")]


def format_reports(reports: Sequence[HostReport]) -> str:
    """Human-readable report: per host every step, the first failure and its fix."""
    out: list[str] = []
    for rep in reports:
        out.append(f"{rep.name}  {rep.target}".rstrip())
        for s in rep.steps:
            mark = {True: "ok  ", False: "FAIL", None: "-   "}[s.ok]
            detail = s.detail if s.ok is not None else "not tried"
            out.append(f"  {mark} {s.name:<9} {detail}")
        bad = rep.first_failure
        if bad is None:
            out.append("  => all steps passed")
        else:
            out.append(f"  => fails at {bad.name}: {bad.fix}")
        out.append("")
    good = sum(r.ok for r in reports)
    out.append(f"{good} of {len(reports)} hosts ready")
    return "\n".join(out)

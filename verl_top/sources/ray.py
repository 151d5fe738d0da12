"""Find a verl job from its Ray cluster: ``verl-top --ray http://HEAD:8265``.

The Ray dashboard's HTTP state API (``/api/v0/nodes``, ``/api/v0/actors``, ``/api/v0/logs``,
``/api/v0/jobs``) says which nodes are alive, which actors of the job run where and under
which pid, and which log files each node has. :class:`RaySource` polls it (every 10 s), runs
one node source per machine (the in-process local source for this machine, an SSH source for
the others), follows nodes joining and leaving, maps the actors to verl roles and ranks, and
asks the driver's node to follow the driver log. Everything it learns is emitted as
:class:`~verl_top.model.RayActors` records. See docs/ray.md.

Token authentication (Ray >= 2.52, ``RAY_AUTH_MODE=token``): the dashboard wants
``Authorization: Bearer <token>``; the token is taken, as Ray itself takes it, from
``RAY_AUTH_TOKEN``, the file named by ``RAY_AUTH_TOKEN_PATH``, or ``~/.ray/auth_token``
(``--ray-token`` wins over all three).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import re
import socket
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from verl_top.model import HostState, RayActor, RayActors, RayNode
from verl_top.protocol import Decoder, to_dict
from verl_top.roles import classify
from verl_top.sources.base import Emit
from verl_top.sources.hosts import host_problem
from verl_top.sources.http_client import HttpClient, HttpError, HttpOptions, run_blocking
from verl_top.untrusted import clean_text

if TYPE_CHECKING:
    from verl_top.sources.ssh import SshSettings

DEFAULT_PORT = 8265
POLL_S = 10.0
HTTP_DEADLINE_S = 10.0  # one whole request, however slowly the server drips headers or reply
MAX_BODY_BYTES = 64 * 1024 * 1024  # a state-API page of 10 000 detailed actors is ~20 MB
MAX_ROWS = 65_536  # rows read from one list reply (the state API pages at 10 000)
MAX_ROW_CHARS = 1 << 20  # characters of one row (a detailed actor is ~2 KB)
MAX_ROW_TEXT = 4096  # characters kept of one string field of a row
MAX_OTHER_CHARS = 4 << 20  # characters of a reply outside its rows (a node's log file list)
MAX_NODES = 4096
DEFAULT_LOGS_DIR = "/tmp/ray/session_latest/logs"
TOKEN_FILE = "~/.ray/auth_token"
LIST_LIMIT = 10000  # the state API's largest page (RAY_MAX_LIMIT_FROM_API_SERVER default)
LEFT_REASON = "left the Ray cluster"
# Ports of a head that are not the dashboard: GCS (ray start --port) and Ray Client.
_GCS_PORTS = {6379: "GCS", 10001: "Ray Client"}
_TOKEN_HELP = (
    "set RAY_AUTH_TOKEN, pass --ray-token, or put the token in ~/.ray/auth_token "
    "(`ray get-auth-token` on the head node prints it)"
)

_WORKER_DICT = re.compile(r"^(?P<group>\w*?)WorkerDict_(?P<pg>\d+):(?P<local>\d+)$")
_SERVER = re.compile(r"^(?:vllm|sglang)_server_(?:\w+_)?(?P<replica>\d+)_(?P<node>\d+)$")
_AGENT_LOOP = re.compile(r"^agent_loop_worker_(?P<index>\d+)(?:_|$)")


class RayError(Exception):
    """The Ray dashboard cannot be used; ``kind`` is config | unreachable | auth | not_ray | api."""

    def __init__(self, message: str, kind: str = "api") -> None:
        # Messages quote the server (reply previews, error bodies): cleaned here, once.
        super().__init__(clean_text(message, 2048))
        self.kind = kind


# --- address and token ------------------------------------------------------------------------


def dashboard_url(address: str | None, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The dashboard's base URL for ``--ray [ADDRESS]``, and a note when it was rewritten.

    No address: ``RAY_API_SERVER_ADDRESS``, then ``RAY_ADDRESS``. ``HOST`` gets the default
    port 8265; a GCS (6379) or Ray Client (10001, ``ray://``) address becomes the dashboard
    port of the same host, with a note saying so. Raises RayError (kind config).
    """
    env = os.environ if env is None else env
    text = (address or "").strip()
    origin = "--ray"
    if not text:
        for var in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):
            if env.get(var, "").strip():
                text, origin = env[var].strip(), var
                break
        else:
            raise RayError(
                "--ray without an address needs RAY_ADDRESS (or RAY_API_SERVER_ADDRESS) to be "
                "set; give it as --ray http://HEAD:8265",
                "config",
            )
    if text == "auto":
        raise RayError(
            f"{origin}=auto means 'the cluster on this machine' to Ray; give verl-top the "
            "dashboard address instead: --ray http://HEAD:8265",
            "config",
        )
    parsed = urllib.parse.urlsplit(text if "://" in text else f"http://{text}")
    scheme = parsed.scheme.lower()
    if scheme not in ("http", "https", "ray"):
        raise RayError(f"{origin} {text}: not an http(s) address of a Ray dashboard", "config")
    try:
        host, port = parsed.hostname, parsed.port
    except ValueError as exc:
        raise RayError(f"{origin} {text}: {exc}", "config") from None
    if not host:
        raise RayError(f"{origin} {text}: no host name in the address", "config")
    note = ""
    if scheme == "ray" or port in _GCS_PORTS:
        what = _GCS_PORTS.get(port or 10001, "Ray Client")
        note = (
            f"{origin} {text} is the {what} address; using the dashboard at "
            f"http://{_host_for_url(host)}:{DEFAULT_PORT} (give that address to silence this)"
        )
        scheme, port = "http", DEFAULT_PORT
    url = f"{scheme}://{_host_for_url(host)}:{port or DEFAULT_PORT}{parsed.path.rstrip('/')}"
    return url, note


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class Token:
    """A dashboard token and where it came from (said in messages; the value never is)."""

    value: str
    origin: str


def find_token(
    flag: str | None = None, env: Mapping[str, str] | None = None, home: Path | None = None
) -> Token | None:
    """The token to send, in Ray's own order after ``--ray-token``; None when there is none.

    Raises RayError (kind config) when ``RAY_AUTH_TOKEN_PATH`` names an unreadable or empty
    file: Ray treats that as fatal too, rather than silently trying the next place.
    """
    env = os.environ if env is None else env
    if flag and flag.strip():
        return Token(flag.strip(), "--ray-token")
    if env.get("RAY_AUTH_TOKEN", "").strip():
        return Token(env["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN")
    path_var = env.get("RAY_AUTH_TOKEN_PATH", "").strip()
    if path_var:
        path = Path(path_var).expanduser()
        try:
            value = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise RayError(
                f"RAY_AUTH_TOKEN_PATH={path_var}: cannot read it ({exc.strerror or exc})", "config"
            ) from None
        if not value:
            raise RayError(f"RAY_AUTH_TOKEN_PATH={path_var}: the file is empty", "config")
        return Token(value, f"RAY_AUTH_TOKEN_PATH={path_var}")
    default = (home / ".ray" / "auth_token") if home else Path(TOKEN_FILE).expanduser()
    with contextlib.suppress(OSError):
        value = default.read_text(encoding="utf-8").strip()
        if value:
            return Token(value, str(default))
    return None


# --- HTTP -----------------------------------------------------------------------------------


def _keep(*keys: str, nested: Mapping[str, tuple[str, ...]] | None = None) -> Callable[[Any], Any]:
    """A row converter for the streamed state API: only ``keys`` of a dict row (and only
    ``nested[key]`` inside those sub-dicts), strings cut at MAX_ROW_TEXT. A 60 MiB reply of
    detailed actors then costs what verl-top keeps, not 1.5 GB of decoded JSON."""
    nested = nested or {}

    def short(value: Any) -> Any:
        return value[:MAX_ROW_TEXT] if isinstance(value, str) else value

    def convert(row: Any) -> Any:
        if not isinstance(row, dict):
            return None
        out: dict[str, Any] = {}
        for key in keys:
            if key not in row:
                continue
            value = row[key]
            if key in nested:
                value = (
                    {k: short(value[k]) for k in nested[key] if k in value}
                    if isinstance(value, dict)
                    else None
                )
            elif isinstance(value, dict | list):
                value = None  # a structure where a scalar belongs: not kept
            out[key] = short(value)
        return out

    return convert


NODE_ROW = _keep(
    "node_id", "node_ip", "state", "is_head_node", "resources_total",
    nested={"resources_total": ("GPU",)},
)  # fmt: skip
ACTOR_ROW = _keep(
    "actor_id", "node_id", "state", "name", "class_name", "pid", "job_id", "required_resources",
    nested={"required_resources": ("GPU",)},
)  # fmt: skip
JOB_ROW = _keep(
    "submission_id", "status", "driver_node_id", "driver_info", "job_id", "entrypoint",
    "start_time", nested={"driver_info": ("node_ip_address",)},
)  # fmt: skip
SUMMARY_ROW = _keep(
    "hostname", "raylet", nested={"raylet": ("nodeId", "nodeManagerHostname", "rayletSocketName")}
)


class Dashboard:
    """JSON GETs against one Ray dashboard, every failure turned into a RayError.

    On the shared asynchronous HTTP client (verl_top/sources/http_client.py): one deadline per
    request covering connect, headers and body (a dashboard dripping its headers or its reply
    is cut there), keep-alive connections, a bounded body, and list replies decoded row by
    row as they arrive, each row cut to the fields verl-top reads.
    """

    def __init__(
        self, url: str, token: Token | None = None, deadline: float = HTTP_DEADLINE_S
    ) -> None:
        self.url = url
        self.token = token
        self.deadline = deadline  # the whole request, reply body included
        self.http = HttpClient(
            url,
            HttpOptions(bearer_token=token.value if token else None),
            deadline=deadline,
            max_body=MAX_BODY_BYTES,
            connections=4,
        )

    @property
    def requests(self) -> int:
        """Requests sent so far."""
        return self.http.requests

    async def close(self) -> None:
        """Close the pooled connections."""
        await self.http.close()

    async def get(
        self,
        path: str,
        params: Sequence[tuple[str, str]] = (),
        array: tuple[str, ...] = (),
        convert: Callable[[Any], Any] | None = None,
    ) -> Any:
        """The decoded JSON body of ``GET path?params`` (the array at ``array`` streamed)."""
        try:
            answer = await self.http.get_json(
                path, list(params), array, convert, MAX_ROWS, MAX_ROW_CHARS, MAX_OTHER_CHARS
            )
        except HttpError as exc:
            raise self._error(exc, path) from None
        return answer.doc

    async def body(
        self, path: str, params: Sequence[tuple[str, str]] = (), accept: str = "*/*"
    ) -> bytes:
        """The raw body of ``GET path?params`` (a text endpoint such as ``/worker/traceback``):
        at most MAX_BODY_BYTES, within the request's deadline."""
        try:
            return await self.http.get_bytes(path, list(params), accept)
        except HttpError as exc:
            raise self._error(exc, path) from None

    async def state(
        self,
        path: str,
        params: Sequence[tuple[str, str]] = (),
        convert: Callable[[Any], Any] | None = None,
    ) -> Any:
        """``data.result`` of a state-API reply (``{"result": ok, "msg": ..., "data": ...}``);
        with ``convert``, the list rows at ``data.result.result`` go through it one by one."""
        array = ("data", "result", "result") if convert is not None else ()
        body = await self.get(path, params, array, convert)
        if not isinstance(body, dict) or not isinstance(body.get("data"), dict):
            raise RayError(
                f"{self.url}{path} answered JSON that is not a Ray state-API reply "
                f"({_preview(json.dumps(body)[:200].encode())}): is this the Ray dashboard?",
                "not_ray",
            )
        if body.get("result") is False:
            raise RayError(f"Ray state API {path}: {body.get('msg') or 'request failed'}", "api")
        return body["data"].get("result")

    def _error(self, exc: HttpError, path: str) -> RayError:
        where = f"cannot reach the Ray dashboard at {self.url}"
        kind = exc.kind
        if kind == "status":
            return self._http_error(exc.status or 0, _error_text(exc.body), path)
        if kind == "not_json":
            if "deeper" in str(exc) or "longer than" in str(exc) or "besides" in str(exc):
                return RayError(f"{self.url}{path}: {exc}; reply refused", "api")
            return RayError(
                f"{self.url}{path} answered, but not with JSON ({exc}): is this the Ray "
                f"dashboard (port {DEFAULT_PORT})?",
                "not_ray",
            )
        if kind == "too_large":
            return RayError(f"{self.url}{path}: {exc}", "api")
        if kind == "timeout":
            if exc.got:
                return RayError(
                    f"{self.url}{path}: no complete answer within {self.deadline:g} s "
                    f"({exc.got} characters so far): the dashboard is overloaded, or this is "
                    "not a Ray dashboard",
                    "unreachable",
                )
            return RayError(
                f"{where}: no answer within {self.deadline:g} s (firewall, or the wrong address?)",
                "unreachable",
            )
        if kind == "refused":
            return RayError(
                f"{where}: connection refused (is the head up, and its dashboard started with "
                "ray[default] installed? A dashboard bound to 127.0.0.1 on the head is reached "
                "through a tunnel: ssh -L 8265:127.0.0.1:8265 HEAD, then --ray localhost:8265)",
                "unreachable",
            )
        if kind == "not_http":
            return RayError(
                f"{self.url} did not answer as an HTTP server ({exc}): is this the GCS or Ray "
                f"Client port? The dashboard listens on port {DEFAULT_PORT}",
                "not_ray",
            )
        return RayError(f"{where}: {exc}", "unreachable")

    def _http_error(self, code: int, text: str, path: str) -> RayError:
        if code == 401:
            if self.token is None:
                return RayError(
                    f"the Ray dashboard at {self.url} requires a token (HTTP 401: {text}): "
                    f"{_TOKEN_HELP}",
                    "auth",
                )
            return RayError(
                f"the Ray dashboard at {self.url} says the token is missing (HTTP 401: {text}) "
                f"although verl-top sent the one from {self.token.origin}: a proxy in between "
                "may drop the Authorization header",
                "auth",
            )
        if code == 403:
            if self.token is None:
                return RayError(
                    f"the Ray dashboard at {self.url} refused access (HTTP 403: {text}) and "
                    f"verl-top sent no token: {_TOKEN_HELP}",
                    "auth",
                )
            return RayError(
                f"the Ray dashboard at {self.url} rejected the token from {self.token.origin} "
                f"(HTTP 403: {text}): it is not this cluster's token; `ray get-auth-token` on "
                "the head node prints the right one",
                "auth",
            )
        if code == 404:
            return RayError(
                f"{self.url}{path} does not exist (HTTP 404): not a Ray dashboard, or a Ray "
                "older than 2.0 without the state API",
                "not_ray",
            )
        return RayError(f"Ray dashboard {self.url}{path}: HTTP {code}: {text}", "api")


def _preview(body: bytes) -> str:
    text = body[:60].decode("utf-8", "replace").replace("\n", " ").strip()
    return repr(text + ("…" if len(body) > 60 else ""))


def _error_text(raw: bytes) -> str:
    """The message of an error reply: its JSON ``msg``, else its first bytes."""
    raw = raw[:300]
    try:
        body = json.loads(raw)
        if isinstance(body, dict) and body.get("msg"):
            return str(body["msg"])[:200]
    except ValueError:
        pass
    return raw.decode("utf-8", "replace").strip()[:200]


# --- the cluster as the state API shows it ---------------------------------------------------


@dataclass
class NodeExtra:
    """What the dashboard's node summary adds: the hostname and the node's logs folder."""

    hostname: str = ""
    logs_dir: str = ""


@dataclass
class ClusterView:
    """One poll: every node (alive or dead), node extras and the job's live actors."""

    nodes: list[RayNode]
    actors: list[dict[str, Any]] = field(default_factory=list)
    extras: dict[str, NodeExtra] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)  # nodes not monitored, and why


def parse_nodes(rows: Any, refused: list[str] | None = None) -> list[RayNode]:
    """RayNodes from ``/api/v0/nodes`` rows (``node_id``, ``node_ip``, ``state``, ...).

    A node whose IP is not an IPv4/IPv6 address is refused (it would reach SSH) and said in
    ``refused`` with its node id; at most MAX_NODES nodes are kept.
    """
    nodes: list[RayNode] = []
    for row in _rows(rows):
        node_id, ip = row.get("node_id"), row.get("node_ip")
        if not isinstance(node_id, str) or not isinstance(ip, str) or not ip:
            continue
        node_id = clean_text(node_id, 128)
        problem = ip_problem(ip)
        if problem:
            if refused is not None:
                refused.append(f"Ray node {node_id}: {problem}; not monitored")
            continue
        if len(nodes) >= MAX_NODES:
            if refused is not None:
                refused.append(f"more than {MAX_NODES} Ray nodes: the rest are not monitored")
            break
        resources = row.get("resources_total")
        gpus = resources.get("GPU") if isinstance(resources, dict) else None
        nodes.append(
            RayNode(
                node_id=node_id,
                ip=ip,
                gpus=float(gpus) if isinstance(gpus, int | float) else 0.0,
                is_head=bool(row.get("is_head_node")),
                alive=row.get("state") == "ALIVE",
            )
        )
    return nodes


def parse_summary(body: Any) -> dict[str, NodeExtra]:
    """Hostname and logs folder per node id from the dashboard's ``/nodes?view=summary``.

    The raylet socket lives in ``<session dir>/sockets/raylet``, so its path gives the node's
    real logs folder even when Ray was started with ``--temp-dir``.
    """
    data = body.get("data") if isinstance(body, dict) else None
    summary = data.get("summary") if isinstance(data, dict) else None
    out: dict[str, NodeExtra] = {}
    for item in summary if isinstance(summary, list) else []:
        raylet = item.get("raylet") if isinstance(item, dict) else None
        if not isinstance(raylet, dict) or not isinstance(raylet.get("nodeId"), str):
            continue
        hostname = item.get("hostname") or raylet.get("nodeManagerHostname") or ""
        if not isinstance(hostname, str) or host_problem(hostname):
            hostname = ""  # shown and keyed by its IP instead: a name must be safe for SSH
        sock = raylet.get("rayletSocketName")
        logs_dir = ""
        if isinstance(sock, str) and sock.endswith("/sockets/raylet"):
            logs_dir = clean_text(f"{sock[: -len('/sockets/raylet')]}/logs", 4096)
        out[clean_text(raylet["nodeId"], 128)] = NodeExtra(hostname, logs_dir)
    return out


def ip_problem(ip: str) -> str:
    """Why a Ray node IP may not be handed to SSH ("" for an IPv4 or IPv6 address)."""
    try:
        ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return f"bad node IP {clean_text(repr(ip), 80)}"
    return host_problem(ip)


def _rows(result: Any) -> list[dict[str, Any]]:
    rows = result.get("result") if isinstance(result, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def map_actors(rows: Sequence[dict[str, Any]], nodes: Mapping[str, RayNode]) -> list[RayActor]:
    """RayActors (role, rank, node, pid) from ``/api/v0/actors`` rows of live actors.

    Roles come from the actor name first (``abc123WorkerDict_0:1``, ``vllm_server_0_0``), then
    the class name (``TaskRunner``). A WorkerDict's global rank is the sizes of the placement
    groups before its own plus its local rank, as verl numbers them.
    """
    actors = []
    for row in rows:
        if row.get("state") not in (None, "ALIVE"):
            continue
        name = str(row.get("name") or "")
        class_name = str(row.get("class_name") or "")
        role = classify(name).role if name else "other"
        if role == "other":
            role = classify(class_name).role
        node = nodes.get(str(row.get("node_id") or ""))
        pid = row.get("pid")
        resources = row.get("required_resources")
        gpus = resources.get("GPU") if isinstance(resources, dict) else None
        actor = RayActor(
            name=name,
            class_name=class_name,
            actor_id=str(row.get("actor_id") or ""),
            node_id=str(row.get("node_id") or ""),
            node_ip=node.ip if node else "",
            host=node.name if node else "",
            pid=pid if isinstance(pid, int) and pid > 0 else None,
            role=role,
            gpus=float(gpus) if isinstance(gpus, int | float) else None,
            job_id=str(row.get("job_id") or ""),
        )
        _name_ranks(actor)
        actors.append(actor)
    _worker_ranks(actors)
    return sorted(
        actors, key=lambda a: (a.role, a.group, a.rank if a.rank is not None else -1, a.name)
    )


def _name_ranks(actor: RayActor) -> None:
    m = _WORKER_DICT.match(actor.name)
    if m:
        actor.group = m.group("group")
        actor.local_rank = int(m.group("local"))
        return
    m = _SERVER.match(actor.name)
    if m:
        actor.rank, actor.local_rank = int(m.group("replica")), int(m.group("node"))
        return
    m = _AGENT_LOOP.match(actor.name)
    if m:
        actor.rank = int(m.group("index"))


def _worker_ranks(actors: Sequence[RayActor]) -> None:
    """Global ranks of WorkerDicts, per worker group: offset of the placement group + local."""
    groups: dict[str, list[tuple[int, RayActor]]] = {}
    for a in actors:
        m = _WORKER_DICT.match(a.name)
        if m:
            groups.setdefault(a.group, []).append((int(m.group("pg")), a))
    for members in groups.values():
        sizes: dict[int, int] = {}
        for pg, a in members:
            sizes[pg] = max(sizes.get(pg, 0), (a.local_rank or 0) + 1)
        uniform = len(set(sizes.values())) == 1
        for pg, a in members:
            if all(p in sizes for p in range(pg)):
                offset: int | None = sum(sizes[p] for p in range(pg))
            elif uniform:  # a whole placement group is missing (its node left): sizes are equal
                offset = pg * sizes[pg]
            else:
                offset = None
            a.rank = None if offset is None else offset + (a.local_rank or 0)


@dataclass(frozen=True)
class JobInfo:
    """The job verl-top watches, as the dashboard's job list has it."""

    job_id: str = ""
    entrypoint: str = ""  # the command the job was launched with


def ray_version(body: Any) -> str:
    """``ray_version`` of a ``/api/version`` reply ('' when it has none)."""
    value = body.get("ray_version") if isinstance(body, dict) else None
    return clean_text(value, 64) if isinstance(value, str) else ""


def pick_job(rows: Sequence[dict[str, Any]], job_id: str = "") -> JobInfo | None:
    """The job whose id is ``job_id`` (the TaskRunner actor's), else the newest running one,
    from ``/api/v0/jobs`` rows; None when neither is there."""

    def info(row: dict[str, Any]) -> JobInfo | None:
        entry, jid = row.get("entrypoint"), row.get("job_id") or row.get("submission_id")
        if not isinstance(entry, str) or not entry.strip():
            return None
        return JobInfo(clean_text(jid, 64) if isinstance(jid, str) else "", entry.strip())

    if job_id:
        for row in rows:
            if row.get("job_id") == job_id and (found := info(row)) is not None:
                return found
    running = [r for r in rows if r.get("status") == "RUNNING"]
    running.sort(key=lambda r: r["start_time"] if isinstance(r.get("start_time"), int) else 0)
    for row in reversed(running):
        if (found := info(row)) is not None:
            return found
    return None


async def fetch_view(dash: Dashboard, detail: bool = False) -> ClusterView:
    """Nodes, node extras and live actors in three requests."""
    refused: list[str] = []
    listed = await dash.state("/api/v0/nodes", [("limit", str(LIST_LIMIT))], NODE_ROW)
    nodes = parse_nodes(listed, refused)
    if not nodes:
        why = f" that can be monitored ({'; '.join(refused[:3])})" if refused else ""
        raise RayError(f"the Ray dashboard at {dash.url} lists no node{why}", "api")
    try:
        extras = parse_summary(
            await dash.get("/nodes", [("view", "summary")], ("data", "summary"), SUMMARY_ROW)
        )
    except RayError as exc:
        if exc.kind == "auth":
            raise
        extras = {}  # older or trimmed dashboards: hostnames and logs folders stay default
    params = [
        ("limit", str(LIST_LIMIT)),
        ("filter_keys", "state"),
        ("filter_predicates", "="),
        ("filter_values", "ALIVE"),
    ]
    if detail:
        params.append(("detail", "true"))
    actors = _rows(await dash.state("/api/v0/actors", params, ACTOR_ROW))
    return ClusterView(nodes=nodes, actors=actors, extras=extras, refused=refused)


def first_look(dash: Dashboard) -> ClusterView:
    """:func:`fetch_view` from synchronous code (the CLI, before the app's loop runs); the
    connections it opened are closed again."""

    async def look() -> ClusterView:
        try:
            return await fetch_view(dash)
        finally:
            await dash.close()

    return run_blocking(look)


async def list_logs(dash: Dashboard, node_id: str, pattern: str) -> list[str]:
    """File names (relative to the node's logs folder) matching ``pattern`` on a node."""
    result = await dash.state("/api/v0/logs", [("node_id", node_id), ("glob", pattern)])
    names: list[str] = []
    if isinstance(result, dict):
        for files in result.values():
            if isinstance(files, list):
                names.extend(f for f in files if isinstance(f, str))
    return sorted(set(names))


def local_addresses() -> set[str]:
    """This machine's IP addresses and host names (to recognise its own Ray node)."""
    names = {"127.0.0.1", "::1", "localhost", socket.gethostname().lower()}
    with contextlib.suppress(Exception):
        import psutil

        for addrs in psutil.net_if_addrs().values():
            names.update(a.address.split("%", 1)[0] for a in addrs if a.family in _INET)
    return names


_INET = (socket.AF_INET, socket.AF_INET6)


# --- the source -----------------------------------------------------------------------------


class NodeSource(Protocol):
    """What the Ray source needs of a per-node source: ``run`` and ``follow``."""

    name: str

    async def run(self, emit: Emit) -> None: ...

    def follow(self, kind: str, path: str, from_start: bool = False) -> Any: ...


SourceFactory = Callable[[RayNode], NodeSource]


@dataclass
class _Running:
    node: RayNode
    source: NodeSource
    task: asyncio.Task[None]


class RaySource:
    """The Ray cluster as a source: supervises one node source per machine of the cluster.

    Nodes are keyed by IP (several raylets on one machine are one host to monitor) and shown
    under their hostname when the dashboard tells it and it is unique, else their IP.
    """

    def __init__(
        self,
        dash: Dashboard,
        factory: SourceFactory,
        poll_s: float = POLL_S,
        find_driver_log: bool = True,
        local_names: set[str] | None = None,
        first: ClusterView | None = None,
        note: str = "",
        on_stop: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.dash = dash
        self.factory = factory
        self.poll_s = poll_s
        self.find_driver_log = find_driver_log
        self.local_names = local_addresses() if local_names is None else local_names
        self.name = f"ray:{dash.url}"
        self.url = dash.url
        self.running: dict[str, _Running] = {}  # by node IP
        self._names: dict[str, str] = {}  # node IP -> shown name, fixed at first sight
        self._view = first
        self._nodes: list[RayNode] = self.name_nodes(first) if first else []
        self._actors: list[RayActor] = []
        self._detail: dict[str, float | None] = {}  # actor id -> GPUs held (detail view)
        self._driver: tuple[str, str] | None = None  # (host, path) being followed
        self._driver_for: tuple[str, int | None] | None = None  # TaskRunner it belongs to
        self._note = note
        self._version: str | None = None  # None: not asked yet ("": the dashboard has none)
        self._job = JobInfo()
        self._last: tuple[Any, ...] | None = None
        self.polls = 0
        self.on_stop = on_stop  # e.g. close the SSH bastions the node sources share
        self.decoder = Decoder()

    # naming

    def name_nodes(self, view: ClusterView) -> list[RayNode]:
        """RayNodes with ``name``, ``hostname`` and ``local`` filled (names never change)."""
        out = []
        taken = set(self._names.values())
        for node in view.nodes:
            extra = view.extras.get(node.node_id, NodeExtra())
            name = self._names.get(node.ip)
            if name is None:
                wanted = extra.hostname
                name = wanted if wanted and wanted not in taken else node.ip
                if node.alive:  # a dead node's IP may come back alive later under its hostname
                    self._names[node.ip] = name
                    taken.add(name)
            local = node.ip in self.local_names or extra.hostname.lower() in self.local_names
            out.append(replace(node, name=name, hostname=extra.hostname, local=local))
        return out

    def node_names(self) -> dict[str, str]:
        """Every way a user may name a live node (name, IP, hostname) -> its shown name."""
        out: dict[str, str] = {}
        for n in self._nodes:
            if n.alive:
                for key in (n.ip, n.hostname, n.name):
                    if key:
                        out[key] = n.name
        return out

    # run loop

    async def run(self, emit: Emit) -> None:
        """Poll the dashboard until cancelled; node sources run as child tasks."""
        try:
            while True:
                await self.poll(emit)
                await asyncio.sleep(self.poll_s)
        finally:
            await self._stop_all()

    async def poll(self, emit: Emit) -> None:
        """One round: nodes joined/left, actors, driver log; emits what changed."""
        self.polls += 1
        try:
            # Only ask for the (larger) detail view when actors we have not seen appear.
            view = await fetch_view(self.dash, False)
            new = {r.get("actor_id") for r in view.actors} - set(self._detail)
            if new:
                view = await fetch_view(self.dash, True)
                for row in view.actors:
                    res = row.get("required_resources")
                    gpus = res.get("GPU") if isinstance(res, dict) else None
                    self._detail[str(row.get("actor_id"))] = (
                        float(gpus) if isinstance(gpus, int | float) else None
                    )
        except RayError as exc:
            self._note = f"Ray: {exc} (nodes kept as last seen; retrying every {self.poll_s:g} s)"
            self._emit(emit)
            return
        self._view = view
        self._nodes = self.name_nodes(view)
        if self._note.startswith("Ray: "):
            self._note = ""  # the dashboard answers again
        if view.refused:  # said while it lasts (the RayActors record repeats only changes)
            more = f" (+{len(view.refused) - 2} more)" if len(view.refused) > 2 else ""
            self._note = "; ".join(view.refused[:2]) + more
        elif self._note.startswith("Ray node ") or self._note.startswith("more than "):
            self._note = ""
        by_id = {n.node_id: n for n in self._nodes}
        self._actors = map_actors(view.actors, by_id)
        for actor in self._actors:
            if actor.gpus is None:
                actor.gpus = self._detail.get(actor.actor_id)
        await self._sync_nodes(emit)
        if self.find_driver_log:
            await self._driver_log(view, by_id)
        await self._snapshot_facts()
        self._emit(emit)

    async def _snapshot_facts(self) -> None:
        """The Ray version (once) and the job's launch command (when the job changed), for a
        snapshot; a dashboard without them leaves them empty (the snapshot says unknown)."""
        if self._version is None:
            try:
                self._version = ray_version(await self.dash.get("/api/version"))
            except RayError as exc:
                if exc.kind != "unreachable":  # a 404 from an older or trimmed dashboard
                    self._version = ""
        runner = next((a for a in self._actors if a.role == "driver" and a.job_id), None)
        wanted = runner.job_id if runner is not None else ""
        if self._job.entrypoint and (not wanted or wanted == self._job.job_id):
            return  # known, and the job is the same
        try:
            rows = await self.dash.state("/api/v0/jobs", [("limit", str(LIST_LIMIT))], JOB_ROW)
        except RayError:
            return  # asked again at the next poll
        self._job = pick_job(_rows(rows), wanted) or self._job

    def _emit(self, emit: Emit) -> None:
        driver = f"{self._driver[0]}:{self._driver[1]}" if self._driver else ""
        version = self._version or ""
        state = (self._nodes, self._actors, driver, self._note, version, self._job)
        if state == self._last:
            return  # the recorder keeps every record: send a snapshot only when it changed
        self._last = (list(self._nodes), list(self._actors), driver, self._note, version, self._job)
        record = RayActors(
            host=self.name,
            t=time.time(),
            nodes=list(self._nodes),
            actors=list(self._actors),
            driver_log=driver,
            note=self._note,
            ray_version=version,
            job_id=self._job.job_id,
            entrypoint=self._job.entrypoint,
        )
        # Actor names, classes and job ids are the dashboard's strings: through the record
        # boundary like an agent's records (cleaned, bounded, counted).
        checked = self.decoder.decode_dict(to_dict(record))
        if checked is not None:
            emit(checked)
        for dropped in self.decoder.take_drops(self.name, record.t):
            emit(dropped)

    async def _sync_nodes(self, emit: Emit) -> None:
        alive: dict[str, RayNode] = {}
        for n in self._nodes:
            if n.alive and n.ip not in alive:
                alive[n.ip] = n
        for ip, node in alive.items():
            if ip not in self.running:
                source = self.factory(node)
                task = asyncio.create_task(source.run(emit), name=f"ray-node:{node.name}")
                self.running[ip] = _Running(node, source, task)
                if self._driver and self._driver[0] == node.name:
                    source.follow("verl", self._driver[1], from_start=True)
        for ip in [ip for ip in self.running if ip not in alive]:
            gone = self.running.pop(ip)
            await _cancel(gone.task)
            emit(HostState(host=gone.node.name, t=time.time(), state="down", reason=LEFT_REASON))

    async def _stop_all(self) -> None:
        for r in self.running.values():
            r.task.cancel()
        for r in list(self.running.values()):
            await _cancel(r.task)
        self.running.clear()
        with contextlib.suppress(Exception):
            await self.dash.close()
        if self.on_stop is not None:
            with contextlib.suppress(Exception):
                await self.on_stop()

    # driver log

    async def _driver_log(self, view: ClusterView, by_id: dict[str, RayNode]) -> None:
        runner = next((a for a in self._actors if a.role == "driver" and a.pid), None)
        key = (runner.actor_id, runner.pid) if runner else None
        if self._driver is not None and (key is None or key == self._driver_for):
            return  # following it already (or the job ended: keep the last log)
        try:
            found = await self._locate_driver_log(view, by_id, runner)
        except RayError as exc:
            self._note = f"Ray: driver log not found: {exc}"
            return
        if isinstance(found, str):
            self._note = found
            return
        node, path = found
        self._driver, self._driver_for = (node.name, path), key
        self._note = f"Ray: following the driver log {node.name}:{path}"
        running = self.running.get(node.ip)
        if running is not None:
            running.source.follow("verl", path, from_start=True)

    async def _locate_driver_log(
        self, view: ClusterView, by_id: dict[str, RayNode], runner: RayActor | None
    ) -> tuple[RayNode, str] | str:
        """(node, path) of the driver's stdout, or a sentence saying where it looked."""
        if runner is not None:
            node = by_id.get(runner.node_id)
            if node is None:
                return f"Ray: TaskRunner (pid {runner.pid}) is on an unknown node {runner.node_id}"
            logs = self._logs_dir(view, node)
            names = [
                n
                for n in await list_logs(self.dash, node.node_id, f"worker-*-{runner.pid}.out")
                if n.endswith(f"-{runner.pid}.out")
            ]
            if names:
                return node, f"{logs}/{names[-1]}"
            return (
                f"Ray: no driver log: the TaskRunner (pid {runner.pid}) runs on {node.name}, but "
                f"its logs folder {logs} has no worker-*-{runner.pid}.out; give --verl-log "
                f"{node.name}:PATH"
            )
        jobs = _rows(await self.dash.state("/api/v0/jobs", [("limit", str(LIST_LIMIT))], JOB_ROW))
        for job in jobs:
            sid = job.get("submission_id")
            if job.get("status") != "RUNNING" or not isinstance(sid, str) or not sid:
                continue
            info = job.get("driver_info") if isinstance(job.get("driver_info"), dict) else {}
            ip = info.get("node_ip_address") if isinstance(info, dict) else None
            node = next(
                (
                    n
                    for n in self._nodes
                    if n.alive and (n.node_id == job.get("driver_node_id") or n.ip == ip)
                ),
                None,
            )
            if node is None:
                continue
            name = f"job-driver-{sid}.log"
            if name in await list_logs(self.dash, node.node_id, name):
                return node, f"{self._logs_dir(view, node)}/{name}"
        heads = [n for n in self._nodes if n.alive and n.is_head]
        where = (
            f" (looked for a running submitted job's job-driver-*.log on {heads[0].name})"
            if heads
            else ""
        )
        return (
            "Ray: no driver log yet: no TaskRunner actor and no running submitted job"
            f"{where}; give --verl-log HOST:PATH to follow one"
        )

    @staticmethod
    def _logs_dir(view: ClusterView, node: RayNode) -> str:
        extra = view.extras.get(node.node_id)
        return extra.logs_dir if extra and extra.logs_dir else DEFAULT_LOGS_DIR


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


# --- building it from the command line ------------------------------------------------------


@dataclass
class RaySettings:
    """The Ray source's settings (built by the CLI from ``--ray`` and the node options).

    ``follows`` are (kind, path) files per node name (or IP) given with ``HOST:PATH``.
    """

    KIND: ClassVar[str] = "ray"
    address: str | None  # --ray ADDRESS ("" = $RAY_ADDRESS)
    ssh: SshSettings
    token: str | None = None
    interval: float = 1.0
    backend: str = "auto"
    replay_trace: str | None = None
    follows: Mapping[str, list[tuple[str, str]]] = field(default_factory=dict)
    find_driver_log: bool = True


def build_sources(settings: RaySettings) -> list[RaySource]:
    """The registry's entry point (raises RayError, like :func:`build_ray_source`)."""
    return [build_ray_source(settings)]


def build_ray_source(settings: RaySettings) -> RaySource:
    """The Ray source, after one synchronous look at the dashboard.

    Raises RayError (unusable dashboard, unknown host in ``settings.follows``).
    """
    from verl_top.sources.hosts import HostSpec
    from verl_top.sources.local import LocalSource
    from verl_top.sources.ssh import SshSource

    url, note = dashboard_url(settings.address)
    dash = Dashboard(url, find_token(settings.token))
    first = first_look(dash)  # fail now, with the reason, rather than inside the UI
    ssh = settings.ssh
    agent_args = ["--interval", str(settings.interval)]
    if settings.backend != "auto":  # the same GPU backend on every node, as with --hosts
        agent_args += ["--backend", settings.backend]
    trace = settings.replay_trace
    if trace:
        agent_args += ["--replay-trace", os.path.abspath(trace)]
    by_name: dict[str, list[tuple[str, str]]] = {}

    def factory(node: RayNode) -> NodeSource:
        files = by_name.get(node.name, [])
        if node.local:
            return LocalSource(
                interval=settings.interval,
                backend=settings.backend,
                follows=[(k, p, True) for k, p in files],
                replay_trace=trace,
                host=node.name,
            )
        return SshSource(HostSpec(None, node.ip, alias=node.name), ssh, agent_args, files)

    source = RaySource(
        dash,
        factory,
        find_driver_log=settings.find_driver_log,
        first=first,
        note=note,
        on_stop=ssh.shared().close,
    )
    names = source.node_names()
    for host, files in settings.follows.items():
        if host not in names:
            known = ", ".join(sorted({n for n in names.values()})) or "none"
            raise RayError(
                f"{host}:{files[0][1]}: host {host} is not an alive node of the Ray cluster "
                f"(nodes: {known})",
                "config",
            )
        by_name.setdefault(names[host], []).extend(files)
    return source

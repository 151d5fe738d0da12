"""Command-line flags -> the typed settings objects of the sources (the CLI's side only).

argparse ends here: ``inputs.py`` and ``nccl/probe.py`` hand the parsed ``Namespace`` to these
functions and pass the returned settings on to ``sources/registry.py``; no source reads a
``Namespace``. Each function checks what it maps and raises ValueError with a sentence naming
the flag.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: a replay needs neither asyncssh nor the HTTP client
    from verl_top.sources.prometheus import PromSettings
    from verl_top.sources.ray import RaySettings
    from verl_top.sources.ssh import SshSettings


def ssh_settings(args: argparse.Namespace) -> SshSettings:
    """SSH options for all hosts from ``--identity``, ``--ssh-config``, ``--jump``, ..."""
    from verl_top.sources.hosts import parse_entry
    from verl_top.sources.ssh import SshSettings

    identities = tuple(str(Path(p).expanduser()) for p in (args.identity or ()))
    for path in identities:
        if not os.path.isfile(path):
            raise ValueError(f"-i {path}: no such key file")
    config = args.ssh_config
    if config is not None and not os.path.isfile(os.path.expanduser(config)):
        raise ValueError(f"--ssh-config {config}: no such file")
    if args.jump:
        try:
            for hop in args.jump.split(","):
                parse_entry(hop)
        except ValueError as exc:
            raise ValueError(f"--jump {args.jump}: {exc}") from None
    if args.max_handshakes < 1:
        raise ValueError("--max-handshakes must be at least 1")
    if args.connect_timeout is not None and args.connect_timeout <= 0:
        raise ValueError("--connect-timeout must be positive")
    return SshSettings(
        ssh_config=os.path.expanduser(config) if config else None,
        identities=identities,
        jump=args.jump or None,
        known_hosts=os.path.expanduser(args.known_hosts) if args.known_hosts else None,
        accept_new_hosts=bool(args.accept_new_hosts),
        connect_timeout=None if args.connect_timeout is None else float(args.connect_timeout),
        max_handshakes=int(args.max_handshakes),
        user=args.ssh_user or None,
    )


def ray_settings(
    args: argparse.Namespace,
    follows: Mapping[str, list[tuple[str, str]]],
    find_driver_log: bool,
) -> RaySettings:
    """The Ray source's settings from ``--ray``, ``--ray-token`` and the node options."""
    from verl_top.sources.ray import RaySettings

    return RaySettings(
        address=args.ray,
        ssh=ssh_settings(args),
        token=getattr(args, "ray_token", None),
        interval=args.interval,
        backend=args.backend,
        replay_trace=getattr(args, "replay_trace", None),
        follows=dict(follows),
        find_driver_log=find_driver_log,
    )


def prom_settings(args: argparse.Namespace) -> PromSettings | None:
    """The Prometheus source's settings from ``--prometheus`` and ``--prom-*`` (None if unset)."""
    if not getattr(args, "prometheus", None):
        return None
    from verl_top.sources.http_client import HttpOptions, parse_header
    from verl_top.sources.prometheus import PromSettings

    window = getattr(args, "window", 300.0)
    http = HttpOptions(
        headers=tuple(parse_header(h) for h in getattr(args, "prom_header", None) or ()),
        bearer_token_file=_path(getattr(args, "prom_bearer_token_file", None)),
        ca_file=_path(getattr(args, "prom_ca_file", None)),
        cert_file=_path(getattr(args, "prom_cert_file", None)),
        key_file=_path(getattr(args, "prom_key_file", None)),
    )
    return PromSettings(
        url=args.prometheus,
        selector=args.prom_selector or "",
        rollout_selector=args.prom_rollout_selector,
        node_selector=getattr(args, "prom_node_selector", None) or "",
        interval=args.prom_interval,
        budget=min(args.prom_timeout, args.prom_interval),
        request_timeout=args.prom_timeout,
        history_s=window,
        http=http,
    )


def _path(value: str | None) -> str | None:
    return os.path.expanduser(value) if value else None


def add_ray_arguments(group: argparse._ArgumentGroup) -> None:
    """``--ray [ADDRESS]`` and ``--ray-token`` (added to the "what to monitor" group)."""
    group.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="find the job's nodes, actors and driver log from the Ray dashboard "
        "(http://HEAD:8265; without ADDRESS: $RAY_ADDRESS)",
    )
    group.add_argument(
        "--ray-token",
        metavar="TOKEN",
        help="Ray dashboard token (default: $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH, "
        "~/.ray/auth_token)",
    )


def add_ssh_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the SSH options (``--ssh-config``, ``-i``, ``--jump``, ...) to ``parser``."""
    g = parser.add_argument_group("SSH (remote nodes)")
    g.add_argument(
        "--ssh-config",
        metavar="FILE",
        help="ssh_config file to read instead of ~/.ssh/config and /etc/ssh/ssh_config "
        "(like ssh -F)",
    )
    g.add_argument(
        "-i",
        "--identity",
        metavar="KEY",
        action="append",
        help="private key to log in with (repeatable; default: ssh-agent and ~/.ssh/id_*)",
    )
    g.add_argument(
        "--jump",
        metavar="[USER@]HOST[:PORT]",
        help="bastion to reach every node through (one shared connection; a,b for two hops)",
    )
    g.add_argument(
        "--accept-new-hosts",
        action="store_true",
        help="trust and remember host keys of nodes not yet in known_hosts (changed keys are "
        "still refused): StrictHostKeyChecking=accept-new over the ssh config",
    )
    g.add_argument(
        "--known-hosts",
        metavar="FILE",
        help="known_hosts file, over UserKnownHostsFile (default: the config's, else "
        "~/.ssh/known_hosts)",
    )
    g.add_argument(
        "--connect-timeout",
        metavar="S",
        type=float,
        default=None,
        help="seconds to wait for TCP connect + SSH handshake (default: ConnectTimeout from "
        "the ssh config, else 10)",
    )
    g.add_argument(
        "--max-handshakes",
        metavar="N",
        type=int,
        default=16,
        help="SSH handshakes in flight at once (default 16)",
    )
    g.add_argument("--ssh-user", metavar="USER", help="login name for hosts without user@")


def add_prometheus_arguments(group: argparse._ArgumentGroup) -> None:
    """``--prometheus URL`` and its options (added to the "what to monitor" group)."""
    group.add_argument(
        "--prometheus",
        metavar="URL",
        help="read GPUs from the DCGM exporter and rollout servers (vLLM/SGLang) through this "
        "Prometheus (http://HOST:9090) instead of SSH; see docs/prometheus.md",
    )
    group.add_argument(
        "--prom-selector",
        metavar="MATCHERS",
        help='label matchers for the DCGM series, e.g. \'namespace="train",job="dcgm"\'',
    )
    group.add_argument(
        "--prom-rollout-selector",
        metavar="MATCHERS",
        help="label matchers for the vllm:/sglang: series (default: --prom-selector)",
    )
    group.add_argument(
        "--prom-node-selector",
        metavar="MATCHERS",
        help="label matchers for node_exporter's series (host CPU, memory, network, disks), "
        "e.g. 'job=\"node\"' (default: every node_exporter, joined to the DCGM hosts by name "
        "or address)",
    )
    group.add_argument(
        "--prom-interval",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds between Prometheus queries (default 5; dcgm-exporter samples every 30 s "
        "unless told otherwise)",
    )
    group.add_argument(
        "--prom-timeout",
        type=float,
        default=4.0,
        metavar="S",
        help="seconds a round of queries may take before Prometheus counts as slow (default 4)",
    )
    group.add_argument(
        "--prom-header",
        action="append",
        metavar="NAME:VALUE",
        help="send this header with every Prometheus request (repeatable; e.g. a tenant: "
        "'X-Scope-OrgID:team-a')",
    )
    group.add_argument(
        "--prom-bearer-token-file",
        metavar="FILE",
        help="send 'Authorization: Bearer' with the token in FILE (read again when it changes)",
    )
    group.add_argument(
        "--prom-ca-file", metavar="FILE", help="CA bundle that signed Prometheus' certificate"
    )
    group.add_argument(
        "--prom-cert-file", metavar="FILE", help="client certificate (PEM) for mutual TLS"
    )
    group.add_argument(
        "--prom-key-file", metavar="FILE", help="private key of --prom-cert-file (if separate)"
    )

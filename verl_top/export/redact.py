"""Remove secrets before anything leaves the machine in a snapshot bundle.

Two kinds of evidence mark a secret:

- a *name* that says so: a config key, environment variable or command-line flag whose last
  part is ``token``, ``secret``, ``password``, ``api_key``, ``access_key``, ``credentials``,
  ``auth``… (``WANDB_API_KEY``, ``HF_TOKEN``, ``trainer.wandb.api_key``, ``--hf-token``);
- a *value* that looks like one: Hugging Face (``hf_…``), OpenAI-style (``sk-…``), GitHub
  (``ghp_…``, ``github_pat_…``), Slack (``xox?-…``) tokens, AWS key ids (``AKIA…``), JWTs,
  ``Bearer …`` headers, Google (``AIza…``) and GitLab (``glpat-…``) keys, and the password of
  ``scheme://user:password@host`` URLs (also one holding ``@`` or ``/``);
- a *place* that holds one: Azure SAS ``sig=``, ``curl -u user:password``, ``sshpass -p``,
  ``mysql -pPASSWORD``, and the body of a PEM ``PRIVATE KEY`` block.

Either way the secret is replaced by ``REDACTED``. Names are matched on whole words at the end
(``ppo_max_token_len_per_gpu`` and ``max_num_batched_tokens`` are not secrets), so the config
numbers the diagnosis needs survive.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***REDACTED***"

_SECRET_WORDS = (
    r"token|secret|password|passwd|pwd|passphrase|api[_-]?key|apikey|access[_-]?key"
    r"|private[_-]?key|secret[_-]?key|credentials?|auth|authorization|cookie|session[_-]?key"
)
# A name is secret when it ends with one of the words, at a word boundary (start, _ - . or /);
# ``password``/``passwd`` need no boundary (``PGPASSWORD``); a bare ``key`` only as a whole name or
# a dotted path's last part (``trainer.wandb.key``, JSON ``"key":``), since verl's own
# ``data.prompt_key`` and ``reward_fn_key`` are not secrets.
_SECRET_NAME = re.compile(
    rf"(?:(?:^|[_.\-/])(?:{_SECRET_WORDS})|passw(?:or)?d|(?:^|[./])key)$", re.IGNORECASE
)
# Tokenizer special tokens are not secrets (``pad_token: <pad>``).
_NOT_SECRET_NAME = re.compile(r"(?:^|[_.\-])(?:pad|eos|bos|unk|sep|cls|mask|special)_token$", re.I)

# Values that are secrets whatever they are called.
_VALUE_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"\bhf_[A-Za-z0-9]{16,}"),
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9\-]{10,}"),
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
    re.compile(r"\bAIza[0-9A-Za-z_\-]{30,40}"),  # Google API keys
    re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}"),  # GitLab personal access tokens
)
# Secrets that sit in a known place rather than having a known shape. Group 1 is kept.
_PLACED_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"([?&]sig=)[^&\s\"']+", re.IGNORECASE),  # Azure SAS signature
    # curl/wget/httpie ``-u user:password`` (user kept, password hidden)
    re.compile(r"""((?<!\S)(?:-u|--user|--auth)(?:\s+|=)?['"]?[^\s:'"/@]+:)[^\s'"]+"""),
    # ``sshpass -p SECRET`` (a quoted secret may hold spaces)
    re.compile(r"""(\bsshpass\s+(?:-[a-oq-zA-Z]\S*\s+)*-p\s*)(?:'[^']*'|"[^"]*"|\S+)"""),
    # ``mysql -pSECRET`` (the password glued to -p; ``-P`` is the port)
    re.compile(r"(\bmysql(?:dump|admin|import|show)?\b[^\n|;&]*?\s-p)(?=\S)[^\s'\"]+"),
)
# A private key in PEM form: the whole block goes, the BEGIN/END lines stay as a marker.
_PEM_BEGIN = re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----")
_PEM_BLOCK = re.compile(
    r"(-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----)[\s\S]*?(-----END \2PRIVATE KEY-----|\Z)"
)
_BEARER = re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=\-]{8,}", re.IGNORECASE)
# ``scheme://user:password@host``: the password runs to the LAST ``@`` before the host, so one
# holding ``@`` or ``/`` is hidden whole (the user part may be empty: ``redis://:pw@cache``).
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:)\S+(@[^\s@/]+)")
# A name ending in a secret word, e.g. ``WANDB_API_KEY``, ``--hf-token``, ``db.password``. Only
# such names match, so a harmless ``name: value`` never hides a secret right after it.
_NAME = (
    rf"(?<![\w.\-])(?:--?)?(?:[A-Za-z0-9_.\-/]*[_.\-/])?(?:{_SECRET_WORDS})(?![\w\-])"
    r"|(?<![\w.\-])[A-Za-z0-9_]*passw(?:or)?d(?![\w\-])"
    r"|(?<![\w.\-])(?:[A-Za-z0-9_.\-/]*[./])?key(?![\w\-])"
)
# ``NAME=value``, ``name: value``, ``"name": "value"``, ``--name=value``.
_ASSIGNMENT = re.compile(
    rf"""(?P<name>{_NAME})(?P<q1>["']?)(?P<sep>\s*[=:]\s*)(?P<q2>["']?)"""
    r"""(?P<value>(?<=")[^"]+|(?<=')[^']+|[^\s"',;}\]]+)""",
    re.IGNORECASE,
)
# ``--name value``: a flag followed by its value.
_FLAG = re.compile(
    rf"""(?P<name>{_NAME})(?P<sep>\s+)(?P<value>"[^"]*"|'[^']*'|[^\s\-][^\s]*)""", re.IGNORECASE
)


def is_secret_name(name: str) -> bool:
    """True when a key / variable / flag name says its value is a secret."""
    bare = name.strip().lstrip("-").strip("\"'")
    return bool(_SECRET_NAME.search(bare)) and not _NOT_SECRET_NAME.search(bare)


def _assignment(m: re.Match[str]) -> str:
    name, value = m.group("name"), m.group("value")
    if not is_secret_name(name) or value == REDACTED:
        return m.group(0)
    return f"{name}{m.group('q1')}{m.group('sep')}{m.group('q2')}{REDACTED}"


def _flag(m: re.Match[str]) -> str:
    name, value = m.group("name"), m.group("value")
    if not name.startswith("-") or not is_secret_name(name) or value == REDACTED:
        return m.group(0)
    return f"{name}{m.group('sep')}{REDACTED}"


def redact_text(text: str) -> str:
    """``text`` with every secret it shows (by value pattern or by name) replaced."""
    if not text:
        return text
    out = text
    for pattern in _VALUE_PATTERNS:
        out = pattern.sub(REDACTED, out)
    out = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", out)
    out = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}{m.group(2)}", out)
    for pattern in _PLACED_PATTERNS:
        out = pattern.sub(lambda m: f"{m.group(1)}{REDACTED}", out)
    if "PRIVATE KEY-----" in out:
        out = _PEM_BLOCK.sub(lambda m: f"{m.group(1)} {REDACTED} {m.group(3)}".rstrip(), out)
    out = _ASSIGNMENT.sub(_assignment, out)
    return _FLAG.sub(_flag, out)


def redact_value(name: str, value: Any) -> Any:
    """A config / environment value, redacted when its name or its text says it is a secret."""
    if isinstance(value, Mapping):
        return redact_mapping(value)
    if isinstance(value, list | tuple):
        return [redact_value(name, v) for v in value]
    if is_secret_name(name) and value not in (None, "") and not isinstance(value, bool):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a (flattened or nested) mapping with secret values replaced."""
    return {str(k): redact_value(str(k), v) for k, v in values.items()}


def redact_lines(lines: list[str]) -> list[str]:
    """``redact_text`` applied to each line; the body of a PEM private-key block is hidden."""
    out: list[str] = []
    in_key = ""
    for line in lines:
        if in_key:
            if f"-----END {in_key}PRIVATE KEY-----" in line:
                out.append(line)
                in_key = ""
            elif not out or out[-1] != REDACTED:
                out.append(REDACTED)
            continue
        begin = _PEM_BEGIN.search(line)
        if begin is not None and "-----END" not in line[begin.end() :]:
            in_key = begin.group(1)
            out.append(line[: begin.end()])
            continue
        out.append(redact_text(line))
    return out


def redact_tree(value: Any, name: str = "") -> Any:
    """A copy of a JSON-like tree with secret strings replaced (by their key or their text).

    Only strings are replaced, so numbers (GPU samples, step metrics) keep their type; use
    ``redact_mapping`` for configs, where a numeric value under a secret name is hidden too.
    """
    if isinstance(value, Mapping):
        return {k: redact_tree(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if all(v is None or type(v) in (int, float, bool) for v in value):
            return list(value)  # series of numbers: nothing to redact, and they are long
        if name and is_secret_name(name):
            return [redact_tree(v, name) for v in value]
        if all(isinstance(v, str) for v in value):
            done = {v: redact_text(v) for v in set(value)}  # label series repeat a few strings
            return [done[v] for v in value]
        return [redact_tree(v, name) for v in value]
    if isinstance(value, str):
        if value and name and is_secret_name(name):
            return REDACTED
        return redact_text(value)
    return value

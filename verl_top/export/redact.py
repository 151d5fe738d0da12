"""Secrets out of every string that leaves verl-top: one table of the forms a secret takes.

A secret is recognised by

- its *shape* (``hf_…``, ``sk-…``, ``ghp_…``, a JWT, a Slack webhook path…),
- its *place* (``wandb login KEY``, ``curl -u user:PASSWORD``, ``docker login -p PASSWORD``,
  ``AccountKey=`` of an Azure connection string, the password of ``scheme://user:pw@host``…),
- or its *name* (``WANDB_API_KEY=…``, ``--hf-token …``, ``SSHPASS=…``, ``"private_key_id": …``):
  a key, variable or flag whose last word says so; names are matched on whole words at the end,
  so verl's ``ppo_max_token_len_per_gpu`` and ``data.prompt_key`` are kept.

:data:`FORMS` is the one table: ``redact_text`` applies each form in order, and
docs/security.md and snapshot.json's ``redaction.rules`` list the same rows. Matching runs on the
text *normalised* first: NFKC (full-width ``ｈｆ＿`` is ``hf_``), invisible characters removed
(an ``hf_`` token split by U+200B is still a token) and percent-escapes decoded (``password%3D``
is ``password=``). A string in which nothing is found is returned unchanged.

The pipeline applies it once to the records that carry foreign free text (process command lines,
configs, log events: :class:`Redactor`), so the screen, snapshots, recordings and metrics all see
the redacted text; snapshot.json and report.md are redacted again as a whole.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from verl_top.model import LogEvent, ProcessList, VerlConfig
from verl_top.untrusted import strip_invisible

REDACTED = "***REDACTED***"

_SECRET_WORDS = (
    r"token|secret|password|passwd|pwd|passphrase|pass|sshpass|api[_-]?key|apikey"
    r"|access[_-]?key|private[_-]?key(?:[_-]?id)?|secret[_-]?key|credentials?|auth"
    r"|authorization|cookie|session[_-]?key"
)
# A name is secret when it ends with one of the words, at a word boundary (start, _ - . or /);
# ``password``/``passwd`` need no boundary (``PGPASSWORD``), nor does ``sshpass`` (``SSHPASS``);
# a bare ``key`` only as a whole name or a dotted path's last part (``trainer.wandb.key``, JSON
# ``"key":``), since verl's own ``data.prompt_key`` and ``reward_fn_key`` are not secrets.
_SECRET_NAME = re.compile(
    rf"(?:(?:^|[_.\-/])(?:{_SECRET_WORDS})|passw(?:or)?d|sshpass|(?:^|[./])key)$", re.IGNORECASE
)
# Tokenizer special tokens are not secrets (``pad_token: <pad>``).
_NOT_SECRET_NAME = re.compile(r"(?:^|[_.\-])(?:pad|eos|bos|unk|sep|cls|mask|special)_token$", re.I)
# A name ending in a secret word, e.g. ``WANDB_API_KEY``, ``--hf-token``, ``db.password``. Only
# such names match, so a harmless ``name: value`` never hides a secret right after it.
_NAME = (
    rf"(?<![\w.\-])(?:--?)?(?:[A-Za-z0-9_.\-/]*[_.\-/])?(?:{_SECRET_WORDS})(?![\w\-])"
    r"|(?<![\w.\-])[A-Za-z0-9_]*(?:passw(?:or)?d|sshpass)(?![\w\-])"
    r"|(?<![\w.\-])(?:[A-Za-z0-9_.\-/]*[./])?key(?![\w\-])"
)


def is_secret_name(name: str) -> bool:
    """True when a key / variable / flag name says its value is a secret."""
    bare = name.strip().lstrip("-").strip("\"'")
    return bool(_SECRET_NAME.search(bare)) and not _NOT_SECRET_NAME.search(bare)


def _all(m: re.Match[str]) -> str:
    return REDACTED


def _after_prefix(m: re.Match[str]) -> str:
    """Keep group 1 (the place), hide the rest of the match (the secret)."""
    return f"{m.group(1)}{REDACTED}"


def _prefix_and_suffix(m: re.Match[str]) -> str:
    return f"{m.group(1)}{REDACTED}{m.group(2)}"


def _bearer(m: re.Match[str]) -> str:
    return f"{m.group(1)} {REDACTED}"


def _pem(m: re.Match[str]) -> str:
    return f"{m.group(1)} {REDACTED} {m.group(3)}".rstrip()


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


@dataclass(frozen=True)
class SecretForm:
    """One form a secret takes in text: how it is found, and what of the match stays."""

    what: str  # in words (docs/security.md, snapshot.json redaction.rules)
    pattern: re.Pattern[str]
    replace: Callable[[re.Match[str]], str] = _all
    example: str = ""  # a CONSTRUCTED line holding one (tests/test_redact_forms.py runs them)


def _form(
    what: str,
    pattern: str,
    replace: Callable[[re.Match[str]], str] = _all,
    example: str = "",
    flags: int = 0,
) -> SecretForm:
    return SecretForm(what, re.compile(pattern, flags), replace, example)


FORMS: tuple[SecretForm, ...] = (
    # --- by shape -------------------------------------------------------------------------
    _form("Hugging Face token hf_…", r"\bhf_[A-Za-z0-9]{16,}", example="hf_QkVbWxRtYuIoPaSdFgHj"),
    _form(
        "OpenAI / Anthropic key sk-…",
        r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}",
        example="sk-proj-Ab3dEf6hIj9kLm2nOp5q",
    ),
    _form(
        "GitHub token ghp_… / github_pat_…",
        r"\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}",
        example="ghp_A1b2C3d4E5f6G7h8I9j0K1l2",
    ),
    _form("Slack token xox?-…", r"\bxox[abprs]-[A-Za-z0-9\-]{10,}", example="xoxb-1234-5678-AbCd"),
    _form(
        "Slack / Discord webhook URL path",
        r"(\bhooks\.slack\.com/(?:services|workflows|triggers)/)[A-Za-z0-9/_\-]+"
        r"|(\bdiscord(?:app)?\.com/api/webhooks/)[0-9]+/[A-Za-z0-9_\-]+",
        lambda m: f"{m.group(1) or m.group(2)}{REDACTED}",
        "https://hooks.slack.com/services/T0ABCDE12/B0FGHIJ34/AbCdEfGhIjKlMnOpQrStUvWx",
    ),
    _form(
        "AWS access key id AKIA… / ASIA…",
        r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
        example="AKIAABCDEFGHIJKLMNOP",
    ),
    _form(
        "JWT eyJ….….…",
        r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
        example="eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlMTIz",
    ),
    _form(
        "Google API key AIza…",
        r"\bAIza[0-9A-Za-z_\-]{30,40}",
        example="AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUv1",
    ),
    _form(
        "GitLab token glpat-…", r"\bglpat-[A-Za-z0-9_\-]{20,}", example="glpat-AbCdEfGhIjKlMnOpQrSt"
    ),
    # --- by place -------------------------------------------------------------------------
    _form(
        "wandb login KEY (40 hex)",
        r"(\bwandb\s+login\s+(?:--?[\w\-]+(?:=\S+)?\s+)*)[0-9a-fA-F]{40}\b",
        _after_prefix,
        "wandb login 0123456789abcdef0123456789abcdef01234567",
    ),
    _form(
        "Bearer / Basic / Token header",
        r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=\-]{8,}",
        _bearer,
        "Authorization: Bearer abcDEF123456ghiJKL",
        re.IGNORECASE,
    ),
    # ``scheme://user:password@host``: the password runs to the LAST ``@`` before the host, so
    # one holding ``@`` or ``/`` is hidden whole (the user part may be empty).
    _form(
        "password of scheme://user:password@host",
        r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:)\S+(@[^\s@/]+)",
        _prefix_and_suffix,
        "https://u:p@ss@w0rd@host.io/x",
    ),
    _form(
        "Azure SAS signature sig=",
        r"([?&]sig=)[^&\s\"']+",
        _after_prefix,
        "https://a.blob.core.windows.net/c?sv=2022&sig=Zm9vYmFyYmF6cXV4%3D&se=1",
        re.IGNORECASE,
    ),
    _form(
        "Azure connection string AccountKey= / SharedAccessKey= / SharedAccessSignature=",
        r"(\b(?:AccountKey|SharedAccessKey|SharedAccessSignature)=)[^;\s\"']+",
        _after_prefix,
        "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=bXlrZXk9PQ==;EndpointSuffix=x",
        re.IGNORECASE,
    ),
    _form(
        "curl / wget / httpie -u user:PASSWORD",
        r"""((?<!\S)(?:-u|--user|--auth)(?:\s+|=)?['"]?[^\s:'"/@]+:)[^\s'"]+""",
        _after_prefix,
        "curl -u alice:s3cr3tPass https://api.x/v1",
    ),
    _form(
        "sshpass -p PASSWORD",
        r"""(\bsshpass\s+(?:-[a-oq-zA-Z]\S*\s+)*-p\s*)(?:'[^']*'|"[^"]*"|\S+)""",
        _after_prefix,
        "sshpass -p 'hunter2xyz' ssh node01",
    ),
    _form(
        "docker / podman / nerdctl login -p PASSWORD",
        r"""(\b(?:docker|podman|nerdctl|buildah)\s+login\b[^\n|;&]*?\s(?:-p|--password)(?:\s+|=))"""
        r"""(?:'[^']*'|"[^"]*"|[^\s'"]+)""",
        _after_prefix,
        "docker login -u bob -p dckr_pat_s3cret registry.example.com",
    ),
    _form(
        "mysql -pPASSWORD",
        r"(\bmysql(?:dump|admin|import|show)?\b[^\n|;&]*?\s-p)(?=\S)[^\s'\"]+",
        _after_prefix,
        "mysql -ualice -pS3cretDbPw runs",
    ),
    _form(
        "PEM PRIVATE KEY block",
        r"(-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----)[\s\S]*?(-----END \2PRIVATE KEY-----|\Z)",
        _pem,
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----",
    ),
    # --- by name --------------------------------------------------------------------------
    _form(
        'NAME=value / name: value / "name": "value" where the name ends in token, secret, '
        "password, passwd, pass, sshpass, api_key, access_key, private_key(_id), credentials, "
        "auth, cookie, or is a bare key",
        rf"""(?P<name>{_NAME})(?P<q1>["']?)(?P<sep>\s*[=:]\s*)(?P<q2>["']?)"""
        r"""(?P<value>(?<=")[^"]+|(?<=')[^']+|[^\s"',;}\]]+)""",
        _assignment,
        "SSHPASS=hunter2xyz sshpass -e ssh node01",
        re.IGNORECASE,
    ),
    _form(
        "--flag value for the same names",
        rf"""(?P<name>{_NAME})(?P<sep>\s+)(?P<value>"[^"]*"|'[^']*'|[^\s\-][^\s]*)""",
        _flag,
        "--hf-token abcdefghijklmnop",
        re.IGNORECASE,
    ),
)
_PEM_BEGIN = re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----")
_PERCENT = re.compile(r"%[0-9A-Fa-f]{2}")


def normalise(text: str) -> str:
    """What the forms are matched on: NFKC, invisible characters gone, %-escapes decoded."""
    out = strip_invisible(unicodedata.normalize("NFKC", text))
    if "%" in out and _PERCENT.search(out) is not None:
        out = urllib.parse.unquote(out, errors="replace")
    return out


def _apply(text: str) -> str:
    for form in FORMS:
        text = form.pattern.sub(form.replace, text)
    return text


def redact_text(text: str) -> str:
    """``text`` with every secret it shows replaced (see :data:`FORMS`); unchanged when it
    holds none. When one is found, the result is the normalised text, redacted."""
    if not text:
        return text
    plain = normalise(text)
    out = _apply(plain)
    return text if out == plain else out


def redact_value(name: str, value: Any) -> Any:
    """A config / environment value, redacted when its name or its text says it is a secret."""
    if isinstance(value, Mapping):
        return redact_mapping(value)
    if isinstance(value, list | tuple):
        return [redact_value(name, v) for v in value]
    if is_secret_name(normalise(name)) and value not in (None, "") and not isinstance(value, bool):
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


_MISSING = object()
_PLAIN = (str, int, float, bool, type(None))  # hashable config values, remembered as they are


class Redactor:
    """``redact_text`` with a bounded memo, for the records that carry foreign free text.

    Process lists arrive every few seconds from every host with the same command lines: the
    memo makes their redaction a dictionary lookup after the first time. One per pipeline.
    """

    def __init__(self, capacity: int = 50_000) -> None:
        self.capacity = capacity
        self._memo: dict[str, str] = {}
        self._values: dict[tuple[str, Any, type], Any] = {}

    def text(self, value: str) -> str:
        """``redact_text(value)``, remembered."""
        hit = self._memo.get(value)
        if hit is None:
            hit = redact_text(value)
            if len(value) <= 8192:
                if len(self._memo) >= self.capacity:
                    self._memo.clear()
                self._memo[value] = hit
        return hit

    def value(self, name: str, value: Any) -> Any:
        """``redact_value(name, value)``, remembered for plain values (a config parsed again,
        or re-sent by every node, is mostly the same keys and values)."""
        kind = type(value)
        if kind in (list, tuple):
            if not all(type(v) in _PLAIN for v in value):
                return redact_value(name, value)
            key: tuple[str, Any, type] = (name, tuple(value), kind)
        elif kind in _PLAIN:
            key = (name, value, kind)
        else:
            return redact_value(name, value)
        hit = self._values.get(key, _MISSING)
        if hit is _MISSING:
            hit = redact_value(name, value)
            if len(self._values) >= self.capacity:
                self._values.clear()
            self._values[key] = hit
        return hit

    def record(self, record: Any) -> Any:
        """The record with its free text redacted (the same object when nothing changed):
        process command lines, a config's values, a log event's text."""
        kind = type(record)  # exact types: this runs for every record of the pipeline
        if kind is ProcessList:
            procs = [
                p if (cmd := self.text(p.cmd)) == p.cmd else dataclasses.replace(p, cmd=cmd)
                for p in record.procs
            ]
            if any(a is not b for a, b in zip(procs, record.procs, strict=True)):
                return dataclasses.replace(record, procs=procs)
        elif kind is VerlConfig:
            values = {k: self.value(k, v) for k, v in record.values.items()}
            if values != record.values:
                return dataclasses.replace(record, values=values)
        elif kind is LogEvent:
            text = self.text(record.text)
            if text != record.text:
                return dataclasses.replace(record, text=text)
        return record


def rules() -> list[str]:
    """The forms in words, in the order they are applied (snapshot.json, docs/security.md)."""
    return [form.what for form in FORMS]

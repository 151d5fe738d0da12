"""The rows of docs/diagnosis-accuracy.md: every corpus log through ``verl-top diagnose``.

    python benchmarks/accuracy_table.py              # both tables, markdown
    python benchmarks/accuracy_table.py --json-out accuracy.json

Real logs: tests/fixtures/real_logs (expected.yaml); CONSTRUCTED verl v0.9.0 logs:
tests/fixtures/verl09 (expected.yaml). Each log is diagnosed once in-process (``cli.main``, as
tests/test_real_log_corpus.py does) and its row says what was expected, what came out (status,
lead rule and severity, verl version range, trainer mode, device) and whether the lead agrees.
The pass/fail checks themselves are the tests; this prints what they read.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path
from typing import Any

import yaml
from _common import REPO, ensure_repo_on_path, write_json

ensure_repo_on_path()

from verl_top.cli import main as cli_main  # noqa: E402

REAL = REPO / "tests" / "fixtures" / "real_logs"
NEW_ERAS = REPO / "tests" / "fixtures" / "verl09"


def diagnose(path: Path) -> tuple[int, dict[str, Any]]:
    """Exit code and JSON of ``verl-top diagnose --verl-log PATH --json``."""
    out = io.StringIO()
    argv = ["diagnose", "--verl-log", str(path), "--json", "--duration", "1"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cli_main(argv)
    return code, json.loads(out.getvalue())


def got_text(code: int, doc: dict[str, Any]) -> str:
    """``step 3 flow.rollout_bound (0.66)``, ``healthy``, ``no data, exit 3`` (+ a crash lead)."""
    state, lead = doc["status"]["state"], doc["bottleneck"]
    sev = next((f["severity"] for f in doc["findings"] if f["rule"] == lead["rule"]), None)
    if state == "no data":
        crash = f"; lead `{lead['rule']}`" if lead["rule"] else ""
        return f"no data, exit {code}{crash}"
    if lead["rule"] is None:
        return state
    return f"step {lead['step']} `{lead['rule']}` ({sev:.2f})"


def real_agrees(case: dict[str, Any], code: int, doc: dict[str, Any]) -> bool:
    """The lead test's reading of agreement (tests/test_real_log_corpus.py)."""
    rules, lead, state = set(case["expected"]["rules"]), doc["bottleneck"]["rule"], None
    state = doc["status"]["state"]
    if case.get("crash"):
        return lead == "job.crashed" and state == "no data" and code != 0
    if lead is not None:
        return lead in rules
    if state in ("healthy", "no single bottleneck"):
        return "none" in rules and doc["inputs"]["steps"] > 0
    return "no_data" in rules and state == "no data" and code != 0


def real_rows() -> list[dict[str, Any]]:
    rows = []
    for case in yaml.safe_load((REAL / "expected.yaml").read_text()):
        code, doc = diagnose(REAL / case["file"])
        rows.append(
            {
                "log": case["file"].removesuffix(".log"),
                "release": case["release"].split(" (")[0],
                "expected": ", ".join(case["expected"]["rules"]),
                "got": got_text(code, doc),
                "agrees": real_agrees(case, code, doc),
                "verl": doc["verl"]["version_range"],
                "device": doc["verl"]["device"],
            }
        )
    return rows


def new_era_rows() -> list[dict[str, Any]]:
    rows = []
    for case in yaml.safe_load((NEW_ERAS / "expected.yaml").read_text()):
        code, doc = diagnose(NEW_ERAS / case["file"])
        verl = doc["verl"]
        rows.append(
            {
                "log": case["file"].removesuffix(".log"),
                "mode": f"{case['mode']} (got {verl['trainer_mode']})",
                "expected": case["lead"],
                "got": got_text(code, doc),
                "agrees": doc["bottleneck"]["rule"] == case["lead"]
                and verl["trainer_mode"] == case["mode"]
                and verl["version_range"] == case["versions"],
                "verl": verl["version_range"],
                "device": verl["device"],
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], cols: list[str]) -> str:
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols)
    body = [
        "| "
        + " | ".join(
            ("**yes**" if r[c] else "no") if c == "agrees" else f"`{r[c]}`" if c == "log" else r[c]
            for c in cols
        )
        + " |"
        for r in rows
    ]
    return "\n".join([head, *body])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json-out", metavar="FILE")
    args = parser.parse_args()
    real, new = real_rows(), new_era_rows()
    print(markdown(real, ["log", "release", "expected", "got", "agrees", "verl", "device"]))
    print(f"\n{sum(r['agrees'] for r in real)} of {len(real)} real leads agree\n")
    print(markdown(new, ["log", "mode", "expected", "got", "agrees", "verl"]))
    print(f"\n{sum(r['agrees'] for r in new)} of {len(new)} CONSTRUCTED v0.9.0 rows agree")
    if args.json_out:
        write_json(args.json_out, {"real": real, "new_eras": new})


if __name__ == "__main__":
    main()

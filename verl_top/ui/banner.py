"""The banner's words: the verdict, its saving and its advice in at most two lines of a width.

Pure text functions (no Textual), so the header, the headless screenshot and tests share them.
Text is shortened by meaning, in this order: asides in parentheses go, then the status loses its
step name, then the title loses its trailing clauses, the advice keeps the sentence that names a
setting (then its first clause, then verl's ``actor_rollout_ref.`` prefix), and only then is a
text cut, at a word, with ``…``. Nothing is ever cut mid-word without the ``…``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from rich.cells import cell_len

from verl_top.diagnosis.findings import STEP_NAMES, Finding
from verl_top.diagnosis.readable import seconds as fmt_seconds  # one way to write seconds

ELLIPSIS = "…"
LEAD_MARK = "● "
ADVICE_MARK = "→ "
# A sentence ends at . ! ? followed by a space and a capital or an opening parenthesis; dotted
# keys (rollout.n, e.g.) have no space after their dot.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")
_PARENS = re.compile(r"\s*\([^()]*\)")
# A setting the advice names: a dotted verl key, key=value, or an environment variable.
_SETTING = re.compile(r"[a-z_]+\.[a-z_][a-z_.]*|\w+=\w+|\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b")
# verl's config root: people say rollout.name for actor_rollout_ref.rollout.name.
_VERL_ROOT = re.compile(r"\bactor_rollout_ref\.")
# Clause breaks: a title shortened by meaning keeps its leading clauses.
_CLAUSE_SEPS = ("; ", " — ", ": ", ", ")


def saving_text(finding: Finding) -> str:
    """What the lead is worth, the banner's way: 'saves up to 18 s/step (91 % of the 19.9 s
    step)'; its cost when no saving is bounded; 'saving not measured' when neither is known.

    The part in parentheses is the first thing the banner leaves out on a narrow terminal."""
    if finding.save_s is not None:
        head = f"saves up to {fmt_seconds(finding.save_s)}/step"
        value = finding.save_s
    elif finding.cost_s is not None:
        head = f"costs {fmt_seconds(finding.cost_s)}/step"
        value = finding.cost_s
    else:
        return "saving not measured"
    if finding.step_s:
        share = 100.0 * value / finding.step_s
        return f"{head} ({share:.0f} % of the {fmt_seconds(finding.step_s)} step)"
    return head


def status_label(finding: Finding) -> str:
    """'step 3 bottleneck (Dataflow)'."""
    return f"step {finding.step} bottleneck ({STEP_NAMES.get(finding.step, '?')})"


def shorten(text: str, width: int) -> str:
    """``text`` if it fits ``width`` cells, else cut at a word boundary and ended with ``…``
    (a single word longer than the width is cut inside, still with the ``…``)."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    room = width - 1
    cut = text
    while cell_len(cut) > room:
        cut = cut[:-1]
    at = cut.rfind(" ")
    if at > 0:
        cut = cut[:at]
    return cut.rstrip(" ,;:—-") + ELLIPSIS


def drop_parens(text: str) -> str:
    """``text`` without its asides in parentheses (nested ones included)."""
    prev = None
    while prev != text:
        prev, text = text, _PARENS.sub("", text)
    return re.sub(r"\s+([.,;:])", r"\1", text).strip()


def leading_clauses(text: str) -> list[str]:
    """``text`` and its heads that end at a clause break ('; ', ' — ', ': ', ', '), longest
    first: 'A; B, C' gives 'A; B, C', 'A; B', 'A'."""
    cuts = {m.start() for sep in _CLAUSE_SEPS for m in re.finditer(re.escape(sep), text)}
    heads = [text[:at].rstrip(" .,;:") for at in sorted(cuts, reverse=True)]
    return _unique([text, *heads])


def title_forms(title: str) -> list[str]:
    """A finding's title from full to its first clause."""
    return _unique([title, *leading_clauses(drop_parens(title))])


def status_forms(status: str) -> list[str]:
    """'step 3 bottleneck (Dataflow)', 'step 3 bottleneck', 'step 3'."""
    bare = drop_parens(status)
    return _unique([status, bare, re.sub(r"\s+bottleneck\b", "", bare)])


def saving_forms(saving: str) -> list[str]:
    """The saving with, then without, its share of the step."""
    return _unique([saving, drop_parens(saving)])


def advice_forms(advice: str) -> list[str]:
    """The advice from full to the first clause of the sentence that names a setting."""
    bare = drop_parens(advice)
    sentences = [s.strip() for s in _SENTENCE_END.split(bare) if s.strip()]
    acting = [s for s in sentences if _SETTING.search(s)] or sentences
    first = acting[0] if acting else bare
    clause = first.split("; ")[0].rstrip(" .,;:")
    return _unique(
        [
            advice,
            bare,
            " ".join(acting),
            first,
            _VERL_ROOT.sub("", first),
            clause,
            _VERL_ROOT.sub("", clause),
        ]
    )


def _unique(forms: Sequence[str]) -> list[str]:
    return [f for f in dict.fromkeys(f.strip() for f in forms) if f]


def _first_fitting(forms: Sequence[str], fits: Callable[[str], bool]) -> str | None:
    return next((f for f in forms if fits(f)), None)


def _lead_line(status: str, title: str, saving: str, width: int) -> str:
    """'● status: title — saving' within ``width``: the status and the saving shrink first,
    then the title loses clauses; the title alone is cut at a word when nothing else helps."""
    statuses, titles, savings = status_forms(status), title_forms(title), saving_forms(saving)

    def line(s: str, t: str, v: str) -> str:
        return f"{LEAD_MARK}{s}: {t} — {v}" if t else f"{LEAD_MARK}{s} — {v}"

    def fits(s: str, t: str, v: str) -> bool:
        return cell_len(line(s, t, v)) <= width

    # Shrink in order of what matters least: the saving's share, the status, the title.
    s, t, v = statuses[0], titles[0], savings[0]
    for kind, forms in (("v", savings), ("s", statuses), ("t", titles)):
        for form in forms:
            s, t, v = (form, t, v) if kind == "s" else (s, form, v) if kind == "t" else (s, t, form)
            if fits(s, t, v):
                break
        if fits(s, t, v):
            break
    else:
        room = width - cell_len(line(s, "", v)) - 2
        short = shorten(t, room) if room >= 4 else ""
        return shorten(line(s, short, v), width)
    # Room left: give back what was dropped from the saving, then the status.
    v = _first_fitting(savings, lambda x: fits(s, t, x)) or v
    s = _first_fitting(statuses, lambda x: fits(x, t, v)) or s
    return line(s, t, v)


def _wrap_two(text: str, width: int) -> tuple[str, str]:
    """``text`` on up to two lines, broken at a space; the second ends in ``…`` if it must."""
    if cell_len(text) <= width:
        return text, ""
    head = text
    while cell_len(head) > width:
        head = head[:-1]
    at = head.rfind(" ") if text[len(head)] != " " else len(head)
    if at <= 0:  # one word wider than the line
        return shorten(text, width), ""
    return text[:at].rstrip(), shorten(text[at:].strip(), width)


def fit_banner(
    lead_title: str, saving_text: str, advice: str, status: str, width: int
) -> tuple[str, str]:
    """The banner's two lines for ``width`` cells.

    With a lead (``lead_title`` given): line 1 is '● status: title — saving', line 2
    '→ advice'. Without one (``lead_title`` empty): the status text alone, over two lines if it
    needs them. Each line fits ``width``; texts are shortened by meaning (module docstring)."""
    width = max(1, width)
    if not lead_title:
        return _wrap_two(status, width)
    first = _lead_line(status, lead_title, saving_text, width)
    if not advice:
        return first, ""
    room = width - cell_len(ADVICE_MARK)
    forms = advice_forms(advice)
    chosen = _first_fitting(forms, lambda a: cell_len(a) <= room)
    second = ADVICE_MARK + (chosen if chosen is not None else shorten(forms[-1], room))
    return first, second if room > 0 else shorten(second, width)

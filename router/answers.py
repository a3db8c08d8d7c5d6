"""Answer normalization for agreement checks: two answers "agree" when they reach the same
final answer, not when their wording matches."""

from __future__ import annotations

import re

_MC = re.compile(r"(?:answer(?: is)?|option|choice)\s*[:\-]?\s*\(?([A-E])\)?\b", re.IGNORECASE)
_LONE_LETTER = re.compile(r"^\s*\(?([A-E])\)?(?:[.):\s]|$)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_CODE = re.compile(r"```(?:[a-zA-Z0-9_+-]*)\n(.*?)```", re.DOTALL)


def normalize_answer(text: str) -> str:
    """A canonical form of a response's final answer: a multiple-choice letter, else the
    last number, else fenced code with whitespace folded, else the first 80 characters of
    the lowercased text without punctuation."""
    if not text:
        return ""
    m = _MC.search(text) or _LONE_LETTER.match(text)
    if m:
        return f"choice:{m.group(1).upper()}"
    code = _CODE.findall(text)
    if code:
        return "code:" + " ".join(code[-1].split())
    numbers = _NUMBER.findall(text)
    if numbers:
        return "num:" + numbers[-1].replace(",", "").rstrip("0").rstrip(".")
    words = re.sub(r"[^a-z0-9 ]+", " ", text.lower()).split()
    return "text:" + " ".join(words)[:80]


def agree(a: str, b: str) -> bool:
    na, nb = normalize_answer(a), normalize_answer(b)
    return bool(na) and na == nb

"""Answer normalization for agreement checks: two answers "agree" when they reach the same
final answer, not when their wording matches."""

from __future__ import annotations

import re

# The keyword in any case, the letter a capital: "the answer is a rose" names no option.
_MC = re.compile(r"(?i:answer(?: is)?|option|choice)\s*[:\-]?\s*\(?([A-E])\)?\b")
# A reply that opens with a letter marked as one ("B.", "(C)", "D:", a lone "A"): not a
# sentence that opens with the article "A" or a formula ("E = mc^2").
_LONE_LETTER = re.compile(r"^\s*(?:\(([A-E])\)|([A-E])(?:[.):]|\s*$))")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_CODE = re.compile(r"```(?:[a-zA-Z0-9_+-]*)\n(.*?)```", re.DOTALL)
# Code without a fence (MBPP-style "[BEGIN] def f(...) ... [Done]"): from its first
# definition or import to the end, or to the "[Done]" that closes it.
_BARE_CODE = re.compile(r"^[ \t]*(?:def |class |import |from \S+ import )", re.MULTILINE)
_DONE = re.compile(r"\[done\]", re.IGNORECASE)


def normalize_answer(text: str) -> str:
    """A canonical form of a response's final answer: a multiple-choice letter, else code
    (fenced, or unfenced from its first definition or import) with whitespace folded, else
    the last number, else the first 80 characters of the lowercased text without
    punctuation."""
    if not text:
        return ""
    m = _MC.search(text)
    if m:
        return f"choice:{m.group(1)}"
    m = _LONE_LETTER.match(text)
    if m:
        return f"choice:{m.group(1) or m.group(2)}"
    code = _CODE.findall(text)
    if code:
        return "code:" + " ".join(code[-1].split())
    bare = _BARE_CODE.search(text)
    if bare:
        # Code, not its last number: two programs ending in "+= 1" do not agree.
        return "code:" + " ".join(_DONE.split(text[bare.start() :])[0].split())
    numbers = _NUMBER.findall(text)
    if numbers:
        number = numbers[-1].replace(",", "")
        if "." in number:  # 1.50 is 1.5 and 2.0 is 2; 10 stays 10
            number = number.rstrip("0").rstrip(".")
        return "num:" + ("0" if number in ("", "-", "-0") else number)
    words = re.sub(r"[^a-z0-9 ]+", " ", text.lower()).split()
    # Nothing but punctuation is no answer: it agrees with none.
    return "text:" + " ".join(words)[:80] if words else ""


def agree(a: str, b: str) -> bool:
    na, nb = normalize_answer(a), normalize_answer(b)
    return bool(na) and na == nb

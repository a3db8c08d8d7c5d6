"""Cheap conversation features: a few dozen numbers computed with string scans and regexes.

They carry what a mean-pooled bag of tokens cannot see well: how long the prompt is, how
many turns the conversation has, whether it holds code, math or a multiple-choice question,
which script it is written in, whether the client offered tools. Every value is bounded
(ratios in [0, 1], counts log-scaled and divided by a typical maximum) so the policy's
input standardization has nothing extreme to cope with.

Changing the list or any formula changes behaviour: bump ``CHEAP_FEATURES_VERSION`` (it
feeds the feature version that checkpoints are checked against).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from router.modalities import request_modalities
from router.outcomes import content_text

CHEAP_FEATURES_VERSION = "cheap-v1"

CHEAP_FEATURE_NAMES: tuple[str, ...] = (
    "log_tokens",  # tokens of the prompt under the embedding tokenizer (before truncation cap)
    "log_chars",
    "log_conversation_chars",
    "log_words",
    "log_lines",
    "mean_word_len",
    "log_user_turns",
    "log_assistant_turns",
    "has_system",
    "log_system_chars",
    "has_code_fence",
    "code_density",
    "has_math",
    "math_density",
    "digit_ratio",
    "log_question_marks",
    "ends_with_question",
    "multiple_choice",
    "ascii_letter_ratio",
    "upper_ratio",
    "punct_ratio",
    "whitespace_ratio",
    "non_ascii_ratio",
    "cjk_ratio",
    "cyrillic_ratio",
    "arabic_ratio",
    "has_tools",
    "log_tools",
    "has_images",
    "has_url",
    "intent_translate",
    "intent_summarize",
    "intent_code",
    "intent_reasoning",
    "intent_creative",
    "intent_extract",
)

_CODE_FENCE = ("```", "~~~")
_CODE_WORDS = frozenset(
    b"def class return import from function const let var public static void include select "
    b"printf println elif lambda async await".split()
)
_CODE_SYMBOLS = ("{", "}", ";", "==", "!=", "=>", "->", "::")
_MATH_WORDS = frozenset(
    b"solve equation integral derivative probability calculate compute sqrt".split()
)
_MATH_PHRASES = (
    "\\frac",
    "\\sqrt",
    "\\sum",
    "\\int",
    "\\cdot",
    "\\times",
    "\\pi",
    "how many",
    "sum of",
)
_MATH_EXPR = re.compile(r"\d\s*[+\-*/^=<>]\s*\d")
_MATH_CHARS = re.compile(r"[+\-*/^=<>%]")
# "A) foo", "(B) bar", "C. baz", "D: qux" at line starts, or inline "(A) ... (B) ...".
_CHOICE_LINE = re.compile(r"(?m)^[ \t]*\(?([A-Ha-h1-8])[\).:][ \t]+\S")
_CHOICE_INLINE = re.compile(r"([A-H])\)")
_CHOICE_PHRASES = ("options", "choices", "which of the following")
_URL_PREFIXES = ("http://", "https://")


def _punct_to_space_table() -> bytes:
    table = bytearray(range(256))
    for ch in b".,;:!?()[]{}<>\"'`*=+-/\\|#@$%^&~":
        table[ch] = 32
    return bytes(table)


# Punctuation becomes spaces before splitting into the word set: bytes.translate with a
# 256-byte table is one C pass (str.translate with a dict is ~10x slower).
_PUNCT_TO_SPACE = _punct_to_space_table()

# Intent cues: single words are looked up in the prompt's word set, phrases by substring
# (both far cheaper than case-insensitive regex alternations on every request).
_INTENTS: dict[str, tuple[frozenset[bytes], tuple[str, ...]]] = {
    "intent_translate": (
        frozenset({b"translate", b"translation", b"translated"}),
        ("in french", "in german", "in spanish", "in chinese", "into english"),
    ),
    "intent_summarize": (
        frozenset({b"summarize", b"summarise", b"summary", b"tldr", b"condense"}),
        ("tl;dr",),
    ),
    "intent_code": (
        frozenset(
            b"python javascript typescript java rust golang sql code function script program "
            b"implement bug compile".split()
        ),
        ("c++",),
    ),
    "intent_reasoning": (
        frozenset(b"prove proof reason reasoning logic puzzle deduce therefore".split()),
        ("step by step", "explain why"),
    ),
    "intent_creative": (
        frozenset(b"poem story creative haiku lyrics".split()),
        ("write a song", "write an essay", "write a story"),
    ),
    "intent_extract": (
        frozenset(b"extract classify label categorize categorise sentiment json".split()),
        (),
    ),
}


def _log_scaled(n: float, typical_max: float) -> float:
    """log1p(n) / log1p(typical_max), clipped to [0, 1.5] (slightly past the typical max)."""
    if n <= 0:
        return 0.0
    return min(math.log1p(n) / math.log1p(typical_max), 1.5)


def _ratio(count: int, total: int) -> float:
    return count / total if total else 0.0


def _has_images(messages: Sequence[dict[str, Any]]) -> bool:
    return "image" in request_modalities(messages)


_ASCII_LETTERS = bytes(range(65, 91)) + bytes(range(97, 123))
_ASCII_UPPER = bytes(range(65, 91))
_ASCII_DIGITS = b"0123456789"
_ASCII_SPACE = b" \t\n\r\x0b\x0c"
_CJK = re.compile(r"[\u4e00-\u9fff\u3040-\u30ff\uac00-\ud7af]")
_CYRILLIC = re.compile(r"[\u0400-\u04ff]")
_ARABIC = re.compile(r"[\u0600-\u06ff]")


def _count_in(data: bytes, alphabet: bytes) -> int:
    # bytes.translate with a delete set runs in C: ~100x faster than a Python char loop.
    return len(data) - len(data.translate(None, alphabet))


def _char_classes(
    text: str, ascii_bytes: bytes
) -> tuple[int, int, int, int, int, int, int, int, int]:
    """(ascii letters, upper, digits, punct, space, non-ascii, cjk, cyrillic, arabic)."""
    non_ascii = len(text) - len(ascii_bytes)
    letters = _count_in(ascii_bytes, _ASCII_LETTERS)
    upper = _count_in(ascii_bytes, _ASCII_UPPER)
    digits = _count_in(ascii_bytes, _ASCII_DIGITS)
    space = _count_in(ascii_bytes, _ASCII_SPACE)
    punct = len(ascii_bytes) - letters - digits - space
    cjk = cyr = arab = 0
    if non_ascii:
        cjk = len(_CJK.findall(text))
        cyr = len(_CYRILLIC.findall(text))
        arab = len(_ARABIC.findall(text))
    return letters, upper, digits, punct, space, non_ascii, cjk, cyr, arab


def cheap_features(
    messages: Sequence[dict[str, Any]],
    *,
    prompt: str | None = None,
    n_tokens: int | None = None,
    tools: Sequence[Any] | None = None,
    max_scan_chars: int = 8_000,
) -> np.ndarray:
    """The feature vector (``len(CHEAP_FEATURE_NAMES)`` float32) of one conversation.

    ``prompt`` is the text the router keys on (default: the last user message);
    ``n_tokens`` its token count if the caller already tokenized it (else estimated from
    characters). Scans look at the first ``max_scan_chars`` characters only, so the cost is
    bounded whatever the prompt's size.
    """
    user_turns = assistant_turns = 0
    system_chars = conv_chars = 0
    last_user = ""
    for m in messages:
        role = m.get("role")
        text = content_text(m.get("content"))
        conv_chars += len(text)
        if role == "user":
            user_turns += 1
            last_user = text
        elif role == "assistant":
            assistant_turns += 1
        elif role in ("system", "developer"):
            system_chars += len(text)
    text = last_user if prompt is None else prompt
    n_chars = len(text)
    scan = text[:max_scan_chars]
    if n_tokens is None:
        n_tokens = n_chars // 4
    low = scan.lower()
    ascii_bytes = scan.encode("ascii", "ignore")
    n_words = len(scan.split())
    # ASCII words only: every cue word is ASCII, and this keeps the pass in C.
    wordset = set(ascii_bytes.lower().translate(_PUNCT_TO_SPACE).split())
    letters, upper, digits, punct, space, non_ascii, cjk, cyr, arab = _char_classes(
        scan, ascii_bytes
    )
    n_scan = len(scan)
    code_hits = len(wordset & _CODE_WORDS) + sum(scan.count(sym) for sym in _CODE_SYMBOLS)
    has_math = (
        "$" in scan
        or bool(wordset & _MATH_WORDS)
        or any(p in low for p in _MATH_PHRASES)
        or (digits > 1 and _MATH_EXPR.search(scan) is not None)
    )
    choice_labels = {hit.group(1).upper() for hit in _CHOICE_LINE.finditer(scan)}
    if ")" in scan:
        # "(A) ..." or "A) ..." not glued to a preceding word ("fA)" is not a choice).
        for hit in _CHOICE_INLINE.finditer(scan):
            i = hit.start()
            if i == 0 or not scan[i - 1].isalnum():
                choice_labels.add(hit.group(1))
    multiple_choice = len(choice_labels) >= 2 or (
        len(choice_labels) >= 1 and any(p in low for p in _CHOICE_PHRASES)
    )
    stripped = scan.rstrip()
    n_tools = len(tools) if tools else 0

    values = [
        _log_scaled(n_tokens, 512),
        _log_scaled(n_chars, 4096),
        _log_scaled(conv_chars, 16384),
        _log_scaled(n_words, 1024),
        _log_scaled(scan.count("\n") + 1 if scan else 0, 256),
        min(((n_scan - space) / n_words) / 10.0, 2.0) if n_words else 0.0,
        _log_scaled(user_turns, 16),
        _log_scaled(assistant_turns, 16),
        float(system_chars > 0),
        _log_scaled(system_chars, 4096),
        float(any(f in scan for f in _CODE_FENCE)),
        min(_ratio(code_hits, max(n_words, 1)) * 4.0, 1.0),
        float(has_math),
        min(_ratio(len(_MATH_CHARS.findall(scan)), max(n_scan, 1)) * 10.0, 1.0),
        _ratio(digits, n_scan),
        _log_scaled(scan.count("?"), 16),
        float(stripped.endswith("?")),
        float(multiple_choice),
        _ratio(letters, n_scan),
        _ratio(upper, max(letters, 1)),
        _ratio(punct, n_scan),
        _ratio(space, n_scan),
        _ratio(non_ascii, n_scan),
        _ratio(cjk, n_scan),
        _ratio(cyr, n_scan),
        _ratio(arab, n_scan),
        float(n_tools > 0),
        _log_scaled(n_tools, 32),
        float(_has_images(messages)),
        float(any(u in low for u in _URL_PREFIXES)),
    ]
    values.extend(
        float(bool(wordset & cue_words) or any(p in low for p in cue_phrases))
        for cue_words, cue_phrases in _INTENTS.values()
    )
    return np.asarray(values, dtype=np.float32)

"""What the escalation policy sees of a prompt: the answers it has bought and their features.

Each recorded response is reduced to a normalized answer (``router.answers``), its kind and
letter, checks that can run on a code answer without its tests, and a token set for a soft
agreement between code answers; the distinct answers among the called models become
candidates for the selector, and a *state* (what the router knows after a set of calls) is
the selector's pick with the features the value models predict from.
"""

from __future__ import annotations

import ast
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from router.answers import normalize_answer
from router.outcomes import OutcomeRecord
from training.evaluation.logistic import Logistic
from training.evaluation.sweep import recorded_response

_FENCE = re.compile(r"```([a-zA-Z0-9_+#-]*)[ \t]*\r?\n(.*?)```", re.DOTALL)
_WORD = re.compile(r"[a-z]+")
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+|[^\sA-Za-z_\d]")
_DEF = re.compile(r"def\s+([A-Za-z_]\w*)")
_OTHER_LANGS = {"cpp", "c++", "c", "java", "javascript", "js", "csharp", "c#", "go", "rust", "ruby"}
_KINDS = ("choice", "num", "code", "text")
_LETTERS = "ABCDE"


def _code_blocks(response: str) -> list[tuple[str, str]]:
    return [(lang.lower(), body) for lang, body in _FENCE.findall(response)]


def code_features(prompt: str, response: str) -> list[float]:
    """Checks a deployment can run on a code answer without tests: is there fenced code, is it
    Python that parses and defines a function, does the function's name echo the prompt, how
    long is the answer (long answers are often cut off)."""
    blocks = _code_blocks(response)
    langs = {lang for lang, _ in blocks}
    code = "\n".join(body for lang, body in blocks if lang in ("python", "py", ""))
    parses = defines = returns = 0.0
    if code.strip():
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError):
            pass
        else:
            nodes = list(ast.walk(tree))
            parses = 1.0
            defines = float(any(isinstance(n, ast.FunctionDef) for n in nodes))
            returns = float(any(isinstance(n, ast.Return) for n in nodes))
    name_words = {w for name in _DEF.findall(code) for w in name.lower().split("_") if w}
    overlap = len(name_words & set(_WORD.findall(prompt.lower()))) / max(1, len(name_words))
    return [
        float(bool(blocks)),
        float(bool(langs & {"python", "py"})),
        float(bool(langs & _OTHER_LANGS)),
        parses,
        defines,
        returns,
        overlap,
        math.log1p(len(response)) / 8.0,
        math.log1p(len(code.splitlines())) / 5.0,
        len(code) / max(1, len(response)),
    ]


def answer_features(normalized: str) -> list[float]:
    """Answer kind (choice / number / code / text; all zero when nothing parsed) and, for a
    multiple-choice answer, its letter (models have letter biases)."""
    kind = normalized.partition(":")[0] if normalized else ""
    letter = normalized[-1] if kind == "choice" else ""
    return [float(kind == k) for k in _KINDS] + [float(letter == x) for x in _LETTERS]


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / max(1, len(a | b))


@dataclass(slots=True)
class Response:
    answer: str  # normalized final answer ("" when none)
    features: list[float]  # answer_features + code_features
    tokens: frozenset[str]  # for a soft agreement between code answers


def response_of(record: OutcomeRecord, model: str) -> Response:
    text = recorded_response(
        record, model, "an escalation policy needs responses to compare answers"
    )
    answer = normalize_answer(text)
    blocks = _code_blocks(text)
    code = "\n".join(body for _, body in blocks) if blocks else text
    return Response(
        answer,
        answer_features(answer) + code_features(record.text, text),
        frozenset(_TOKEN.findall(code)),
    )


# -- candidates and states ---------------------------------------------------------------------


@dataclass(slots=True)
class Candidate:
    model: str  # the cheapest called model giving this answer (its response is returned)
    features: np.ndarray


def candidates(responses: Mapping[str, Response], called: Sequence[str]) -> list[Candidate]:
    """One candidate per distinct non-empty answer among ``called``: who voted for it, how
    large its share is, its representative's answer/code features, and how much the
    representative's text overlaps the other answers (agreement for code, which never
    matches textually)."""
    groups: dict[str, list[str]] = {}
    for m in called:
        if responses[m].answer:
            groups.setdefault(responses[m].answer, []).append(m)
    n = len(called)
    out = []
    for voters in groups.values():
        rep = voters[0]
        others = [m for m in called if m not in voters]
        sims = [_jaccard(responses[rep].tokens, responses[m].tokens) for m in others]
        f = [float(m in voters) for m in called]
        f += [float(m == rep) for m in called]
        f += [len(voters) / n, float(len(groups) == 1), len(groups) / n]
        f += [float(np.mean(sims)) if sims else 1.0, max(sims) if sims else 1.0]
        f += responses[rep].features
        out.append(Candidate(rep, np.array(f)))
    return out


@dataclass(slots=True)
class State:
    """What the router knows after calling ``called``: its pick and the state's features."""

    called: tuple[str, ...]
    pick: str
    features: np.ndarray


def _prompt_features(record: OutcomeRecord) -> list[float]:
    return [math.log1p(len(record.text)) / 10.0]


def build_state(
    record: OutcomeRecord,
    responses: Mapping[str, Response],
    called: tuple[str, ...],
    selectors: Mapping[tuple[str, ...], Logistic],
) -> State:
    selector = selectors.get(called)
    if not called:
        return State(called, "", np.array(_prompt_features(record)))
    cands = candidates(responses, called)
    if cands and selector is not None:
        p = selector.predict(np.stack([c.features for c in cands]))
        order = np.argsort(-p, kind="stable")
        top = float(p[order[0]])
        margin = top - (float(p[order[1]]) if len(cands) > 1 else 0.0)
        pick, pick_features = cands[int(order[0])].model, responses[cands[int(order[0])].model]
    else:
        top = margin = 0.0
        pick, pick_features = called[0], responses[called[0]]
    answers = [responses[m].answer for m in called]
    f = [top, margin, len({a for a in answers if a}) / len(called)]
    f += [float(bool(a) and a == b) for a, b in itertools.combinations(answers, 2)]
    for m in called:
        f += responses[m].features[: len(_KINDS) + len(_LETTERS)]
    f += pick_features.features + _prompt_features(record)
    return State(called, pick, np.array(f))

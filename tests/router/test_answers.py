"""Answer normalization for the agreement check: answers agree on the final answer they
reach (a letter, a number, code), not on their wording, and never by accident."""

from __future__ import annotations

import pytest

from router.answers import agree, normalize_answer


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("The answer is (B).", "choice:B"),
        ("Answer: C", "choice:C"),
        ("B. Paris", "choice:B"),
        ("(C) blue", "choice:C"),
        ("D", "choice:D"),
        ("The answer is 10.", "num:10"),
        ("1,000 apples", "num:1000"),
        ("It costs 1.50", "num:1.5"),
        ("2.0", "num:2"),
        ("0.0", "num:0"),
        ("-3", "num:-3"),
        ("```python\ndef f(x):\n    return  x\n```", "code:def f(x): return x"),
        # Unfenced, as MBPP's prompt asks for it: the code, up to its closing marker.
        ("[BEGIN]\ndef f(x):\n    return  x + 1\n[Done]", "code:def f(x): return x + 1"),
        (
            "Here it is:\nimport math\ndef f(x): return math.pi",
            "code:import math def f(x): return math.pi",
        ),
        ("It is 3 km from here.", "num:3"),
        ("Paris, of course!", "text:paris of course"),
        ("...", ""),
        ("", ""),
    ],
)
def test_the_final_answer_is_kept(text: str, key: str) -> None:
    assert normalize_answer(text) == key


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # Integers keep their zeros: 10 is not 100, nor 2 twenty.
        ("The answer is 10.", "The answer is 100."),
        ("20", "2"),
        # A sentence opening with the article, a formula, a lower-case "a": no option named.
        ("A cat.", "A dog."),
        ("E = mc^2", "E = hf"),
        ("The answer is a rose.", "The answer is a tulip."),
        # Punctuation alone is no answer.
        ("...", "!!!"),
        # Two programs are not the same answer for ending in the same number.
        (
            "[BEGIN]\ndef f(l):\n    n = 0\n    n += 1\n[Done]",
            "[BEGIN]\ndef g(l):\n    return len(set(l)) + 1\n[Done]",
        ),
    ],
)
def test_different_answers_do_not_agree(a: str, b: str) -> None:
    assert not agree(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("The answer is (B).", "B"),
        ("The total is 1,000.", "1000"),
        ("x = 2.50", "It is 2.5"),
        ("0", "0.0"),
    ],
)
def test_the_same_answer_worded_differently_agrees(a: str, b: str) -> None:
    assert agree(a, b)

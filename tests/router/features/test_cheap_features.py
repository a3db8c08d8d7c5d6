"""Cheap conversation features: each one reacts to what it names, all stay bounded."""

from __future__ import annotations

from typing import Any

import numpy as np

from router.features import CHEAP_FEATURE_NAMES, cheap_features


def feats(messages: list[dict[str, Any]], **kw: Any) -> dict[str, float]:
    v = cheap_features(messages, **kw)
    assert v.dtype == np.float32 and v.shape == (len(CHEAP_FEATURE_NAMES),)
    return dict(zip(CHEAP_FEATURE_NAMES, v.tolist(), strict=True))


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_code_math_choices_and_questions() -> None:
    code = feats(user("Fix this:\n```python\ndef f(x):\n    return x == 1\n```"))
    assert code["has_code_fence"] == 1.0 and code["code_density"] > 0 and code["intent_code"] == 1.0
    plain = feats(user("Tell me about the history of Rome"))
    assert (
        plain["has_code_fence"] == 0.0 and plain["code_density"] == 0.0 and plain["has_math"] == 0.0
    )
    math = feats(user("Solve for x: 3x + 5 = 20"))
    assert math["has_math"] == 1.0 and math["math_density"] > 0 and math["digit_ratio"] > 0
    mc = feats(user("Which planet is largest?\nA) Mars\nB) Jupiter\nC) Venus\nD) Earth"))
    assert mc["multiple_choice"] == 1.0 and mc["log_question_marks"] > 0
    assert feats(user("Which planet is largest?"))["multiple_choice"] == 0.0
    assert feats(user("Is it (A) red or (B) blue?"))["multiple_choice"] == 1.0
    assert feats(user("What time is it?"))["ends_with_question"] == 1.0


def test_conversation_shape_tools_and_images() -> None:
    conv: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "x"}},
            ],
        },
    ]
    f = feats(conv, tools=[{"type": "function", "function": {"name": "f"}}])
    assert f["has_system"] == 1.0 and f["log_system_chars"] > 0
    assert f["log_user_turns"] > feats(user("what is this?"))["log_user_turns"]
    assert f["log_assistant_turns"] > 0 and f["has_tools"] == 1.0 and f["log_tools"] > 0
    assert f["has_images"] == 1.0
    assert feats(user("x"))["has_tools"] == 0.0


def test_scripts_and_lengths() -> None:
    zh = feats(user("请把这句话翻译成英文"))
    ru = feats(user("Переведите это предложение"))
    en = feats(user("Translate this sentence into French"))
    assert zh["cjk_ratio"] > 0.5 and zh["non_ascii_ratio"] > 0.5
    assert ru["cyrillic_ratio"] > 0.5 and en["non_ascii_ratio"] == 0.0
    assert en["intent_translate"] == 1.0 and en["ascii_letter_ratio"] > 0.5
    short, long = feats(user("hi there")), feats(user("hi there " * 300))
    assert long["log_chars"] > short["log_chars"] and long["log_words"] > short["log_words"]


def test_values_are_bounded_for_huge_inputs() -> None:
    v = cheap_features(user("```" + "x = 1; " * 200_000), tools=[{}] * 500, n_tokens=10**6)
    assert np.all(np.isfinite(v)) and v.min() >= 0.0 and v.max() <= 2.0

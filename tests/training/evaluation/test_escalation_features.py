from __future__ import annotations

from training.evaluation.escalation_features import code_features


def test_code_checks_tell_parsing_python_from_broken_code() -> None:
    prompt = "Write a function to reverse a string."
    good = "```python\ndef reverse_string(s):\n    return s[::-1]\n```"
    broken = "```python\ndef reverse_string(s)\n    return s[::-1\n```"
    cpp = "```cpp\nstring reverse(string s) { return s; }\n```"
    f_good, f_broken, f_cpp = (code_features(prompt, x) for x in (good, broken, cpp))
    parses, defines, other_lang, overlap = 3, 4, 2, 6
    assert f_good[parses] == 1.0 and f_good[defines] == 1.0 and f_good[overlap] == 1.0
    assert f_broken[parses] == 0.0
    assert f_cpp[other_lang] == 1.0 and f_good[other_lang] == 0.0

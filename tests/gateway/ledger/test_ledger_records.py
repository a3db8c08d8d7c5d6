"""What a client sends that the ledger stores as it can."""

from __future__ import annotations

from gateway.ledger.records import END_USER_MAX, end_user


def test_an_end_user_is_made_storable_never_refused() -> None:
    assert end_user("user-1234") == "user-1234"
    assert end_user(None) is None and end_user("") is None
    assert end_user("a\x00b") == "ab"  # PostgreSQL's text refuses NUL characters
    assert end_user("\x00\x00") is None
    long = "é" * (END_USER_MAX + 45)
    assert end_user(long) == "é" * END_USER_MAX

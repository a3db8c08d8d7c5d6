"""Passwords in URLs masked wherever a URL is shown (``router.url_secrets``)."""

from __future__ import annotations

import pytest

from router.url_secrets import mask_url, mask_userinfo, redact


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("llm:http://u:pw@h:1/v1#m", "llm:http://u:***@h:1/v1#m"),
        (
            "a postgresql://u:p%40ss@db/x and https://k:v@h",
            "a postgresql://u:***@db/x and https://k:***@h",
        ),
        ("http://user@h/v1", "http://user@h/v1"),  # no password: nothing to hide
        ("http://h/v1?x=a:b@c", "http://h/v1?x=a:b@c"),  # an @ past the host is no userinfo
        ("no url here: a:b@c", "no url here: a:b@c"),
    ],
)
def test_mask_userinfo_hides_every_password_in_a_text(text: str, shown: str) -> None:
    assert mask_userinfo(text) == shown


def test_a_url_and_its_password_quoted_elsewhere() -> None:
    url = "http://admin:s%3Acret@gw:8000"
    assert mask_url(url) == "http://admin:***@gw:8000"
    assert redact("failed: s:cret and s%3Acret", url) == "failed: *** and ***"

"""Passwords in URLs kept out of what is shown: a URL's ``user:password@`` as ``user:***@``.

A base URL may carry its credentials (``http://user:pw@host/v1``, a ledger's
``postgresql://user:pw@host/db``); messages, logs, reports and recorded command lines are
read by others and must name the URL without them.
"""

from __future__ import annotations

import re
import urllib.parse

__all__ = ["mask_url", "mask_userinfo", "redact", "split_userinfo"]

# ``scheme://user:password@`` anywhere in a text: the password is what stops at the ``@``
# (no ``/``, whitespace or another ``@`` before it), as URL syntax has it.
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*):([^\s/@]*)@")


def split_userinfo(url: str) -> tuple[str, str, str | None, str] | None:
    """``url`` as (scheme://, user, password, rest after the ``@``), or None without a
    userinfo. Parsed on the text, not with urlsplit: a malformed URL (a bad port, an
    unbalanced bracket) is still masked."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    userinfo, at, host = rest[:end].rpartition("@")
    if not at:
        return None
    user, colon, password = userinfo.partition(":")
    return f"{scheme}://", user, password if colon else None, host + rest[end:]


def mask_url(url: str) -> str:
    """``url`` with the password of its userinfo as ``***`` (``http://admin:***@host``)."""
    parts = split_userinfo(url)
    if parts is None or parts[2] is None:
        return url
    scheme, user, _, rest = parts
    return f"{scheme}{user}:***@{rest}"


def redact(text: str, url: str) -> str:
    """``text`` with the password of ``url`` masked as ``***`` wherever it appears (an error
    message may quote it, as written or percent-decoded)."""
    parts = split_userinfo(url)
    password = parts[2] if parts is not None else None
    if not password:
        return text
    # The longer first, so neither leaves part of the other behind.
    for secret in sorted({password, urllib.parse.unquote(password)}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def mask_userinfo(text: str) -> str:
    """Every ``scheme://user:password@`` in ``text`` (a policy spec, a command line) with its
    password as ``***``."""
    return _USERINFO.sub(r"\1:***@", text)

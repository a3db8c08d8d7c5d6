"""What an error message may repeat of the client's input.

Messages name what was wrong — "the model 'gpt-5o' does not exist", "no key 'k_…'", "GET
/v1/embedings is not served" — which is what makes them useful, but a value repeated whole
made the answer as large as the request: a 1 MB ``model`` was a 1 MB 404, and a megabyte
path a megabyte of JSON to log and to render. Every value an error echoes goes through
:func:`echo` (quoted, as ``{value!r}`` was) or :func:`clip` (as is): the first
``ECHO_LIMIT`` characters, then ``…`` and the value's whole length, which names and ids
never reach. ``APIError`` clips whole messages and ``param`` as a last bound
(``MESSAGE_LIMIT``), for a value that reaches one by a path these do not see (a validator's
message, an upstream's).
"""

from __future__ import annotations

# Model names, ids, paths and parameter values are far shorter.
ECHO_LIMIT = 256
# A whole error message: several echoed values and the text around them.
MESSAGE_LIMIT = 4096


def clip(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text``, or its first ``limit`` characters, ``…`` and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def echo(value: object) -> str:
    """``repr(value)`` as a message quotes it (``'gpt-5o'``), of at most ``ECHO_LIMIT``
    characters of the value; a longer one is cut, its length said after the quote."""
    if not isinstance(value, str):
        return clip(repr(value))
    if len(value) <= ECHO_LIMIT:
        return repr(value)
    return f"{value[:ECHO_LIMIT]!r}… ({len(value)} characters)"

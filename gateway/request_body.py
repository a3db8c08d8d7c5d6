"""Reading a request body: the size limit, and the body's content coding.

A client may compress what it sends (``Content-Encoding: gzip`` or ``deflate``, RFC 9110
§8.4), as HTTP clients configured for large prompts or a compressing proxy in front of the
gateway do. The limit (``server.max_body_bytes``) holds for the decoded body, which is what
the gateway parses and keeps, and decoding stops as soon as it is passed, so a small
compressed body cannot expand into gigabytes (a decompression bomb). Any other coding is a
415 naming the ones taken (with ``Accept-Encoding``, as RFC 9110 §15.5.16 asks), rather than
compressed bytes failing as "not valid JSON".
"""

from __future__ import annotations

import asyncio
import zlib
from typing import TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from gateway.echo import echo
from gateway.errors import APIError, bad_request, validation_error

M = TypeVar("M", bound=BaseModel)

# Taken as sent; "identity" is what no header means.
_IDENTITY = frozenset({"", "identity"})
# zlib's window bits for each coding: 16 + 15 reads gzip's header and trailer; for
# "deflate", which RFC 9110 defines as the zlib format, 32 + 15 reads zlib's (or gzip's) and
# raw deflate, which some clients send under that name, is tried next with -15.
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_WBITS = {"gzip": _GZIP_WBITS, "x-gzip": _GZIP_WBITS, "deflate": 32 + zlib.MAX_WBITS}
_RAW_DEFLATE_WBITS = -zlib.MAX_WBITS
ACCEPTED_ENCODINGS = "gzip, deflate"
# Inflating a compressed body larger than this would hold the event loop for more than about
# 0.3 ms (text inflates at ~17 µs per compressed KB: bench/request_decode.py): it is inflated
# in a worker thread instead.
INLINE_DECODE_BYTES = 16 * 1024
# How long a small body (the admin API's, feedback's) may take to arrive; the model
# endpoints take ``server.body_timeout_s``.
BODY_TIMEOUT_S = 30.0


def too_large(limit: int) -> APIError:
    return APIError(413, f"request body is larger than {limit} bytes", code="request_too_large")


def body_timeout(timeout_s: float) -> APIError:
    # The rest of the body may still be on its way: the connection cannot be reused.
    return APIError(
        408,
        f"the request body did not arrive within {timeout_s:g} s",
        code="request_timeout",
        headers={"connection": "close"},
    )


async def read_body(request: Request, limit: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The body, decoded, refused (413) as soon as it exceeds ``limit`` — before buffering it
    all when the client announced a length past it — 415 for a coding not taken, and 408
    when it takes longer than ``timeout_s`` to arrive."""
    coding = _coding(request.headers.get("content-encoding"))
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large(limit)
                chunks.append(chunk)
    except TimeoutError:
        raise body_timeout(timeout_s) from None
    except ClientDisconnect:
        # Gone before its body was in: nobody to answer, nothing routed or logged.
        raise APIError(
            499, "the client closed the connection before sending its body", code="client_closed"
        ) from None
    raw = b"".join(chunks)
    if coding is None:
        return raw
    if len(raw) <= INLINE_DECODE_BYTES:
        return inflate_body(raw, coding, limit)
    return await asyncio.to_thread(inflate_body, raw, coding, limit)


def _coding(header: str | None) -> str | None:
    """The one coding the body is in (None: as sent). Several stacked codings
    (``gzip, gzip``) are refused too: no client sends them."""
    value = (header or "").strip().lower()
    if value in _IDENTITY:
        return None
    if value in _WBITS:
        return value
    raise APIError(
        415,
        f"Content-Encoding {echo(header)} is not supported; send the body as is, or in "
        f"{ACCEPTED_ENCODINGS}",
        param="content-encoding",
        code="unsupported_content_encoding",
        headers={"accept-encoding": ACCEPTED_ENCODINGS},
    )


def inflate_body(raw: bytes, coding: str, limit: int) -> bytes:
    """Decompress ``raw``, at most ``limit`` bytes of output: more is a 413, a truncated or
    corrupt stream a 400."""
    try:
        return _inflate(raw, _WBITS[coding], limit)
    except zlib.error:
        if coding != "deflate":
            raise _corrupt(coding) from None
    try:
        return _inflate(raw, _RAW_DEFLATE_WBITS, limit)
    except zlib.error:
        raise _corrupt(coding) from None


def _inflate(raw: bytes, wbits: int, limit: int) -> bytes:
    out: list[bytes] = []
    size = 0
    while True:
        d = zlib.decompressobj(wbits)
        # One byte past what is left says it is over without inflating the rest.
        piece = d.decompress(raw, limit - size + 1)
        size += len(piece)
        if size > limit:
            raise too_large(limit)
        if not d.eof:
            raise zlib.error("incomplete or truncated stream")
        out.append(piece)
        raw = d.unused_data
        if not raw:
            return b"".join(out)
        # gzip allows several members back to back; anything else after the end is junk.
        if wbits != _GZIP_WBITS:
            raise zlib.error("data after the end of the stream")


def _corrupt(coding: str) -> APIError:
    return APIError(
        400,
        f"the request body is not valid {coding} data",
        param="content-encoding",
        code="invalid_content_encoding",
    )


def invalid_json(raw: bytes, exc: orjson.JSONDecodeError) -> APIError:
    """The 400 ``invalid_json`` for a body orjson refused, saying what is wrong with it."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        # orjson says "str is not valid UTF-8: surrogates not allowed" at char 0 for any
        # undecodable byte (UTF-16, Latin-1): say what is wrong, and where.
        return bad_request(
            f"request body is not valid UTF-8 (at byte offset {bad.start}): JSON must be "
            "sent as UTF-8",
            code="invalid_json",
        )
    return bad_request(f"request body is not valid JSON: {exc}", code="invalid_json")


async def read_model(request: Request, model: type[M], limit: int = 64 * 1024) -> M:
    """A small JSON body (the admin API's, feedback's) as ``model``: an empty body is ``{}``;
    a 400 naming the first field that is wrong, and ``invalid_json`` for a body that is not
    JSON or not an object, as on every other JSON endpoint (the README's error table)."""
    raw = await read_body(request, limit) or b"{}"
    try:
        # Parsed as the chat API parses (orjson) first: pydantic takes 1e400 as infinity,
        # which a key's metadata then stored as null; here, as there, it is invalid JSON.
        orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_json(raw, exc) from None
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors()
        code = "invalid_json" if errors[0]["type"] in ("json_invalid", "model_type") else None
        raise validation_error(errors, code=code) from None

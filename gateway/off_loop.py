"""Reading a large request off the event loop.

Parsing a request's JSON, validating it and routing it (the pool it may go to, its context
window, the translation of a Responses or Messages request to a chat one) costs CPU in
proportion to how many messages, items and tools it holds: about 5 µs a short message, so
a body of 20,000 one-line messages held one worker's loop for 0.4–0.7 s, and every other
request and stream on that worker with it. A body that large is read in a worker thread:
the GIL is still held, but the interpreter hands it over every few milliseconds
(``sys.getswitchinterval``), so the loop keeps serving the others meanwhile. Small bodies
— nearly all of them — are read in place: a thread hop costs more than they do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# At 32 KiB a body of short messages (~1,000 of them) takes ~5 ms to read, past the loop
# latency a streaming client notices; a thread hop costs ~50–100 µs, nothing beside it.
OFF_LOOP_BYTES = 32 * 1024


async def read_sized(size: int, read: Callable[[], T]) -> T:
    """``read()`` (work on a body of ``size`` bytes), in a worker thread from
    ``OFF_LOOP_BYTES`` on, in place below."""
    if size < OFF_LOOP_BYTES:
        return read()
    return await asyncio.to_thread(read)

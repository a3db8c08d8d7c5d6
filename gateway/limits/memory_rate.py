"""The in-process store's rate windows: a sliding-window log per key, summed per tick.

The same log as the Redis store's (``gateway.limits.lua_rate``), with the same answers: an
entry at time t counts while now < t + window, the rpm count is the number of requests in
the window, the tpm count the sum of the token entries (weights may be negative: refunds),
and a 429's retry-after is when the first whole timestamp has left by which enough has left.

Bounded work. The in-process store runs on the gateway's event loop, so a call that reads a
whole window stalls every request of that worker. The logs used to be deques of entries:
the first check after a pause took out everything that had left one entry at a time, and
every tpm 429 walked the window from its oldest entry for its retry-after (on a key at 1,000
requests a second, 120,000 entries: ~10 ms per 429, ~7 ms after a 30 s pause). Now, as on
Redis, each log is also summed per tick of time (1/4 s):

* ticks wholly out of the window leave by their sums, and only the tick the cutoff falls in
  is cut, by bisection;
* a 429 adds ticks up by their sums and reads only the tick its answer falls in. A tick is
  skipped only when none of its timestamps can get there (what left before it, plus its
  timestamps' positive net weights, is short of the need), so the answer is the one walking
  every entry gives;
* the entries of one timestamp are kept as their net weight (a refund is dated at its
  estimate's admission, so a request's two entries are one), which is all an answer reads
  of them.

A call runs O(ticks in the window + one tick's timestamps) of Python, whatever the key's rate
or the pause before it; the rest is C on flat arrays: a bisection, and, once half of a log's
arrays have left the window, one copy of what is left (amortized: on a key at 1,000 requests
a second, 60,000 timestamps copied once a minute, 0.1-0.2 ms). Flat arrays, not an object
per entry or per tick: a log is four objects for the garbage collector whatever it holds
(objects that live a minute each would be promoted to the oldest generation and make its
full passes come sooner: 0.37 s over a gateway's heap on a loaded 2-core VM). Weights are 64-bit integers,
Redis's own range (INCRBY), far above what a key's tpm (at most 2^31 - 1) admits.
"""

from __future__ import annotations

import bisect
import math
from array import array

from gateway.limits.windows import RATE_WINDOW_S

# Ticks a second, as on Redis (lua_rate's TICKS): at 1,000 requests a second a tick holds
# ~250 timestamps and a window ~240 ticks, so neither the pass over ticks a 429 makes nor
# the one tick it reads dominates (~10-20 µs each).
TICKS_PER_S = 4

# A tick is four ints in TickLog._ticks: its number k (it holds the timestamps in
# [k / TICKS_PER_S, (k + 1) / TICKS_PER_S)), how many timestamps it has in the window, the sum
# of their net weights, and the sum of those below 0.
_K, _COUNT, _SUM, _NEGATIVE = range(4)
_STRIDE = 4


class TickLog:
    """One sliding-window log (a key's requests, weight 1 each, or its tokens).

    ``_times[_head:]`` are the timestamps in the window, ascending, ``_nets`` their net
    weights beside them; ``_ticks`` from tick ``_first`` on sums them per tick (those before
    ``_head`` and ``_first`` have left: dropped in bulk, by ``_compact``)."""

    __slots__ = ("_first", "_head", "_nets", "_ticks", "_times", "total")

    def __init__(self) -> None:
        self._times = array("d")
        self._nets = array("q")
        self._head = 0
        self._ticks = array("q")
        self._first = 0
        self.total = 0  # the sum of every weight in the window

    def reset_s(self, now: float) -> float:
        """Seconds until the newest entry has left the window (0: none)."""
        return gone_in(self._times[-1], now) if self._times else 0.0

    def sweep(self, cutoff: float) -> None:
        """Takes out what has left the window: the timestamps <= cutoff (= now - window)."""
        times, ticks = self._times, self._ticks
        head = self._head
        if not times or times[head] > cutoff:
            return
        ck = math.floor(cutoff * TICKS_PER_S)  # ticks before ck end at or before the cutoff
        at, end = self._first * _STRIDE, len(ticks)
        freed = 0
        while at < end and ticks[at + _K] < ck:
            freed += ticks[at + _SUM]
            head += ticks[at + _COUNT]
            at += _STRIDE
        if at < end and ticks[at + _K] == ck:
            # the cutoff's tick: its timestamps up to the cutoff, found by bisection
            count = ticks[at + _COUNT]
            cut = bisect.bisect_right(times, cutoff, head, head + count)
            if cut > head:
                gone = self._nets[head:cut]
                part = sum(gone)
                freed += part
                ticks[at + _SUM] -= part
                if ticks[at + _NEGATIVE]:
                    ticks[at + _NEGATIVE] -= sum(w for w in gone if w < 0)
                if cut - head == count:
                    at += _STRIDE
                else:
                    ticks[at + _COUNT] = count - (cut - head)
                head = cut
        self.total -= freed
        self._head, self._first = head, at // _STRIDE
        if 2 * head >= len(times):
            self._compact()

    def _compact(self) -> None:
        # At least half the arrays have left: copying the rest down costs at most what has
        # left since the last copy (amortized O(1) an entry, in C).
        del self._times[: self._head]
        del self._nets[: self._head]
        del self._ticks[: self._first * _STRIDE]
        self._head = self._first = 0
        if not self._times:
            self.total = 0

    def add(self, at: float, weight: int) -> None:
        times, nets, ticks = self._times, self._nets, self._ticks
        self.total += weight
        k = math.floor(at * TICKS_PER_S)
        newest = times[-1] if times else -math.inf
        if at > newest:  # the usual case: the clock moves forward
            times.append(at)
            nets.append(weight)
            if len(ticks) > self._first * _STRIDE and ticks[-_STRIDE + _K] == k:
                _book(ticks, len(ticks) - _STRIDE, 1, weight, min(weight, 0))
            else:
                ticks.extend((k, 1, weight, min(weight, 0)))
            return
        # a correction, dated at its request's admission (or now, after that of the newest)
        if at == newest:
            i, j = len(times) - 1, len(ticks) - _STRIDE
        else:
            i = bisect.bisect_left(times, at, self._head)
            j = _STRIDE * bisect.bisect_left(
                range(self._first, len(ticks) // _STRIDE), k, key=lambda n: ticks[n * _STRIDE]
            )
            j += self._first * _STRIDE
        if times[i] == at:  # i < len(times): at <= newest
            before = nets[i]
            nets[i] = before + weight
            _book(ticks, j, 0, weight, min(before + weight, 0) - min(before, 0))
            return
        times.insert(i, at)
        nets.insert(i, weight)
        if j < len(ticks) and ticks[j + _K] == k:
            _book(ticks, j, 1, weight, min(weight, 0))
        else:
            ticks[j:j] = array("q", (k, 1, weight, min(weight, 0)))

    def left_by(self, need: int) -> float | None:
        """The first timestamp by which at least ``need`` has left the window (its weight and
        all older ones), or None if that never happens. A refund shares its estimate's
        timestamp and leaves with it, so only whole timestamps count."""
        times, nets, ticks = self._times, self._nets, self._ticks
        freed, start = 0, self._head
        for at in range(self._first * _STRIDE, len(ticks), _STRIDE):
            end = start + ticks[at + _COUNT]
            total = ticks[at + _SUM]
            # freed before this tick plus its positive nets bounds what is freed at any of
            # its timestamps: short of need, none gets there and its entries are skipped
            if freed + total - ticks[at + _NEGATIVE] >= need:
                for i in range(start, end):
                    freed += nets[i]
                    if freed >= need:
                        return times[i]
            else:
                freed += total
            start = end
        return None


def _book(ticks: array[int], at: int, count: int, weight: int, negative: int) -> None:
    ticks[at + _COUNT] += count
    ticks[at + _SUM] += weight
    if negative:
        ticks[at + _NEGATIVE] += negative


def gone_in(at: float, now: float) -> float:
    """Seconds until an entry at ``at`` has left the window."""
    return max(0.0, at + RATE_WINDOW_S - now)

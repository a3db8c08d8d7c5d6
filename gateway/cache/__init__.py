"""The exact-match answer cache: a request asked again (same messages, parameters, model
or policy, and caller scope) within the TTL is answered with the stored answer for nothing.
Off by default; ``cache.backend`` is per-worker memory or Redis shared by every worker and
replica."""

from gateway.cache.backends import CacheUnavailable, MemoryBackend, RedisBackend
from gateway.cache.entry import CachedAnswer, cache_key, price_tag
from gateway.cache.service import AnswerCache, CacheTicket, build_answer_cache

__all__ = [
    "AnswerCache",
    "CacheTicket",
    "CacheUnavailable",
    "CachedAnswer",
    "MemoryBackend",
    "RedisBackend",
    "build_answer_cache",
    "cache_key",
    "price_tag",
]

"""The local services the integration tests use (Redis on 127.0.0.1:6379, PostgreSQL on
127.0.0.1:5432), the shared data beside the repository, and what a test does when one is
missing.

``make test`` — what CI runs — starts Redis and PostgreSQL first (``scripts/services.sh``)
and sets ``XROUTER_TEST_REQUIRE_SERVICES=1``: a missing service or data set then *fails*
the tests that need it, so a run cannot pass with them silently left out. Run pytest
directly without it and those tests are skipped, with the reason.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import NoReturn

import pytest

REQUIRE_ENV = "XROUTER_TEST_REQUIRE_SERVICES"
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
REDIS_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/0"
SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


def unavailable(reason: str) -> NoReturn:
    """Skip the test for ``reason``, or fail it when the services are required."""
    if required():
        pytest.fail(f"{reason} ({REQUIRE_ENV}=1: the run needs it)", pytrace=False)
    pytest.skip(reason)


def redis_reachable() -> bool:
    try:
        with socket.create_connection((REDIS_HOST, REDIS_PORT), timeout=0.5):
            return True
    except OSError:
        return False


def need_redis() -> None:
    if not redis_reachable():
        unavailable(f"Redis is not running on {REDIS_HOST}:{REDIS_PORT}")


def needs_shared_data(*parts: str) -> pytest.MarkDecorator:
    """Skip unless ``../shared/data/<parts>`` exists — never when the data is required: the
    test then runs, and fails on the missing file."""
    path = SHARED_DATA.joinpath(*parts)
    return pytest.mark.skipif(
        not path.exists() and not required(), reason=f"{path} is absent (shared data)"
    )

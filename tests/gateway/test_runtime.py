"""Building the runtime snapshot: what it prepares before the first request."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.replay import REPO_ROOT

PROBE = """
import sys
from pathlib import Path
from gateway.runtime import build_runtime
from gateway.settings import load_settings
build_runtime(load_settings(Path(sys.argv[1]), env={}))
print("litellm" in sys.modules)
"""


@pytest.mark.parametrize(
    ("entry", "imported"),
    [
        # Importing LiteLLM takes seconds: done while the runtime is built (before serving,
        # or in a thread on reload) when a model needs it, never on the first call's event
        # loop; and not at all for a pool that does not need it.
        ("{name: claude, model: anthropic/claude-3-5-haiku, price: {input: 0.8, output: 4}}", True),
        (
            "{name: mine, model: hosted_vllm/mine, api_base: 'http://127.0.0.1:9/v1', price: 0}",
            False,
        ),
    ],
)
def test_litellm_is_imported_with_the_runtime_only_when_the_pool_needs_it(
    tmp_path: Path, entry: str, imported: bool
) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"router: {{watch_files: false}}\npool:\n  - {entry}\n")
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(cfg)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == str(imported), out.stderr


def _runtime(tmp_path: Path, router: str, extra: str = "") -> Any:
    from gateway.runtime import build_runtime
    from gateway.settings import load_settings

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        extra + f"router: {{watch_files: false, {router}}}\n"
        "pool:\n"
        "  - {name: small, model: hosted_vllm/small, api_base: 'http://127.0.0.1:9/v1', price: 0}\n"
        "  - {name: large, model: hosted_vllm/large, api_base: 'http://127.0.0.1:9/v1', price: {input: 1, output: 2}}\n"
    )
    return build_runtime(load_settings(cfg, env={}))


@pytest.mark.parametrize(
    ("configured", "serving"),
    [
        ("fixed:large", "fixed:large"),  # one pool model, routed to always
        ("llm", "cascade"),  # no router server configured yet: the warning's fallback
        ("cheapest", "cheapest"),
    ],
)
def test_the_default_policy_is_any_policy_the_runtime_can_resolve(
    tmp_path: Path, configured: str, serving: str
) -> None:
    rt = _runtime(tmp_path, f"default_policy: '{configured}'")
    assert rt.default_policy == serving and rt.policy(serving) is not None


@pytest.mark.parametrize("configured", ["fixed:missing", "cheapst"])
def test_a_default_policy_that_is_no_policy_is_refused(tmp_path: Path, configured: str) -> None:
    # A model not in the pool, a typo: no configuration could serve it, so the config is
    # refused (at startup; a reload keeps what serves) rather than served as cascade.
    with pytest.raises(ValueError, match=r"router\.default_policy"):
        _runtime(tmp_path, f"default_policy: '{configured}'")


def test_the_router_models_output_cap_is_configured(tmp_path: Path) -> None:
    url = "base_url: 'http://127.0.0.1:9/v1'"
    rt = _runtime(tmp_path, f"llm: {{{url}, max_output_tokens: 512}}")
    assert rt.policies["llm"].router_model.max_output_tokens == 512
    assert (
        _runtime(tmp_path, f"llm: {{{url}}}").policies["llm"].router_model.max_output_tokens == 4096
    )


def test_the_reference_model_is_priced_as_the_pool_prices_it(tmp_path: Path) -> None:
    from gateway.runtime import reference_price

    # "large" has no catalog price, only its pool entry's: savings are measured against it.
    rt = _runtime(tmp_path, "default_policy: cheapest", "metrics: {reference_model: large}\n")
    price = reference_price(rt.settings, rt.pool, rt.catalog)
    assert price is not None and price == rt.pool["large"].price
    # A catalog model outside the pool keeps its catalog price.
    rt = _runtime(tmp_path, "default_policy: cheapest", "metrics: {reference_model: gpt-4o}\n")
    assert reference_price(rt.settings, rt.pool, rt.catalog) == rt.catalog.get("gpt-4o")
    # A name with no price at all is refused, not reported as no savings.
    with pytest.raises(ValueError, match=r"metrics\.reference_model 'gtp-4o' has no price"):
        _runtime(tmp_path, "default_policy: cheapest", "metrics: {reference_model: gtp-4o}\n")


def test_a_cascade_order_naming_a_model_outside_the_pool_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Such a name is left out of the order (a reload may take a model out of the pool), but a
    # typo silently put the cascade back in price order.
    with caplog.at_level("WARNING", logger="gateway.runtime"):
        _runtime(tmp_path, "cascade_order: [large, smal]")
    [record] = [r for r in caplog.records if "cascade_order" in r.getMessage()]
    assert record.getMessage() == (
        "router.cascade_order names smal, not in the pool (small, large): left out of the "
        "cascade order"
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="gateway.runtime"):
        _runtime(tmp_path, "cascade_order: [large, small]")
    assert not [r for r in caplog.records if "cascade_order" in r.getMessage()]

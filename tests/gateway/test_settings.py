import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.settings import SettingsError, load_ledger_settings, load_settings
from pricing import CatalogError, load_default_catalog
from router.pool import ModelPool


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return p


POOL = """
pool:
  - name: small
    model: openai/small
    api_base: http://127.0.0.1:9/v1
    api_key: ${SMALL_KEY}
    price: {input: 0.1, output: 0.2}
"""


def test_yaml_with_env_secret_and_overrides(tmp_path: Path) -> None:
    s = load_settings(
        write(tmp_path, POOL),
        env={
            "SMALL_KEY": "sk-secret",
            "XROUTER_SERVER__PORT": "9123",
            "XROUTER_AUTH__ENABLED": "false",
        },
    )
    assert s.server.port == 9123
    assert s.auth.enabled is False
    key = s.pool[0].api_key
    assert key is not None and key.get_secret_value() == "sk-secret"
    assert "sk-secret" not in repr(s)  # secrets never print


def test_missing_env_var_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="SMALL_KEY"):
        load_settings(write(tmp_path, POOL), env={})


def test_env_default_syntax(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, POOL.replace("${SMALL_KEY}", "${SMALL_KEY:-none}")), env={})
    assert s.pool[0].api_key is not None and s.pool[0].api_key.get_secret_value() == "none"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("server: {port: 99999}", "server.port"),
        ("ledger: {log_content: everything}", "ledger.log_content"),
        ("unknown_section: {}", "unknown_section"),
        ("pool: [{name: 'bad name!', model: openai/x}]", "pool.0.name"),
        (POOL + "  - name: small\n    model: openai/x\n    price: 0\n", "duplicate"),
        ("pool: [{name: a, model: openai/a, price: 0, fallbacks: [nope]}]", "unknown models"),
        ("pool: [{name: xrouter, model: openai/a, price: 0}]", "xrouter"),
        # Both would be the llm router's tool call_a_b: it could call only one of them.
        (
            "pool: [{name: a.b, model: openai/a, price: 0}, {name: a_b, model: openai/b, price: 0}]",
            "'a.b' and 'a_b' are both 'call_a_b'",
        ),
        ("cache: {backend: disk}", "cache.backend"),
        # A URL redis-py cannot use: one line at startup, not a traceback from the lifespan.
        ("limits: {backend: redis, redis_url: notaurl}", "limits.redis_url"),
        ("cache: {redis_url: 'http://127.0.0.1:6379'}", "cache.redis_url"),
        ("cache: {ttl_s: 0}", "cache.ttl_s"),
        ("cache: {scope: team}", "cache.scope"),
        ("cache: {max_bytes: 4096, max_entry_bytes: 8192}", "max_entry_bytes"),
        ("metrics: {bearer_token: '${TOKEN:-}'}", "metrics.bearer_token"),
        # Every request routed with an infinite λ would fail: refused here, as a request's is.
        ("router: {cost_weight: .inf}", "router.cost_weight"),
        ("router: {cost_weight: .nan}", "router.cost_weight"),
        # An infinite timeout passed `gt=0` and overflowed where it became milliseconds.
        ("server: {request_timeout_s: .inf}", "server.request_timeout_s"),
        # A huge finite one made every budget hold's TTL one Redis refuses: each request of
        # a key with limits was a 503, "the rate-limit store is unavailable".
        ("server: {request_timeout_s: 1.0e+20}", "server.request_timeout_s"),
        # Further back than the year 1: the retention task failed every interval.
        ("ledger: {content_retention_days: 999999}", "ledger.content_retention_days"),
        ("ledger: {request_retention_days: 999999}", "ledger.request_retention_days"),
        ("router: {deployment_poll_s: .inf}", "router.deployment_poll_s"),
        # A circuit's cooldown goes to Redis in milliseconds, to share it: 1e20 s was refused
        # there ("value is not an integer or out of range") each time a circuit opened.
        ("router: {circuit_breaker: {cooldown_s: 1.0e+20}}", "router.circuit_breaker.cooldown_s"),
        ("router: {circuit_breaker: {sync_interval_s: 1.0e+20}}", "sync_interval_s"),
        (POOL + "    timeout_s: .inf\n", "pool.0.timeout_s"),
        # A port or database the Redis client cannot use crashed the lifespan.
        ("limits: {redis_url: 'redis://:pw@127.0.0.1:99999/0'}", "limits.redis_url: .* port"),
        ("cache: {redis_url: 'redis://127.0.0.1:63x9/0'}", "cache.redis_url: .* port"),
        ("limits: {redis_url: 'redis://127.0.0.1:6379/x'}", "limits.redis_url: .* database"),
        ("limits: {redis_url: 'redis://127.0.0.1:6379/-1'}", "limits.redis_url: .* database"),
        ("limits: {redis_url: 'redis://:pa#ss@127.0.0.1:6379/0'}", "limits.redis_url: .* %23"),
    ],
)
def test_invalid_configs_name_the_problem(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(SettingsError, match=needle):
        load_settings(write(tmp_path, text), env={"SMALL_KEY": "k"})


# Bug: the router model's credentials were not checked at load as a pool model's are: both
# Authorization headers went on every router turn, refused, and every request fell back.
def test_router_llm_credentials_in_its_url_and_a_key_are_refused(tmp_path: Path) -> None:
    text = "router: {llm: {base_url: 'http://bot:hunter2@r:8000/v1', api_key: sk-router}}\n"
    with pytest.raises(SettingsError, match=r"router\.llm.*carries credentials") as exc:
        load_settings(write(tmp_path, text), env={})
    assert "hunter2" not in str(exc.value) and "sk-router" not in str(exc.value)
    # Either alone is fine, and so is a key left empty by an unset ${VAR:-}.
    for llm in (
        "{base_url: 'http://bot:hunter2@r:8000/v1'}",
        "{base_url: 'http://r:8000/v1', api_key: sk-router}",
        "{base_url: 'http://bot:hunter2@r:8000/v1', api_key: '${ROUTER_KEY:-}'}",
    ):
        assert load_settings(write(tmp_path, f"router: {{llm: {llm}}}\n"), env={}).router.llm


def test_several_workers_need_shared_limits(tmp_path: Path) -> None:
    text = POOL + "server: {workers: 2}\nauth: {enabled: true}\n"
    with pytest.raises(SettingsError, match=r"limits\.backend: redis"):
        load_settings(write(tmp_path, text), env={"SMALL_KEY": "k"})
    # Shared limits, or no keys at all (auth off: nothing to limit), are fine.
    redis = text + "limits: {backend: redis}\n"
    assert load_settings(write(tmp_path, redis), env={"SMALL_KEY": "k"}).server.workers == 2
    no_auth = POOL + "server: {workers: 2}\nauth: {enabled: false}\n"
    assert load_settings(write(tmp_path, no_auth), env={"SMALL_KEY": "k"}).server.workers == 2


def test_not_yaml(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="YAML"):
        load_settings(write(tmp_path, "pool: [unclosed"), env={})


@pytest.mark.parametrize(
    "text",
    [
        'auth:\n  admin_key: "sk-admin-secret-1234\n',  # an unclosed quote
        "auth: {admin_key: sk-admin-secret-1234 }}\n",
        "auth:\n  admin_key: sk-admin-secret-1234\n\tenabled: true\n",  # a tab
    ],
)
def test_a_yaml_error_says_where_without_quoting_the_file(tmp_path: Path, text: str) -> None:
    # PyYAML's message quotes the offending line: a secret on it reached the log and a
    # reload's 400.
    with pytest.raises(SettingsError, match=r"not valid YAML: .+ at line \d+, column \d+") as exc:
        load_settings(write(tmp_path, text), env={})
    assert "sk-admin-secret" not in str(exc.value)
    assert exc.value.__cause__ is None and exc.value.__suppress_context__


def test_an_environment_value_that_is_not_yaml_is_taken_as_a_string(tmp_path: Path) -> None:
    env = {"SMALL_KEY": "k", "XROUTER_AUTH__ADMIN_KEY": "[sk-admin-{secret"}
    s = load_settings(write(tmp_path, POOL), env=env)
    assert s.auth.admin_key is not None
    assert s.auth.admin_key.get_secret_value() == "[sk-admin-{secret"


def test_an_admin_key_read_from_a_file_loses_its_newline(tmp_path: Path) -> None:
    env = {"SMALL_KEY": "k", "XROUTER_AUTH__ADMIN_KEY": "sk-admin-from-a-file\n"}
    s = load_settings(write(tmp_path, POOL), env=env)
    assert s.auth.admin_key is not None
    assert s.auth.admin_key.get_secret_value() == "sk-admin-from-a-file"
    blank = load_settings(write(tmp_path, POOL), env={**env, "XROUTER_AUTH__ADMIN_KEY": " \n"})
    assert not blank.auth.admin_key  # no admin key, not one made of whitespace
    # The scrape token too: with its newline no Authorization header could ever match it.
    token = load_settings(
        write(tmp_path, POOL),
        env={**env, "XROUTER_METRICS__BEARER_TOKEN": "metrics-token-0123456789\n"},
    ).metrics.bearer_token
    assert token is not None and token.get_secret_value() == "metrics-token-0123456789"
    with pytest.raises(SettingsError, match="bearer_token"):
        load_settings(write(tmp_path, POOL), env={**env, "XROUTER_METRICS__BEARER_TOKEN": " " * 16})


def test_provider_keys_read_from_a_file_lose_their_newline(tmp_path: Path) -> None:
    # As the admin key does: with its newline, every call to the model (or router turn)
    # failed on a header no HTTP client sends.
    text = POOL + (
        "  - name: spread\n    model: openai/spread\n    price: 0\n"
        "    deployments: [{api_base: 'http://127.0.0.1:8/v1', api_key: \"dk\\n\"}]\n"
        "router: {llm: {base_url: 'http://127.0.0.1:9/v1', api_key: \"rk\\n\"}}\n"
    )
    s = load_settings(write(tmp_path, text), env={"SMALL_KEY": "sk-small\n"})
    secrets = [
        s.pool[0].api_key,
        s.pool[1].deployments[0].api_key if s.pool[1].deployments else None,
        s.router.llm.api_key,
    ]
    assert [k.get_secret_value() if k else None for k in secrets] == ["sk-small", "dk", "rk"]


def test_an_override_reaches_a_pool_entry_by_its_index(tmp_path: Path) -> None:
    # XROUTER_POOL__0__API_KEY replaced the pool with {"0": {...}}: "Input should be a
    # valid list". Now it sets that entry's field, as a text setting (taken as written).
    env = {"SMALL_KEY": "k", "XROUTER_POOL__0__API_KEY": "12345", "XROUTER_POOL__0__TIMEOUT_S": "5"}
    s = load_settings(write(tmp_path, POOL), env=env)
    assert s.pool[0].api_key is not None and s.pool[0].api_key.get_secret_value() == "12345"
    assert s.pool[0].timeout_s == 5 and s.pool[0].name == "small"
    for key, says in (
        ("XROUTER_POOL__1__API_KEY", "pool has 1 entries"),
        ("XROUTER_POOL__X__API_KEY", "pool has 1 entries"),
        ("XROUTER_POOL__0", "an entry of a list"),
    ):
        with pytest.raises(SettingsError, match=says):
            load_settings(write(tmp_path, POOL), env={"SMALL_KEY": "k", key: "v"})
    # A section the file gives as something else is named, not replaced by the override.
    for text, says in (("server:\n", "not empty"), ("server: 8000\n", "not 8000")):
        with pytest.raises(SettingsError, match=f"server: should be a section, {says}"):
            load_settings(
                write(tmp_path, POOL + text), env={"SMALL_KEY": "k", "XROUTER_SERVER__PORT": "1"}
            )
    # Another section's bad override is not `xrouter export`'s to refuse.
    ledger = load_ledger_settings(None, env={"XROUTER_POOL__3__API_KEY": "k"})
    assert ledger.url.startswith("sqlite")


def test_pool_prices_from_catalog_explicit_or_free(tmp_path: Path) -> None:
    text = """
pool:
  - {name: llama-3.3-70b-instruct, model: openai/llama-3.3-70b-instruct, api_base: http://h/v1}
  - {name: mine, model: hosted_vllm/mine, api_base: http://h/v1, price: 0}
  - {name: claude, model: anthropic/claude-3-5-haiku, price: {input: 0.8, output: 4}}
"""
    s = load_settings(write(tmp_path, text), env={})
    pool = ModelPool.from_configs(s.pool, load_default_catalog())
    assert str(pool["llama-3.3-70b-instruct"].price.input) == "0.88"
    assert pool["mine"].price.is_free and pool["mine"].transport == "native"
    assert pool["claude"].transport == "litellm"


def test_unpriced_pool_model_fails_at_startup(tmp_path: Path) -> None:
    s = load_settings(
        write(tmp_path, "pool: [{name: x, model: openai/unknown-model, api_base: http://h/v1}]"),
        env={},
    )
    with pytest.raises(CatalogError, match="no price"):
        ModelPool.from_configs(s.pool, load_default_catalog())


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("server: {log_level: warning}\n", "the pool is empty"),
        ("pool: [{name: x, model: openai/unknown-model, api_base: 'http://h/v1'}]\n", "no price"),
        ("limits: {backend: nope}\n", "limits.backend"),
        # Not YAML, or not a mapping: said as such, though `serve` peeks at the file first.
        ("pool: [\n", "is not valid YAML"),
        ("- a\n- b\n", "must hold a mapping"),
        ("demo: [replay]\n", "demo"),
        # A section left empty or given a value, with serve's own --port: a TypeError
        # traceback where the flag was set on it.
        (POOL + "server:\n", "server: should be a section, not empty"),
        (POOL + "server: 8000\n", "server: should be a section, not 8000"),
    ],
)
def test_serve_refuses_an_unusable_config_in_one_line(
    tmp_path: Path, text: str, needle: str
) -> None:
    # `xrouter serve` exits 2 with the reason, before any server starts: no traceback.
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "gateway.cli", "serve", "--config", str(write(tmp_path, text))),
            *("--port", "8123"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SMALL_KEY": "k"},
    )
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        # PostgreSQL (on this machine) without that database or role; nothing listening.
        ("postgresql+asyncpg://127.0.0.1:5432/xrouter_no_such_db", "does not exist"),
        ("postgresql+asyncpg://nobody:s3cret-pw@127.0.0.1:5432/test", 'role "nobody"'),
        ("postgresql+asyncpg://127.0.0.1:1/test", "ConnectionRefusedError"),
        ("postgresql+asyncpg://127.0.0.1:5432/test?timeout=soon", "timeout must be a positive"),
        # libpq's spelling of TLS, and a number asyncpg was handed as text: tracebacks from
        # inside the first connection (TypeError) before 2026-11-29.
        ("postgresql+asyncpg://u:s3cret-pw@127.0.0.1:5432/test?sslmode=require", "?ssl=require"),
        ("postgresql+asyncpg://127.0.0.1:5432/test?statement_cache_size=all", "cannot be 'all'"),
        ("sqlite+aiosqlite:////proc/xrouter/ledger.db", "not usable"),
        # A database the ledger has no driver for; one holding another application's tables.
        ("mysql://u:s3cret-pw@127.0.0.1/x", "not usable"),
        ("sqlite:///{tmp}/foreign.db", "not usable"),
    ],
)
def test_serve_refuses_a_ledger_database_it_cannot_use_in_one_line(
    tmp_path: Path, url: str, needle: str
) -> None:
    with sqlite3.connect(tmp_path / "foreign.db") as db:
        db.execute("CREATE TABLE requests (id INTEGER PRIMARY KEY, body TEXT)")
    url = url.format(tmp=tmp_path)
    pool = "pool: [{name: m, model: openai/m, api_base: 'http://127.0.0.1:1/v1', price: 0}]\n"
    text = pool + f"ledger: {{url: '{url}'}}\n"
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(write(tmp_path, text))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "cannot start: the ledger database" in proc.stderr and needle in proc.stderr
    assert "Traceback" not in proc.stderr and "s3cret-pw" not in proc.stderr


def test_the_readmes_configuration_reference_loads(tmp_path: Path) -> None:
    """The README's annotated config is what operators copy: it must be a config that loads,
    with every default it names being the real one."""
    from tests.support.replay import REPO_ROOT

    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    blocks = readme.split("```yaml\n")[1:]
    (reference,) = [b.split("```")[0] for b in blocks if b.startswith("server: {host")]
    env = {
        "XROUTER_ADMIN_KEY": "admin-secret-0123456789",
        "OPENAI_API_KEY": "sk-test",
        "ANTHROPIC_API_KEY": "sk-ant-test",
    }
    s = load_settings(write(tmp_path, reference), env=env)
    assert s.auth.admin_key is not None
    assert s.auth.admin_key.get_secret_value() == env["XROUTER_ADMIN_KEY"]
    assert [m.name for m in s.pool][:2] == ["gpt-4o-mini", "claude-haiku"]
    assert s.router.llm.max_output_tokens == 4096 and s.router.default_policy == "compact"


@pytest.mark.parametrize(
    "key",
    [
        "s3cret-admin #2026-rotation",  # YAML read " #2026-rotation" as a comment
        "123456789012345678",  # YAML read it as an int: "Input should be a valid string"
        "yes",  # ... as a boolean
        "on",
        "0777",  # ... as an octal int (511)
        "null",  # ... as None: no admin key at all
        "'quoted'",  # ... as the string without its quotes
    ],
)
def test_a_text_setting_from_the_environment_is_taken_as_written(tmp_path: Path, key: str) -> None:
    env = {"SMALL_KEY": "k", "XROUTER_AUTH__ADMIN_KEY": key}
    s = load_settings(write(tmp_path, POOL), env=env)
    assert s.auth.admin_key is not None
    assert s.auth.admin_key.get_secret_value() == key


def test_text_settings_of_every_kind_are_taken_as_written(tmp_path: Path) -> None:
    url = "postgresql+asyncpg://xrouter:pa #ss#w0rd@127.0.0.1:5432/xrouter"
    env = {
        "SMALL_KEY": "k",
        "XROUTER_LEDGER__URL": url,  # str
        "XROUTER_METRICS__BEARER_TOKEN": "1234567890123456789",  # SecretStr | None
        "XROUTER_METRICS__REFERENCE_MODEL": "1.5",  # str | None
        "XROUTER_ROUTER__LLM__API_KEY": "12345 #x",  # a nested section's
        "XROUTER_CACHE__REDIS_URL": "redis://:p%40ss@127.0.0.1:6379/0?client_name=a #1",
        "XROUTER_LEDGER__LOG_CONTENT": "hash",  # Literal of strings
    }
    s = load_settings(write(tmp_path, POOL), env=env)
    assert s.ledger.url == url
    assert s.metrics.bearer_token is not None
    assert s.metrics.bearer_token.get_secret_value() == "1234567890123456789"
    assert s.metrics.reference_model == "1.5"
    assert s.router.llm.api_key is not None
    assert s.router.llm.api_key.get_secret_value() == "12345 #x"
    assert s.cache.redis_url == "redis://:p%40ss@127.0.0.1:6379/0?client_name=a #1"
    assert s.ledger.log_content == "hash"


def test_other_settings_from_the_environment_are_still_read_as_yaml(tmp_path: Path) -> None:
    env = {
        "SMALL_KEY": "k",
        "XROUTER_SERVER__WORKERS": "2",
        "XROUTER_SERVER__PORT": "0x1F90",  # YAML's hex: 8080
        "XROUTER_SERVER__MAX_IN_FLIGHT": "512",
        "XROUTER_SERVER__FORWARD_TRACE_CONTEXT": "no",
        "XROUTER_AUTH__ENABLED": "false",
        "XROUTER_ROUTER__COST_WEIGHT": "0.25",
        "XROUTER_ROUTER__LLM__MAX_TURNS": "3",
        "XROUTER_ROUTER__CASCADE_ORDER": "[small, big]",
        "XROUTER_SERVER__CORS_ALLOW_ORIGINS": "*",  # not YAML: the string, split on commas
        "XROUTER_PRICING__OVERRIDES": "{small: {input: 1, output: 2}}",
    }
    s = load_settings(write(tmp_path, POOL), env=env)
    assert (s.server.workers, s.server.port, s.server.max_in_flight) == (2, 8080, 512)
    assert s.server.forward_trace_context is False and s.auth.enabled is False
    assert s.router.cost_weight == 0.25 and s.router.llm.max_turns == 3
    assert s.router.cascade_order == ["small", "big"]
    assert s.server.cors_allow_origins == ["*"]
    assert str(s.pricing.overrides["small"].output) == "2"
    # A number where a number belongs is still checked as one.
    with pytest.raises(SettingsError, match=r"server\.workers"):
        load_settings(write(tmp_path, POOL), env={**env, "XROUTER_SERVER__WORKERS": "two"})


def test_serve_takes_an_admin_key_from_the_environment_as_written(tmp_path: Path) -> None:
    # End to end: the key an operator exported is the one the admin API accepts. Read as
    # YAML, this one was the int 123456789012345678 (its " #..." a comment), and startup
    # failed with "auth.admin_key: Input should be a valid string".
    from tests.support.gateway import gateway_config, start_gateway

    key = "123456789012345678 #2026-rotation"
    pool = [{"name": "m", "model": "openai/m", "api_base": "http://127.0.0.1:1/v1", "price": 0}]
    config = gateway_config(tmp_path, "unused", pool=pool, auth={"enabled": True})
    del config["auth"]["admin_key"]
    gw = start_gateway(tmp_path, config, env={"XROUTER_AUTH__ADMIN_KEY": key})
    try:
        url = f"{gw.url}/admin/router"
        ok = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=10)
        assert ok.status_code == 200, ok.text
        cut = httpx.get(url, headers={"Authorization": "Bearer 123456789012345678"}, timeout=10)
        assert cut.status_code == 401, cut.text
    finally:
        gw.stop()


def test_a_key_given_twice_is_refused_not_overwritten(tmp_path: Path) -> None:
    """PyYAML keeps a repeated key's last value: a second `ledger:` dropped the first one's
    `url`, and the gateway would have written its spend to a local SQLite file."""
    text = (
        "ledger: {url: 'postgresql+asyncpg://postgres@db/x'}\n"
        "router: {cost_weight: 1}\n"
        "ledger: {log_content: none}\n" + POOL.replace("${SMALL_KEY}", "k")
    )
    with pytest.raises(SettingsError, match=r"key 'ledger' is given twice at line 3"):
        load_settings(write(tmp_path, text), env={})
    with pytest.raises(SettingsError, match="given twice"):
        load_ledger_settings(write(tmp_path, text), env={})
    # Anchors and merge keys still load.
    merged = "server: &s {port: 9001}\nmetrics: {enabled: true}\n" + POOL.replace(
        "${SMALL_KEY}", "k"
    )
    assert load_settings(write(tmp_path, merged), env={}).server.port == 9001


def test_an_empty_variable_takes_the_default_as_the_shell_does(tmp_path: Path) -> None:
    """`${VAR:-default}` with VAR set but empty gave the empty string (compose and Kubernetes
    often define variables as empty): the ledger URL became '' and the gateway could not
    start, naming no field."""
    text = POOL.replace("${SMALL_KEY}", "${SMALL_KEY:-fallback}")
    s = load_settings(write(tmp_path, text), env={"SMALL_KEY": ""})
    assert s.pool[0].api_key is not None and s.pool[0].api_key.get_secret_value() == "fallback"
    # Without a default an empty variable is its value, as before.
    s = load_settings(write(tmp_path, POOL), env={"SMALL_KEY": ""})
    assert s.pool[0].api_key is None or s.pool[0].api_key.get_secret_value() == ""


def test_every_reward_setting_can_come_from_the_environment(tmp_path: Path) -> None:
    """Environment paths are lower-cased: XROUTER_ROUTER__REWARD__K was refused as an unknown
    `router.reward.k`."""
    env = {"SMALL_KEY": "k", "XROUTER_ROUTER__REWARD__K": "2", "XROUTER_ROUTER__REWARD__C_MAX": "3"}
    s = load_settings(write(tmp_path, POOL), env=env)
    assert (s.router.reward.K, s.router.reward.c_max) == (2.0, 3.0)
    assert (
        load_settings(write(tmp_path, POOL + "router: {reward: {K: 4}}\n"), env=env).router.reward.K
        == 2.0
    )


def test_a_gated_reward_with_K_0_is_refused_at_load(tmp_path: Path) -> None:
    # It would log a reward of at most 0 for every right answer: a settings error, named.
    text = POOL + "router: {reward: {form: gated, K: 0}}\n"
    with pytest.raises(SettingsError, match=r"router\.reward.*K must be positive"):
        load_settings(write(tmp_path, text), env={"SMALL_KEY": "k"})
    additive = POOL + "router: {reward: {form: additive, K: 0}}\n"
    assert load_settings(write(tmp_path, additive), env={"SMALL_KEY": "k"}).router.reward.K == 0


def test_the_ledger_section_alone_names_every_bad_field_as_serve_does(tmp_path: Path) -> None:
    text = "ledger: {flush_rows: 0, log_content: all}\npool: ${NOT_SET}\n"
    with pytest.raises(SettingsError) as exc:
        load_ledger_settings(write(tmp_path, text), env={})
    assert "ledger.flush_rows" in str(exc.value) and "ledger.log_content" in str(exc.value)


def test_server_log_level_takes_the_levels_serve_s_flag_takes(tmp_path: Path) -> None:
    # `serve --log-level critical` worked, `server.log_level: critical` was refused.
    from gateway.cli import LOG_LEVELS

    for level in LOG_LEVELS:
        s = load_settings(
            write(tmp_path, POOL), env={"SMALL_KEY": "k", "XROUTER_SERVER__LOG_LEVEL": level}
        )
        assert s.server.log_level == level

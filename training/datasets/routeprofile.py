"""RouteProfile routing data -> outcome records.

Source items (``routing_test_data.json``): ``task_name``, ``query`` and ``model_performance``
{model: {response, prompt_tokens, completion_tokens, success, task_performance}}; the upstream
file stores ``model_performance`` as a Python-literal string in some versions and as a JSON
object in others, so both are read. Score = ``task_performance`` clipped to [0, 1] (a failed
call with no score earns 0; no score for a call that did not fail is a missing outcome);
cost = the recorded tokens x ``candidate_models.json`` prices.
Ids match ``scripts/build_demo_table.py`` (``rp-<task>-<sha256(query)[:10]>``), so the
packaged demo table and a converted one split identically; a query repeated within a task is
kept once, its first occurrence, and the repeats counted in the log. The models are those
most items hold (over all the files): an item without one of them is dropped and counted in
the log, and a model only some items hold is an error.
"""

from __future__ import annotations

import ast
import hashlib
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pricing import PriceCatalog
from router.outcomes import OutcomeRecord
from training.datasets.common import (
    ConversionError,
    Incomplete,
    UniqueIds,
    build_record,
    models_of_most_items,
)
from training.datasets.prices import call_cost_usd, require_prices
from training.datasets.routerdc import load_json_items

logger = logging.getLogger(__name__)


def routeprofile_id(task: str, query: str) -> str:
    return f"rp-{task}-{hashlib.sha256(query.encode('utf-8')).hexdigest()[:10]}"


def _performance(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            raw = ast.literal_eval(raw)
        # TypeError: a literal that cannot be built ("{[1]: 2}", an unhashable key).
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
            raise ConversionError(
                f"{where}: model_performance is not a Python literal ({exc})"
            ) from None
    if not isinstance(raw, dict) or not raw:
        raise ConversionError(f"{where}: model_performance must be a non-empty mapping")
    bad = [k for k in raw if not isinstance(k, str) or not k]
    if bad:
        raise ConversionError(
            f"{where}: model_performance's keys must be model names (strings), got {bad[0]!r}"
        )
    return raw


def _tokens(result: dict[str, Any], key: str, where: str) -> int:
    value = result.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConversionError(f"{where}: {key} must be a non-negative integer, got {value!r}")
    return value


def convert_routeprofile(paths: list[Path], prices: PriceCatalog | None) -> Iterator[OutcomeRecord]:
    # First every item is read and checked, to know the models (those most items hold).
    files: list[tuple[Path, list[tuple[str, str, str, dict[str, dict[str, Any]]]]]] = []
    for path in paths:
        items: list[tuple[str, str, str, dict[str, dict[str, Any]]]] = []
        files.append((path, items))
        for index, item in enumerate(load_json_items(path)):
            where = f"{path}: item {index}"
            if not isinstance(item, dict):
                raise ConversionError(f"{where}: not an object")
            task, query = item.get("task_name"), item.get("query")
            if not isinstance(task, str) or not isinstance(query, str) or not query:
                raise ConversionError(f"{where}: needs string `task_name` and non-empty `query`")
            perf = _performance(item.get("model_performance"), where)
            outcomes: dict[str, dict[str, Any]] = {}
            for model, result in perf.items():
                at = f"{where}: model_performance.{model}"
                if not isinstance(result, dict):
                    raise ConversionError(f"{at}: not an object")
                raw_score = result.get("task_performance")
                if raw_score is None:
                    if result.get("success") is not False:
                        # No score for a call that did not fail: missing, not a 0 (the item
                        # is dropped and counted, as for a model it lacks).
                        continue
                    raw_score = 0.0  # a failed call earns nothing
                if not isinstance(raw_score, int | float) or isinstance(raw_score, bool):
                    raise ConversionError(f"{at}: task_performance {raw_score!r} is not a number")
                if not math.isfinite(raw_score):
                    # Clipping would make NaN a 0 and Infinity a 1: a made-up score.
                    raise ConversionError(
                        f"{at}: task_performance {raw_score!r} is not a finite number"
                    )
                out: dict[str, Any] = {
                    "score": min(1.0, max(0.0, float(raw_score))),
                    "prompt_tokens": _tokens(result, "prompt_tokens", at),
                    "completion_tokens": _tokens(result, "completion_tokens", at),
                    "response": str(result.get("response") or ""),
                }
                if "success" in result:
                    out["success"] = bool(result["success"])
                outcomes[str(model)] = out
            items.append((where, task, query, outcomes))
    models = models_of_most_items([(i[0], i[3]) for _, items in files for i in items])
    ids = UniqueIds()
    for path, items in files:
        repeated = 0
        incomplete = Incomplete(models)
        for where, task, query, outcomes in items:
            if incomplete.lacks(outcomes):
                continue
            record_id = routeprofile_id(task, query)
            if record_id in ids:
                # The same query of the same task again (the id is its hash): one prompt,
                # kept once (its first occurrence), as RouterDC's repeated questions are.
                repeated += 1
                continue
            catalog = require_prices(prices, list(outcomes), where)
            for model, out in outcomes.items():
                at = f"{where}: model_performance.{model}"
                out["cost_usd"] = call_cost_usd(
                    catalog, model, out["prompt_tokens"], out["completion_tokens"], at
                )
            ids.check(record_id, where)
            yield build_record(
                {"id": record_id, "task": task, "prompt": query, "outcomes": outcomes}, where
            )
        incomplete.log(logger, path, "item")
        if repeated:
            logger.info(
                "%s: dropped %d repeated prompt(s) (kept the first occurrence)", path, repeated
            )

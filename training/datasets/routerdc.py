"""RouterDC JSON -> outcome records.

Source items (LLMRouter's preprocessed DC-Router data): ``{"question": str, "scores":
{model: 0..1}, "cluster_id": int?}``. The source has no token counts and no responses, so
each call's cost is *estimated*: prompt tokens from the question length (``ceil(chars/4)``)
and a fixed assumed completion length, priced with a price table (``default_llm.json``
format). Every outcome says so with ``cost_estimated: true``. The models are those most items
score (over all the files); an item without a score for one of them (absent, null or NaN)
is dropped and counted in the log, and a model only some items score is an error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pricing import PriceCatalog, estimate_tokens
from router.outcomes import OutcomeRecord
from training.datasets.common import (
    ENCODING,
    ConversionError,
    Incomplete,
    UniqueIds,
    build_record,
    models_of_most_items,
    parse_score,
    reading,
    text_id,
)
from training.datasets.prices import call_cost_usd, require_prices

logger = logging.getLogger(__name__)

# Assumed completion length when the source records none: a short worked answer.
DEFAULT_COMPLETION_TOKENS = 256


def load_json_items(path: Path) -> list[Any]:
    with reading(path):
        text = path.read_text(encoding=ENCODING)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConversionError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        # The parser recurses per level: no dataset nests this deep.
        raise ConversionError(f"{path}: JSON nested too deeply to read") from None
    if not isinstance(data, list):
        raise ConversionError(f"{path}: expected a JSON list of items, got {type(data).__name__}")
    return data


def convert_routerdc(
    paths: list[Path],
    prices: PriceCatalog | None,
    completion_tokens: int = DEFAULT_COMPLETION_TOKENS,
) -> Iterator[OutcomeRecord]:
    # First every item is read and checked, to know the models (those most items score).
    files: list[tuple[Path, list[tuple[str, str, dict[str, float], Any]]]] = []
    for path in paths:
        items: list[tuple[str, str, dict[str, float], Any]] = []
        files.append((path, items))
        for index, item in enumerate(load_json_items(path)):
            where = f"{path}: item {index}"
            if not isinstance(item, dict):
                raise ConversionError(f"{where}: not an object")
            question = item.get("question")
            scores = item.get("scores")
            if not isinstance(question, str) or not question:
                raise ConversionError(f"{where}: `question` must be a non-empty string")
            if not isinstance(scores, dict) or not scores:
                raise ConversionError(f"{where}: `scores` must be a non-empty object")
            parsed: dict[str, float] = {}
            for model, raw in scores.items():
                score = parse_score(raw, f"{where}: scores.{model}")
                # A null (or NaN) score is a missing one, like an empty CSV cell.
                if score is not None:
                    parsed[str(model)] = score
            items.append((where, question, parsed, item.get("cluster_id")))
    models = models_of_most_items([(i[0], i[2]) for _, items in files for i in items])
    ids = UniqueIds()
    for path, items in files:
        repeated = 0
        incomplete = Incomplete(models)
        for where, question, scores, cluster in items:
            if incomplete.lacks(scores):
                continue
            record_id = text_id("dc", question)
            if record_id in ids:
                # The same question again (the id is its hash): one prompt, kept once, as
                # the README promises for every converter whose ids hash the prompt.
                repeated += 1
                continue
            catalog = require_prices(prices, list(scores), where)
            prompt_tokens = estimate_tokens(question)
            outcomes = {
                model: {
                    "score": score,
                    "cost_usd": call_cost_usd(
                        catalog, model, prompt_tokens, completion_tokens, where
                    ),
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "cost_estimated": True,
                }
                for model, score in scores.items()
            }
            ids.check(record_id, where)
            data: dict[str, Any] = {"id": record_id, "prompt": question, "outcomes": outcomes}
            if cluster is not None:
                data["task"] = f"cluster-{cluster}"
            yield build_record(data, where)
        incomplete.log(logger, path, "item")
        if repeated:
            logger.info(
                "%s: dropped %d repeated question(s) (kept the first occurrence)", path, repeated
            )

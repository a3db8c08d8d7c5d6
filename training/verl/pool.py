"""The pool a verl run routes over, as ``pool.json``: model names and prices (what the
router's tool descriptions show). Written by ``xrouter verl-data``, read by the agent loop."""

from __future__ import annotations

from typing import Any

from pricing import ModelPrice
from router.pool import ModelPool
from training.evaluation.loop_router import replay_model


def pool_to_json(pool: ModelPool) -> list[dict[str, Any]]:
    return [{"name": m.name, "price": m.price.model_dump(mode="json")} for m in pool]


def pool_from_json(items: list[dict[str, Any]]) -> ModelPool:
    return ModelPool(replay_model(i["name"], ModelPrice.model_validate(i["price"])) for i in items)

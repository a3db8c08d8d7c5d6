"""Narrowing an offline router's routes in tests."""

from __future__ import annotations

from collections.abc import Sequence

from training.evaluation.sweep import Route, RoutedPrompt


def trajectories(routes: Sequence[Route]) -> list[RoutedPrompt]:
    """The routes of a router that replays whole trajectories (the orchestration loop on
    full-information records), each checked to be a ``RoutedPrompt``."""
    out: list[RoutedPrompt] = []
    for route in routes:
        assert isinstance(route, RoutedPrompt), route
        out.append(route)
    return out

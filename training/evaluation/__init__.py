"""Offline evaluation of routers on outcome tables: sweeps, cost-quality metrics (AIQ,
PGR/APGR/CPT) with paired-bootstrap intervals, baselines (single models, random mixes,
oracle, kNN, MF, cascades), off-policy estimators and the ``xrouter eval`` report.

The CLI (``training.evaluation.cli``) is not imported here, so ``python -m
training.evaluation.cli`` runs cleanly and importing the package stays light (matplotlib is
imported only when a plot is drawn).
"""

from training.evaluation.bootstrap import Interval, aiq_intervals, apgr_intervals, mean_difference
from training.evaluation.metrics import CurvePoint, aiq, apgr, cost_to_reach, cpt, frontier, pgr
from training.evaluation.registry import LoadContext, RouterRegistry, register_router_loader
from training.evaluation.sweep import (
    OfflineRouter,
    OutcomeMatrix,
    RoutedPrompt,
    RoutingError,
    evaluate_routes,
    sweep,
)

__all__ = [
    "CurvePoint",
    "Interval",
    "LoadContext",
    "OfflineRouter",
    "OutcomeMatrix",
    "RoutedPrompt",
    "RouterRegistry",
    "RoutingError",
    "aiq",
    "aiq_intervals",
    "apgr",
    "apgr_intervals",
    "cost_to_reach",
    "cpt",
    "evaluate_routes",
    "frontier",
    "mean_difference",
    "pgr",
    "register_router_loader",
    "sweep",
]

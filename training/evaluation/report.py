"""The evaluation report: ``metrics.json`` (everything), ``curve.png`` (cost-quality curves,
and PGR curves for a two-model slice) and ``report.md`` (the comparison table)."""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from training.evaluation.bootstrap import Interval
from training.evaluation.compare import Comparison, OffPolicyRow, RouterCurve
from training.evaluation.metrics import CurvePoint, frontier, pgr

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
PLOT_FILE = "curve.png"
REPORT_FILE = "report.md"


@dataclass(slots=True)
class EvalResult:
    meta: dict[str, Any]
    main: Comparison | None = None
    two_model: Comparison | None = None
    off_policy: list[OffPolicyRow] = field(default_factory=list)
    # What the logging policy achieved on the logs estimated on (``logging_baseline``).
    logging_policy: dict[str, Any] | None = None
    # Routers whose average cost rose as λ grew (``monotone.cost_rises``), by name.
    cost_rises: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "comparison": self.main.to_dict() if self.main else None,
            "two_model": self.two_model.to_dict() if self.two_model else None,
            "off_policy": [r.to_dict() for r in self.off_policy],
            "logging_policy": self.logging_policy,
            "cost_rises_with_lambda": self.cost_rises,
            "notes": self.notes,
        }

    def display_name(self, name: str) -> str:
        """A router's name with the checkpoint it came from (``meta["sources"]``), where it
        came from one: its name carries only the content version."""
        source = self.meta.get("sources", {}).get(name)
        return name if source is None else f"{name} ({source})"


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _usd(x: float | None) -> str:
    if x is None:
        return "–"
    # An interval's upper end is +inf when the data cannot bound it (one logged record:
    # its standard error is infinite and a cost has no ceiling); "$inf" reads as a bug.
    return "unbounded" if math.isinf(x) else f"${x:.6f}"


def _ci(iv: Interval | None, signed: bool = False) -> str:
    if iv is None:
        return "–"
    spec = "+.4f" if signed else ".4f"
    return f"[{iv.low:{spec}}, {iv.high:{spec}}]"


def _table(comp: Comparison, with_pgr: bool, name: Callable[[str], str]) -> list[str]:
    boot = comp.bootstrap
    head = "| router | kind | AIQ |"
    sep = "|---|---|---:|"
    if boot is not None:
        pct = f"{100 * boot.level:g}%"
        head += f" AIQ {pct} CI | AIQ − no routing, {pct} CI |"
        sep += "---:|---:|"
        if boot.reference is not None:
            head += f" AIQ − {boot.reference}, {pct} CI |"
            sep += "---:|"
    head += " best score | min cost | cost to match best | % of best's cost |"
    sep += "---:|---:|---:|---:|"
    if with_pgr:
        head += " APGR | CPT(50%) | CPT(80%) |"
        sep += "---:|---:|---:|"
    lines = [head, sep]
    order = sorted(comp.curves, key=lambda c: (c.kind != "policy", c.kind == "single", -c.aiq))
    for c in order:
        row = f"| {name(c.name)} | {c.kind} | {_fmt(c.aiq)} |"
        if boot is not None:
            gain = "–" if c.gain_ci is None else f"{c.gain_ci.estimate:+.4f} {_ci(c.gain_ci, True)}"
            row += f" {_ci(c.aiq_ci)} | {gain} |"
            if boot.reference is not None:
                vs = c.vs_reference_ci
                row += " – |" if vs is None else f" {vs.estimate:+.4f} {_ci(vs, True)} |"
        row += (
            f" {_fmt(c.max_score)} | {_usd(c.min_cost)} "
            f"| {_usd(c.cost_to_best)} | {_fmt(c.cost_to_best_pct, '.1f')} |"
        )
        if with_pgr:
            cpt = [None if v is None else 100 * v for v in (c.cpt.get("50"), c.cpt.get("80"))]
            ap = _fmt(c.apgr) if c.apgr_ci is None else f"{_fmt(c.apgr)} {_ci(c.apgr_ci)}"
            row += f" {ap} | {_fmt(cpt[0], '.1f')} | {_fmt(cpt[1], '.1f')} |"
        lines.append(row)
    return lines


def _comparison_md(comp: Comparison, title: str, name: Callable[[str], str]) -> list[str]:
    lo, hi = comp.cost_range
    lines = [
        f"## {title}",
        "",
        f"{comp.n_records} prompts, {len(comp.models)} models. Best single model: "
        f"**{comp.best_model}** (score {comp.best_score:.4f}, {_usd(comp.best_cost)} per prompt). "
        f"AIQ is over [{_usd(lo)}, {_usd(hi)}] (cheapest to dearest single model); "
        f"no-routing AIQ (hull of the single models) = **{comp.no_routing_aiq:.4f}**.",
    ]
    if comp.bootstrap is not None:
        b = comp.bootstrap
        lines.append(
            f"Intervals: paired bootstrap over the {comp.n_records} prompts ({b.samples} "
            f"resamples, {100 * b.level:g}% percentile intervals; the routers are not refitted). "
            f"No-routing AIQ {_ci(b.no_routing)}."
        )
    if comp.strong:
        lines.append(f"PGR pair: strong = {comp.strong}, weak = {comp.weak}.")
    lines += ["", *_table(comp, comp.strong is not None, name), ""]
    lines += [f"- {n}" for n in comp.notes]
    return lines


def _estimate_md(e: dict[str, Any]) -> str:
    return f"{e['value']:.4f} [{e['ci_low']:.4f}, {e['ci_high']:.4f}]"


def _off_policy_md(result: EvalResult) -> list[str]:
    lines = [
        "## Off-policy estimates (logged traffic)",
        "",
        "Score estimates with 95% intervals.",
        "",
        "| router | λ | score IPS | score SNIPS | score DR | cost USD (SNIPS) | no support "
        "| mean weight |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result.off_policy:
        s, c = r.estimates["score"], r.estimates["cost_usd"]
        n = s["snips"]["n"]
        lines.append(
            f"| {result.display_name(r.router)} "
            f"| {'as logged' if r.param is None else f'{r.param:g}'} "
            f"| {_estimate_md(s['ips'])} | {_estimate_md(s['snips'])} | {_estimate_md(s['dr'])} "
            f"| {_usd(c['snips']['value'])} | {r.unsupported} of {n} "
            f"| {r.mean_weight:.2f} ± {r.mean_weight_stderr:.2f} |"
        )
    base = result.logging_policy
    if base is not None:
        score, cost = base["score"], base["cost_usd"]
        lines += [
            "",
            f"Logging policy on these {base['n']} logs (the logged outcomes' mean, the "
            f"baseline to beat): score {_estimate_md(score)}, cost "
            f"{_usd(cost['value'])} [{_usd(cost['ci_low'])}, {_usd(cost['ci_high'])}].",
        ]
    lines += [
        "",
        "'No support': logged records where the router chooses a model the logging policy "
        "gave probability 0 (logged with propensity 1 for another model); IPS counts them "
        "as 0, so a router with many is underestimated, and SNIPS leaves them out, so it "
        "estimates the router on the records where it agrees with the logging policy. "
        "'Mean weight': the importance weights' mean (± its standard error), 1 in "
        "expectation when the logged propensities are right and the router has support "
        "everywhere; IPS is SNIPS times it.",
    ]
    return [*lines, ""]


def render_markdown(result: EvalResult) -> str:
    meta = result.meta
    lines = [
        "# xrouter evaluation",
        "",
        f"Table `{meta.get('table')}`, split **{meta.get('split')}** "
        f"(seed {meta.get('split_seed')}, fractions {meta.get('split_fractions')}), "
        f"fitted on {meta.get('n_train')} training prompts.",
    ]
    if meta.get("command"):
        lines += ["", f"Command: `{meta['command']}`"]
    lines.append("")
    if result.main:
        lines += _comparison_md(result.main, "Cost-quality comparison", result.display_name)
    if result.two_model:
        lines += _comparison_md(
            result.two_model, "Two-model slice (RouteLLM metrics)", result.display_name
        )
    if result.off_policy:
        lines += _off_policy_md(result)
    if result.notes:
        lines += ["## Notes", "", *[f"- {n}" for n in result.notes], ""]
    lines += [
        "Definitions: a point is (average cost per prompt, average score); a router's curve is "
        "the non-decreasing upper-left convex hull of its points over a sweep of cost weights. "
        "AIQ = area under that curve over the AIQ range divided by its width (0 left of the "
        "curve's cheapest point). 'Cost to match best' is where the curve first reaches the "
        "best single model's score (interpolated along the hull). APGR = area under PGR vs. "
        "share of strong-model calls; CPT(x%) = the smallest share of strong calls reaching "
        "PGR x%.",
        "",
    ]
    return "\n".join(lines)


def _dense_hull(
    hull: Sequence[CurvePoint], per_segment: int = 24
) -> tuple[list[float], list[float]]:
    """The hull's chords sampled in linear cost, so they show as the curves they are on the
    plot's log axis (AIQ integrates in linear cost)."""
    xs: list[float] = [p.cost for p in hull[:1]]
    ys: list[float] = [p.score for p in hull[:1]]
    for a, b in itertools.pairwise(hull):
        for t in np.linspace(0.0, 1.0, per_segment)[1:]:
            xs.append(a.cost + t * (b.cost - a.cost))
            ys.append(a.score + t * (b.score - a.score))
    return xs, ys


def _plot_comparison(ax: Any, comp: Comparison) -> None:
    singles = [c for c in comp.curves if c.kind == "single"]
    for c in singles:
        p = c.points[0]
        ax.scatter([p.cost], [p.score], color="black", s=18, zorder=3)
        ax.annotate(
            c.name.removeprefix("single:"),
            (p.cost, p.score),
            fontsize=6,
            xytext=(3, 3),
            textcoords="offset points",
        )
    xs, ys = _dense_hull(frontier(c.points[0] for c in singles))
    # Above the routers' curves: a router that does no better than the single models (a
    # cascade often, at its cheap end) would hide it.
    ax.plot(xs, ys, "k--", lw=1, label="no routing (hull)", zorder=2.5)
    for c in comp.curves:
        if c.kind == "single":
            continue
        xs, ys = _dense_hull(c.hull)
        line = ax.plot(xs, ys, lw=1.5, label=f"{c.name} (AIQ {c.aiq:.3f})")
        ax.scatter(
            [p.cost for p in c.points],
            [p.score for p in c.points],
            s=6,
            color=line[0].get_color(),
            alpha=0.5,
        )
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    costs = [p.cost for c in comp.curves for p in c.points]
    positive = [x for x in costs if x > 0]
    if len(positive) == len(costs):
        ax.set_xscale("log")
        # Ticks at 1, 2 and 5 per decade, labelled in plain dollars: matplotlib's default
        # labels every minor tick of a short log range in scientific notation, and they
        # overlap.
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        linthresh = 0.0
        scale = "log scale"
    elif positive:
        # A free model (a local one, cost 0) has no place on a log axis: matplotlib would
        # drop its point and every curve starting there. Linear up to the cheapest paid
        # point, logarithmic above it.
        linthresh = min(positive)
        ax.set_xscale("symlog", linthresh=linthresh)
        scale = f"linear below ${_plain(linthresh)}, log above"
    else:
        linthresh = 0.0
        scale = "every point is free"  # a linear axis around 0

    def label(x: float, _: object) -> str:
        # Ticks inside the linear part of a symlog axis crowd the one at $0.
        return "" if 0 < x < linthresh else "$" + _plain(x)

    ax.xaxis.set_major_formatter(FuncFormatter(label))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel(f"average cost per prompt (USD, {scale})")
    ax.set_ylabel("average score")
    ax.set_title(f"cost-quality ({comp.n_records} prompts)")
    ax.grid(True, which="both", alpha=0.3)
    # Beside the axes: inside, it hides the cheap single models at the bottom right.
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _plain(x: float) -> str:
    """2 significant digits without exponent: 2e-05 -> 0.00002."""
    return str(np.format_float_positional(x, precision=2, unique=False, fractional=False, trim="-"))


def _plot_pgr(ax: Any, comp: Comparison, curves: list[RouterCurve]) -> None:
    q_strong = next(c.max_score for c in curves if c.name == f"single:{comp.strong}")
    q_weak = next(c.max_score for c in curves if c.name == f"single:{comp.weak}")
    for c in curves:
        if c.kind == "single" or c.apgr is None or comp.strong is None:
            continue
        pts = sorted(
            (min(1.0, p.calls.get(comp.strong, 0.0)), pgr(p.score, q_weak, q_strong))
            for p in c.points
        )
        ax.plot(
            [x for x, _ in pts],
            [y for _, y in pts],
            marker=".",
            lw=1,
            label=f"{c.name} (APGR {c.apgr:.3f})",
        )
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="random (0.5)")
    ax.set_xlabel(f"share of calls to {comp.strong}")
    ax.set_ylabel("PGR")
    ax.set_title(f"{comp.strong} vs {comp.weak}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, loc="lower right")


def _plot_off_policy(ax: Any, rows: list[OffPolicyRow]) -> None:
    by_router: dict[str, list[OffPolicyRow]] = {}
    for r in rows:
        by_router.setdefault(r.router, []).append(r)

    def points(rs: list[OffPolicyRow]) -> tuple[list[float], list[float], list[list[float]]]:
        xs = [r.estimates["cost_usd"]["snips"]["value"] for r in rs]
        ys = [r.estimates["score"]["snips"]["value"] for r in rs]
        err = [
            [y - r.estimates["score"]["snips"]["ci_low"] for y, r in zip(ys, rs, strict=True)],
            [r.estimates["score"]["snips"]["ci_high"] - y for y, r in zip(ys, rs, strict=True)],
        ]
        return xs, ys, err

    for name, rs in by_router.items():
        swept = [r for r in rs if r.param is not None]
        logged = [r for r in rs if r.param is None]
        color = None
        if swept:
            xs, ys, err = points(swept)
            bars = ax.errorbar(xs, ys, yerr=err, fmt="o-", ms=3, lw=1, capsize=2, label=name)
            color = bars.lines[0].get_color()
        if logged:  # at the traffic's own cost weights: a point apart from the λ sweep
            xs, ys, err = points(logged)
            ax.errorbar(xs, ys, yerr=err, fmt="*", ms=9, capsize=2, color=color,
                        label=f"{name}, as logged")  # fmt: skip
    ax.set_xlabel("estimated average cost per prompt (USD, SNIPS)")
    ax.set_ylabel("estimated average score (SNIPS, 95% CI)")
    ax.set_title("off-policy estimates")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, loc="lower right")


def plot(result: EvalResult, path: Path) -> None:
    # The object-oriented API with the Agg canvas: no pyplot global state, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels: list[Callable[[Any], None]] = []
    main, two, rows = result.main, result.two_model, result.off_policy
    if main is not None:
        panels.append(lambda ax: _plot_comparison(ax, main))
    if two is not None and two.strong:
        panels.append(lambda ax: _plot_pgr(ax, two, two.curves))
    if rows:
        panels.append(lambda ax: _plot_off_policy(ax, rows))
    fig = Figure(figsize=(8.5 * max(1, len(panels)), 5.5))
    FigureCanvasAgg(fig)
    if not panels:
        fig.text(0.5, 0.5, "nothing to plot", ha="center")
    for i, draw in enumerate(panels, 1):
        draw(fig.add_subplot(1, len(panels), i))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_report(result: EvalResult, out_dir: str | Path) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"metrics": out / METRICS_FILE, "plot": out / PLOT_FILE, "report": out / REPORT_FILE}
    paths["metrics"].write_bytes(
        orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    )
    try:
        import matplotlib  # noqa: F401  (the plot's only dependency outside the base install)
    except ImportError:
        # `xrouter eval` runs on the base install; only the picture needs the train extra.
        logger.warning(
            "no %s: matplotlib is not installed (pip install 'xrouter[train]'); the metrics "
            "and the report are written",
            PLOT_FILE,
        )
        del paths["plot"]
    else:
        plot(result, paths["plot"])
    paths["report"].write_text(render_markdown(result), encoding="utf-8")
    return paths

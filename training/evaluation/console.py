"""What ``xrouter eval`` prints when it is done: the figures a user reads first (the full
set is in the report), each router named with the checkpoint it came from."""

from __future__ import annotations

from training.evaluation.report import EvalResult


def print_summary(result: EvalResult) -> None:
    """The comparison's headline figures (AIQ per router), the off-policy estimates of
    each evaluated policy beside the logging policy's own figures, and every note."""
    if result.main is not None:
        comp = result.main
        print(
            f"{comp.n_records} prompts; best single model {comp.best_model} ({comp.best_score:.4f}); "
            f"no-routing AIQ {comp.no_routing_aiq:.4f}"
        )
        rows = [c for c in comp.curves if c.kind != "single"]
        names = {c.name: result.display_name(c.name) for c in rows}
        width = max((len(n) for n in names.values()), default=0)
        for c in rows:
            if c.cost_to_best is None:
                pct = "never"
            elif c.cost_to_best_pct is None:  # the best model is free: no share of its cost
                pct = f"${c.cost_to_best:.6f}"
            else:
                pct = f"{c.cost_to_best_pct:.1f}%"
            ci = "" if c.aiq_ci is None else f" [{c.aiq_ci.low:.4f}, {c.aiq_ci.high:.4f}]"
            print(
                f"  {names[c.name]:<{width}}  AIQ {c.aiq:.4f}{ci}  best {c.max_score:.4f}  "
                f"cost to match best {pct}"
            )
    base = result.logging_policy
    if base is not None:
        s = base["score"]
        print(
            f"{base['n']} logged prompts; logging policy score {s['value']:.4f} "
            f"[{s['ci_low']:.4f}, {s['ci_high']:.4f}], cost ${base['cost_usd']['value']:.6f}"
        )
        policies = set(result.meta.get("policies", ()))
        for r in result.off_policy:
            if r.router.startswith("single:") and r.router not in policies:
                continue  # the per-model rows are in the report
            e = r.estimates["score"]["snips"]
            lam = "as logged" if r.param is None else f"λ {r.param:g}"
            print(
                f"  {result.display_name(r.router)}  {lam}  score (SNIPS) {e['value']:.4f} "
                f"[{e['ci_low']:.4f}, {e['ci_high']:.4f}]"
            )
    for note in [*(result.main.notes if result.main is not None else ()), *result.notes]:
        print(f"note: {note}")

"""How much can escalation on cheap models' votes save on RouterBench? An optimistic estimate.

The training issue asks for GPT-4's accuracy at <= 50% of GPT-4's cost. A router on this
data knows, per prompt, only the prompt and the answers of the models it has called (the
multiple-choice responses are a single letter: no explanation, no hedging to read). This
script estimates what escalating on the cheap models' votes can reach when every choice
that a deployed router would have to make blind is made in hindsight, in its favour:

- per task, for each prefix of the cheap models (most accurate first among those costing at
  most 10% of GPT-4), a weighted vote: a logistic model over candidate answers (which cheap
  model chose it, the letter) fitted with 10-fold cross-fitting, so each prompt's confidence
  comes from a model that never saw it;
- GPT-4 is called on the least confident prompts, for every share from 0 to 100%;
- the operating point of every task is then chosen *on the same prompts* (the upper concave
  hull of each task's (cost, correct) points, filled greedily by marginal accuracy per
  dollar, fractions allowed), which no deployable router can do.

It is an estimate, not a proof: another confidence model (more voters, the prompt's text)
could rank prompts better than this vote does. ``escalation_routerbench.py`` measures the
deployable, learned version on held-out data.

Tasks whose answers are code (MBPP) have no agreement to vote on; their line is the best cheap
model with GPT-4 on a random share of prompts (what no signal buys). The "perfect escalation"
line calls GPT-4 exactly where the vote is wrong and GPT-4 right: the per-prompt headroom
that the oracle's figures advertise and that a vote cannot see. The last lines ask what a
perfect check on the unvoted tasks (tests that tell a right MBPP answer) would add: one that
only confirms the best cheap model's answer (GPT-4's accuracy at that model's cost), and one
that picks a right answer among the first 1-4 cheap models' answers when there is one (their
union), calling GPT-4 when none is right.

It also prints what routing by task alone reaches: each task's most accurate single model,
picked in hindsight on these prompts. The training issue's premise is that this "needs
about 75% of GPT-4's cost"; on this subset GPT-4 is the most accurate model on every task.

Only the training and validation parts are read (same split as ``routing_quality.py``,
60/20/20 by id hash, seed 0); the test part is not touched.

Usage::

    .venv/bin/python bench/escalation_headroom.py [--data DIR] [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a plain script from a checkout

from routerbench_data import GPT4, add_data_argument, load_records, split_parts  # noqa: E402

from router.answers import normalize_answer  # noqa: E402
from router.outcomes import OutcomeRecord  # noqa: E402
from training.evaluation.logistic import Logistic  # noqa: E402

log = logging.getLogger("escalation_headroom")

# Cheap answers a perfect code check may choose among.
MAX_CHECKED = 4
BUDGETS = (0.3, 0.5, 0.75)
FOLDS = 10
MAX_VOTERS = 3


@dataclass(frozen=True, slots=True)
class Point:
    cost: float  # total USD over the task's prompts
    correct: float  # number of right answers


def _letters(rows: Sequence[OutcomeRecord], models: Sequence[str]) -> list[str]:
    """The choice letters of a multiple-choice task; none when most answers are not a letter
    (a stray "A)" in a code answer does not make MBPP multiple-choice)."""
    answers = [normalize_answer(r.outcomes[m].response or "") for r in rows for m in models]
    letters = [a.partition(":")[2] for a in answers if a.startswith("choice:")]
    return sorted(set(letters)) if len(letters) >= 0.9 * len(answers) else []


def _truth(record: OutcomeRecord) -> str | None:
    """The right letter: the answer of any model scored 1 (same answer, same score here)."""
    for outcome in record.outcomes.values():
        if outcome.score == 1.0:
            return normalize_answer(outcome.response or "")
    return None


def vote_curve(
    rows: Sequence[OutcomeRecord], voters: Sequence[str], letters: Sequence[str]
) -> tuple[list[Point], Point]:
    """Cross-fitted weighted vote of ``voters``, GPT-4 on the least confident 0..100% of
    prompts; also the perfect-escalation point for the same vote."""
    feats = np.array(
        [
            [
                [
                    float(normalize_answer(r.outcomes[m].response or "") == f"choice:{x}")
                    for m in voters
                ]
                + [float(x == y) for y in letters]
                for x in letters
            ]
            for r in rows
        ]
    )
    truth = [_truth(r) for r in rows]
    labels = np.array([[float(t == f"choice:{x}") for x in letters] for t in truth])
    fold = np.arange(len(rows)) % FOLDS
    prob = np.zeros(labels.shape)
    width = feats.shape[2]
    for k in range(FOLDS):
        fit = fold != k
        model = Logistic(1.0).fit(feats[fit].reshape(-1, width), labels[fit].reshape(-1))
        prob[~fit] = model.predict(feats[~fit].reshape(-1, width)).reshape(-1, len(letters))
    pick = prob.argmax(axis=1)
    right = labels[np.arange(len(rows)), pick]
    confidence = prob.max(axis=1) / np.maximum(prob.sum(axis=1), 1e-12)
    order = np.argsort(confidence, kind="stable")
    base = sum(r.outcomes[m].cost_usd or 0.0 for r in rows for m in voters)
    g_score = np.array([r.outcomes[GPT4].score for r in rows])
    g_cost = np.array([r.outcomes[GPT4].cost_usd or 0.0 for r in rows])
    points = []
    escalated = np.zeros(len(rows), dtype=bool)
    for k in range(len(rows) + 1):
        if k:
            escalated[order[k - 1]] = True
        points.append(
            Point(
                base + float(g_cost[escalated].sum()),
                float(np.where(escalated, g_score, right).sum()),
            )
        )
    perfect = (right == 0) & (g_score == 1)
    best = Point(
        base + float(g_cost[perfect].sum()), float(np.maximum(right, g_score * perfect).sum())
    )
    return points, best


def random_curve(rows: Sequence[OutcomeRecord], cheap: str) -> list[Point]:
    """``cheap`` everywhere, GPT-4 instead on a random share (the expected line)."""
    c0 = sum(r.outcomes[cheap].cost_usd or 0.0 for r in rows)
    s0 = sum(r.outcomes[cheap].score for r in rows)
    c1 = sum(r.outcomes[GPT4].cost_usd or 0.0 for r in rows)
    s1 = sum(r.outcomes[GPT4].score for r in rows)
    return [Point(c0 + f * c1, s0 + f * (s1 - s0)) for f in np.linspace(0.0, 1.0, 101)]


def upper_hull(points: Sequence[Point]) -> list[Point]:
    """The upper concave hull from the cheapest point (segments of falling slope)."""
    pts = sorted(points, key=lambda p: (p.cost, -p.correct))
    hull: list[Point] = []
    for p in pts:
        if hull and p.correct <= hull[-1].correct:
            continue
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b is under the chord a-p: drop it.
            if (b.correct - a.correct) * (p.cost - a.cost) <= (p.correct - a.correct) * (
                b.cost - a.cost
            ):
                hull.pop()
            else:
                break
        hull.append(p)
    return hull


def best_mix(hulls: dict[str, list[Point]], budget: float) -> tuple[float, dict[str, float]]:
    """Most right answers for at most ``budget`` USD: every task starts at its cheapest point;
    hull segments are bought by falling accuracy-per-dollar (fractions allowed)."""
    spent = sum(h[0].cost for h in hulls.values())
    correct = sum(h[0].correct for h in hulls.values())
    where = {t: h[0].cost for t, h in hulls.items()}
    segments = sorted(
        (
            ((b.correct - a.correct) / (b.cost - a.cost), t, a, b)
            for t, h in hulls.items()
            for a, b in itertools.pairwise(h)
        ),
        key=lambda s: -s[0],
    )
    for _slope, task, a, b in segments:
        if spent >= budget:
            break
        take = min(1.0, (budget - spent) / (b.cost - a.cost))
        spent += take * (b.cost - a.cost)
        correct += take * (b.correct - a.correct)
        where[task] = a.cost + take * (b.cost - a.cost)
    return correct, where


def reach_pct(points: Sequence[Point], target: float, ref_cost: float) -> str:
    costs = [p.cost for p in points if p.correct >= target - 1e-9]
    return f"{100 * min(costs) / ref_cost:.0f}%" if costs else "never"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_argument(parser)
    parser.add_argument("--seed", default="0", help="split seed")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    records = load_records(args.data)
    if records is None:
        return 2
    parts = split_parts(records, args.seed)
    rows_all = [*parts.train, *parts.validation]
    g_total = sum(r.outcomes[GPT4].cost_usd or 0.0 for r in rows_all)
    g_right = sum(r.outcomes[GPT4].score for r in rows_all)
    print(
        f"RouterBench 0-shot, train + validation ({len(rows_all)} prompts; test untouched); "
        f"GPT-4 accuracy {g_right / len(rows_all):.4f}"
    )
    task_only(rows_all, g_total, g_right)
    hulls: dict[str, list[Point]] = {}
    # What if every task without a vote had a perfect check? Two bounds: the check confirms
    # the best cheap model (GPT-4's accuracy at its cost), or it picks a right answer among
    # several cheap answers (their union) and calls GPT-4 when none is right.
    checked: dict[str, list[Point]] = {}
    union_checked: dict[str, list[Point]] = {}
    for task in sorted({r.task or "*" for r in rows_all}):
        rows = [r for r in rows_all if (r.task or "*") == task]
        models = [m for m in rows[0].outcomes if m != GPT4]
        score = {m: float(np.mean([r.outcomes[m].score for r in rows])) for m in models}
        cost = {m: float(np.mean([r.outcomes[m].cost_usd or 0.0 for r in rows])) for m in models}
        g_cost = sum(r.outcomes[GPT4].cost_usd or 0.0 for r in rows)
        g_acc = float(np.mean([r.outcomes[GPT4].score for r in rows]))
        cheap = sorted(
            (m for m in models if cost[m] <= 0.1 * g_cost / len(rows)), key=lambda m: -score[m]
        )
        letters = _letters(rows, [GPT4, *cheap])
        print(
            f"\n{task}: {len(rows)} prompts, GPT-4 {g_acc:.3f}, "
            f"{100 * g_cost / g_total:.0f}% of GPT-4's total cost"
        )
        points: list[Point] = [Point(g_cost, sum(r.outcomes[GPT4].score for r in rows))]
        if letters:
            for n in range(1, min(MAX_VOTERS, len(cheap)) + 1):
                curve, perfect = vote_curve(rows, cheap[:n], letters)
                points += curve
                shares = [0, len(rows) // 4, len(rows) // 2, 3 * len(rows) // 4]
                line = ", ".join(
                    f"{100 * curve[k].cost / g_cost:.0f}%: {curve[k].correct / len(rows):.3f}"
                    for k in shares
                )
                print(
                    f"  vote of {n} ({', '.join(m.split('/')[-1] for m in cheap[:n])}), GPT-4 on "
                    f"0/25/50/75% of prompts -> cost (% of task's GPT-4): accuracy  {line}; "
                    f"reaches GPT-4 at {reach_pct(curve, g_acc * len(rows), g_cost)}; perfect "
                    f"escalation {perfect.correct / len(rows):.3f} at "
                    f"{100 * perfect.cost / g_cost:.0f}%"
                )
        else:
            best = max(cheap, key=lambda m: score[m])
            curve = random_curve(rows, best)
            points += curve
            print(
                f"  no answers to vote on: {best.split('/')[-1]} ({score[best]:.3f}) with GPT-4 on "
                f"a random share; reaches GPT-4 at {reach_pct(curve, g_acc * len(rows), g_cost)}"
            )
            ideal = Point(curve[0].cost, sum(r.outcomes[GPT4].score for r in rows))
            checked[task] = upper_hull([*points, ideal])
            union = union_points(rows, cheap[:MAX_CHECKED])
            union_checked[task] = upper_hull([*points, *itertools.chain.from_iterable(union)])
            for n, (alone, escalated) in enumerate(union, start=1):
                print(
                    f"  perfect check over the first {n} cheap answers: "
                    f"{alone.correct / len(rows):.3f} at {100 * alone.cost / g_cost:.0f}% of the "
                    f"task's GPT-4 cost (GPT-4 where none is right: "
                    f"{escalated.correct / len(rows):.3f} at {100 * escalated.cost / g_cost:.0f}%)"
                )
        hulls[task] = upper_hull(points)
    print()
    for b in BUDGETS:
        correct, where = best_mix(hulls, b * g_total)
        split = ", ".join(f"{t} {100 * c / g_total:.1f}%" for t, c in sorted(where.items()))
        print(
            f"budget {100 * b:.0f}% of GPT-4's cost: estimate {correct / len(rows_all):.4f} "
            f"accuracy ({correct / len(rows_all) - g_right / len(rows_all):+.4f} vs GPT-4); "
            f"spend {split}"
        )
    if checked:
        for label, bound in (
            ("GPT-4's accuracy at the best cheap model's cost", checked),
            (f"a right answer among up to {MAX_CHECKED} cheap answers", union_checked),
        ):
            correct, _ = best_mix({**hulls, **bound}, 0.5 * g_total)
            print(
                f"if {', '.join(sorted(bound))} had a perfect check ({label}): "
                f"{correct / len(rows_all):.4f} at 50% "
                f"({correct / len(rows_all) - g_right / len(rows_all):+.4f} vs GPT-4)"
            )
    return 0


def task_only(rows: Sequence[OutcomeRecord], g_total: float, g_right: float) -> None:
    """Routing by task alone, in hindsight: each task's most accurate model (the cheaper
    on ties) on every prompt of the task."""
    correct = cost = 0.0
    picks = []
    for task in sorted({r.task or "*" for r in rows}):
        part = [r for r in rows if (r.task or "*") == task]
        models = list(part[0].outcomes)
        right = {m: sum(r.outcomes[m].score for r in part) for m in models}
        spend = {m: sum(r.outcomes[m].cost_usd or 0.0 for r in part) for m in models}
        best = max(models, key=lambda m: (right[m], -spend[m]))
        correct += right[best]
        cost += spend[best]
        picks.append(f"{task}: {best.split('/')[-1]}")
    print(
        f"routing by task alone (each task's most accurate model, in hindsight; "
        f"{', '.join(picks)}): {correct / len(rows):.4f} at {100 * cost / g_total:.0f}% of "
        f"GPT-4's cost ({(correct - g_right) / len(rows):+.4f} vs GPT-4)"
    )


def union_points(rows: Sequence[OutcomeRecord], cheap: Sequence[str]) -> list[tuple[Point, Point]]:
    """A perfect check over the answers of the first n cheap models (all called), for each
    n: right whenever one of them is; and the same with GPT-4 called where none is."""
    pairs: list[tuple[Point, Point]] = []
    for n in range(1, len(cheap) + 1):
        called = cheap[:n]
        base = sum(sum(r.outcomes[m].cost_usd or 0.0 for m in called) for r in rows)
        none = [r for r in rows if not any(r.outcomes[m].score > 0 for m in called)]
        right = len(rows) - len(none)
        escalated = Point(
            base + sum(r.outcomes[GPT4].cost_usd or 0.0 for r in none),
            right + sum(r.outcomes[GPT4].score for r in none),
        )
        pairs.append((Point(base, right), escalated))
    return pairs


if __name__ == "__main__":
    raise SystemExit(main())

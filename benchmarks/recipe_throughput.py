"""The recipes' and the full baselines' training throughput (pairs/s, MFU, peak memory,
padding), each through its own ``run_training``, in fp32 and in modsent's mixed precision side
by side.

    python benchmarks/recipe_throughput.py                                  # small random models, CPU
    python benchmarks/recipe_throughput.py --device cuda --size paper --mst5 xxl

Each recipe trains as its job trains it (the method's ``run_training``: its batches, data loader
thread, fast path, loss, AdamW, clipping and the model FLOPs and peak memory it records in
``metrics.json``), from a random model of its paper's base, for ``--warmup`` + ``--steps``
optimizer steps; the timed steps are those after the warm-up (each new shape is slow once),
between two waits for the GPU. The recipes and their settings (the methods' defaults but where
named):

- ``mST5-xnli``: the encoder of a random mT5 (``--mst5``: large, xl or xxl, the paper's; with
  ``--size small`` a 2-layer one), frozen, in bf16 as ``configs/mst5.yaml`` keeps it, LoRA on
  the query and value projections, triplet InfoNCE over 128 triplets encoded in three passes;
  ``--checkpointing`` adds ``gradient_checkpointing: true`` (the config's, which mt5-xxl needs
  on an 80 GB GPU);
- ``DuEAM-weak``: every weight of a random XLM-R base (12 x 768, 250,002 pieces), one pass over
  a batch's 64 pairs, L_A - 0.003 L_B (the WMD targets computed before training, by the same
  random model as the anchor: not timed; where POT is not installed, as on the GPU image, whose
  carried wheels leave no room for its 33 MB, each pair's optimal transport is replaced by its
  lower bound, the distance of the two texts' mass-weighted mean token vectors: the targets'
  values do not change a step's work);
- ``InteMATs-ST``: a frozen random XLM-R base with MATs-ST's serial adapters, InfoNCE over 8
  pairs a micro-batch, 2 micro-batches a step (texts up to 384 tokens);
- ``Full_c``, the full baselines' step (:func:`modsent.methods.baselines.run_full_training`):
  every weight of a random LaBSE-sized BERT (12 x 768 and LaBSE's 501,153-piece embedding, which
  AdamW updates every step), MNRL over 128 cross-lingual pairs with their hard negatives (every
  pair here has one; the paper's English data about a third).

Variants: ``fp32`` (``precision: fp32``: no autocast, the recipes' only unoptimised switch, and
m-ST5's frozen weights in float32; the fast path's frozen-weight forwards and fused AdamW stay)
and, on a GPU, ``auto`` (bf16 autocast, m-ST5's frozen weights in bf16 at the paper's size: how
the jobs run), with ``--length-groups K`` also ``auto, length_groups K`` (batches grouped by
length within each stratum, as the setting groups them).

The data are real sentences, not a paraphrase corpus: English prose of 5-40 words
(:func:`modsent.testing.sample_texts`, the standard library's docstrings) set out as the
paraphrase files' triplets (anchor, positive, negative: three consecutive sentences) in English
and, shifted by a third of the list, as a second language's file with the same pair ids, so that
every text has a real length and no pair is two identical texts. The losses mean nothing;
the shapes, and so the time and memory, are those of English training data of those lengths.

Printed per recipe and variant: pairs a second over the timed steps, counting the pairs each
step gave its training log (triplets for m-ST5, both micro-batches' pairs for InteMATs; batches
grouped by length are not all full: a group's leftovers make a smaller batch), the pairs of a
timed step on average, model TFLOP/s and MFU (the FLOPs the recipe records for its run, the
run's mean step times the timed steps; against ``--peak-tflops``, else the GPU's own peak), the
GPU's peak memory, the share of padding in the encoded positions and the ratio against ``fp32``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

RECIPES = ("mST5-xnli", "DuEAM-weak", "InteMATs-ST", "Full_c")
XLMR_BASE = dict(hidden=768, layers=12, heads=12, intermediate=3072)
XLMR_VOCAB = 250_002
LABSE_VOCAB = 501_153
SMALL_XLMR = dict(hidden=64, layers=2, heads=4, intermediate=256)
SMALL_MT5 = dict(d_model=64, d_kv=16, d_ff=128, layers=2, heads=4)
TOKENIZER_PIECES = 8000  # learnt from the sample texts: about a real tokenizer's pieces per English word


def pair_files(root: Path, languages=("en", "de")) -> dict[str, Path]:
    """The paraphrase files' format (pair_id, dataset, anchor, positive, negative) with sample
    sentences: row i of the language at position j is sentences i, i + 1, i + 2 shifted by
    j/3 of the list (see the module's text)."""
    from modsent.testing import sample_texts

    texts = sample_texts(1200)
    n = len(texts)
    paths = {}
    for j, lang in enumerate(languages):
        shift = j * n // 3
        rows = [{"pair_id": f"{i:016x}", "dataset": "sample-texts", "anchor": texts[(i + shift) % n],
                 "positive": texts[(i + 1 + shift) % n], "negative": texts[(i + 2 + shift) % n]} for i in range(n)]
        paths[lang] = root / f"pairs-{lang}.parquet"
        pd.DataFrame(rows).to_parquet(paths[lang], index=False)
    return paths


def random_encoder(out: Path, kind: str, size: str) -> Path:
    """A random XLM-R (``kind`` "xlmr"; paper: XLM-R base with its 250,002-piece embedding) or
    BERT ("bert"; paper: LaBSE's shape and 501,153 pieces) as a sentence-transformers directory
    with mean pooling, its tokenizer learnt from the sample texts."""
    import transformers

    from modsent.testing import make_tiny_bert, make_tiny_xlmr, sample_texts

    make = make_tiny_xlmr if kind == "xlmr" else make_tiny_bert
    make(out, sample_texts(1200), vocab_size=TOKENIZER_PIECES, max_seq_length=512,
         **(XLMR_BASE if size == "paper" else SMALL_XLMR))
    if size == "paper":  # the real vocabulary's embedding: trained by DuEAM and the full baselines, with AdamW's state
        model = transformers.AutoModelForMaskedLM.from_pretrained(out)
        model.resize_token_embeddings(XLMR_VOCAB if kind == "xlmr" else LABSE_VOCAB, mean_resizing=False)
        model.save_pretrained(out)
    return out


def random_mt5(out: Path, size: str, mst5: str, device: str) -> Path:
    from modsent.testing import MT5_SIZES, MT5_VOCAB, make_random_mt5, sample_texts

    if size == "paper":
        return make_random_mt5(out, sample_texts(1200), vocab_size=TOKENIZER_PIECES, model_vocab_size=MT5_VOCAB,
                               encoder_only=True, dtype="bfloat16", device=device, **MT5_SIZES[mst5])
    return make_random_mt5(out, sample_texts(1200), vocab_size=TOKENIZER_PIECES, encoder_only=True, **SMALL_MT5)


def settings_of(recipe: str, source: Path, args, precision: str, length_groups: int) -> dict:
    settings = {"max_steps": args.warmup + args.steps, "eval_pairs": 16, "precision": precision,
                "length_groups": length_groups, "log_every": 1000}
    if not recipe.startswith("Full"):  # a method's settings: its model and paraphrase datasets
        settings.update(model=str(source), datasets=None)
    if recipe.startswith("mST5"):  # fp32: the frozen weights too; else as configs/mst5.yaml keeps mt5-xxl's
        settings.update(dtype="bfloat16" if args.size == "paper" and precision != "fp32" else "float32",
                        gradient_checkpointing=args.checkpointing)
    if recipe.startswith("DuEAM"):
        settings.update(warmup_steps=0)
    if recipe.startswith("InteMATs"):
        settings.update(warmup_steps=0)
    if args.batch_size:
        settings["batch_size"] = args.batch_size
    return settings


def centroid_distance(x: np.ndarray, y: np.ndarray, wx: np.ndarray | None = None, wy: np.ndarray | None = None,
                      ground_cost: str = "euclidean") -> float:
    """The word centroid distance, a lower bound of WMD with a Euclidean ground cost: the distance
    of the two texts' mass-weighted mean token vectors (DuEAM's targets where POT is missing)."""
    return float(np.linalg.norm(np.average(x, axis=0, weights=wx) - np.average(y, axis=0, weights=wy)))


def train(recipe: str, source: Path, pairs: dict[str, Path], settings: dict, warmup: int, device: str):
    """One run of ``recipe``'s ``run_training``: (its metrics, its config, the seconds of the
    steps after the first ``warmup``, between two waits for the GPU, and the pairs they trained
    on: what each step gave the training log, whose ``record`` is watched for the run)."""
    from unittest import mock

    from modsent.training.loop import TrainingLog

    marks: dict[int, float] = {}
    counted: dict[int, int] = {}
    last = settings["max_steps"]
    record = TrainingLog.record

    def watched(log, step, loss, lr, n_pairs, inputs=None):
        counted[step] = counted.get(step, 0) + n_pairs
        return record(log, step, loss, lr, n_pairs, inputs)

    def on_step(step: int) -> None:
        if step in (warmup, last):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            marks[step] = time.perf_counter()

    inputs = {"base": str(source), "pairs": {lang: str(path) for lang, path in pairs.items()}}
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(TrainingLog, "record", watched))
        if recipe.startswith("DuEAM") and importlib.util.find_spec("ot") is None:
            from modsent.methods.dueam import wmd

            stack.enter_context(mock.patch.object(wmd, "word_movers_distance", centroid_distance))
        metrics, cfg = _run(recipe, inputs, settings, device, on_step)
    if metrics.get("steps") != last:
        raise SystemExit(f"{recipe}: {metrics.get('steps')} steps ran, {last} asked")
    return metrics, cfg, marks[last] - marks[warmup], sum(n for step, n in counted.items() if step >= warmup)


def _run(recipe: str, inputs: dict, settings: dict, device: str, on_step):
    if recipe.startswith("mST5"):
        from modsent.methods.mst5 import training as module

        cfg = module.MST5Config.from_settings(recipe, settings)
        result = module.run_training(recipe, inputs, cfg, english_only=False, device=device, progress=False,
                                     on_step=on_step)
    elif recipe.startswith("DuEAM"):
        from modsent.methods.dueam import training as module
        from modsent.methods.dueam.settings import DuEAMConfig

        cfg = DuEAMConfig.from_settings(recipe, settings)
        result = module.run_training(recipe, inputs, cfg, device=device, progress=False, on_step=on_step)
    elif recipe.startswith("InteMATs"):
        from modsent.methods.intemats import training as module

        cfg = module.InteMATsConfig.from_settings(recipe, settings)
        result = module.run_training(recipe, inputs, cfg, device=device, progress=False, on_step=on_step)
    else:
        from modsent.methods import baselines

        cfg = baselines.FullTrainingConfig.from_config(settings)
        result = baselines.run_full_training(recipe, inputs["base"], inputs["pairs"], cfg, device=device,
                                             progress=False, on_step=on_step)
    return result.metrics, cfg


def row(recipe: str, variant: str, metrics: dict, seconds: float, timed_pairs: int, args, peak: float | None) -> dict:
    steps = args.steps
    flops = (metrics.get("model_flops") or 0.0) * steps / metrics["steps"]  # pro rata: the run's mean step
    rate = flops / seconds if seconds > 0 else None
    return {"recipe": recipe, "variant": variant, "pairs_s": timed_pairs / seconds, "pairs": timed_pairs / steps,
            "tflops": None if rate is None else rate / 1e12,
            "mfu": None if rate is None or peak is None else rate / (peak * 1e12),
            "memory": metrics.get("gpu_peak_memory_gib"), "padding": metrics.get("padding_fraction"),
            "step_ms": 1000 * seconds / steps}


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def main(argv=None) -> None:
    import warnings

    import transformers

    from modsent.logs import LIBRARY_NOISE
    from modsent.training import efficiency

    transformers.utils.logging.disable_progress_bar()  # loading and saving the random models
    transformers.logging.set_verbosity_error()  # the random XLM-R's unused pooler, reloaded as a masked LM
    for category, message in LIBRARY_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", nargs="+", choices=RECIPES, default=list(RECIPES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", choices=("small", "paper"), default="small",
                        help="paper: the papers' bases' shapes (XLM-R base; mT5 of --mst5); small: 2 layers")
    parser.add_argument("--mst5", choices=("large", "xl", "xxl"), default="large",
                        help="the mT5 size with --size paper (the paper's main model: xxl)")
    parser.add_argument("--checkpointing", action="store_true", help="m-ST5 with gradient_checkpointing: true")
    parser.add_argument("--steps", type=int, default=5, help="timed optimizer steps (after --warmup steps)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (each new shape is slow once)")
    parser.add_argument("--batch-size", type=int, default=None, help="the recipes' own batch sizes unless given")
    parser.add_argument("--length-groups", type=int, default=None,
                        help="also the mixed-precision run with length_groups K (on the CPU: fp32)")
    parser.add_argument("--variants", nargs="+", choices=("fp32", "auto"), default=None,
                        help="default: fp32 and, on a GPU, auto")
    parser.add_argument("--peak-tflops", type=float, default=None, help="default: the GPU's own (efficiency)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    variants = args.variants or (["fp32", "auto"] if cuda else ["fp32"])
    runs = [(v, 1) for v in variants]
    if args.length_groups:
        runs.append((variants[-1], args.length_groups))
    peak = args.peak_tflops or (efficiency.peak_tflops(args.device)[0] if cuda else None)
    name = torch.cuda.get_device_name(torch.device(args.device)) if cuda else "cpu"
    print(f"device {args.device} ({name}); torch {torch.__version__}; size {args.size}"
          + (f", m-ST5 on mt5-{args.mst5}" if args.size == "paper" else "")
          + f"; {args.warmup} warm-up + {args.steps} timed steps; peak {peak or '-'} TFLOP/s")
    rows = []
    with tempfile.TemporaryDirectory(prefix="recipe-throughput-") as tmp:
        root = Path(tmp)
        pairs = pair_files(root)
        bases = {}
        for recipe in args.recipes:
            kind = "mt5" if recipe.startswith("mST5") else "bert" if recipe.startswith("Full") else "xlmr"
            if kind not in bases:
                started = time.perf_counter()
                bases[kind] = (random_mt5(root / "mt5", args.size, args.mst5, args.device) if kind == "mt5"
                               else random_encoder(root / kind, kind, args.size))
                print(f"{kind}: built and saved in {time.perf_counter() - started:.0f} s")
                if cuda:  # the weights built on the GPU (m-ST5) are freed: each run loads its own
                    torch.cuda.empty_cache()
            for precision, groups in runs:
                variant = precision + (f", length_groups {groups}" if groups > 1 else "")
                settings = settings_of(recipe, bases[kind], args, precision, groups)
                started = time.perf_counter()
                metrics, cfg, seconds, timed_pairs = train(recipe, bases[kind], pairs, settings, args.warmup,
                                                           args.device)
                rows.append(row(recipe, variant, metrics, seconds, timed_pairs, args, peak))
                print(f"{recipe}, {variant}: {metrics['steps']} steps (batch_size {cfg.batch_size}), the run "
                      f"{time.perf_counter() - started:.0f} s with its data, model and evaluations")
                if cuda:
                    torch.cuda.empty_cache()
    print()
    print(f"{'recipe':<12} {'variant':<22} {'pairs/s':>9} {'pairs':>6} {'step ms':>9} {'TFLOP/s':>8} {'MFU':>6} "
          f"{'peak GiB':>9} {'padding':>8} {'vs fp32':>8}")
    for r in rows:
        base = next((b for b in rows if b["recipe"] == r["recipe"] and b["variant"] == "fp32"), None)
        ratio = r["pairs_s"] / base["pairs_s"] if base else None
        print(f"{r['recipe']:<12} {r['variant']:<22} {r['pairs_s']:>9.1f} {r['pairs']:>6.0f} {r['step_ms']:>9.1f} "
              f"{_fmt(r['tflops'], '.2f'):>8} {_fmt(r['mfu'], '.1%'):>6} {_fmt(r['memory'], '.2f'):>9} "
              f"{_fmt(r['padding'], '.1%'):>8} {_fmt(ratio, '.2f') + ('x' if ratio else ''):>8}")


if __name__ == "__main__":
    main()

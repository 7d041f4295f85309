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

With ``--join N ...`` each text is N consecutive sentences (6: about 115 tokens, near the
recipes' 128-token limit: the worst case of memory that ``configs/mst5.yaml`` estimates for
mt5-xxl, where the default texts, 5-40 words, are typical NLI lengths).

Printed per recipe and variant, as each run ends and again in one table: pairs a second over the
timed steps, counting the pairs each step gave its training log (triplets for m-ST5, both
micro-batches' pairs for InteMATs; batches grouped by length are not all full: a group's
leftovers make a smaller batch), the pairs of a timed step on average, model TFLOP/s and MFU
(the FLOPs the recipe records for its run, by its convention, 6N per token plus attention, times
the timed steps' share of them, from the tokens those steps counted; m-ST5's and InteMATs-ST's
frozen bodies do about two thirds of that, 4N, as no weight gradient of theirs is computed; the
fp32 rows against the same bf16 peak, ``--peak-tflops`` or the GPU's own), the GPU's peak
memory, the real tokens and the padded width of a text on average in the timed steps and the
widest batch, the share of padding in the run's encoded positions and the ratio against ``fp32``
on the same texts. A run that fails (out of memory, say) is reported and the others go on.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import torch

RECIPES = ("mST5-xnli", "DuEAM-weak", "InteMATs-ST", "Full_c")
XLMR_BASE = dict(hidden=768, layers=12, heads=12, intermediate=3072)
XLMR_VOCAB = 250_002
LABSE_VOCAB = 501_153
SMALL_XLMR = dict(hidden=64, layers=2, heads=4, intermediate=256)
SMALL_MT5 = dict(d_model=64, d_kv=16, d_ff=128, layers=2, heads=4)
# the tokenizers' vocabulary, learnt from the sample texts: BERT's WordPiece reaches it (1.37 pieces a
# word, counting [CLS] and [SEP]); the Unigram ones of XLM-R and mT5 stop at about 2,100 pieces on
# 1,200 sentences (1.57-1.65 a word with their special tokens, where the real ones cut English into
# fewer): their texts are somewhat longer than real tokenizers would make them ("tokens" column)
TOKENIZER_PIECES = 8000


def pair_files(root: Path, languages=("en", "de"), join: int = 1) -> dict[str, Path]:
    """The paraphrase files' format (pair_id, dataset, anchor, positive, negative) with sample
    sentences: row i of the language at position j is texts i, i + 1, i + 2 shifted by j/3 of
    the list (see the module's text); a text is ``join`` consecutive sentences."""
    from modsent.testing import sample_texts

    sentences = sample_texts(1200)
    n = len(sentences)
    texts = [" ".join(sentences[(i + k) % n] for k in range(join)) for i in range(n)]
    root.mkdir(parents=True, exist_ok=True)
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
    if recipe.startswith(("DuEAM", "InteMATs")):  # their learning rate from the first step (warm-up in steps)
        settings.update(warmup_steps=0)
    if args.batch_size:
        settings["batch_size"] = args.batch_size
    return settings


def centroid_distance(x: np.ndarray, y: np.ndarray, wx: np.ndarray | None = None, wy: np.ndarray | None = None,
                      ground_cost: str = "euclidean") -> float:
    """The word centroid distance, a lower bound of WMD with a Euclidean ground cost: the distance
    of the two texts' mass-weighted mean token vectors (DuEAM's targets where POT is missing)."""
    return float(np.linalg.norm(np.average(x, axis=0, weights=wx) - np.average(y, axis=0, weights=wy)))


class Watch:
    """What a run's training log saw, for the timed steps alone: the pairs each step gave it
    (``record``), the sequences and widths of the batches it counted (``count_padding``), the
    body shape its FLOPs are counted for (``efficiency``), and at ``on_step(warmup)`` and
    ``on_step(last)`` the time (after a wait for the GPU) and its token counts. The log's
    methods are wrapped for the run only; the recipe's own code runs unchanged."""

    def __init__(self, warmup: int, last: int, device: str):
        self.warmup, self.last, self.device = warmup, last, device
        self.pairs: dict[int, int] = {}
        self.log = None
        self.shape = None
        self.sequences = 0
        self.widest = 0
        self.marks: dict[int, tuple] = {}

    def patches(self):
        from modsent.training import loop

        record, count_padding, efficiency = (loop.TrainingLog.record, loop.TrainingLog.count_padding,
                                             loop.TrainingLog.efficiency)

        def watched_record(log, step, loss, lr, n_pairs, inputs=None):
            self.log = log
            self.pairs[step] = self.pairs.get(step, 0) + n_pairs
            return record(log, step, loss, lr, n_pairs, inputs)

        def watched_count(log, *inputs):
            for mask in loop._feature_masks(inputs):
                self.sequences += mask.shape[0]
                if self.warmup in self.marks:
                    self.widest = max(self.widest, mask.shape[-1])
            return count_padding(log, *inputs)

        def watched_efficiency(log, shape, *args, **kwargs):
            self.shape = shape
            return efficiency(log, shape, *args, **kwargs)

        stack = contextlib.ExitStack()
        for name, function in (("record", watched_record), ("count_padding", watched_count),
                               ("efficiency", watched_efficiency)):
            stack.enter_context(mock.patch.object(loop.TrainingLog, name, function))
        return stack

    def on_step(self, step: int) -> None:
        if step in (self.warmup, self.last):
            if self.device.startswith("cuda"):
                torch.cuda.synchronize(torch.device(self.device))
            log = self.log
            self.marks[step] = (time.perf_counter(), log.tokens, log.token_squares, log.positions, self.sequences)

    def figures(self, metrics: dict) -> dict:
        """The timed steps': seconds, pairs, model FLOPs (the run's recorded ``model_flops`` times
        the timed steps' share of the counted tokens' FLOPs: each step's own lengths), real
        tokens and padded positions per sequence, the widest batch."""
        from modsent.training.efficiency import encoder_flops

        (t0, tokens0, squares0, positions0, sequences0), (t1, tokens1, squares1, positions1, sequences1) = (
            self.marks[self.warmup], self.marks[self.last])
        whole = encoder_flops(self.shape, tokens1, squares1) if self.shape else 0.0
        share = encoder_flops(self.shape, tokens1 - tokens0, squares1 - squares0) / whole if whole else None
        sequences = sequences1 - sequences0
        return {"seconds": t1 - t0, "pairs": sum(n for step, n in self.pairs.items() if step >= self.warmup),
                "flops": None if share is None or not metrics.get("model_flops") else metrics["model_flops"] * share,
                "tokens_per_text": (tokens1 - tokens0) / sequences if sequences else None,
                "width": (positions1 - positions0) / sequences if sequences else None, "widest": self.widest}


def train(recipe: str, source: Path, pairs: dict[str, Path], settings: dict, warmup: int, device: str):
    """One run of ``recipe``'s ``run_training`` (without cuDNN's attention, as every job whose
    batch shapes vary runs: :func:`modsent.training.fastpath.attention_for_varying_shapes`; the
    full baselines' ``run_full_training`` is called here without the job's wrapper that sets
    it): (its metrics, its config, :meth:`Watch.figures` of the steps after the first ``warmup``)."""
    from modsent.training import fastpath

    watch = Watch(warmup, settings["max_steps"], device)
    inputs = {"base": str(source), "pairs": {lang: str(path) for lang, path in pairs.items()}}
    with contextlib.ExitStack() as stack:
        stack.enter_context(watch.patches())
        stack.enter_context(fastpath.attention_for_varying_shapes())
        if recipe.startswith("DuEAM") and importlib.util.find_spec("ot") is None:
            from modsent.methods.dueam import wmd

            stack.enter_context(mock.patch.object(wmd, "word_movers_distance", centroid_distance))
        metrics, cfg = _run(recipe, inputs, settings, device, watch.on_step)
    if metrics.get("steps") != watch.last or set(watch.marks) != {warmup, watch.last}:
        raise RuntimeError(f"{recipe}: {metrics.get('steps')} steps ran, {watch.last} asked")
    return metrics, cfg, watch.figures(metrics)


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


def row(recipe: str, variant: str, metrics: dict, timed: dict, steps: int, peak: float | None) -> dict:
    seconds = timed["seconds"]
    rate = timed["flops"] / seconds if timed["flops"] is not None and seconds > 0 else None
    return {"recipe": recipe, "variant": variant, "pairs_s": timed["pairs"] / seconds, "pairs": timed["pairs"] / steps,
            "tflops": None if rate is None else rate / 1e12,
            "mfu": None if rate is None or peak is None else rate / (peak * 1e12),
            "memory": metrics.get("gpu_peak_memory_gib"), "padding": metrics.get("padding_fraction"),
            "step_ms": 1000 * seconds / steps, "tokens": timed["tokens_per_text"], "width": timed["width"],
            "widest": timed["widest"]}


HEADER = (f"{'recipe':<12} {'variant':<40} {'pairs/s':>9} {'pairs':>6} {'step ms':>9} {'TFLOP/s':>8} {'MFU':>6} "
          f"{'peak GiB':>9} {'tokens':>7} {'width':>6} {'widest':>7} {'padding':>8} {'vs fp32':>8}")


def line(r: dict, ratio: float | None) -> str:
    return (f"{r['recipe']:<12} {r['variant']:<40} {r['pairs_s']:>9.1f} {r['pairs']:>6.0f} {r['step_ms']:>9.1f} "
            f"{_fmt(r['tflops'], '.2f'):>8} {_fmt(r['mfu'], '.1%'):>6} {_fmt(r['memory'], '.2f'):>9} "
            f"{_fmt(r['tokens'], '.1f'):>7} {_fmt(r['width'], '.1f'):>6} {r['widest']:>7} "
            f"{_fmt(r['padding'], '.1%'):>8} {_fmt(ratio, '.2f') + ('x' if ratio else ''):>8}")


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What the options' types cannot check (tests/test_gpu_blocks.py runs it on gpu.sh's lines)."""
    if args.warmup < 1 or args.steps < 1 or min(args.join) < 1:
        parser.error("--warmup, --steps and --join must be at least 1")


def main(argv=None) -> None:
    import warnings

    import transformers

    from modsent.logs import LIBRARY_NOISE
    from modsent.training import efficiency

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
    parser.add_argument("--join", type=int, nargs="+", default=[1],
                        help="texts of N consecutive sentences, each N given (6: about 115 tokens, near the "
                             "recipes' 128-token limit: their worst case of memory)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="default: the GPU's own (efficiency)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    check_options(parser, args)
    transformers.utils.logging.disable_progress_bar()  # loading and saving the random models
    transformers.logging.set_verbosity_error()  # the random XLM-R's unused pooler, reloaded as a masked LM
    for category, message in LIBRARY_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)
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
    rows, failed = [], []
    with tempfile.TemporaryDirectory(prefix="recipe-throughput-") as tmp:
        root = Path(tmp)
        pairs = {join: pair_files(root / f"texts-{join}", join=join) for join in args.join}
        bases = {}
        for recipe in args.recipes:
            kind = "mt5" if recipe.startswith("mST5") else "bert" if recipe.startswith("Full") else "xlmr"
            if kind not in bases:
                started = time.perf_counter()
                bases[kind] = (random_mt5(root / "mt5", args.size, args.mst5, args.device) if kind == "mt5"
                               else random_encoder(root / kind, kind, args.size))
                print(f"{kind}: built and saved in {time.perf_counter() - started:.0f} s", flush=True)
                release(cuda)  # the weights built on the GPU (m-ST5): each run loads its own
            for join in args.join:
                for precision, groups in runs:
                    variant = precision + (f", length_groups {groups}" if groups > 1 else "") + (
                        f", {join}-sentence texts" if join > 1 else "")
                    settings = settings_of(recipe, bases[kind], args, precision, groups)
                    started = time.perf_counter()
                    try:
                        metrics, cfg, timed = train(recipe, bases[kind], pairs[join], settings, args.warmup,
                                                    args.device)
                    except Exception as err:  # the other runs' figures still print (out of memory, a bad setting)
                        failed.append(f"{recipe}, {variant}: {type(err).__name__}: {err}")
                        print(f"{recipe}, {variant}: FAILED: {failed[-1]}", flush=True)
                        release(cuda)
                        continue
                    rows.append({**row(recipe, variant, metrics, timed, args.steps, peak), "join": join,
                                 "base": precision == "fp32" and groups == 1})
                    print(f"{recipe}, {variant}: {metrics['steps']} steps (batch_size {cfg.batch_size}), the run "
                          f"{time.perf_counter() - started:.0f} s with its data, model and evaluations\n"
                          f"  {HEADER}\n  {line(rows[-1], ratio_of(rows[-1], rows))}", flush=True)
                    release(cuda)
    print()
    print(HEADER)
    for r in rows:
        print(line(r, ratio_of(r, rows)))
    for message in failed:
        print(f"FAILED {message}")


def ratio_of(r: dict, rows: list[dict]) -> float | None:
    """``r``'s pairs/s against the same recipe's fp32 run on the same texts, where there is one."""
    base = next((b for b in rows if b["recipe"] == r["recipe"] and b["join"] == r["join"] and b["base"]), None)
    return r["pairs_s"] / base["pairs_s"] if base else None


def release(cuda: bool) -> None:
    """A run's model freed before the next (PEFT's layers hold theirs in reference cycles)."""
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

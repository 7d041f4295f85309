"""What ``length_groups`` does to a pair file's batches: padding and each batch's datasets.

    python benchmarks/pair_batching.py results/paraphrase/de.parquet --tokenizer results/BASE/tokenizers/de
    python benchmarks/pair_batching.py --fixture     # the tests' two datasets (modsent.testing.two_length_datasets)

For each k of ``--groups`` the batches of one epoch as the SE stage (or, with ``--stage cla``, the
CLA's pp stage, which encodes L's positives and negatives only) builds them
(``modsent.training.pairs.no_duplicate_batches``), each batch encoded in one pass padded to its
longest text, as on a GPU. It prints the share of padded positions that are padding (tokens
with ``--tokenizer``, truncated at ``--seq-len``; else characters), the share of batches
whose pairs all come from one dataset, and the largest gap between a dataset's share of a
batch and its share of the file; k = 1 is the random batches, and each grouped k is also
shown grouped by length alone (``strata_column=None``), the most padding grouping can save.
Run it on a run's pair file with the base's or the language's tokenizer to choose k; no GPU
needed (what the padding costs a GPU step: ``benchmarks/pair_throughput.py``).

A recipe's batches (``--recipe``), made by the recipe's own data functions at k = 1 and each k,
from a run's files (every row with the recipe's default strata; ``datasets: null``, no
held-out split), each batch one pass as the recipe encodes it (m-ST5: anchors, positives and
negatives; InteMATs-ST: both sides; MEXMA: each micro-batch of ``--batch-size`` pairs, a step
being ``--grad-accum`` of them; DuEAM: both sides of the weak pairs, and the parallel ones
with ``--translations``); "one stratum" and the share gap are over the recipe's strata:

    python benchmarks/pair_batching.py --recipe mst5 --pairs en=results/paraphrase/en.parquet \
        de=results/paraphrase/de.parquet --tokenizer resources/base_models/BASE --batch-size 128
    python benchmarks/pair_batching.py --recipe mexma --translations de=results/translation/de.parquet ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def lengths_of(pairs, columns, tokenizer, seq_len):
    """Each text's length per column (0 where absent): tokens with special ones, or characters."""
    import numpy as np

    out = {}
    for column in columns:
        texts = [t if isinstance(t, str) else "" for t in pairs[column]]
        if tokenizer is None:
            counts = [len(t) for t in texts]
        else:
            counts = [min(len(ids), seq_len) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]]
        out[column] = np.where([isinstance(t, str) for t in pairs[column]], counts, 0)
    return out


def describe(pairs, batches, lengths, columns, strata=None) -> tuple[float, float, float]:
    """(padding share, share of batches of a single dataset, largest gap of a dataset's share);
    ``strata``: each row's stratum instead of its ``dataset`` (a recipe's)."""
    import pandas as pd

    real = padded = single = 0
    gap = 0.0
    labels = pd.Series(list(strata)) if strata is not None else (
        pairs["dataset"].reset_index(drop=True) if "dataset" in pairs.columns else None)
    overall = labels.value_counts(normalize=True) if labels is not None else None
    for batch in batches:
        counts = [lengths[c][i] for c in columns for i in batch if lengths[c][i] > 0]
        real += sum(counts)
        padded += max(counts) * len(counts)
        if labels is not None:
            shares = labels.iloc[batch].value_counts(normalize=True)
            single += len(shares) == 1
            gap = max(gap, float((shares.reindex(overall.index, fill_value=0) - overall).abs().max()))
    return 1 - real / padded, single / len(batches), gap


RECIPES = ("mst5", "intemats", "mexma", "dueam")


def _files(items) -> dict:
    out = {}
    for item in items or ():
        lang, sep, path = item.partition("=")
        if not sep or not lang or not path:
            raise SystemExit(f"expected LANG=FILE, got {item!r}")
        out[lang] = path
    return out


def recipe_batches(recipe: str, pairs_paths: dict, translation_paths: dict, batch_size: int, seed: int,
                   grad_accum: int = 2):
    """(rows, encoded text columns, each row's stratum, batches(k) -> the passes of one epoch)
    of ``recipe``'s training data, made by its own functions (every row: no held-out split,
    every dataset)."""
    from modsent.methods import baselines as bl
    from modsent.training.pairs import row_strata

    if recipe == "mst5":
        from modsent.methods.mst5 import training as mt

        rows = mt.crosslingual_triplets(mt.read_frames(pairs_paths, None, "--pairs"), seed)
        return rows, ("anchor", "positive", "negative"), row_strata(rows, mt.STRATA), \
            lambda k: mt.triplet_data(rows, batch_size, seed, k).epoch_batches(0)
    if recipe == "intemats":
        from modsent.methods.intemats import training as it

        frames = it.read_frames(pairs_paths, None, "--pairs")
        rows, _ = it.sentence_pairs(frames, bl.pivot_language(frames))
        return rows, ("anchor", "positive"), row_strata(rows, it.STRATA), \
            lambda k: it.grouped_data(rows, batch_size, seed, k).epoch_batches(0)
    if recipe == "mexma":
        from modsent.methods.mexma import training as mx

        rows = mx.read_bitext(translation_paths)
        return rows, ("english", "translation"), row_strata(rows, "lang"), \
            lambda k: [step[i:i + batch_size] for step in mx.epoch_batches(rows, batch_size * grad_accum, seed, k)(0)
                       for i in range(0, len(step), batch_size)]
    from modsent.methods.dueam import training as du
    from modsent.methods.dueam.pairs import build_pairs
    from modsent.methods.dueam.settings import DuEAMConfig

    cfg = DuEAMConfig(data="weak+parallel" if translation_paths else "weak", datasets=None, eval_pairs=0, seed=seed)
    rows = build_pairs(pairs_paths, translation_paths, cfg, "--recipe dueam").rows
    return rows, ("text_a", "text_b"), row_strata(rows, du.STRATA), \
        lambda k: du.epoch_batches(rows, batch_size, seed, k)(0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs", nargs="?", help="a pair file (parquet: anchor, positive, negative, dataset)")
    parser.add_argument("--fixture", action="store_true", help="the tests' two-dataset fixture instead")
    parser.add_argument("--tokenizer", help="count tokens with this tokenizer (a directory or Hub id)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens a text is truncated to")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--stage", choices=["se", "cla"], default="se",
                        help="se: every text is encoded; cla: L's positives and negatives only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recipe", choices=RECIPES, help="a recipe's batches, from --pairs / --translations")
    parser.add_argument("--pair-files", "--pairs", dest="pair_files", nargs="+", metavar="LANG=FILE",
                        help="--recipe: the run's paraphrase pair files (results/paraphrase/LANG.parquet)")
    parser.add_argument("--translations", nargs="+", metavar="LANG=FILE",
                        help="--recipe mexma, dueam: the run's translation files (results/translation/LANG.parquet)")
    parser.add_argument("--grad-accum", type=int, default=2, help="--recipe mexma: micro-batches a step")
    args = parser.parse_args(argv)
    if args.recipe:
        if args.pairs or args.fixture:
            parser.error("--recipe reads --pairs LANG=FILE and --translations LANG=FILE, not a pair file")
        return recipe_main(args)
    if bool(args.pairs) == args.fixture:
        parser.error("give a pair file or --fixture")

    from modsent.testing import two_length_datasets
    from modsent.training.pairs import PAIR_TEXT_COLUMNS, no_duplicate_batches, read_pairs

    pairs = two_length_datasets() if args.fixture else read_pairs(args.pairs)
    columns = ("positive", "negative") if args.stage == "cla" else PAIR_TEXT_COLUMNS
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    lengths = lengths_of(pairs, columns, tokenizer, args.seq_len)
    datasets = pairs["dataset"].nunique() if "dataset" in pairs.columns else 0
    print(f"{len(pairs)} pairs, {datasets} datasets, batches of {args.batch_size}, {args.stage} stage, "
          f"padding counted in {'tokens' if tokenizer else 'characters'}")
    print(f"{'batches':<28} {'padding':>8} {'one dataset':>12} {'largest share gap':>18}")
    for k in args.groups:
        variants = [("random" if k == 1 else f"length_groups {k}", "dataset")]
        if k > 1:
            variants.append((f"  by length alone, {k}", None))
        for name, strata in variants:
            batches = no_duplicate_batches(pairs, args.batch_size, args.seed, length_groups=k,
                                           length_columns=columns, strata_column=strata)
            padding, single, gap = describe(pairs, batches, lengths, columns)
            print(f"{name:<28} {padding:>8.1%} {single:>12.1%} {gap:>18.2f}")
    return 0


def recipe_main(args) -> int:
    pairs_paths, translation_paths = _files(args.pair_files), _files(args.translations)
    if args.recipe == "mexma" and not translation_paths:
        raise SystemExit("--recipe mexma reads --translations LANG=FILE")
    if args.recipe != "mexma" and not pairs_paths:
        raise SystemExit(f"--recipe {args.recipe} reads --pairs LANG=FILE")
    rows, columns, strata, batches_of = recipe_batches(args.recipe, pairs_paths, translation_paths,
                                                       args.batch_size, args.seed, args.grad_accum)
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    lengths = lengths_of(rows, columns, tokenizer, args.seq_len)
    print(f"{args.recipe}: {len(rows)} rows, {len(set(strata or []))} strata, passes of {args.batch_size}, "
          f"padding counted in {'tokens' if tokenizer else 'characters'}")
    print(f"{'batches':<28} {'padding':>8} {'one stratum':>12} {'largest share gap':>18}")
    for k in args.groups:
        padding, single, gap = describe(rows, batches_of(k), lengths, columns, strata)
        print(f"{'random' if k == 1 else f'length_groups {k}':<28} {padding:>8.1%} {single:>12.1%} {gap:>18.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

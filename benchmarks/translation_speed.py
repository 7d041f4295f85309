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


def run(translator: T.Translator, texts: list[str], batch_size: int, tokens: int) -> tuple[float, int]:
    """Seconds to translate ``texts`` as translate_shard batches them; generated tokens."""
    sources = translator.encode(texts)
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    batches = [[sources[i] for i in order[k:k + batch_size]] for k in range(0, len(order), batch_size)]
    translator.decode(translator.generate(batches[0]))  # warm-up
    if translator.engine == "transformers" and translator.model.device.type == "cuda":
        torch.cuda.synchronize()
    start, generated = time.perf_counter(), 0
    for batch in batches:
        targets = translator.generate(batch)
        translator.decode(targets)
        lengths = {len(t) for t in targets}
        if lengths != {tokens}:
            sys.exit(f"{translator.engine}: generated {sorted(lengths)} tokens, expected exactly {tokens}")
        generated += sum(lengths) * len(batch)
    if translator.engine == "transformers" and translator.model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, generated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--units", type=int, default=48, help="sentences to translate")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=24, help="generated tokens per sentence (min = max)")
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
        options = dict(src_lang="en", tgt_lang="de", beam_size=args.beam_size, max_length=args.tokens,
                       min_length=args.tokens, device=args.device)
        runs = [("transformers", checkpoint, args.torch_compute_type)]
        ct2_types = args.ct2_compute_types.split(",") if args.ct2_compute_types else [None]
        runs += [("ctranslate2", converted, compute_type) for compute_type in ct2_types]

        rows = []
        for engine, model, compute_type in runs:
            start = time.perf_counter()
            translator = T.load_translator(engine, model, compute_type=compute_type, **options)
            loaded = time.perf_counter() - start
            seconds, generated = run(translator, texts, args.batch_size, args.tokens)
            shown = compute_type or ("default" if engine == "ctranslate2" else "auto")
            rows.append((engine, shown, loaded, seconds, len(texts) / seconds, generated / seconds))
            del translator
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()

    config = SIZES[args.size]
    print(f"\nNLLB-{args.size} random weights (d_model {config['d_model']}, {config['layers']}+{config['layers']} "
          f"layers, vocabulary {config['model_vocab_size']}), {args.device}, {args.threads} threads; "
          f"{len(texts)} sentences, batch {args.batch_size}, beam {args.beam_size}, {args.tokens} tokens each\n")
    print(f"{'engine':<13} {'compute':<9} {'load s':>7} {'translate s':>12} {'sent/s':>8} {'tokens/s':>9} {'× transformers':>15}")
    base = rows[0][4]
    for engine, compute, loaded, seconds, per_second, tokens_per_second in rows:
        print(f"{engine:<13} {compute:<9} {loaded:>7.1f} {seconds:>12.2f} {per_second:>8.2f} "
              f"{tokens_per_second:>9.1f} {per_second / base:>15.2f}")


if __name__ == "__main__":
    main()

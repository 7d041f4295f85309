"""ModularEncoder vs plain sentence-transformers: throughput and memory, measured side by side.

    python benchmarks/modular_encoder.py                 # the demo's results tree (./run demo first)
    python benchmarks/modular_encoder.py --languages 23 --lang ky

1. Throughput: the same language's modules (LA + SE + merged CLA) encoded by a ModularEncoder and
   by the standalone export of that language loaded with SentenceTransformer, on the same
   sentences, alternating runs; prints sentences/s and the ratio (goal >= 0.95).
2. Memory: resident memory added by holding N languages in one ModularEncoder (the language's
   modules registered under N codes) vs N separate models (N x the resident memory one exported
   model adds); prints the ratio (goal <= 1/5 for N = 23).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    import torch

    from modsent.encoders.modular import ModularEncoder, load_exported

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=str(REPO / "results/me5-small"))
    parser.add_argument("--base", default=str(REPO / "resources/base_models/me5-small"))
    parser.add_argument("--lang", default="ky")
    parser.add_argument("--alignment", default="merged-0.5")
    parser.add_argument("--languages", type=int, default=23)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    results, lang = Path(args.results), args.lang
    modules = {"language_adapter": results / "language_adapters" / lang,
               "sentence_adapter": results / "sentence_adapters" / lang,
               "alignment": results / "alignment" / args.alignment / lang}
    sentences = [line.strip() for line in open(REPO / f"resources/corpora/{lang}.txt", encoding="utf-8")][:256]

    encoder = ModularEncoder(args.base)
    encoder.add_language(lang, **modules)
    with tempfile.TemporaryDirectory() as tmp:
        exported = encoder.export(lang, Path(tmp) / "export")
        plain = load_exported(exported)
        encoder.encode(sentences[:16], lang=lang)
        plain.encode(sentences[:16])
        modular_times, plain_times = [], []
        for _ in range(args.repeat):
            start = time.perf_counter()
            encoder.encode(sentences, lang=lang, batch_size=32)
            modular_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            plain.encode(sentences, batch_size=32)
            plain_times.append(time.perf_counter() - start)
        m = len(sentences) / statistics.median(modular_times)
        p = len(sentences) / statistics.median(plain_times)
        print(f"throughput ({lang}, {len(sentences)} sentences, median of {args.repeat}): ModularEncoder "
              f"{m:.1f} sent/s, SentenceTransformer export {p:.1f} sent/s, ratio {m / p:.2f} (goal >= 0.95)")

        # memory: each measurement in a fresh process (freed memory is not returned to the OS)
        per_model = child_memory("plain", exported, args, 1)
        modular = child_memory("modular", exported, args, args.languages)
    separate = per_model * args.languages
    print(f"memory for {args.languages} languages: one ModularEncoder {modular:.0f} MiB, {args.languages} "
          f"separate models ~{separate:.0f} MiB ({per_model:.0f} MiB each); ratio {modular / separate:.3f} "
          f"(goal <= 0.2)")


def child_memory(kind: str, exported: Path, args, n: int) -> float:
    """Resident memory (MiB) a fresh process adds by loading one exported model (plain) or a
    ModularEncoder with n languages (modular), after the same imports."""
    import json
    import subprocess
    import sys

    code = f"""
import gc, json, os, sys
sys.path.insert(0, {str(REPO)!r})
from benchmarks.modular_encoder import rss_mib
from pathlib import Path
import torch, sentence_transformers
from modsent.encoders.modular import ModularEncoder, load_exported
from modsent import languages as registry
gc.collect(); before = rss_mib()
if {kind!r} == "plain":
    model = load_exported({str(exported)!r})
    model.encode(["warm up: every weight is touched"])  # safetensors are mapped lazily
else:
    results, lang = Path({args.results!r}), {args.lang!r}
    modules = dict(language_adapter=results / "language_adapters" / lang,
                   sentence_adapter=results / "sentence_adapters" / lang,
                   alignment=results / "alignment" / {args.alignment!r} / lang)
    model = ModularEncoder({args.base!r})
    for code in [c for c in registry.codes() if "-" not in c][:{n}]:
        model.add_language(code, **modules)
        model.encode(["warm up: every weight is touched"], lang=code)
gc.collect()
print(json.dumps(rss_mib() - before))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()

"""Time and memory of turning an LA corpus into packed sequences, side by side.

    python benchmarks/pack_corpus.py                  # 1,000,000 lines
    python benchmarks/pack_corpus.py --lines 3000000

The language adapter tokenises its whole corpus before training (the paper: up to 10M sentences
per language, ~300M tokens). ``modsent.modular.language_adapter.pack_sequences`` tokenises in
chunks with the Rust tokenizer into one int32 stream; the reference here is the earlier
implementation (the Python wrapper over all lines at once, one Python list of every token id,
then an int64 tensor). Each runs in its own process on the same lines (German sentences of the
built-in corpus, numbered so that no two are equal), with a WordPiece tokenizer trained on them;
the script prints seconds, the peak resident memory above that of the lines alone, and checks
that both give the same sequences.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def reference_pack(lines, tokenizer, seq_len):
    """The earlier pack_sequences, kept here as the baseline."""
    import torch

    body = seq_len - 2
    stream: list[int] = []
    for ids in tokenizer(lines, add_special_tokens=False)["input_ids"]:
        if ids:
            stream.extend(ids)
            stream.append(tokenizer.sep_token_id)
    n = len(stream) // body
    chunks = torch.tensor(stream[: n * body], dtype=torch.long).view(n, body)
    cls = torch.full((n, 1), tokenizer.cls_token_id, dtype=torch.long)
    sep = torch.full((n, 1), tokenizer.sep_token_id, dtype=torch.long)
    return torch.cat([cls, chunks, sep], dim=1)


def lines_of(count: int) -> list[str]:
    from modsent.sources.builtin import builtin_corpus

    base = builtin_corpus("de")
    return [f"{base[i % len(base)]} {i}" for i in range(count)]


def make_tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(lines_of(20_000), trainers.WordPieceTrainer(vocab_size=8000, special_tokens=special))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]").save_pretrained(str(directory))


def child(which: str, count: int, seq_len: int, tokenizer_dir: str) -> None:
    import transformers

    from modsent.modular.language_adapter import pack_sequences

    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    lines = lines_of(count)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    packed = (pack_sequences if which == "modsent" else reference_pack)(lines, tokenizer, seq_len)
    seconds = time.perf_counter() - start
    extra = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    print(json.dumps({"seconds": seconds, "extra_bytes": extra, "shape": list(packed.shape),
                      "checksum": int(packed.sum()), "first": packed[0, :8].tolist()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--child", nargs=2, metavar=("WHICH", "TOKENIZER_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.lines, args.seq_len, args.child[1])
        return
    with tempfile.TemporaryDirectory() as scratch:
        make_tokenizer(Path(scratch))
        results = {}
        for which in ("reference", "modsent"):
            out = subprocess.run([sys.executable, __file__, "--lines", str(args.lines), "--seq-len", str(args.seq_len),
                                  "--child", which, scratch], capture_output=True, text=True, check=True)
            results[which] = json.loads(out.stdout.strip().splitlines()[-1])
    ref, ours = results["reference"], results["modsent"]
    same = all(ref[k] == ours[k] for k in ("shape", "checksum", "first"))
    print(f"{args.lines:,} lines -> {ours['shape'][0]:,} sequences of {args.seq_len} tokens; same sequences: {same}")
    for name, r in results.items():
        print(f"  {name:10s} {r['seconds']:7.1f} s   peak memory above the lines {r['extra_bytes'] / 2**30:6.2f} GiB")
    print(f"  modsent / reference: time {ours['seconds'] / ref['seconds']:.2f}x, "
          f"memory {ours['extra_bytes'] / ref['extra_bytes']:.2f}x")
    if not same:
        sys.exit("the two implementations gave different sequences")


if __name__ == "__main__":
    main()

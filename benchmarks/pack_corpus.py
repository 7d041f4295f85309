"""Time and memory of turning an LA corpus into packed sequences, side by side.

    python benchmarks/pack_corpus.py                  # 1,000,000 lines
    python benchmarks/pack_corpus.py --lines 3000000
    python benchmarks/pack_corpus.py --la             # the LA's whole preparation from the file

The language adapter tokenises its whole corpus before training (the paper: up to 10M sentences
per language, ~300M tokens). ``modsent.modular.language_adapter.pack_sequences`` tokenises in
chunks with the Rust tokenizer into one int32 stream; the reference here is the earlier
implementation (the Python wrapper over all lines at once, one Python list of every token id,
then an int64 tensor). Each runs in its own process on the same lines (German sentences of the
built-in corpus, numbered so that no two are equal), with a WordPiece tokenizer trained on them;
the script prints seconds, the peak resident memory above that of the lines alone, and checks
that both give the same sequences.

``--la`` times the language adapter's whole preparation from the corpus file instead: the
earlier one (every line read into a list, the held-out lines chosen by sorting all their hashes,
the parts concatenated into one stream, int64 sequences) against the LA's (the file read twice,
the held-out lines chosen by a heap of as many hashes, each part moved into its rows of int32
sequences and freed), from the file to the training and held-out sequences; the peak resident
memory (sampled every 5 ms) is above the process's when the file is first read, and both must
give the same sequences.
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


def previous_la_data(path, tokenizer, seq_len, eval_sentences):
    """The LA's preparation before it read its corpus twice: kept here as the baseline."""
    import hashlib
    import itertools

    import numpy as np
    import torch

    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    lines = [line for line in lines if line]
    count = min(eval_sentences, len(lines) // 10)
    ranked = sorted(range(len(lines)), key=lambda i: hashlib.sha1(lines[i].encode()).digest())
    held = set(ranked[:count])
    train = [line for i, line in enumerate(lines) if i not in held]
    heldout = [line for i, line in enumerate(lines) if i in held]

    def pack(lines):
        body, sep, parts = seq_len - 2, tokenizer.sep_token_id, []
        for start in range(0, len(lines), 100_000):
            encoded = [e.ids for e in tokenizer.backend_tokenizer.encode_batch(lines[start:start + 100_000],
                                                                             add_special_tokens=False) if e.ids]
            lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
            part = np.empty(int(lengths.sum()) + len(encoded), dtype=np.int32)
            seps = np.cumsum(lengths + 1) - 1
            tokens = np.ones(len(part), dtype=bool)
            tokens[seps] = False
            part[tokens] = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int32,
                                       count=len(part) - len(encoded))
            part[seps] = sep
            parts.append(part)
        stream = np.concatenate(parts)
        n = len(stream) // body
        packed = torch.empty((n, seq_len), dtype=torch.long)
        packed[:, 0] = tokenizer.cls_token_id
        packed[:, 1:-1] = torch.from_numpy(stream[: n * body].reshape(n, body))
        packed[:, -1] = sep
        return packed

    return pack(train), pack(heldout)


def la_data(path, tokenizer, seq_len, eval_sentences):
    """The LA's preparation (modsent.modular.language_adapter.train_language_adapter's)."""
    import torch

    from modsent.modular.language_adapter import pack_sequences, read_split_corpus

    train_lines, n_train, heldout_lines = read_split_corpus(path, eval_sentences)
    return (pack_sequences(train_lines(), tokenizer, seq_len, total=n_train, dtype=torch.int32),
            pack_sequences(heldout_lines, tokenizer, seq_len, dtype=torch.int32))


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
    if which in ("previous-la", "la"):
        # the resident memory sampled every 5 ms, above what it was when the preparation began
        # (ru_maxrss would be the process's peak so far: imports and the tokenizer's load)
        import os
        import threading

        page = os.sysconf("SC_PAGE_SIZE")

        def resident() -> int:
            with open("/proc/self/statm") as handle:
                return int(handle.read().split()[1]) * page

        before, peak, done = resident(), [0], threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], resident())
                done.wait(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start = time.perf_counter()
        train, heldout = (la_data if which == "la" else previous_la_data)(Path(tokenizer_dir) / "corpus.txt",
                                                                          tokenizer, seq_len, 1000)
        seconds = time.perf_counter() - start
        done.set()
        sampler.join()
        extra = max(peak[0], resident()) - before
        print(json.dumps({"seconds": seconds, "extra_bytes": extra, "shape": list(train.shape),
                          "checksum": int(train.long().sum()) + int(heldout.long().sum()),
                          "first": train[0, :8].tolist() + heldout[0, :8].tolist()}))
        return
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
    parser.add_argument("--la", action="store_true", help="the LA's whole preparation from the corpus file")
    parser.add_argument("--child", nargs=2, metavar=("WHICH", "TOKENIZER_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.lines, args.seq_len, args.child[1])
        return
    names = ("previous-la", "la") if args.la else ("reference", "modsent")
    with tempfile.TemporaryDirectory() as scratch:
        make_tokenizer(Path(scratch))
        if args.la:
            (Path(scratch) / "corpus.txt").write_text("".join(f"{line}\n" for line in lines_of(args.lines)),
                                                      encoding="utf-8")
        results = {}
        for which in names:
            out = subprocess.run([sys.executable, __file__, "--lines", str(args.lines), "--seq-len", str(args.seq_len),
                                  "--child", which, scratch], capture_output=True, text=True, check=True)
            results[which] = json.loads(out.stdout.strip().splitlines()[-1])
    ref, ours = results[names[0]], results[names[1]]
    same = all(ref[k] == ours[k] for k in ("shape", "checksum", "first"))
    print(f"{args.lines:,} lines -> {ours['shape'][0]:,} sequences of {args.seq_len} tokens; same sequences: {same}")
    above = "above the process before the file" if args.la else "above the lines"
    for name, r in results.items():
        print(f"  {name:11s} {r['seconds']:7.1f} s   peak memory {above} {r['extra_bytes'] / 2**30:6.2f} GiB")
    print(f"  {names[1]} / {names[0]}: time {ours['seconds'] / ref['seconds']:.2f}x, "
          f"memory {ours['extra_bytes'] / max(ref['extra_bytes'], 1):.2f}x")
    if not same:
        sys.exit("the two implementations gave different sequences")


if __name__ == "__main__":
    main()

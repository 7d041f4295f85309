"""The processes of a data-parallel LA: each tokenising its own corpus, or one writing it for all.

    python benchmarks/la_sequences.py                         # 4 processes, 1,000,000 lines
    python benchmarks/la_sequences.py --processes 8 --lines 2000000

A language adapter on N GPUs runs N processes (torchrun). Before
``modsent.modular.language_adapter.prepared_sequences`` every process read and tokenised the
whole corpus and held its own copy of the sequences, and a job rerun after a kill or a time
limit did it all again. Now the main process tokenises once, writes ``{out}.sequences/``, and
every process maps the file copy-on-write; a rerun maps what is there.

The script starts N processes in a gloo process group (as torchrun does, on the CPU) three
times on the same corpus (lines of four German sentences of the built-in corpus, about 18
tokens, numbered so that no two are equal, with a WordPiece tokenizer trained on them):

- ``each``: every process prepares its own sequences (the earlier way);
- ``shared``: ``prepared_sequences``, the first run of a job;
- ``rerun``: ``prepared_sequences`` again, the folder left by the first run.

Each process then reads every sequence once (as an epoch of training does) and reports its
proportional set size (PSS: a page shared by k processes counts 1/k in each) above its PSS
before the preparation. Printed: the wall time of the preparation, the sum of the PSS over the
processes, and the ratios against ``each``; every process of every run must hold the same
sequences (a SHA-256 of their bytes).

With fewer cores than processes (this machine: 2 cores, 4 processes) the earlier way's
tokenisers also competed for the cores; on a GPU node with cores to spare the first run takes
about as long as before (a little more: the folder is hashed and written), and the time saved
is a rerun's.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def pss() -> int:
    """This process's proportional set size in bytes (Linux, /proc/self/smaps_rollup)."""
    with open("/proc/self/smaps_rollup") as handle:
        for line in handle:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Pss in /proc/self/smaps_rollup")


def child(mode: str, scratch: str, seq_len: int) -> None:
    import hashlib

    import torch
    import transformers

    from modsent import distributed
    from modsent.modular import language_adapter as la

    torch.distributed.init_process_group("gloo")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(Path(scratch) / "tok"))
    cfg = la.LanguageAdapterConfig(steps=1, batch_size=8, learning_rate=1e-4, seq_len=seq_len, eval_sentences=1000)
    corpus = Path(scratch) / "corpus.txt"
    distributed.barrier()
    before, start = pss(), time.perf_counter()
    if mode == "each":
        train, heldout, _ = la._tokenised(corpus, tokenizer, cfg, False)
    else:
        train, heldout, _ = la.prepared_sequences(corpus, tokenizer, Path(scratch) / "tok", cfg,
                                                  Path(scratch) / "de.sequences")
    distributed.barrier()
    seconds = time.perf_counter() - start
    digest = hashlib.sha256()  # every sequence read once, as an epoch of training reads them
    for i in range(0, len(train), 4096):
        digest.update(train[i:i + 4096].numpy().tobytes())
    digest.update(heldout.numpy().tobytes())
    checksum = digest.hexdigest()
    distributed.barrier()
    print(json.dumps({"seconds": seconds, "pss": pss() - before, "checksum": checksum, "shape": list(train.shape)}))
    torch.distributed.destroy_process_group()


def run(mode: str, processes: int, scratch: str, seq_len: int) -> list[dict]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    children = []
    for rank in range(processes):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": str(processes), "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1"}
        children.append(subprocess.Popen([sys.executable, __file__, "--child", mode, scratch, "--seq-len", str(seq_len)],
                                         env=env, stdout=subprocess.PIPE, text=True))
    results = []
    for process in children:
        out, _ = process.communicate()
        if process.returncode:
            sys.exit(f"{mode}: a process failed ({process.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "SCRATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.seq_len)
        return
    from benchmarks.pack_corpus import make_tokenizer

    from modsent.sources.builtin import builtin_corpus

    sentences = builtin_corpus("de")  # four sentences a line (~18 tokens), numbered

    def lines_of(count: int) -> list[str]:
        return [" ".join(sentences[(4 * i + k) % len(sentences)] for k in range(4)) + f" {i}" for i in range(count)]

    with tempfile.TemporaryDirectory() as scratch:
        make_tokenizer(Path(scratch) / "tok")
        (Path(scratch) / "corpus.txt").write_text("".join(f"{line}\n" for line in lines_of(args.lines)),
                                                  encoding="utf-8")
        results = {mode: run(mode, args.processes, scratch, args.seq_len) for mode in ("each", "shared", "rerun")}
        size = sum(p.stat().st_size for p in (Path(scratch) / "de.sequences").iterdir())
    shape = results["each"][0]["shape"]
    same = len({(r["checksum"], tuple(r["shape"])) for rs in results.values() for r in rs}) == 1
    print(f"{args.lines:,} lines -> {shape[0]:,} sequences of {args.seq_len} tokens, {args.processes} processes; "
          f"same sequences in every process and run: {same}; the folder: {size / 2**30:.2f} GiB")
    base = results["each"]
    for mode, rs in results.items():
        seconds, memory = max(r["seconds"] for r in rs), sum(r["pss"] for r in rs)
        ratio = "" if mode == "each" else (f"   time {seconds / max(r['seconds'] for r in base):.2f}x, "
                                           f"memory {memory / sum(r['pss'] for r in base):.2f}x")
        print(f"  {mode:7s} {seconds:7.1f} s   PSS of all processes {memory / 2**30:6.2f} GiB{ratio}")
    if not same:
        sys.exit("the runs gave different sequences")


if __name__ == "__main__":
    main()

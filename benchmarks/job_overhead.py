"""What a workflow job's process costs around its work: imports, garbage collection, shutdown.

    python benchmarks/job_overhead.py                  # the built-in base model, 5 rounds
    python benchmarks/job_overhead.py --model DIR --repeat 7

Every Snakemake job runs its script in a new Python process, which imports torch, transformers
and, for most jobs, sentence-transformers: a few hundred thousand objects that live as long as
the process. Python's cyclic garbage collector walks all of them in each full collection, and
the interpreter's shutdown runs such collections while it tears the modules down.
``modsent.logs.start_job`` freezes what is alive after the script's imports, and again at exit
(``freeze_long_lived``). This runs what an evaluation job does, a process that imports the
three libraries, loads a SentenceTransformer (the built-in multilingual-e5-small, converted
once into a temporary directory, or ``--model``) and encodes the built-in held-out German
parallel sentences on one thread, both ways, alternating, ``--repeat`` times. Prints the
medians of: the imports, the load and encoding, one ``gc.collect()`` after the work (what
freeing a model costs, as the evaluation does between systems), the exit (from the script's
last statement to the process's end, measured by the parent) and the whole process, with the
ratio of each against the unfrozen process. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CHILD = r"""
import json, sys, time
start = time.time()
import torch, transformers, sentence_transformers
torch.set_num_threads(1)
imported = time.time()
if sys.argv[1] == "frozen":
    from modsent.logs import freeze_long_lived
    freeze_long_lived()
from sentence_transformers import SentenceTransformer
sentences = json.loads(sys.argv[3])
model = SentenceTransformer(sys.argv[2], device="cpu")
model.encode(sentences, batch_size=32)
del model
worked = time.time()
import gc
gc.collect()
collected = time.time()
print(json.dumps({"imports": imported - start, "work": worked - imported, "gc_collect": collected - worked,
                  "end": time.time()}), flush=True)
"""


def run_once(mode: str, model_dir: str, sentences: list[str]) -> dict[str, float]:
    started = time.time()
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, model_dir, json.dumps(sentences)],
                          capture_output=True, text=True, cwd=REPO)
    ended = time.time()
    if proc.returncode:
        raise SystemExit(f"the {mode} process failed:\n{proc.stderr[-3000:]}")
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    row["exit"] = ended - row.pop("end")
    row["process"] = ended - started
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a SentenceTransformer directory (default: the built-in base model)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=256)
    args = parser.parse_args()

    import sentence_transformers
    import torch

    from modsent.sources.builtin import builtin_parallel_eval

    model_dir = args.model
    if model_dir is None:
        from modsent.encoders.base_models import prepare_base_model

        model_dir = str(Path(tempfile.mkdtemp(prefix="job-overhead-")) / "me5-small")
        prepare_base_model("builtin:multilingual-e5-small", model_dir)
    sentences = builtin_parallel_eval(["de"])["de"].tolist()[:args.sentences]
    print(" ".join(["# benchmarks/job_overhead.py", *sys.argv[1:]]))
    print(f"Python {sys.version.split()[0]}; torch {torch.__version__}; sentence-transformers "
          f"{sentence_transformers.__version__}; model {Path(model_dir).name}; {len(sentences)} sentences, one thread")
    rows: dict[str, list[dict[str, float]]] = {"unfrozen": [], "frozen": []}
    for _ in range(args.repeat):
        for mode in rows:  # alternating: the machine's load falls on both alike
            rows[mode].append(run_once(mode, model_dir, sentences))
    keys = ["imports", "work", "gc_collect", "exit", "process"]
    medians = {mode: {key: statistics.median(r[key] for r in runs) for key in keys} for mode, runs in rows.items()}
    print("seconds, the median of the rounds; ratio: frozen against unfrozen, measured side by side")
    print(f"{'':10s}" + "".join(f"{key:>12s}" for key in keys))
    for mode in rows:
        print(f"{mode:10s}" + "".join(f"{medians[mode][key]:12.3f}" for key in keys))
    print(f"{'ratio':10s}" + "".join(
        f"{medians['frozen'][key] / medians['unfrozen'][key]:12.2f}" if medians["unfrozen"][key] > 0 else f"{'-':>12s}"
        for key in keys))
    saved = medians["unfrozen"]["process"] - medians["frozen"]["process"]
    print(f"each process: {saved:.2f} s less ({saved / medians['unfrozen']['process']:.0%})")


if __name__ == "__main__":
    main()

"""Planning time and job count of `snakemake -n`, and the demo's wall time.

    python benchmarks/planning.py                      # plan configs/paper-labse.yaml (goal < 10 s)
    python benchmarks/planning.py --config configs/paper-me5.yaml --repeat 5
    python benchmarks/planning.py --demo               # also run the demo from scratch (goal <= 20 min)

Each plan runs in an empty working directory, so every job of the config is planned.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def snakemake(*args: str, cwd: Path) -> tuple[float, str]:
    exe = shutil.which("snakemake") or str(Path(sys.executable).parent / "snakemake")
    start = time.perf_counter()
    proc = subprocess.run([exe, "--snakefile", str(REPO / "Snakefile"), *args], cwd=cwd,
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


def job_count(dry_run_output: str) -> int:
    match = re.search(r"^total\s+(\d+)", dry_run_output, re.M)
    return int(match.group(1)) if match else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/paper-labse.yaml")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--demo", action="store_true", help="also time the demo from scratch")
    args = parser.parse_args()

    config = str((REPO / args.config).resolve())
    times = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as work:
            elapsed, out = snakemake("-n", "--configfile", config, cwd=Path(work))
            times.append(elapsed)
    print(f"plan {args.config}: {job_count(out)} jobs; `snakemake -n` median {statistics.median(times):.2f} s "
          f"(min {min(times):.2f}, max {max(times):.2f}, n={len(times)}); goal < 10 s")

    if args.demo:
        with tempfile.TemporaryDirectory() as work:
            elapsed, out = snakemake("--cores", "2", "--configfile", str(REPO / "config.yaml"),
                                     cwd=Path(work))
            print(f"demo (config.yaml) from scratch: {elapsed / 60:.1f} min; goal <= 20 min")


if __name__ == "__main__":
    main()

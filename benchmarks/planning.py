"""Planning time and job count of `snakemake -n`, and the demo's wall time.

    python benchmarks/planning.py                      # plan configs/paper-labse.yaml (goal < 10 s)
    python benchmarks/planning.py --config configs/paper-me5.yaml --repeat 5
    python benchmarks/planning.py --demo               # also run the demo from scratch (goal <= 20 min)
    python benchmarks/planning.py --config config.yaml --against e049f81   # side by side with a revision

Each plan runs in an empty working directory, so every job of the config is planned. With
``--against REV`` the same config is also planned by revision REV's workflow and package (its
tree from ``git archive``, first on PYTHONPATH), the two alternating, and the ratio printed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def snakemake(*args: str, cwd: Path, tree: Path = REPO) -> tuple[float, str]:
    """``snakemake`` on ``tree``'s Snakefile, with ``tree``'s modsent first on the path."""
    exe = shutil.which("snakemake") or str(Path(sys.executable).parent / "snakemake")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    proc = subprocess.run([exe, "--snakefile", str(tree / "Snakefile"), *args], cwd=cwd,
                          capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


def plan_times(trees: dict[str, Path], config: Path, repeat: int) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Each tree plans ``config`` ``repeat`` times, the trees alternating: a config of this
    repository as each tree's own copy of it, any other file as it is."""
    times: dict[str, list[float]] = {name: [] for name in trees}
    jobs: dict[str, int] = {}
    for _ in range(repeat):
        for name, tree in trees.items():
            own = tree / config.relative_to(REPO) if config.is_relative_to(REPO) else config
            with tempfile.TemporaryDirectory() as work:
                elapsed, out = snakemake("-n", "--configfile", str(own), cwd=Path(work), tree=tree)
            times[name].append(elapsed)
            jobs[name] = job_count(out)
    return times, jobs


def job_count(dry_run_output: str) -> int:
    match = re.search(r"^total\s+(\d+)", dry_run_output, re.M)
    return int(match.group(1)) if match else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/paper-labse.yaml")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--demo", action="store_true", help="also time the demo from scratch")
    parser.add_argument("--against", metavar="REV", help="also plan with git revision REV's workflow and package")
    args = parser.parse_args()

    config = (REPO / args.config).resolve()
    trees = {"this tree": REPO}
    with tempfile.TemporaryDirectory() as other:
        if args.against:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.against], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", other], input=archive.stdout, check=True)
            trees[args.against] = Path(other)
        times, jobs = plan_times(trees, config, args.repeat)
    for name, values in times.items():
        print(f"plan {args.config} ({name}): {jobs[name]} jobs; `snakemake -n` median {statistics.median(values):.2f} s "
              f"(min {min(values):.2f}, max {max(values):.2f}, n={len(values)}); goal < 10 s")
    if args.against:
        ratio = statistics.median(times[args.against]) / statistics.median(times["this tree"])
        print(f"{args.against} / this tree: {ratio:.2f}x the planning time (medians, runs alternating)")

    if args.demo:
        with tempfile.TemporaryDirectory() as work:
            elapsed, out = snakemake("--cores", "2", "--configfile", str(REPO / "config.yaml"),
                                     cwd=Path(work))
            print(f"demo (config.yaml) from scratch: {elapsed / 60:.1f} min; goal <= 20 min")


if __name__ == "__main__":
    main()

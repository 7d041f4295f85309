"""The tests' whole-DAG workflow with its training and encoding jobs on a GPU: every stage, every
baseline, every recipe's system and the evaluation, run by Snakemake end to end where they run
for users, which the CPU tests cannot show (a tensor left on the host, a dtype that bf16
autocast changes, a job that silently trains on the CPU).

Two steps, so that the GPU machine needs only what the GPU jobs import:

    python benchmarks/gpu_workflow.py prepare .gpu-workflow        # here, on the CPU (about a minute)
    python benchmarks/gpu_workflow.py run .gpu-workflow --wheels .whl/workflow   # on the GPU machine

``prepare`` writes the workflow test's configuration (configs/test.yaml, the toy method and a
tiny system of each recipe; without the mteb-backed evaluation set, whose package the GPU image
lacks) to DIR/workflow.yaml and runs every job upstream of the GPU rules: the inputs, tokenizers,
fastText, FOCUS, and DuEAM's word mover's distances (a GPU-resource rule, prepared here because
its solver's wheel would not fit the GPU machine's transfer limit). ``run`` copies DIR to a
scratch directory (DIR stays prepared) and first marks the prepared outputs up to date there
(``snakemake --touch`` over the prepared part of the DAG: a copy between machines keeps no order
of modification times, and Snakemake reruns a job whose input or script is newer than its
output); it stops when a prepared job would still run. Then it runs the rest (the rules whose
resources name a ``gpu_`` class, and what follows them) with ``--cores 16``, greedily scheduled
(Snakemake's ILP solver's wheel is left behind), echoing Snakemake's progress, and prints each
rule's jobs and job-seconds, the device each GPU rule's job logged (``training on cuda:0
(...)``, ``encoding on ...``), the failed jobs' log tails, whether a second ``snakemake -n``
plans nothing, and the summary. It passes when every job succeeded, every GPU rule ran, nothing
is left to do and, on a machine with CUDA, every GPU rule's job names a CUDA device.
``--time-limit`` stops Snakemake in time to report what ran (gpu.sh's block: 50 s before its own limit, 250 s at most).
``--set section.key=VALUE`` sets a runtime setting in the run's copy of the config (gpu.sh's
``workflow_triton`` block: ``language_adapter.kernels=triton``) and prints what the jobs logged of it.

``--wheels DIR...`` installs the wheels of each DIR into a private directory first, without their
dependencies: ``.whl/workflow`` holds Snakemake and its dependencies, jsonschema, and modsent's
pinned transformers, tokenizers, PEFT, sentence-transformers and huggingface_hub, for Python 3.12
(the GPU image's: ``bash benchmarks/gpu_wheels.sh`` downloads them); the image has the
rest (torch, pandas, scikit-learn, ...). Run on the CPU, it checks the same flow without devices.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
# GPU-resource rules prepared on the CPU, with the reason
PREPARED_ON_CPU = {"dueam_wmd": "POT's wheel (32 MB) does not fit the GPU machine's transfer limit"}
# what the GPU part's jobs import besides the carried wheels, expected of the image: a missing one
# is named before the run (its jobs will fail), so that the next lease knows what to carry
IMAGE_MODULES = ("numpy", "pandas", "pyarrow", "safetensors", "scipy", "sklearn", "matplotlib", "yaml", "tqdm",
                 "datasets", "pycountry", "babel", "markdown_it")
# the line each GPU job writes (modsent.training.precision.grad_scaler; the encoding jobs')
DEVICE_LINE = re.compile(r"INFO \S+: (?:training|encoding) on (\S+)")


def snakemake_command(workdir: Path, cores: int, *args: str) -> list[str]:
    """Snakemake on modsent's Snakefile in ``workdir``, with ``workdir/workflow.yaml``."""
    return [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory",
            str(workdir), "--configfile", str(workdir / "workflow.yaml"), "--cores", str(cores), *args]


def environment(extra_path: Path | None = None) -> dict:
    """The jobs' environment: tests/ (the toy method's module), the repository and ``extra_path``
    (the installed wheels) before what PYTHONPATH held."""
    paths = [str(TESTS), str(REPO)] + ([str(extra_path)] if extra_path else [])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "TOKENIZERS_PARALLELISM": "false"}


def gpu_rules(workdir: Path, env: dict | None = None, *, prepared_too: bool = False) -> list[str]:
    """The rules of the workflow configured in ``workdir`` whose resources name a ``gpu_``
    class (rules/**/*.smk), less those prepared on the CPU (with them: ``prepared_too``)."""
    rules = set()
    for path in sorted((REPO / "rules").rglob("*.smk")):
        for block in re.split(r"^(?=\s*(?:rule|checkpoint) \w+:)", path.read_text(), flags=re.M):
            head = re.match(r"\s*(?:rule|checkpoint) (\w+):", block)
            if head and re.search(r"job_resources\(\"gpu_", block):
                rules.add(head.group(1))
    listed = subprocess.run(snakemake_command(workdir, 1, "--list-rules"), env=env or environment(),
                            capture_output=True, text=True)
    if listed.returncode:
        raise SystemExit(f"snakemake --list-rules failed:\n{listed.stderr[-3000:]}")
    rules &= set(listed.stdout.split())
    return sorted(rules if prepared_too else rules - set(PREPARED_ON_CPU))


def workflow_config() -> dict:
    """tests/test_workflow.py's configuration of the whole-DAG run, less the evaluation set
    that mteb scores (the mteb package is a test extra the GPU image lacks)."""
    sys.path.insert(0, str(TESTS))
    from test_workflow import workflow_config as tests_config

    config = tests_config()
    config["evaluation"]["datasets"].pop("tatoeba", None)
    return config


def prepare(workdir: Path, cores: int) -> None:
    """Write the configuration (and the English-only dataset's file it names) and run every job
    upstream of the GPU rules in ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "workflow.yaml").write_text(yaml.safe_dump(workflow_config(), sort_keys=False))
    sys.path.insert(0, str(TESTS))
    from test_workflow import write_english_only_file

    write_english_only_file(workdir)
    start = time.perf_counter()
    rules = gpu_rules(workdir)
    subprocess.run(snakemake_command(workdir, cores, "--omit-from", *rules), env=environment(), check=True)
    size = sum(path.stat().st_size for path in workdir.rglob("*") if path.is_file())
    print(f"prepared {workdir} in {time.perf_counter() - start:.0f} s: {size / 2**20:.1f} MiB; "
          f"left for the GPU: {', '.join(rules)}")


def install(wheels: list[Path]) -> Path:
    """The wheels of the folders ``wheels`` installed, without dependencies, into a private
    directory (returned), for the jobs' PYTHONPATH."""
    files = [str(path) for folder in wheels for path in sorted(folder.glob("*.whl"))]
    if not files:
        raise SystemExit(f"no wheels in {', '.join(map(str, wheels))} (download them: bash "
                         "benchmarks/gpu_wheels.sh)")
    target = Path("/tmp/site-gpu-workflow")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(target), *files], check=True)
    return target


def jobs_of_run(workdir: Path, log_file: Path | None = None) -> list[dict]:
    """Every job of a Snakemake log (``log_file``, else the newest of ``workdir``): rule, log
    file, seconds (None: not finished), failed."""
    logs = [log_file] if log_file else sorted((workdir / ".snakemake" / "log").glob("*.snakemake.log"))[-1:]
    jobs, stamp, current, in_error = {}, None, None, None
    for line in logs[0].read_text().splitlines() if logs else []:
        if m := re.match(r"\[(\w{3} \w{3} +\d+ [\d:]+ \d{4})\]", line):
            stamp, current, in_error = datetime.datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y"), None, None
        elif m := re.match(r"(?:local)?(?:rule|checkpoint) (\w+):", line):
            current = {"rule": m.group(1), "start": stamp, "log": None, "seconds": None, "failed": False}
        elif m := re.match(r"Error in rule (\w+):", line):
            current, in_error = None, m.group(1)
        elif (m := re.match(r"\s+log: (\S+?),?$", line)) and current:
            current["log"] = m.group(1)
        elif (m := re.match(r"\s+jobid: (\d+)", line)) and (current or in_error):
            if current:
                jobs[m.group(1)] = current
            elif m.group(1) in jobs:
                jobs[m.group(1)]["failed"] = True
        elif (m := re.match(r"Finished jobid: (\d+)", line)) and m.group(1) in jobs:
            job = jobs[m.group(1)]
            job["seconds"] = (stamp - job["start"]).total_seconds()
    return list(jobs.values())


def device_of(workdir: Path, job: dict) -> str | None:
    """The device a job's log names (modsent.training.precision.grad_scaler's line, the
    encoding jobs'), or None."""
    path = workdir / job["log"] if job["log"] else None
    if path is None or not path.exists():
        return None
    found = DEVICE_LINE.findall(path.read_text(errors="replace"))
    return found[-1] if found else None


def run_snakemake(command: list[str], env: dict, output: Path, time_limit: float | None) -> tuple[int, bool]:
    """Run ``command`` with its output in ``output``, echoing every tenth job's progress line and
    the errors; stop it (its whole process group) after ``time_limit`` seconds. (exit status,
    stopped at the limit)."""
    stopped = threading.Event()
    with open(output, "w") as out:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)

        def stop():
            stopped.set()
            print(f"time limit of {time_limit:.0f} s: stopping Snakemake", flush=True)
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 0)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(wait)
                    return
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue

        timer = threading.Timer(time_limit, stop) if time_limit else None
        if timer:
            timer.start()
        for line in proc.stdout:
            out.write(line)
            progress = re.match(r"(\d+) of (\d+) steps", line)
            if (progress and (int(progress.group(1)) % 10 == 0 or progress.group(1) == progress.group(2))
                    or re.match(r"Error in rule|Exiting because", line)):
                print(f"{time.strftime('%H:%M:%S')} {line.rstrip()}", flush=True)
        code = proc.wait()
        if timer:
            timer.cancel()
    return code, stopped.is_set()


def set_keys(config_path: Path, settings: list[str]) -> list[str]:
    """Set each ``section.key=VALUE`` (VALUE read as YAML) in the config file; returns the lines
    naming them. Meant for runtime settings (``x-role: runtime``): any other key changes the
    prepared jobs' params, and the run stops at its check that nothing prepared would run again."""
    config = yaml.safe_load(config_path.read_text()) or {}
    done = []
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {setting!r}: expected section.key=VALUE")
        node = config
        *parents, name = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[name] = yaml.safe_load(value)
        done.append(f"{key}: {node[name]!r}")
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return done


def run(prepared: Path, cores: int, wheels: list[Path], scratch: Path, time_limit: float | None,
        settings: list[str] = ()) -> int:
    """Run the GPU part of the prepared workflow in a copy of it, check and report it; 0 when it
    passed. ``settings``: runtime settings set in the copy's config first (:func:`set_keys`)."""
    import torch

    env = environment(install(wheels) if wheels else None)
    versions = subprocess.run(
        [sys.executable, "-c", "import sys, torch, transformers, peft, sentence_transformers, snakemake, pandas; "
         "print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, "
         "'peft', peft.__version__, 'sentence-transformers', sentence_transformers.__version__, "
         "'snakemake', snakemake.__version__, 'pandas', pandas.__version__)"],
        env=env, capture_output=True, text=True)
    print(versions.stdout.strip() or versions.stderr.strip()[-3000:], flush=True)
    if versions.returncode:
        return 1
    probe = subprocess.run(
        [sys.executable, "-c", "import importlib.util, sys; "
         "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))", *IMAGE_MODULES],
        env=env, capture_output=True, text=True)
    if probe.returncode:
        print(f"the module probe failed: {probe.stderr.strip()[-2000:]}", flush=True)
        return 1
    absent = probe.stdout.split()
    print(f"missing here: {', '.join(absent)} (the jobs importing them will fail)" if absent else
          f"present: {', '.join(IMAGE_MODULES)}", flush=True)
    on_gpu = torch.cuda.is_available()
    print(f"CUDA: {torch.cuda.get_device_name(0) if on_gpu else 'none (the jobs run on the CPU)'}", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)  # the prepared directory stays as it was: a run can be repeated
    shutil.copytree(prepared, scratch, symlinks=True)
    if settings:
        print("set in the run's config: " + ", ".join(set_keys(scratch / "workflow.yaml", list(settings))), flush=True)
    rules = gpu_rules(scratch, env)
    # the prepared outputs up to date in the copy, whatever order of times the copy gave them
    omit = ["--omit-from", *rules]
    touched = subprocess.run(snakemake_command(scratch, cores, "--touch", *omit), env=env, capture_output=True,
                             text=True)
    left = subprocess.run(snakemake_command(scratch, cores, "-n", *omit), env=env, capture_output=True, text=True)
    if touched.returncode or "Nothing to be done" not in left.stdout + left.stderr:
        print("the prepared jobs would run again here (prepare again?):\n"
              + (touched.stdout + touched.stderr + left.stdout + left.stderr)[-3000:])
        return 1
    logs_before = set((scratch / ".snakemake" / "log").glob("*.snakemake.log"))
    start = time.perf_counter()
    code, stopped = run_snakemake(snakemake_command(scratch, cores, "--scheduler", "greedy", "--keep-going"), env,
                                  scratch / "snakemake.out", time_limit)
    wall = time.perf_counter() - start
    new_logs = sorted(set((scratch / ".snakemake" / "log").glob("*.snakemake.log")) - logs_before)
    jobs = jobs_of_run(scratch, new_logs[-1]) if new_logs else []
    print(f"snakemake: exit {code}{' (stopped at the time limit)' if stopped else ''} after {wall:.0f} s, "
          f"{len(jobs)} jobs started, {sum(job['seconds'] is not None for job in jobs)} finished, {cores} cores "
          f"(in {scratch})")
    if code:
        print("\n".join((scratch / "snakemake.out").read_text(errors="replace").splitlines()[-40:]))
    by_rule = collections.defaultdict(list)
    for job in jobs:
        by_rule[job["rule"]].append(job)
    print(f"{'rule':32s} {'jobs':>4s} {'job-s':>6s}  devices the GPU rules' logs name")
    off_gpu = []
    for name, group in sorted(by_rule.items(), key=lambda item: -sum(j["seconds"] or 0 for j in item[1])):
        named = [device_of(scratch, job) or "none" for job in group] if name in rules else []
        off_gpu += [job["log"] for job, device in zip(group, named) if not device.startswith("cuda")]
        print(f"{name:32s} {len(group):4d} {sum(j['seconds'] or 0 for j in group):6.0f}  "
              + ", ".join(f"{d} x{n}" for d, n in collections.Counter(named).items()))
    failed = [job for job in jobs if job["failed"]]
    for job in failed:
        path = scratch / job["log"] if job["log"] else None
        tail = path.read_text(errors="replace").splitlines()[-30:] if path and path.exists() else ["(no log)"]
        print(f"== FAILED {job['rule']}: {job['log']}\n" + "\n".join(tail))
    missing = sorted(set(rules) - set(by_rule))
    if missing:
        print("GPU rules with no job in the run: " + ", ".join(missing))
    again = subprocess.run(snakemake_command(scratch, cores, "-n"), env=env, capture_output=True, text=True)
    settled = "Nothing to be done" in again.stdout + again.stderr
    print(f"snakemake -n afterwards: {'nothing to do' if settled else 'jobs planned'}")
    if not settled:
        print((again.stdout + again.stderr)[-3000:])
    unmeasured = stage_efficiency(scratch, on_gpu)
    for setting in settings:  # what the jobs logged of each setting (e.g. how many layers the kernels took)
        key = setting.partition("=")[0]
        lines = sorted({line.split(": ", 1)[-1].strip() for path in (scratch / "logs").rglob("*.log")
                        for line in path.read_text(errors="replace").splitlines() if key in line})
        print(f"{key} in the jobs' logs: " + ("; ".join(lines[:5]) if lines else "never named"))
    summaries = sorted((scratch / "results").glob("*/summary.md"))
    for summary in summaries:
        print(f"== {summary.relative_to(scratch)}\n{summary.read_text()}")
    if on_gpu and off_gpu:
        print(f"GPU-rule jobs whose logs name no CUDA device ({len(off_gpu)}): " + ", ".join(map(str, off_gpu)))
    ok = (code == 0 and jobs and not failed and not missing and settled and summaries
          and not (on_gpu and (off_gpu or unmeasured)))
    print("GPU workflow:", "passed" if ok else "FAILED")
    return 0 if ok else 1


def stage_efficiency(workdir: Path, on_gpu: bool) -> list[str]:
    """Print the model TFLOP/s, MFU and peak memory every training stage's metrics.json recorded
    (modsent.training.efficiency; the tests' tiny models: a check that they are recorded, not a
    figure of the method); return those that ran on a GPU without recording its memory."""
    print(f"{'stage output':60s} {'TFLOP/s':>9s} {'MFU':>6s} {'GiB':>6s}")
    unmeasured, unknown_peak = [], ""
    for path in sorted((workdir / "results").rglob("metrics.json")):
        metrics = json.loads(path.read_text())
        if "model_flops" not in metrics:
            continue
        rate, mfu, memory = (metrics.get(key) for key in ("model_tflops_per_second", "mfu", "gpu_peak_memory_gib"))
        where = path.parent.relative_to(workdir).as_posix()
        print(f"{where:60s} {rate or 0:9.3f} {'-' if mfu is None else f'{mfu:.2%}':>6s} "
              f"{'-' if memory is None else f'{memory:.2f}':>6s}")
        if on_gpu and str(metrics.get("device", "")).startswith("cuda") and memory is None:
            unmeasured.append(where)
        if on_gpu and metrics.get("peak_tflops") is None and not unknown_peak:
            unknown_peak = f"{where}: no MFU, this GPU's peak is not in modsent.training.efficiency.PEAK_TFLOPS"
    if unknown_peak:
        print(unknown_peak)
    if unmeasured:
        print(f"GPU stages without their efficiency figures ({len(unmeasured)}): " + ", ".join(unmeasured))
    return unmeasured


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["prepare", "run"])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--cores", type=int, default=None, help="Snakemake's cores (prepare: 2; run: 16)")
    parser.add_argument("--wheels", type=Path, nargs="*", default=[],
                        help="run: folders of wheels to install first (without their dependencies)")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/gpu-workflow-run"),
                        help="run: where the prepared directory is copied and run")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="run: seconds after which Snakemake is stopped and what ran is reported")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="run: a runtime setting for the run's config (repeatable), e.g. "
                             "language_adapter.kernels=triton")
    args = parser.parse_args(argv)
    if args.step == "prepare":
        prepare(args.workdir.resolve(), args.cores or 2)
        return 0
    return run(args.workdir.resolve(), args.cores or 16, args.wheels, args.scratch.resolve(), args.time_limit,
               args.settings)


if __name__ == "__main__":
    sys.exit(main())

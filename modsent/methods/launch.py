"""A registered training method run from the command line: how the workflow trains a
data-parallel method (:attr:`modsent.methods.Method.data_parallel`) on several GPUs of one node.

    python -m modsent.methods.launch --method DuEAM-weak --inputs JSON --settings JSON --out DIR

The workflow script of rule ``train_method`` calls :func:`train` with the method's inputs and
settings: with ``gpus`` 1 (or no CUDA) the method trains in that process; with more it runs
this module under torchrun (:func:`modsent.distributed.launch_command`), one process per GPU,
and each process calls the method's ``train`` (:func:`main`). The inputs and settings travel as
JSON: file paths, lists and mappings of them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from modsent import methods

log = logging.getLogger(__name__)

# the key of a method's settings that says how many processes run it; not passed to ``train``
GPUS = "gpus"


def _plain(value):
    """``value`` with paths as strings and Snakemake's named lists as lists (JSON-ready)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (str, Path)):
        return str(value)
    if isinstance(value, Sequence):
        return [_plain(v) for v in value]
    return value


def training_settings(settings: Mapping) -> dict:
    """The settings ``train`` receives: all but the process count and the job's resources
    (the workflow's to request)."""
    return {key: value for key, value in settings.items() if key not in (GPUS, methods.RESOURCES)}


def cli_arguments(name: str, inputs: Mapping, out_dir, settings: Mapping, *, modules: Sequence[str] = (),
                  log_path=None, threads: int | None = None, progress: bool = True) -> list[str]:
    """The arguments of ``python -m modsent.methods.launch`` that train method ``name`` as
    ``methods.get(name).train(inputs, out_dir, settings)`` does (:func:`main` reads them back);
    ``modules``: the config's ``method_modules`` (where a method outside modsent lives). No
    option is a prefix of torchrun's own (see ``distributed.launch_command``). The inputs keep
    their order (a method may pair one input's entries with another's, as MEXMA's provided
    translations follow the translations' languages): JSON objects keep it, sorting would not."""
    args = ["--method", name, "--inputs", json.dumps(_plain(inputs)), "--out", str(out_dir),
            "--settings", json.dumps(_plain(training_settings(settings)), sort_keys=True)]
    for module in modules:
        args += ["--method-module", module]
    if log_path is not None:
        args += ["--log-file", str(log_path)]
    if threads is not None:
        args += ["--threads", str(threads)]
    if not progress:
        args.append("--no-progress")
    return args


def train(name: str, inputs: Mapping, out_dir, settings: Mapping, *, modules: Sequence[str] = (),
          log_path=None, threads: int = 1) -> int:
    """Train method ``name`` from a workflow job that has ``threads`` CPU threads and whose log
    is ``log_path``: in this process, or under torchrun with ``settings["gpus"]`` processes when
    the method is data-parallel and the job sees that many GPUs
    (:func:`modsent.distributed.launched_processes`). Returns the exit status."""
    import torch

    from modsent import distributed

    method = methods.get(name)
    gpus = int(settings.get(GPUS, 1))
    processes = distributed.launched_processes(gpus, f"methods.{name}.gpus") if method.data_parallel else 1
    if processes > 1:
        per_process = max(1, threads // processes)
        log.info("%s: %d GPUs, %d threads each", name, processes, per_process)
        command = distributed.launch_command("modsent.methods.launch", cli_arguments(
            name, inputs, out_dir, settings, modules=modules, log_path=log_path, threads=per_process), processes)
        return distributed.run_launched(command, log_path, per_process)
    torch.set_num_threads(threads)
    method.train(dict(inputs), out_dir, training_settings(settings))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Train one registered method in this process (under torchrun: in each process of the
    group; the method's ``train`` is data-parallel)."""
    from modsent import distributed

    parser = argparse.ArgumentParser(prog="python -m modsent.methods.launch",
                                     description="Train one registered training method (modsent.methods).")
    parser.add_argument("--method", required=True, help="the method's registered name")
    parser.add_argument("--inputs", required=True, help="its inputs as JSON ({key: path, [paths] or {lang: path}})")
    parser.add_argument("--out", required=True, help="the output directory")
    parser.add_argument("--settings", required=True, help="its settings as JSON (methods.{name})")
    parser.add_argument("--method-module", action="append", default=[],
                        help="a module to import that registers methods (the config's method_modules)")
    distributed.add_process_arguments(parser)
    args = parser.parse_args(argv)

    methods.load(args.method_module)
    method = methods.get(args.method)
    with distributed.trainer_process(args) as device:
        method.train(json.loads(args.inputs), args.out, json.loads(args.settings), device=str(device),
                     progress=not args.no_progress)
    return 0


if __name__ == "__main__":
    # run the imported module's main, so that log records carry the module's real name
    from modsent.methods.launch import main as _main

    sys.exit(_main())

"""Data-parallel training on several GPUs of one node: the few helpers the trainers need.

A training that should use N GPUs is started as N processes by torchrun (``python -m
torch.distributed.run --standalone --nproc_per_node=N ...``, see :func:`launch_command`), one
process per GPU. torchrun tells each process who it is through the environment (RANK,
WORLD_SIZE, LOCAL_RANK, and where to meet the others); :func:`setup` reads it and joins the
process group: NCCL between GPUs, gloo between CPU processes (the tests).

Every helper also works in a plain single process, where it does nothing: a trainer calls them
unconditionally and stays one code path. The main process (rank 0) is the one that writes
files, logs and shows progress.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from modsent.training.precision import default_device

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
# a folder where each trainer process of a launch (run_launched) marks that its work finished,
# before it leaves the process group: a crash of that teardown outside Python (NCCL aborting
# the process) then fails no job whose outputs are complete
FINISHED_ENV = "MODSENT_FINISHED_DIR"
FINISHED_MARK = "finished"

# How long a process waits for the others at a collective. The main process evaluates and
# writes outputs while the others wait at a barrier: minutes, not the 10-minute default's worth.
TIMEOUT = datetime.timedelta(minutes=60)


def is_launched() -> bool:
    """True in a process that torchrun started (its environment names rank and world size)."""
    return all(name in os.environ for name in LAUNCH_VARIABLES)


def is_initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    return torch.distributed.get_rank() if is_initialized() else 0


def world_size() -> int:
    return torch.distributed.get_world_size() if is_initialized() else 1


def is_main() -> bool:
    """The process that writes outputs, checkpoints and logs: rank 0, or the only one."""
    return rank() == 0


def setup(device_kind: str | None = None) -> tuple[int, int, torch.device]:
    """Join the process group when launched by torchrun; return (rank, world size, device).

    ``device_kind``: "cuda", "cpu", or None for CUDA when available. Under torchrun on CUDA each
    process takes the GPU of its LOCAL_RANK and the group talks over NCCL; on the CPU over gloo.
    Not launched: (0, 1, the device) and no process group."""
    kind = default_device(device_kind)
    if not is_launched():
        return 0, 1, torch.device(kind)
    local_rank = int(os.environ["LOCAL_RANK"])
    if kind == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"process {local_rank} of this node has no GPU: "
                               f"{torch.cuda.device_count()} visible "
                               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl", timeout=TIMEOUT, device_id=device)
    else:
        device = torch.device(kind)
        torch.distributed.init_process_group("gloo", timeout=TIMEOUT)
    return torch.distributed.get_rank(), torch.distributed.get_world_size(), device


def cleanup() -> None:
    """Leave the process group (if one was joined)."""
    if is_initialized():
        torch.distributed.destroy_process_group()


def barrier() -> None:
    """Wait until every process arrives here (nothing to wait for in a single process)."""
    if not is_initialized():
        return
    if torch.distributed.get_backend() == "nccl":
        torch.distributed.barrier(device_ids=[torch.cuda.current_device()])
    else:
        torch.distributed.barrier()


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """The mean of ``tensor`` over the processes, in place (gloo has no AVG: sum, then divide)."""
    if is_initialized():
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
        tensor.div_(torch.distributed.get_world_size())
    return tensor


def average_gradients(params: Iterable[torch.Tensor]) -> None:
    """Replace each parameter's gradient by its mean over the processes, as DDP does after
    backward. A parameter that got no gradient in this process counts as zero (every process
    must take part in every all-reduce, in the same order). So a trainable parameter that no
    process's loss reaches ends with a zero gradient, not None: AdamW then decays it and moves
    its moments, where one process would leave it alone (finding out would cost every step a
    wait for the GPU). A data-parallel trainer freezes what its loss does not reach, as DuEAM
    freezes its pooler (tests/test_distributed.py checks the pooler stays unchanged)."""
    if not is_initialized():
        return
    world = torch.distributed.get_world_size()
    grads = []
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        grads.append(param.grad)
    pending = [torch.distributed.all_reduce(g, op=torch.distributed.ReduceOp.SUM, async_op=True)
               for g in grads]
    for work, grad in zip(pending, grads):
        work.wait()
        grad.div_(world)


def broadcast_from_main(tensors: Iterable[torch.Tensor]) -> None:
    """Overwrite ``tensors`` in every process with the main process's values."""
    if not is_initialized():
        return
    with torch.no_grad():
        for tensor in tensors:
            torch.distributed.broadcast(tensor, src=0)


class _GatherRows(torch.autograd.Function):
    """all_gather of row blocks of different lengths; backward keeps this process's rows."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, sizes: list[int], width: int) -> torch.Tensor:
        rank = torch.distributed.get_rank()
        ctx.rows = slice(sum(sizes[:rank]), sum(sizes[:rank + 1]))
        padded = tensor.new_zeros(max(sizes), width)  # all_gather needs one shape everywhere
        padded[:len(tensor)] = tensor
        parts = [torch.empty_like(padded) for _ in sizes]
        torch.distributed.all_gather(parts, padded)
        return torch.cat([part[:size] for part, size in zip(parts, sizes)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad[ctx.rows], None, None


def all_gather_rows(tensor: torch.Tensor, sizes: Sequence[int] | None = None) -> torch.Tensor:
    """The processes' 2-D ``tensor``s stacked along the first dimension in rank order; they may
    differ in their number of rows (an empty one may have any width; dtype and device must
    agree). In a single process: ``tensor`` itself.

    Gradient: back into this process's own rows only, with no communication in backward. When
    every process computes the same loss of the gathered tensor, the gradient of its weights
    is then this process's share of the whole gradient: the shares *sum* to the gradient, so
    a trainer that averages gradients over the processes (:func:`average_gradients`)
    back-propagates ``world_size`` × the loss.

    ``sizes``: every process's number of rows, where the caller knows them (shares of a batch:
    :func:`local_slice`); the tensors then share this one's width and the shapes are not
    exchanged first (reading them would make the host wait for the GPU)."""
    if not is_initialized():
        return tensor
    if sizes is not None:
        if len(sizes) != torch.distributed.get_world_size() or sizes[torch.distributed.get_rank()] != len(tensor):
            raise ValueError(f"sizes {list(sizes)} do not match {torch.distributed.get_world_size()} processes "
                             f"with {len(tensor)} rows in this one")
        return _GatherRows.apply(tensor, list(sizes), tensor.shape[1])
    shape = torch.tensor(tensor.shape, dtype=torch.long, device=tensor.device)
    shapes = [torch.empty_like(shape) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(shapes, shape)
    sizes = [int(s[0]) for s in shapes]
    width = max(int(s[1]) for s in shapes)
    if len(tensor) == 0:
        tensor = tensor.new_zeros(0, width)
    return _GatherRows.apply(tensor, sizes, width)


def local_slice(size: int, rank: int, world: int) -> slice:
    """This process's contiguous share of a global batch of ``size`` rows: shares differ by
    at most one row, and together cover the batch in order."""
    return slice(rank * size // world, (rank + 1) * size // world)


def share_sizes(size: int, world: int) -> list[int] | None:
    """Every process's number of rows of a batch of ``size`` rows (:func:`local_slice`), for
    :func:`all_gather_rows`; None where a share is empty (its width is unknown there, so the
    shapes are exchanged)."""
    sizes = [len(range(size)[local_slice(size, rank, world)]) for rank in range(world)]
    return sizes if all(sizes) else None


def launch_command(module_or_script: str | Path, args: Sequence[str], nproc: int) -> list[str]:
    """The command that runs ``module_or_script`` with ``args`` as ``nproc`` processes on this
    node: torchrun (``python -m torch.distributed.run``, from this interpreter's environment)
    with a rendezvous of its own (--standalone: a free local port, so several such jobs can
    share a node). A path ending in .py is run as a script, anything else as a module (-m).

    torchrun's own parser reads abbreviated options even among the script's arguments: a
    script option that begins two of torchrun's (``--log`` of --log-dir and --logs-specs) is
    refused, so the scripts' options must not be such prefixes."""
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    target = str(module_or_script)
    program = [target] if target.endswith(".py") else ["-m", target]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", *program, *map(str, args)]


def launched_processes(gpus: int, setting: str) -> int:
    """How many training processes a workflow job that requested ``gpus`` GPUs (the config's
    ``setting``) starts under torchrun: ``gpus`` when it is more than one and this job sees that
    many GPUs; as many as it sees when it sees fewer (Snakemake lowers a job's ``gpu`` resource
    to ``--resources gpu=N``, a host may have fewer), with a warning; 1 (train in the job's own
    process) with one GPU, without CUDA (a warning when more were configured) or when already
    launched. ``gpus`` is a runtime setting: the batch stays the global one whatever the count."""
    if gpus <= 1 or is_launched():
        return 1
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible == 0:
        logging.getLogger(__name__).warning(
            "%s is %d but this job sees no GPU: one process on the CPU", setting, gpus)
        return 1
    if visible < gpus:
        logging.getLogger(__name__).warning(
            "%s is %d but this job sees %d GPU(s) (CUDA_VISIBLE_DEVICES=%s; Snakemake gives a job at most "
            "--resources gpu=N): %d process(es), the same global batch", setting, gpus, visible,
            os.environ.get("CUDA_VISIBLE_DEVICES", "unset"), visible)
        return visible
    return gpus


def run_launched(command: Sequence[str], log_path: str | Path, threads: int) -> int:
    """Run ``command`` (a :func:`launch_command`) from a workflow script whose log is
    ``log_path``; return its exit status. The trainers' main process appends to that log (their
    ``--log-file``): this process's file handlers are closed first, so that neither writes over
    the other's lines, and reopened to record a failure. ``threads``: OMP threads per process.
    A failed torchrun whose processes had all finished their work (:func:`trainer_process`'s
    mark: one crashed while leaving the group) counts as a success, with a warning in the log."""
    log = logging.getLogger(__name__)
    log.info("%s", shlex.join(command))
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(handler)
        handler.close()
    with tempfile.TemporaryDirectory(prefix="modsent-finished-") as finished:
        result = subprocess.run(list(command), env={**os.environ, "OMP_NUM_THREADS": str(threads),
                                                    FINISHED_ENV: finished})
        done = (Path(finished) / FINISHED_MARK).is_file()
    if result.returncode:
        from modsent.logs import FORMAT, attempts_log

        for path in (log_path, attempts_log(log_path)):
            handler = logging.FileHandler(path, mode="a", encoding="utf-8")
            handler.setFormatter(logging.Formatter(FORMAT))
            root.addHandler(handler)
        if done:
            # every process finished its work (the outputs are written) and one crashed as it
            # left the group, outside Python (NCCL's teardown aborting): failing the job would
            # have Snakemake delete complete outputs and retrain from the start
            log.warning("torchrun exited with status %d after every process had finished its work (a crash "
                        "while leaving the process group); the outputs are complete", result.returncode)
            return 0
        log.error("torchrun exited with status %d", result.returncode)
    return result.returncode


def _mark_finished(rank: int, world: int) -> None:
    """Mark, for run_launched, that the work of every process of the group finished (the
    outputs are written): once all of them are past a barrier, the main process writes the
    mark. Nothing outside a launch (FINISHED_ENV unset), nor when the barrier fails. (A process
    that ended its work with SystemExit skips the barrier: the others wait for it there, as
    they would in any collective of the work.)"""
    folder = os.environ.get(FINISHED_ENV)
    if not folder or not os.path.isdir(folder):
        return
    try:
        if world > 1:
            barrier()  # nothing when the work left the group itself
        if rank == 0:
            (Path(folder) / FINISHED_MARK).write_text("finished\n", encoding="utf-8")
    except Exception as error:  # noqa: BLE001 - no mark: a crash while leaving then fails the job
        logging.getLogger(__name__).warning("the processes could not mark their work finished (%s: %s)",
                                            type(error).__name__, error)


# ---- a trainer's command line under torchrun ------------------------------------------------------


def add_process_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every trainer's ``main`` takes for how its process runs (see
    :func:`trainer_process`): --log-file, --threads, --device, --no-progress."""
    parser.add_argument("--log-file", help="append the main process's log records to this file")
    parser.add_argument("--threads", type=int, help="CPU threads per process")
    parser.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda when available")
    parser.add_argument("--no-progress", action="store_true")


def process_logging(log_path: str | None, rank: int) -> None:
    """The main process logs to stderr and appends to ``log_path`` (the workflow script that
    started torchrun wrote the log's first lines); the others report warnings and errors on
    stderr and append their errors to ``log_path`` too. In every process, as in a workflow
    script (:func:`modsent.logs.log_warnings_and_failures`), an exception that ends it is
    written to the log with its traceback (bad input that only several processes meet, such as
    a batch too small to split, included) and the libraries' known warnings are left out."""
    from modsent.logs import FORMAT, ConsoleFormatter, attempts_log, log_warnings_and_failures

    form = FORMAT if rank == 0 else f"[rank {rank}] {FORMAT}"
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(ConsoleFormatter(form))  # bad input: its message, the traceback in the log
    handlers: list[logging.Handler] = [console]
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        for path in (log_path, attempts_log(log_path)):  # the attempt's log and the history
            handler = logging.FileHandler(path, mode="a", encoding="utf-8")
            if rank != 0:  # (each record is one appending write: the processes' lines do not mix)
                handler.setLevel(logging.ERROR)
            handlers.append(handler)
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format=form, handlers=handlers,
                        force=True)
    log_warnings_and_failures()


@contextlib.contextmanager
def trainer_process(args: argparse.Namespace):
    """One trainer process started from the command line (the options of
    :func:`add_process_arguments`): its threads, the process group when torchrun started it,
    its logging; yields its device and leaves the group at the end. A failure is written to the
    log first (:func:`modsent.logs.log_failure`), and the group is then left without the
    collective goodbye: when one process fails alone, the others wait inside a collective, and
    destroying the group could hang until the timeout before anything reached the log; torchrun
    stops the others once this process exits. A failure to leave the group after the work
    finished (the backend's teardown) is a warning, not the job's failure: the outputs are
    complete, and a failed job would have Snakemake delete them and retrain from the start,
    the checkpoint removed. So that a teardown that crashes outside Python (NCCL aborting the
    process) fails no job either, the processes meet at a barrier when their work is done and
    the main process then marks it (:data:`FINISHED_ENV`; :func:`run_launched` reads the mark)
    before any of them leaves the group."""
    from modsent.logs import log_failure

    if args.threads:
        torch.set_num_threads(args.threads)
    rank, world, device = setup(args.device)
    try:
        process_logging(args.log_file, rank)  # the main process's records reach the rule's log
        if world > 1:
            logging.getLogger(__name__).info("process group: %d processes (%s), this one on %s",
                                             world, torch.distributed.get_backend(), device)
        yield device
    except BaseException as error:
        if not isinstance(error, (KeyboardInterrupt, SystemExit)):
            log_failure(error)
        raise
    _mark_finished(rank, world)  # reached only when the work finished: its outputs are complete
    try:
        cleanup()
    except Exception as error:  # noqa: BLE001 - the job's result is written; failing now would delete it
        logging.getLogger(__name__).warning(
            "leaving the process group failed after the work finished (%s: %s); the outputs are complete",
            type(error).__name__, error)

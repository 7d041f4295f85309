"""GPU placement for jobs run without SLURM: each local GPU job on GPUs of its own.

``snakemake --cores 32 --resources gpu=4`` on a machine with four GPUs runs up to four GPU jobs
at once, but Snakemake only counts: every job would see every GPU and put its work on the first
one. So each workflow script, when it starts (:func:`modsent.logs.start_job`), claims as many of
the GPUs it can see as its rule's ``gpu`` resource asks for, and narrows ``CUDA_VISIBLE_DEVICES``
to them before anything initialises CUDA. A torchrun job (``language_adapter.gpus: N``) claims N
and its workers inherit them.

A claim is an exclusive ``flock`` on one file per GPU in a host-local directory
(``$MODSENT_GPU_LOCKS``, else ``<tmp>/modsent-gpus-<uid>``: one user's runs; set the variable to
a shared directory for several users), held by the job's process until it exits: the kernel
releases it when the last process holding the file ends, however it ends (a crash, ``kill -9``;
a forked data-loader worker holds it until it ends too), so no claim outlives its job's
processes, and runs started from different working directories share the same claims.

Nothing is claimed when the job sees no more GPUs than it asks for: a SLURM job (its
``CUDA_VISIBLE_DEVICES`` holds exactly the GPUs it was given), a one-GPU workstation, or a
CPU-only machine. The GPUs a job can see are ``CUDA_VISIBLE_DEVICES`` when it is set (the
indices or UUIDs it lists), else every GPU ``nvidia-smi -L`` lists, by its index; a job claims
those with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` set, so that CUDA numbers them as nvidia-smi does.
When fewer are free than the job needs (``--resources gpu=`` larger than the GPUs of the host,
or another run on the same host), the job waits for them and says so in its log, rather than
share a GPU.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

# the open lock files of this process's claims: released when the process exits
_HELD: list = []


def lock_directory() -> Path:
    """Where the per-GPU lock files of this host live (see the module docstring)."""
    configured = os.environ.get("MODSENT_GPU_LOCKS")
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"modsent-gpus-{os.getuid()}"


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them: that variable's
    entries when it is set (an empty value: none), else the indices of ``nvidia-smi -L``
    (none when there is no nvidia-smi, or it fails)."""
    declared = os.environ.get("CUDA_VISIBLE_DEVICES")
    if declared is not None:
        return [entry.strip() for entry in declared.split(",") if entry.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(index) for index, line in enumerate(line for line in listing.splitlines() if line.startswith("GPU "))]


def _try_lock(path: Path):
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def claim(count: int, *, poll_seconds: float = 10.0, timeout: float | None = None) -> list[str] | None:
    """Claim ``count`` of the visible GPUs for this process and set ``CUDA_VISIBLE_DEVICES`` to
    them; the claim lasts until the process exits. Returns the GPUs claimed, or None when there
    was nothing to choose (``count`` 0, or no more GPUs visible than ``count``).

    Waits while fewer than ``count`` are free (logging once, then every 10 minutes); with
    ``timeout`` (seconds) raises TimeoutError instead of waiting longer."""
    if count <= 0:
        return None
    listed = os.environ.get("CUDA_VISIBLE_DEVICES") is None  # the indices are nvidia-smi's
    gpus = visible_gpus()
    if len(gpus) <= count:
        return None
    directory = lock_directory()
    directory.mkdir(parents=True, exist_ok=True)
    start = last_report = time.monotonic()
    waited = False
    while True:
        taken = []
        for gpu in gpus:
            handle = _try_lock(directory / f"gpu-{gpu.replace('/', '_')}.lock")
            if handle is not None:
                taken.append((gpu, handle))
                if len(taken) == count:
                    break
        if len(taken) == count:
            chosen = [gpu for gpu, _ in taken]
            for gpu, handle in taken:
                handle.seek(0)
                handle.truncate()
                handle.write(f"pid {os.getpid()}\n")
                handle.flush()
                _HELD.append(handle)
            if listed:  # nvidia-smi numbers by PCI bus, CUDA by default fastest first: same GPUs only in its order
                os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)
            log.info("placed on GPU %s of the %d visible (%s)%s", ",".join(chosen), len(gpus),
                     ",".join(gpus), f", after waiting {time.monotonic() - start:.0f} s" if waited else "")
            return chosen
        for _, handle in taken:  # not enough free: give back the partial claim, then wait
            handle.close()
        now = time.monotonic()
        if timeout is not None and now - start >= timeout:
            raise TimeoutError(f"{count} of the GPUs {','.join(gpus)} did not become free within "
                               f"{timeout:.0f} s (locks in {directory})")
        if not waited or now - last_report >= 600:
            log.warning("waiting for %d free GPU(s) of %s: the others are claimed by other jobs on "
                        "this host (locks in %s); is --resources gpu= larger than the host's GPUs?",
                        count, ",".join(gpus), directory)
            waited, last_report = True, now
        time.sleep(poll_seconds)


def release() -> None:
    """Give back this process's claims (they end with the process anyway)."""
    while _HELD:
        _HELD.pop().close()

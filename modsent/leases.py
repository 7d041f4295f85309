"""Leases: which job is producing an output, so that a restart never starts a second one.

When Snakemake dies (killed, or the login session lost), the SLURM jobs it submitted keep
running. A restart with ``--rerun-incomplete`` would remove their outputs and submit the same
jobs again, and both attempts would then write the same checkpoint. To prevent that, every
workflow script takes a lease on each of its outputs when it starts (:func:`modsent.logs.start_job`):
``.modsent/leases/<digest>.json`` in the working directory records the output, the rule, the
SLURM job id, the host, the process id and its start time. The script removes its leases when it
exits, whether it succeeded or failed. A job killed outright leaves its lease behind, but then
its holder is no longer running, and a stale lease is ignored and cleared.

Two checks read the leases:

- the Snakefile's ``onstart`` hook (:func:`check_no_running_holders`), in the Snakemake process,
  before any output is removed or any job is submitted: it refuses to start while an earlier
  run's job still runs, and names the jobs and the ``scancel`` command;
- :func:`take`, in each job, for a second run started with ``--nolock``: a job whose output is
  still leased by a running job fails at once instead of writing over it.

A holder counts as running when the scheduler says so (``squeue -j ID``: pending, running,
suspended, completing, ...), or, for a job run without SLURM or inside the checker's own SLURM
allocation, when its process still exists on this host with the recorded start time (so a
reused process id does not count).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from modsent.io import atomic_open

log = logging.getLogger(__name__)

LEASE_DIR = Path(".modsent") / "leases"
# squeue's states of a job that may still write (every other state is final, or the job is
# gone from squeue altogether)
LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
               "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
               "RESV_DEL_HOLD"}


class LeaseError(RuntimeError):
    """An output is still being produced by another job."""


def lease_path(output: str | os.PathLike, root: str | os.PathLike = ".") -> Path:
    """The lease file of ``output`` (a path relative to the working directory ``root``)."""
    key = os.path.normpath(str(output))
    return Path(root) / LEASE_DIR / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (/proc/PID/stat field 22),
    or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _process_running(record: dict) -> bool | None:
    """Whether the process of ``record`` still runs on this host (None: cannot tell here)."""
    if record.get("host") != socket.gethostname() or not Path("/proc/self/stat").exists():
        return None
    pid = record.get("pid")
    if not isinstance(pid, int):
        return False
    started = _process_start(pid)
    return started is not None and started == record.get("pid_start")


def current_holder(rule: str | None = None) -> dict:
    """This process as a lease holder."""
    pid = os.getpid()
    return {"rule": rule, "slurm_job": os.environ.get("SLURM_JOB_ID"), "host": socket.gethostname(),
            "pid": pid, "pid_start": _process_start(pid), "started": time.strftime("%Y-%m-%d %H:%M:%S")}


def _same_holder(record: dict, holder: dict) -> bool:
    """The same process (a requeued SLURM job is a new process: its old lease is stale)."""
    return (record.get("host"), record.get("pid"), record.get("pid_start")) == \
        (holder.get("host"), holder.get("pid"), holder.get("pid_start"))


def slurm_job_state(job_id: str) -> str | None:
    """squeue's state of SLURM job ``job_id``: e.g. "RUNNING"; "" when squeue no longer knows
    the job (it ended); None when squeue cannot be asked."""
    squeue = shutil.which("squeue")
    if squeue is None:
        return None
    try:
        proc = subprocess.run([squeue, "-h", "-j", str(job_id), "-o", "%A %T"], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        # "Invalid job id specified": the job left squeue's memory (MinJobAge); other errors
        # (slurmctld unreachable) mean we cannot tell
        return "" if "Invalid job id" in proc.stderr else None
    # an array's first task has the array's id, and `-j` lists every task: keep this one's line
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == str(job_id):
            return fields[1]
    return ""


def holder_running(record: dict) -> bool | None:
    """Whether the holder of lease ``record`` still runs: True, False, or None when this
    machine cannot tell (no squeue for a SLURM holder; another host for a local one)."""
    own_allocation = record.get("slurm_job") and record.get("slurm_job") == os.environ.get("SLURM_JOB_ID")
    if record.get("slurm_job") and not own_allocation:
        state = slurm_job_state(record["slurm_job"])
        if state is None:
            return None
        return state.split("+")[0] in LIVE_STATES
    # a local job, or one run inside the checker's own allocation (`snakemake --cores` under
    # salloc/sbatch: every job shares its id, which squeue reports as running): its process
    return _process_running(record)


def describe(record: dict) -> str:
    where = (f"SLURM job {record['slurm_job']}" if record.get("slurm_job")
             else f"process {record.get('pid')} on {record.get('host')}")
    return f"{record.get('output')} (rule {record.get('rule')}: {where}, started {record.get('started')})"


def _read_record(path: Path) -> dict | None:
    """The lease in ``path``, or None when it is gone or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_leases(root: str | os.PathLike = ".") -> list[tuple[Path, dict]]:
    """Every lease under ``root`` as (file, record); unreadable files are skipped."""
    folder = Path(root) / LEASE_DIR
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = _read_record(path)
        if record is None:
            log.warning("unreadable lease %s: ignored", path)
        else:
            found.append((path, record))
    return found


_held: list[Path] = []


def _release() -> None:
    for path in _held:
        record = _read_record(path)
        if record is not None and _same_holder(record, current_holder()):
            path.unlink(missing_ok=True)
    _held.clear()


def take(outputs, rule: str | None = None, root: str | os.PathLike = ".") -> list[Path]:
    """Lease ``outputs`` to this process until it exits. Raises :class:`LeaseError` when one of
    them is leased by another job that still runs."""
    holder = current_holder(rule)
    outputs, paths = list(outputs), []
    for output in outputs:  # every output checked before any lease is written
        path = lease_path(output, root)
        if path.is_file():
            record = _read_record(path)
            if record and not _same_holder(record, holder) and holder_running(record):
                raise LeaseError(
                    f"{output} is still being produced by {describe(record)}; this job stops so as "
                    "not to write over it. Wait for that job to end, or cancel it"
                    + (f" (scancel {record['slurm_job']})" if record.get("slurm_job") else "")
                    + ", then run the workflow again")
        paths.append(path)
    for output, path in zip(outputs, paths):
        with atomic_open(path) as handle:
            json.dump({"output": os.path.normpath(str(output)), **holder}, handle)
    paths = [path.resolve() for path in paths]  # released at exit, whatever the directory then
    if not _held:
        atexit.register(_release)
    _held.extend(paths)
    return paths


def check_no_running_holders(root: str | os.PathLike = ".", outputs=None) -> list[dict]:
    """Before a run: raise :class:`LeaseError` naming every output (of ``outputs``, the run's,
    when given) whose lease holder still runs (an earlier run's orphaned job); remove the stale
    leases. Returns the records whose holder this machine cannot check (they are kept, and
    logged as a warning)."""
    wanted = None if outputs is None else {os.path.normpath(str(output)) for output in outputs}
    running, unknown = [], []
    for path, record in read_leases(root):
        if wanted is not None and record.get("output") not in wanted:
            continue
        state = holder_running(record)
        if state:
            running.append(record)
        elif state is None:
            unknown.append(record)
        else:
            path.unlink(missing_ok=True)
    if running:
        jobs = sorted({r["slurm_job"] for r in running if r.get("slurm_job")})
        pids = sorted({str(r["pid"]) for r in running if not r.get("slurm_job")})
        cancel = ([f"scancel {' '.join(jobs)}"] if jobs else []) + ([f"kill {' '.join(pids)}"] if pids else [])
        lines = "\n".join(f"  {describe(r)}" for r in running)
        raise LeaseError(
            "jobs of an earlier run of this workflow are still producing outputs:\n" + lines +
            "\nStarting now would remove those outputs and start the same jobs a second time. "
            f"Wait for them to end{' (squeue --me)' if jobs else ''}, or cancel them "
            f"({'; '.join(cancel)}), then start the run again; their outputs are redone either "
            "way (the run that started them cannot record them as complete).")
    for record in unknown:
        log.warning("cannot tell from this machine whether %s still runs", describe(record))
    return unknown

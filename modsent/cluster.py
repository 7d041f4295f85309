"""What the SLURM cluster's nodes offer, so that no job asks for more than any node has.

sbatch rejects a job whose memory, CPUs or GPUs exceed every node of its partition, and the
profile's retries would submit it again with even more memory (rules/resources.smk grows memory
with the attempt). Instead, rules/resources.smk asks sinfo once for the nodes and

- stops the run, before any job is submitted, when a job's first attempt needs more than any
  node offers, with an error that names the rule's resource kind and the config key to change
  (``resources: {KIND: {mem_mb: ...}}``);
- caps a retry's grown memory at the largest node that can run the job.

The nodes considered are every node of the cluster (a job's partition comes from the profile,
which the resource functions do not see): a request no node can meet is certainly rejected.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass


class ClusterFitError(ValueError):
    """A job asks for more than any node of the cluster has."""


@dataclass(frozen=True)
class Node:
    name: str
    mem_mb: int
    cpus: int
    gpus: int


def gpu_count(gres: str) -> int:
    """GPUs in a sinfo %G field: "gpu:2", "gpu:a100:4(S:0-1)", "gpu:a100:2,mps:100", "(null)"."""
    total = 0
    for item in re.sub(r"\(.*?\)", "", gres).split(","):  # "(S:0,2)" holds commas too
        parts = item.strip().split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def parse_sinfo(text: str) -> list[Node]:
    """Nodes from ``sinfo -h -N -o "%N|%m|%c|%G"`` (one line per node and partition)."""
    nodes = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4:
            continue
        name, mem, cpus, gres = fields
        try:
            nodes[name] = Node(name, int(mem.rstrip("+")), int(cpus.rstrip("+")), gpu_count(gres))
        except ValueError:
            continue
    return list(nodes.values())


def query_nodes() -> list[Node] | None:
    """The cluster's nodes (sinfo), or None when sinfo is missing or fails."""
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return None
    try:
        proc = subprocess.run([sinfo, "-h", "-N", "-o", "%N|%m|%c|%G"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    nodes = parse_sinfo(proc.stdout) if proc.returncode == 0 else []
    return nodes or None


def fit_memory(kind: str, nodes: list[Node], *, mem_mb: int, attempt: int, cpus: int, gpus: int) -> int:
    """The memory (MB) to request for a job of resource kind ``kind`` on its ``attempt``:
    ``mem_mb`` × attempt (``mem_mb`` is per GPU for GPU jobs: × ``gpus``), capped at the
    largest node with ``cpus`` CPUs and ``gpus`` GPUs. Raises :class:`ClusterFitError` naming
    the config key when no node has the CPUs or GPUs, or the first attempt's memory exceeds
    every node that has them."""
    per = max(gpus, 1)
    first, wanted = mem_mb * per, mem_mb * per * attempt
    key = f"your config's resources: {{{kind}: {{...}}}} (defaults in rules/resources.smk)"
    if gpus and not any(node.gpus for node in nodes):
        raise ClusterFitError(
            f"jobs of kind {kind} need a GPU, but sinfo reports no node with gpu GRES on this "
            "cluster (run Snakemake where sinfo sees the GPU partitions, or check gres.conf)")
    if gpus and not any(node.gpus >= gpus for node in nodes):
        most = max(node.gpus for node in nodes)
        raise ClusterFitError(
            f"jobs of kind {kind} ask for {gpus} GPUs on one node, but no node of this cluster has "
            f"more than {most} (sinfo); lower the job's GPU count (language_adapter.gpus, "
            f"baselines.gpus or methods.METHOD.gpus) to at most {most}")
    fitting = [node for node in nodes if node.gpus >= gpus]
    if not any(node.cpus >= cpus for node in fitting):
        most = max(node.cpus for node in fitting)
        raise ClusterFitError(
            f"jobs of kind {kind} ask for {cpus} CPUs, but no node of this cluster "
            f"{f'with {gpus} GPUs ' if gpus else ''}has more than {most} (sinfo); set "
            f"resources.{kind}.cpus{' (per GPU)' if gpus else ''} to at most {most // per} in {key}")
    largest = max(node.mem_mb for node in fitting if node.cpus >= cpus)
    if first > largest:
        raise ClusterFitError(
            f"jobs of kind {kind} ask for {first} MB of memory, but no node of this cluster that has "
            f"their {cpus} CPUs{f' and {gpus} GPUs' if gpus else ''} has more than {largest} MB "
            f"(sinfo); set resources.{kind}.mem_mb{' (per GPU)' if gpus else ''} to at most "
            f"{largest // per} in {key}")
    return min(wanted, largest)

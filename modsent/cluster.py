"""What the SLURM cluster's nodes offer, so that no job asks for more than any node has.

sbatch rejects a job whose memory, CPUs or GPUs exceed every node of its partition, and the
profile's retries would submit it again with even more memory (rules/resources.smk grows memory
with the attempt). Instead, rules/resources.smk asks sinfo once for the nodes and

- stops the run, before any job is submitted, when a job's first attempt needs more than any
  node offers, with an error that names the rule's resource kind and the config key to change
  (``resources: {KIND: {mem_mb: ...}}``);
- caps a retry's grown memory at the largest node that can run the job;
- caps a job's runtime (the first attempt's, and a retry's grown one) at the longest time limit
  of a partition with a node that can run it: longer, the job would wait in the queue forever
  (or be rejected); shorter, a training job that times out resumes from its checkpoint.

The nodes considered are every node of the cluster (a job's partition comes from the profile,
which the resource functions do not see): a request no node can meet is certainly rejected.
"""

from __future__ import annotations

import dataclasses
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
    time_limit: int | None = None  # minutes: the longest of its partitions' limits; None: unlimited


def gpu_count(gres: str) -> int:
    """GPUs in a sinfo %G field: "gpu:2", "gpu:a100:4(S:0-1)", "gpu:a100:2,mps:100", "(null)"."""
    total = 0
    for item in re.sub(r"\(.*?\)", "", gres).split(","):  # "(S:0,2)" holds commas too
        parts = item.strip().split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def parse_time_limit(text: str) -> int | None:
    """Minutes in a sinfo %l field ("2-00:00:00", "12:00:00", "30:00", "90", "1-12"), None for
    "infinite" or "UNLIMITED"; a field it cannot read is unlimited too (nothing is capped)."""
    text = text.strip()
    days, _, clock = text.rpartition("-") if "-" in text else ("0", "", text)
    try:
        parts = [int(p) for p in clock.split(":")]
        days = int(days)
    except ValueError:
        return None
    if "-" in text or len(parts) == 3:  # days-hours[:minutes[:seconds]], hours:minutes:seconds
        hours, minutes = (parts + [0])[:2]
    else:  # minutes[:seconds]
        hours, minutes = 0, parts[0]
    return days * 24 * 60 + hours * 60 + minutes


def parse_sinfo(text: str) -> list[Node]:
    """Nodes from ``sinfo -h -N -o "%N|%m|%c|%G|%l"`` (one line per node and partition; the
    time limit optional): a node in several partitions gets the longest of their limits."""
    nodes = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) not in (4, 5):
            continue
        name, mem, cpus, gres = fields[:4]
        limit = parse_time_limit(fields[4]) if len(fields) == 5 else None
        try:
            node = Node(name, int(mem.rstrip("+")), int(cpus.rstrip("+")), gpu_count(gres), limit)
        except ValueError:
            continue
        if name in nodes:  # another partition of the same node
            earlier = nodes[name].time_limit
            node = dataclasses.replace(node, time_limit=None if earlier is None or limit is None
                                       else max(earlier, limit))
        nodes[name] = node
    return list(nodes.values())


def query_nodes() -> list[Node] | None:
    """The cluster's nodes (sinfo), or None when sinfo is missing or fails."""
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return None
    try:
        proc = subprocess.run([sinfo, "-h", "-N", "-o", "%N|%m|%c|%G|%l"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    nodes = parse_sinfo(proc.stdout) if proc.returncode == 0 else []
    return nodes or None


def can_run(node: Node, cpus: int, gpus: int) -> bool:
    """Whether ``node`` has a job's ``cpus`` CPUs and ``gpus`` GPUs."""
    return node.gpus >= gpus and node.cpus >= cpus


def fit_memory(kind: str, nodes: list[Node], *, mem_mb: int, attempt: int, cpus: int, gpus: int,
               setting: str | None = None) -> int:
    """The memory (MB) to request for a job of resource kind ``kind`` on its ``attempt``:
    ``mem_mb`` × attempt (``mem_mb`` is per GPU for GPU jobs: × ``gpus``), capped at the
    largest node with ``cpus`` CPUs and ``gpus`` GPUs. Raises :class:`ClusterFitError` naming
    the config key when no node has the CPUs or GPUs, or the first attempt's memory exceeds
    every node that has them: ``setting``'s ``cpus`` or ``mem_mb`` (default: the kind's,
    ``resources.{kind}``; a method's job: ``methods.{name}.resources``)."""
    per = max(gpus, 1)
    first, wanted = mem_mb * per, mem_mb * per * attempt
    setting = setting or f"resources.{kind}"
    key = "your config (defaults in rules/resources.smk)"
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
            f"{setting}.cpus{' (per GPU)' if gpus else ''} to at most {most // per} in {key}")
    largest = max(node.mem_mb for node in nodes if can_run(node, cpus, gpus))
    if first > largest:
        raise ClusterFitError(
            f"jobs of kind {kind} ask for {first} MB of memory, but no node of this cluster that has "
            f"their {cpus} CPUs{f' and {gpus} GPUs' if gpus else ''} has more than {largest} MB "
            f"(sinfo); set {setting}.mem_mb{' (per GPU)' if gpus else ''} to at most "
            f"{largest // per} in {key}")
    return min(wanted, largest)


def fit_runtime(nodes: list[Node], *, runtime: int, cpus: int, gpus: int) -> int:
    """The runtime (minutes) to request: ``runtime``, capped at the longest time limit of a
    partition that has a node with ``cpus`` CPUs and ``gpus`` GPUs (no such node: ``runtime``,
    :func:`fit_memory` names the problem)."""
    fitting = [node for node in nodes if can_run(node, cpus, gpus)]
    if not fitting or any(node.time_limit is None for node in fitting):
        return runtime
    return min(runtime, max(node.time_limit for node in fitting))

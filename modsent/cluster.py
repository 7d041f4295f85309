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
  (or be rejected); shorter, a training job that times out resumes from its checkpoint;
- stops the run when a job's ``constraint`` (node features: ``a100_80gb``, ``a100&ib``,
  ``h100|h200``) or ``gpu_model`` names what no node has: sbatch would reject the job when its
  turn comes, hours into the run. A node runs a job only with its features and GPU model;
- checks every job's final request, as sbatch will get it, once more (:func:`check_request`):
  what the profile sets in place of the rule's fitted memory, time or CPUs is sent unchanged.

The nodes considered are those of the job's partition (the profile's, or the config's; "" the
cluster's default), with its time limit, when sinfo reports partitions; a partition that sinfo
does not list stops the run too. A request no node can meet is rejected, or, for a runtime over
its partition's limit, left pending (unless a QOS allows more: a job with one is not checked
for it). A job sent to another cluster (slurm_cluster) is neither fitted nor checked.
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
    features: frozenset[str] = frozenset()  # sinfo %f
    gpu_models: tuple[tuple[str, int], ...] = ()  # (model, count) of its typed GPUs ("gpu:a100:4")
    # (partition, its time limit, whether it is the cluster's default) of each partition it is in
    # (sinfo %P, the default marked "*"); empty when sinfo was not asked for them
    partitions: tuple[tuple[str, int | None, bool], ...] = ()


def _gpu_items(gres: str) -> list[tuple[str | None, int | None]]:
    """(model, count) of each GPU item of a gres string, sinfo's %G field or a job's ``gres``:
    "gpu:a100:4(S:0-1),gpu:2,mps:100" → [("a100", 4), (None, 2)]; no count (a job's "gpu",
    "gpu:a100") → None; ``no_consume`` dropped ("gpu:a100:no_consume:4")."""
    found = []
    for item in re.sub(r"\(.*?\)", "", gres).split(","):  # "(S:0,2)" holds commas too
        parts = [part for part in item.strip().split(":") if part != "no_consume"]
        if parts[0] != "gpu":
            continue
        counted = len(parts) >= 2 and parts[-1].isdigit()
        found.append((":".join(parts[1:-1] if counted else parts[1:]) or None,
                      int(parts[-1]) if counted else None))
    return found


def gpu_count(gres: str) -> int:
    """GPUs in a sinfo %G field: "gpu:2", "gpu:a100:4(S:0-1)", "gpu:a100:2,mps:100", "(null)"."""
    return sum(count for _, count in _gpu_items(gres) if count is not None)


def gpu_models(gres: str) -> tuple[tuple[str, int], ...]:
    """(model, count) of the typed GPUs in a sinfo %G field: "gpu:a100:4(S:0-1),gpu:v100:2" →
    (("a100", 4), ("v100", 2)); untyped ("gpu:2") none."""
    return tuple((model, count) for model, count in _gpu_items(gres) if model and count is not None)


def requested_gpus(gres: str) -> tuple[int, str | None]:
    """(GPUs, model) a job's ``gres`` resource asks for: "gpu:a100:2" → (2, "a100"); "gpu" or
    "gpu:a100" one GPU (SLURM's default count); none → (0, None)."""
    items = _gpu_items(gres)
    return (sum(1 if count is None else count for _, count in items),
            next((model for model, _ in items if model), None))


def parse_features(text: str) -> frozenset[str]:
    """Node features from a sinfo %f field ("a100,ib", "(null)")."""
    return frozenset(f.strip() for f in text.split(",") if f.strip() and f.strip() != "(null)")


# the constraints this module evaluates: feature names joined by & (and) and | (or), with
# parentheses; other SLURM forms (counts "a*2", matching or "[a|b]", commas, spaces) are left to
# sbatch. & binds tighter here, where SLURM evaluates left to right ("a|b&c" is "(a|b)&c"):
# what this accepts is a superset of what SLURM accepts, so it never refuses a job SLURM runs
_TOKEN = re.compile(r"[A-Za-z0-9_.:+-]+|[&|()]")


def satisfies(features: frozenset[str], constraint: str) -> bool | None:
    """Whether a node with ``features`` meets ``constraint`` (sbatch --constraint); None when
    the constraint has a form this module does not evaluate."""
    text = constraint
    tokens = _TOKEN.findall(text)
    if not tokens or "".join(tokens) != text:
        return None
    position = 0

    def take(token=None):
        nonlocal position
        if position < len(tokens) and (token is None or tokens[position] == token):
            position += 1
            return tokens[position - 1]
        return None

    def either():  # term (| term)*
        value = both()
        while value is not None and take("|"):
            other = both()
            value = None if other is None else value or other
        return value

    def both():  # factor (& factor)*
        value = factor()
        while value is not None and take("&"):
            other = factor()
            value = None if other is None else value and other
        return value

    def factor():  # NAME | ( either )
        if take("("):
            value = either()
            return value if take(")") else None
        token = take()
        return None if token is None or token in "&|()" else token in features

    value = either()
    return value if position == len(tokens) else None


def partition_names(nodes: list[Node]) -> list[str]:
    """The partitions the nodes are in (sinfo %P), the default one marked "*"."""
    names = {name + ("*" if default else ""): None for node in nodes for name, _, default in node.partitions}
    return sorted(names)


def _in_partition(node: Node, partition: str) -> Node | None:
    """``node`` as a node of ``partition`` ("gpu"; "gpu,gpu-long": any of them; "": the cluster's
    default), with that partition's time limit (the longest of those named), or None when it is
    not in it."""
    wanted = [name.strip() for name in partition.split(",") if name.strip()]
    limits = [limit for name, limit, default in node.partitions if (name in wanted if wanted else default)]
    if not limits:
        return None
    return dataclasses.replace(node, time_limit=None if None in limits else max(limits))


def select(nodes: list[Node], *, constraint: str | None = None, gpu_model: str | None = None,
           partition: str | None = None) -> list[Node]:
    """The nodes that can run a job with ``constraint`` (their features meet it, or it has a form
    :func:`satisfies` does not evaluate), ``gpu_model`` (their GPUs counted as those of that
    model only; when no node reports typed GPUs, e.g. before the nodes registered, every node)
    and ``partition`` (the nodes of it, each with that partition's time limit; "" the default
    partition; None, or no node reporting its partitions: every node, with its longest limit)."""
    if gpu_model and not any(node.gpu_models for node in nodes):
        gpu_model = None
    if partition is not None and not any(node.partitions for node in nodes):
        partition = None
    if partition is not None and not partition.strip() and not any(
            default for node in nodes for _, _, default in node.partitions):
        partition = None  # no default partition: sbatch decides (SBATCH_PARTITION, a submit plugin)
    chosen = []
    for node in nodes:
        if partition is not None:
            node = _in_partition(node, partition)
            if node is None:
                continue
        if constraint and satisfies(node.features, constraint) is False:
            continue
        if gpu_model:
            node = dataclasses.replace(node, gpus=sum(n for model, n in node.gpu_models if model == gpu_model))
            if not node.gpus:
                continue
        chosen.append(node)
    return chosen


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
    """Nodes from ``sinfo -h -N -o "%N|%m|%c|%G|%l|%f|%P"`` (one line per node and partition;
    the time limit, the features and the partition optional): a node in several partitions gets
    the longest of their limits, and each partition with its own (``Node.partitions``)."""
    nodes = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) not in (4, 5, 6, 7):
            continue
        name, mem, cpus, gres = fields[:4]
        limit = parse_time_limit(fields[4]) if len(fields) >= 5 else None
        features = parse_features(fields[5]) if len(fields) >= 6 else frozenset()
        partition = fields[6].strip() if len(fields) == 7 else ""
        partitions = ((partition.rstrip("*"), limit, partition.endswith("*")),) if partition else ()
        try:
            node = Node(name, int(mem.rstrip("+")), int(cpus.rstrip("+")), gpu_count(gres), limit, features,
                        gpu_models(gres), partitions)
        except ValueError:
            continue
        if name in nodes:  # another partition of the same node
            earlier = nodes[name]
            node = dataclasses.replace(
                node, time_limit=None if earlier.time_limit is None or limit is None else max(earlier.time_limit, limit),
                partitions=earlier.partitions + partitions)
        nodes[name] = node
    return list(nodes.values())


def local_cluster_name() -> str | None:
    """The name of the cluster this machine's sinfo describes (``scontrol show config``'s
    ClusterName), or None when it cannot be asked."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        proc = subprocess.run([scontrol, "show", "config"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"^ClusterName\s*=\s*(\S+)", proc.stdout, flags=re.M)
    return match.group(1) if proc.returncode == 0 and match else None


def query_nodes() -> list[Node] | None:
    """The cluster's nodes (sinfo), or None when sinfo is missing or fails."""
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return None
    try:
        # --all: hidden partitions too (a job may go to one; one missing here stops the run)
        proc = subprocess.run([sinfo, "-h", "-N", "--all", "-o", "%N|%m|%c|%G|%l|%f|%P"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    nodes = parse_sinfo(proc.stdout) if proc.returncode == 0 else []
    return nodes or None


def can_run(node: Node, cpus: int, gpus: int) -> bool:
    """Whether ``node`` has a job's ``cpus`` CPUs and ``gpus`` GPUs."""
    return node.gpus >= gpus and node.cpus >= cpus


def fit_memory(kind: str, nodes: list[Node], *, mem_mb: int, attempt: int, cpus: int, gpus: int,
               setting: str | None = None, constraint: str | None = None, gpu_model: str | None = None,
               partition: str | None = None, constraint_setting: str | None = None,
               gpu_model_setting: str | None = None, partition_setting: str | None = None) -> int:
    """The memory (MB) to request for a job of resource kind ``kind`` on its ``attempt``:
    ``mem_mb`` × attempt (``mem_mb`` is per GPU for GPU jobs: × ``gpus``), capped at the
    largest node with ``cpus`` CPUs and ``gpus`` GPUs. Raises :class:`ClusterFitError` naming
    the config key when no node has the CPUs or GPUs, or the first attempt's memory exceeds
    every node that has them: ``setting``'s ``cpus`` or ``mem_mb`` (default: the kind's,
    ``resources.{kind}``; a method's job: ``methods.{name}.resources``). Only the nodes with
    the job's ``constraint``'s features and ``gpu_model``'s GPUs count; none: an error naming
    the key they come from (``constraint_setting``, ``gpu_model_setting``: default ``setting``'s;
    one of the profile's names the profile) and what the nodes have."""
    per = max(gpus, 1)
    first, wanted = mem_mb * per, mem_mb * per * attempt
    setting = setting or f"resources.{kind}"
    all_nodes = nodes
    key = "your config (defaults in rules/resources.smk)"

    def where(source):
        return "the profile (slurm/config.yaml)" if source.startswith("the profile") else key

    scope = "of this cluster"
    if partition is not None:
        in_partition = select(nodes, partition=partition)
        named = partition.strip()
        # where the partition comes from; none given (""): the default one, set nowhere
        source = partition_setting or (f"{setting}.slurm_partition" if named else None)
        listed = ', '.join(partition_names(nodes)) or 'none'
        if not in_partition:
            asked = f"{source} {partition!r}" + ("" if named else " (the default partition)") if source \
                else "the default partition"
            raise ClusterFitError(
                f"jobs of kind {kind} go to {asked}, but sinfo lists no node in {'it' if named else 'one'} "
                f"(sinfo %P: {listed}); " + (f"change it in {where(source)}" if source else
                                             "set slurm_partition in the profile"))
        if in_partition != nodes:
            scope = (f"in partition {partition!r}" if named else "in the default partition") + \
                (f" ({source})" if source else "")
        nodes = in_partition
    featured = select(nodes, constraint=constraint)
    if constraint and not featured:
        source = constraint_setting or f"{setting}.constraint"
        features = sorted(set().union(*(node.features for node in nodes)))
        raise ClusterFitError(
            f"jobs of kind {kind} ask for nodes with {source} {constraint!r}, but no node "
            f"{scope} has those features (sinfo %f: {', '.join(features) or 'none'}); change it in "
            f"{where(source)}")
    chosen = select(nodes, constraint=constraint, gpu_model=gpu_model)
    if gpu_model and not chosen:
        source = gpu_model_setting or f"{setting}.gpu_model"
        models = sorted({model for node in featured for model, _ in node.gpu_models})
        raise ClusterFitError(
            f"jobs of kind {kind} ask for {source} {gpu_model!r}, but no node {scope} "
            f"{'with its constraint ' if constraint else ''}has GPUs of that type (sinfo %G: "
            f"{', '.join(models) or 'no typed GPUs'}); change it in {where(source)}")
    nodes = chosen
    if gpus and not any(node.gpus for node in nodes):
        if scope != "of this cluster":
            raise ClusterFitError(
                f"jobs of kind {kind} need a GPU, but no node {scope} has one (sinfo); send them to a "
                f"partition with GPUs (sinfo %P: {', '.join(partition_names(all_nodes))}): the rule's "
                f"slurm_partition in the profile's set-resources (slurm/config.yaml)")
        raise ClusterFitError(
            f"jobs of kind {kind} need a GPU, but sinfo reports no node with gpu GRES on this "
            "cluster (run Snakemake where sinfo sees the GPU partitions, or check gres.conf)")
    if gpus and not any(node.gpus >= gpus for node in nodes):
        most = max(node.gpus for node in nodes)
        raise ClusterFitError(
            f"jobs of kind {kind} ask for {gpus} GPUs on one node, but no node {scope} has "
            f"more than {most} (sinfo); lower the job's GPU count (language_adapter.gpus, "
            f"baselines.gpus or methods.METHOD.gpus) to at most {most}")
    fitting = [node for node in nodes if node.gpus >= gpus]
    if not any(node.cpus >= cpus for node in fitting):
        most = max(node.cpus for node in fitting)
        raise ClusterFitError(
            f"jobs of kind {kind} ask for {cpus} CPUs, but no node {scope} "
            f"{f'with {gpus} GPUs ' if gpus else ''}has more than {most} (sinfo); set "
            f"{setting}.cpus{' (per GPU)' if gpus else ''} to at most {most // per} in {key}")
    largest = max(node.mem_mb for node in nodes if can_run(node, cpus, gpus))
    if first > largest:
        raise ClusterFitError(
            f"jobs of kind {kind} ask for {first} MB of memory, but no node {scope} that has "
            f"their {cpus} CPUs{f' and {gpus} GPUs' if gpus else ''} has more than {largest} MB "
            f"(sinfo); set {setting}.mem_mb{' (per GPU)' if gpus else ''} to at most "
            f"{largest // per} in {key}")
    return min(wanted, largest)


def check_request(nodes: list[Node], what: str, *, mem_mb: int | None, runtime: int | None, cpus: int,
                  gpus: int, constraint: str | None = None, gpu_model: str | None = None,
                  partition: str | None = None, source=lambda key: key) -> None:
    """Raise :class:`ClusterFitError` when no node can run a job whose request sbatch will get
    as given (``what``: "jobs of rule R", for the message): none in its ``partition`` ("" the
    default one, None every node) meets its ``constraint`` and has ``gpus`` GPUs (of
    ``gpu_model``) and ``cpus`` CPUs, none of those has ``mem_mb`` MB (per node), or none of
    their partitions allows ``runtime`` minutes (longer, SLURM keeps the job pending, or
    rejects it). ``source(key)`` names where a key's value comes from, for the message.

    The last check of a job's resources, with every value final: the rule's own are fitted to
    the nodes by :func:`fit_memory` and :func:`fit_runtime` before this runs, so what it finds
    comes from elsewhere (the profile's set-resources or default-resources, or a value
    Snakemake computed)."""
    chosen = select(nodes, partition=partition) if partition is not None else nodes
    if not chosen:
        raise ClusterFitError(
            f"{what} go to {f'partition {partition!r}' if partition else 'the default partition'} "
            f"({source('slurm_partition')}), but sinfo "
            f"lists no node in it (sinfo %P: {', '.join(partition_names(nodes)) or 'none'})")
    scope = f"in partition {partition!r}" if partition else (
        "in the default partition" if partition is not None and chosen != nodes else "of this cluster")
    featured = select(chosen, constraint=constraint)
    if constraint and not featured:
        raise ClusterFitError(
            f"{what} ask for nodes with constraint {constraint!r} ({source('constraint')}), but no node {scope} "
            f"has those features (sinfo %f: {', '.join(sorted(set().union(*(n.features for n in chosen)))) or 'none'})")
    typed = select(featured, gpu_model=gpu_model) if gpus else featured
    if gpus and gpu_model and not typed:
        raise ClusterFitError(
            f"{what} ask for GPUs of type {gpu_model!r} ({source('gpu_model')}), but no node {scope} has them "
            f"(sinfo %G: {', '.join(sorted({m for n in featured for m, _ in n.gpu_models})) or 'no typed GPUs'})")
    if not any(node.gpus >= gpus for node in typed):
        raise ClusterFitError(
            f"{what} ask for {gpus} GPUs on one node ({source('gpu')}), but no node {scope} has more than "
            f"{max((node.gpus for node in typed), default=0)} (sinfo %G)")
    with_gpus = [node for node in typed if node.gpus >= gpus]
    fitting = [node for node in with_gpus if node.cpus >= cpus]
    if not fitting:
        raise ClusterFitError(
            f"{what} ask for {cpus} CPUs ({source('cpus')}), but no node {scope}"
            f"{f' with {gpus} GPUs' if gpus else ''} has more than {max(n.cpus for n in with_gpus)} (sinfo %c)")
    largest = max(node.mem_mb for node in fitting)
    if mem_mb is not None and mem_mb > largest:
        raise ClusterFitError(
            f"{what} ask for {mem_mb} MB of memory ({source('mem_mb')}), but no node {scope} that has their "
            f"{cpus} CPUs{f' and {gpus} GPUs' if gpus else ''} has more than {largest} MB (sinfo %m); sbatch "
            f"would reject them: ask for at most {largest}")
    limits = [node.time_limit for node in fitting]
    if runtime is not None and None not in limits and runtime > max(limits):
        raise ClusterFitError(
            f"{what} ask for {runtime} minutes ({source('runtime')}), but the longest time limit {scope} for "
            f"a node that can run them is {max(limits)} minutes (sinfo %l); SLURM would keep them pending "
            f"(or reject them): ask for at most {max(limits)}, or give them a QOS that allows more (qos)")


def fit_runtime(nodes: list[Node], *, runtime: int, cpus: int, gpus: int, constraint: str | None = None,
                gpu_model: str | None = None, partition: str | None = None) -> int:
    """The runtime (minutes) to request: ``runtime``, capped at the longest time limit of a
    partition (the job's ``partition``, when known) that has a node with ``cpus`` CPUs, ``gpus``
    GPUs (of ``gpu_model``) and ``constraint``'s features (no such node: ``runtime``,
    :func:`fit_memory` names the problem)."""
    fitting = [node for node in select(nodes, constraint=constraint, gpu_model=gpu_model, partition=partition)
               if can_run(node, cpus, gpus)]
    if not fitting or any(node.time_limit is None for node in fitting):
        return runtime
    return min(runtime, max(node.time_limit for node in fitting))

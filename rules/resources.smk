# Compute resources of every rule, declared in one place.
#
# Each rule names the kind of job it is and takes that kind's resources and threads, as in
#
#     threads: job_threads("gpu_train")
#     resources:
#         **job_resources("gpu_train"),
#
# The keys are those of Snakemake and its SLURM executor plugin: `gpu` (sbatch --gpus=N, or
# --gpus=MODEL:N with `gpu_model`), `cpus_per_gpu`, `nodes` (--nodes=1 for GPU jobs), `mem_mb`
# (--mem), `runtime` (minutes, -t).
# CPU jobs get --cpus-per-task from the rule's threads. Partition and account come from the
# profile (slurm/config.yaml); a config's `resources:` section (below) overrides a kind, a
# method's `resources` (methods.NAME.resources) its own training job's (job_resources' overrides).
# A job that can use several GPUs of a node passes their number, e.g. the language adapter's
# `job_resources("gpu_train", gpus=language_adapter_gpus)` (language_adapter.gpus, torchrun;
# the full baselines' baselines.gpus likewise).
# Without SLURM (`snakemake --cores N`) only threads matter, `--resources gpu=1` keeps GPU jobs
# from sharing a local GPU, and `--resources gpu=K` on a K-GPU machine runs K one-GPU jobs at once,
# each on its own GPU (modsent.devices, claimed when the job's script starts).

import re

from modsent import cluster as modsent_cluster
from modsent import config as modsent_config
from modsent import methods as modsent_methods
from modsent import planning as modsent_planning

# kind: GPUs, CPU cores (the threads of a rule that uses them), memory in MB and runtime in
# minutes for the first attempt. Sized for the paper's runs (LaBSE / mE5-base, 200K LA steps,
# NLLB-200 3.3B); the demo and the tests use a fraction of them. CPU jobs fit a modest node
# (16 GB; a 3.3B translation model's conversion asks for more: conversion_resources); a retry
# after an out-of-memory kill asks for more, up to the largest node.
RESOURCE_CLASSES = {
    # LA (MLM) training, the full baselines and the methods' training: one GPU, data loading
    # and tokenisation on CPUs
    "gpu_train": {"gpu": 1, "cpus": 8, "mem_mb": 32000, "runtime": 24 * 60},
    # SE (MNRL) and CLA adapters and their ablations: gpu_train's job, shorter (the paper's 20 min
    # per 600K pairs on an A100; `modsent plan` estimates a config's), so that a cluster's
    # backfill starts it sooner; the config's resources.gpu_train apply to it too, but for the
    # runtime (KIND_PARENTS)
    "gpu_adapter": {"gpu": 1, "cpus": 8, "mem_mb": 32000, "runtime": 4 * 60},
    # NLLB / M2M100 translation of one shard (bf16 on the GPU; the checkpoint loads in RAM)
    "gpu_translate": {"gpu": 1, "cpus": 8, "mem_mb": 48000, "runtime": 12 * 60},
    # a forward pass over a fixed set of sentences (the frozen English encoder)
    "gpu_encode": {"gpu": 1, "cpus": 4, "mem_mb": 16000, "runtime": 2 * 60},
    # data preparation, merges, summaries, plots
    "cpu": {"gpu": 0, "cpus": 1, "mem_mb": 8000, "runtime": 2 * 60},
    # tokenizer training, fastText, FOCUS, model download and conversion: 10M-line corpora
    "cpu_heavy": {"gpu": 0, "cpus": 8, "mem_mb": 16000, "runtime": 8 * 60},
}

# kind: the kind whose config overrides (`resources: {gpu_train: ...}`) it takes too, under its
# own, but for the keys listed: a constraint, GPU model, partition or CPU count set for the
# training jobs reaches the adapters' jobs, a longer time for the language adapters does not
KIND_PARENTS = {"gpu_adapter": ("gpu_train", ("runtime",))}

# A retried job (profile: retries) asks for more than the attempt before: memory × attempt
# (an out-of-memory kill is the usual reason), never more than the largest node that can run
# the job offers (under SLURM, sinfo: modsent.cluster; a first attempt that no node can run
# stops the run before anything is submitted, naming the key to change), runtime × RUNTIME_GROWTH per attempt up to
# MAX_RUNTIME (most clusters cap a job at 2 days; training and translation resume from their
# checkpoints, so a timed-out job continues where it stopped) and up to the longest time limit
# of a partition that can run the job (sinfo).
RUNTIME_GROWTH = 1.5
MAX_RUNTIME = 48 * 60
# what every job's resources compute from its kind, or from its own values (job_resources' overrides)
SIZES = ("cpus", "mem_mb", "runtime", "max_runtime")


# the SLURM cluster's nodes (sinfo), asked once per run; see cluster_nodes()
_CLUSTER_NODES = []
# `modsent plan --profile P` of a SLURM profile dry-runs the workflow with this set (a file to
# write): the dry run fits each job to sinfo's nodes as the run would, and writes there, as it
# exits, what the run's check of every request would find (write_planned_requests;
# modsent.planning). Its value holds the profile's SLURM settings the checks read (qos,
# partition_config), which a dry run's workflow does not have.
PLAN_REQUESTS = modsent_planning.plan_requests_setting()


def cluster_nodes():
    """The nodes of the SLURM cluster this run submits its jobs to (modsent.cluster), or None
    when it does not submit with sbatch (`--cores`, or inside a job) or sinfo cannot be asked.
    A dry run asks sinfo too when it plans a SLURM run (PLAN_REQUESTS)."""
    if not _CLUSTER_NODES:
        plugin = getattr(globals().get("workflow"), "executor_plugin", None)
        if plugin is None:  # not executing (yet)
            return None
        slurm = plugin.name == "slurm" or (plugin.name == "dryrun" and PLAN_REQUESTS is not None)
        _CLUSTER_NODES.append(modsent_cluster.query_nodes() if slurm else None)
    return _CLUSTER_NODES[0]


def _executor_setting(name):
    """The SLURM plugin's setting `name` (qos, partition_config, array_jobs) of this run, or of the run a
    dry run plans (PLAN_REQUESTS)."""
    settings = getattr(globals().get("workflow"), "executor_settings", None)
    value = getattr(settings, name, None)
    if value is None and PLAN_REQUESTS is not None:
        value = PLAN_REQUESTS.settings.get(name)
    return value


def resource_class(kind):
    """The class `kind` with the config's overrides (`resources: {kind: {key: value}}`) applied.

    Override keys: gpu, cpus, mem_mb, runtime, max_runtime, and any other resource the SLURM
    plugin reads (slurm_partition, slurm_account, constraint, gpu_model, qos, slurm_extra). A
    kind of KIND_PARENTS takes its parent's overrides first, but for its own keys."""
    if kind not in RESOURCE_CLASSES:
        raise WorkflowError(
            f"unknown resource kind {kind!r}; known: {', '.join(RESOURCE_CLASSES)}"
        )
    values = {"max_runtime": MAX_RUNTIME, **RESOURCE_CLASSES[kind]}
    overrides = config.get("resources") or {}
    if kind in KIND_PARENTS:
        parent, own = KIND_PARENTS[kind]
        values.update((key, value) for key, value in (overrides.get(parent) or {}).items() if key not in own)
    values.update(overrides.get(kind) or {})
    return values


def _gpu_count(gpus, wildcards):
    return int(gpus(wildcards) if callable(gpus) else gpus)


def _job_class(kind, overrides):
    """A function of the wildcards: the class `kind` (resource_class) with the job's own
    resources over it, the config key that sets them and those own resources (None without
    `overrides`; both for errors). `overrides` (None, or a function of the wildcards returning
    (config key, {key: value})): a method's `resources`."""
    values = resource_class(kind)

    def job_class(wildcards):
        if overrides is None:
            return values, f"resources.{kind}", None
        setting, own = overrides(wildcards)
        return {**values, **own}, setting, own

    return job_class


# the keys that decide which nodes can run a job, and the name modsent.cluster.select and
# fit_memory give each
NODE_KEYS = {"constraint": "constraint", "gpu_model": "gpu_model", "slurm_partition": "partition"}
# resources that send a job to another cluster (the SLURM plugin's): local sinfo does not know its partitions
CLUSTER_KEYS = ("slurm_cluster", "cluster", "clusters")
# a value the profile gives that Snakemake computes (an expression): not known before it does
COMPUTED = "<computed>"
_BARE = re.compile(r"^[\w.,&|:+*\-\[\]()]*$")


def _literal(raw):
    """The value a resource of the profile stands for: its text when quoted ('a100', "a100") or
    bare (a100, a100&ib), a number as text, "" for None (YAML null or an empty value: Snakemake
    drops the key, so no constraint and the default partition), COMPUTED for an expression or
    an environment variable (Snakemake expands and evaluates those), None for no value."""
    if isinstance(raw, int):
        return str(raw)
    if not isinstance(raw, str):
        return None
    text = raw.strip()
    if text == "None":
        return ""
    if "$" in text or text.startswith("~"):
        return COMPUTED
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"" and text[0] not in text[1:-1]:
        return text[1:-1]
    return text if _BARE.match(text) else COMPUTED


def _profile_values(rulename):
    """The profile's (or command line's) constraint, GPU model, partition and cluster keys for
    jobs of `rulename`: ({key: value} of its set-resources, which replace the rule's own,
    {key: value} of default-resources, which apply where the rule has none); empty values kept
    (no constraint; the default partition), expressions as COMPUTED."""
    settings = getattr(globals().get("workflow"), "resource_settings", None)
    if settings is None:
        return {}, {}

    def plain(resources):
        found = {}
        for key in (*NODE_KEYS, *CLUSTER_KEYS):
            resource = resources.get(key) if resources is not None else None
            value = _literal(getattr(resource, "raw", None))
            if value is not None:
                found[key] = value
        return found

    overwrite = (settings.overwrite_resources or {}).get(rulename) if rulename else None
    return plain(overwrite), plain(settings.default_resources)


def _automatic_partition():
    """Whether the SLURM plugin chooses a partition for jobs that name none (its partition
    config: --slurm-partition-config, or $SNAKEMAKE_SLURM_PARTITIONS) rather than the default."""
    import os

    return bool(_executor_setting("partition_config") or os.environ.get("SNAKEMAKE_SLURM_PARTITIONS"))


def _config_source(kind, setting, key, own=None):
    """The config key a job's `key` comes from: `setting`'s (a job's own, `own`, when it sets
    the key), else the kind's, or, for a kind of KIND_PARENTS that inherited it, its parent's
    (resources.gpu_train.constraint for a gpu_adapter job)."""
    if own is not None and key in own:
        return f"{setting}.{key}"
    setting = f"resources.{kind}"
    overrides = config.get("resources") or {}
    if kind in KIND_PARENTS and key not in (overrides.get(kind) or {}):
        parent = KIND_PARENTS[kind][0]
        if key in (overrides.get(parent) or {}):
            return f"resources.{parent}.{key}"
    return f"{setting}.{key}"


def _node_choice(kind, values, gpus, setting, rulename=None, rule_keys=(), own=None):
    """The job's constraint, GPU model (a GPU job's) and partition, which decide the nodes that
    can run it (modsent.cluster.select), and the key each comes from (for errors), as Snakemake
    resolves them: the profile's set-resources for the rule (which replace the rule's own),
    else the rule's own (`rule_keys`: the config's for the kind, `values`, or the job's own,
    named by `setting`; None when the job sets none), else the profile's default-resources.
    An empty constraint or GPU model asks for none; a job without a partition, or with "",
    goes to the default one. A value Snakemake computes, or a partition on another cluster or
    chosen by the plugin, chooses no nodes (every node counts). As fit_memory's keywords."""
    overwrite, default = _profile_values(rulename)
    choice = {}
    for key, name in NODE_KEYS.items():
        if key == "gpu_model" and not gpus:
            value, source = None, None
        elif key in overwrite:
            value, source = overwrite[key], f"the profile's set-resources: {rulename}: {key}"
        elif key in rule_keys:
            value, source = values.get(key), _config_source(kind, setting, key, own)
        elif key in default:
            value, source = default[key], f"the profile's default-resources: {key}"
        else:
            value, source = None, None
        if value == COMPUTED:
            value = None
        if key == "slurm_partition":  # (a job for another cluster is not fitted: _elsewhere)
            if (not value and _automatic_partition()) or (value is None and source):
                value = None  # every node (a computed partition: source set, value None)
            elif value is None:
                value, source = "", None  # none set: the default partition
        elif not value:
            value = None
        choice[name], choice[f"{name}_setting"] = value, source
    return choice


# the names Snakemake turns into mem_mb
SIZE_ALIASES = {"mem": "mem_mb", "mem_mib": "mem_mb"}


def _number(value):
    """A resource's value as an int, or None when it has none or is not a number (sbatch judges it)."""
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


# the name of the cluster sinfo describes (scontrol show config), asked once, when a job names a cluster
_LOCAL_CLUSTER = []


def _other_cluster(names):
    """Whether a job whose cluster keys hold `names` (the values of slurm_cluster, cluster or
    clusters; "a,b" lists several) may run on a cluster other than the one sinfo describes."""
    names = {name.strip() for value in names for name in str(value or "").split(",") if name.strip()}
    if not names:
        return False
    if not _LOCAL_CLUSTER:
        _LOCAL_CLUSTER.append(modsent_cluster.local_cluster_name())
    return names != {_LOCAL_CLUSTER[0]}


def _elsewhere(rulename, values):
    """Whether a job of `rulename` (the kind's or the job's own `values`) goes to another
    cluster (the SLURM plugin's slurm_cluster, cluster or clusters, as Snakemake resolves them:
    the profile's set-resources, else the rule's own, else default-resources): local sinfo does
    not know its nodes, so nothing is fitted or checked. A computed value counts as another."""
    overwrite, default = _profile_values(rulename)
    names = [overwrite[key] if key in overwrite else values[key] if key in values else default.get(key)
             for key in CLUSTER_KEYS]
    return _other_cluster(names)


def _from_default(rulename, key, default):
    """Whether the value of `key` that jobs of `rulename` get is the profile's
    default-resources one (the rule sets none of its own, and set-resources none)."""
    if default is None or key not in default:
        return False
    ours = workflow.get_rule(rulename).resources
    if key not in ours:
        return False
    return getattr(ours[key], "raw", None) == getattr(default[key], "raw", object())


def check_request(rulename, resources, threads, attempt=1):
    """Stop the run when no node can take a job's request as sbatch will get it (`resources`,
    the job's final values, and `threads`; modsent.cluster.check_request): the rule's own
    memory and time are fitted to the nodes by job_resources, but a value the profile sets
    (set-resources for the rule, or a default-resources one the rule does not set) replaces
    them unchecked: more memory than any node has is rejected at every retry, a runtime over
    the partition's time limit waits in the queue forever. A CPU job with a GPU model (from
    default-resources, say) is refused too: the plugin would give it a GPU. Under SLURM only
    (cluster_nodes); not a job for another cluster, nor the runtime of one with a QOS (which
    may allow more than the partition), nor a value Snakemake has not computed yet. `attempt`:
    the attempt `resources` are of (a retry's, _later_attempts), named in the message."""
    nodes = cluster_nodes()
    if nodes is None:
        return

    def get(key):
        return _known(resources.get(key))

    if _other_cluster([get(key) for key in CLUSTER_KEYS]):
        return
    settings = getattr(globals().get("workflow"), "resource_settings", None)
    # the keys set-resources gives the rule (mem and mem_mib arrive as mem_mb, as Snakemake renames them)
    overwrite = {SIZE_ALIASES.get(key, key)
                 for key in (getattr(settings, "overwrite_resources", None) or {}).get(rulename) or ()}
    default = getattr(settings, "default_resources", None)
    gres = str(get("gres") or "")
    gres_gpus, gres_model = modsent_cluster.requested_gpus(gres)
    # as the SLURM plugin builds sbatch's options (--gpus, --gres, --cpus-per-*, --mem*)
    number = {key: _number(get(key)) for key in ("gpu", "cpus_per_task", "cpus_per_gpu", "mem_mb_per_cpu",
                                                 "mem_mb", "runtime")}
    gpus = number["gpu"] or gres_gpus
    if number["cpus_per_task"]:
        cpus, cpus_key = max(1, number["cpus_per_task"]), "cpus_per_task"
    elif gpus and number["cpus_per_gpu"]:
        cpus, cpus_key = max(1, number["cpus_per_gpu"]) * gpus, "cpus_per_gpu"
    else:
        cpus, cpus_key = int(threads), "threads"
    if number["mem_mb_per_cpu"]:  # --mem-per-cpu, which the plugin prefers to --mem
        mem_mb, mem_key = number["mem_mb_per_cpu"] * cpus, "mem_mb_per_cpu"
    else:
        mem_mb, mem_key = number["mem_mb"] or None, "mem_mb"
    model = get("gpu_model") or gres_model
    keys = {"cpus": cpus_key, "mem_mb": mem_key, "gpu": "gpu" if number["gpu"] else "gres",
            "gpu_model": "gpu_model" if get("gpu_model") else "gres"}

    def source(key):
        key = keys.get(key, key)
        if key in overwrite:
            return f"the profile's set-resources: {rulename}: {key}"
        if key == "threads":
            return "the rule's threads, or the profile's set-threads"
        if _from_default(rulename, key, default):
            return f"the profile's default-resources: {key}"
        return f"the rule's {key} (rules/resources.smk, your config's resources:)"

    if get("gpu_model") and get("gpu") is None and not gres_gpus:
        # the plugin sends --gpus=MODEL:1 for a job with a GPU model and no count
        raise WorkflowError(
            f"jobs of rule {rulename} have gpu_model {model!r} "
            f"({source('gpu_model')}) but ask for no GPU; the SLURM plugin would ask for one GPU of that "
            f"model for each (--gpus={model}:1), so give a GPU model to the GPU rules only (the profile's "
            f"set-resources block for them, or the config's resources.gpu_train)")
    partition = get("slurm_partition")
    if not partition and _automatic_partition():
        partition = None  # the plugin's choice: every node
    else:
        partition = str(partition or "")  # none: the default partition
    # a QOS may allow more time than the partition (its PartitionTimeLimit flag): sbatch judges
    # the runtime of a job with one (the qos resource, the plugin's --slurm-qos, or -q in slurm_extra)
    qos = get("qos") or _executor_setting("qos") \
        or re.search(r"(^|\s)(-q\b|--qos\b)", str(get("slurm_extra") or ""))
    try:
        modsent_cluster.check_request(
            nodes, f"jobs of rule {rulename}" + (f" on their attempt {attempt} (the profile's retries)"
                                                  if attempt > 1 else ""), mem_mb=mem_mb,
            runtime=None if qos else number["runtime"] or None,
            cpus=cpus, gpus=gpus, constraint=get("constraint") or None, gpu_model=model,
            partition=partition, source=source)
    except modsent_cluster.ClusterFitError as err:
        raise WorkflowError(str(err)) from None


def _through_sbatch(job):
    """Whether the SLURM run submits `job` with sbatch (not a local rule's, which runs in the
    Snakemake process). A dry run runs every job locally, so for the run it plans
    (PLAN_REQUESTS) the rule decides, as Snakemake's Workflow.is_local does under SLURM."""
    if PLAN_REQUESTS is None or not workflow.dryrun:
        return not job.is_local
    own = job.rule
    return own.group is not None or not (own.norun or own.name in getattr(workflow, "_localrules", ())
                                         or getattr(own, "is_template_engine", False))


def _known(value):
    """A job's resource value, or None for one not known until its inputs exist (<TBD>)."""
    return None if type(value).__name__ == "TBDString" else value


def _later_attempts(job):
    """The attempts after the first that `job` may have: 2 up to the profile's retries + 1.
    The rule's own memory and time are fitted to the nodes at every attempt (job_resources),
    but a profile value computed from `attempt` (`mem_mb: 20000 * attempt`, `mem: ...`, a
    set-threads expression) is not: request_problems checks each of them."""
    return range(2, (job.restart_times or 0) + 2)


def _attempt_request(job, attempt):
    """(resources, threads) of `job` at its attempt `attempt`, as Snakemake computes them for a
    retry, or None when they cannot be computed now (a value from inputs that do not exist yet:
    Snakemake computes it when the job is ready, <TBD> until then). A value that can be
    computed for the first attempt and not for this one (`[8000, 16000][attempt - 1]`) is a
    WorkflowError naming the attempt: the retry would fail on it."""
    def expand(number):
        return job.rule.expand_resources(job.wildcards_dict, job.input, number, skip_evaluation={"tmpdir"})

    try:
        resources = expand(attempt)
    except Exception as err:  # noqa: BLE001 - judged against the first attempt's, below
        try:
            expand(1)
        except Exception:  # noqa: BLE001 - not this attempt's doing: not known yet
            return None
        raise WorkflowError(f"jobs of rule {job.rule.name} have resources that cannot be computed for their "
                            f"attempt {attempt} (the profile's retries), which sbatch would need; "
                            f"{type(err).__name__}: {err}") from None
    return resources, resources.get("_cores", job.threads)


# the resources the SLURM plugin makes a job's sbatch call of (its submit string, GPU and CPU
# settings, partition choice); job arrays compare these, and the threads
SBATCH_KEYS = ("runtime", "mem_mb", "mem_mb_per_cpu", "cpus_per_task", "cpus_per_gpu", "gpu", "gres", "gpu_model",
               "constraint", "qos", "nodes", "tasks", "tasks_per_gpu", "tasks_per_node", "mpi", "slurm_partition",
               "slurm_account", "slurm_extra", "slurm_cluster", "cluster", "clusters")


def _array_rules():
    """The rules the SLURM plugin submits as job arrays (its array_jobs setting, read as it
    reads it: names separated by commas or semicolons; "all": every rule), or an empty set."""
    value = _executor_setting("array_jobs")
    if not value:
        return set()
    return {name.strip() for name in str(value).replace(";", ",").split(",") if name.strip()}


def _sbatch_request(job):
    """The values of `job`'s request that its sbatch call is made of (SBATCH_KEYS, and its
    threads), as strings; a value not known until the job's inputs exist (<TBD>) as None."""
    request = {"threads": str(job.threads)}
    for key, value in job.resources.items():
        if key in SBATCH_KEYS:
            request[key] = None if _known(value) is None else str(value)
    return request


def _array_problem(rulename, jobs, arrays):
    """Why the jobs `jobs` of rule `rulename`, which the profile's slurm-array-jobs submits as
    arrays, cannot go as one: the plugin makes an array's sbatch call from its first job and
    gives every task that request, so jobs that ask differently (a language's GPUs, a method's
    own memory) would run with another job's. None when they ask alike. `arrays`: the
    profile's list (_array_rules), for the advice."""
    first = _sbatch_request(jobs[0])
    differ = {}  # key: (the first job that asks otherwise, its request)
    for job in jobs[1:]:
        request = _sbatch_request(job)
        for key in sorted(set(first) | set(request)):
            if key not in differ and first.get(key) != request.get(key) \
                    and None not in (first.get(key, ""), request.get(key, "")):
                differ[key] = job, request
    if not differ:
        return None

    def named(job, other):  # the wildcards that tell the two jobs apart
        own, others = job.wildcards_dict, other.wildcards_dict
        return ", ".join(f"{key}={value}" for key, value in own.items() if others.get(key) != value) or "a job"

    shown = "; ".join(f"{key} {first.get(key, 'unset')} for {named(jobs[0], job)}, "
                      f"{request.get(key, 'unset')} for {named(job, jobs[0])}"
                      for key, (job, request) in list(differ.items())[:3])
    leave = (f"replace 'all' in slurm-array-jobs by the rules whose jobs ask alike, without {rulename}"
             if "all" in arrays else f"leave {rulename} out of slurm-array-jobs")
    return (f"jobs of rule {rulename} ask differently ({shown}), but the profile's slurm-array-jobs submits them "
            f"as job arrays, whose tasks all get the first job's request: {leave} (its jobs then go one by one), "
            f"or make its jobs ask alike")


def request_problems(jobs):
    """What check_request finds in `jobs` (Snakemake's jobs of this run; local ones run here,
    not through sbatch), at their first attempt and at the retries whose request the profile
    computes from the attempt, and the rules of the profile's slurm-array-jobs whose jobs ask
    differently: every rule's first problem, by the rules' names. Empty when every request fits
    a node (or the run does not submit to a SLURM cluster sinfo describes) and every array asks
    alike."""
    problems, arrays = {}, _array_rules()
    in_array = {}  # rule: its jobs, for the rules submitted as job arrays
    for job in jobs:
        resources = job.resources  # every job's, local ones too: a fitting error stops the run now
        name = job.rule.name
        if not _through_sbatch(job) or name in problems:
            continue
        try:
            check_request(name, resources, job.threads)
            for attempt in _later_attempts(job) if cluster_nodes() is not None else ():
                request = _attempt_request(job, attempt)
                if request is not None:
                    check_request(name, *request, attempt=attempt)
        except WorkflowError as err:
            problems[name] = str(err)
            continue
        # the plugin submits a group job by itself, never in an array
        if ("all" in arrays or name in arrays) and job.rule.group is None:
            in_array.setdefault(name, []).append(job)
    for name, members in in_array.items():
        problem = _array_problem(name, members, arrays) if name not in problems and len(members) > 1 else None
        if problem:
            problems[name] = problem
    return [problems[name] for name in sorted(problems)]


def write_planned_requests():
    """At the exit of a dry run that plans a SLURM run (PLAN_REQUESTS): write to its file what
    the run's check of every job's request (the Snakefile's onstart) would find, as JSON:
    {"nodes": sinfo's nodes (null: sinfo did not answer), "jobs": the jobs checked, "problems":
    request_problems' messages}, or {"error": why the check failed}. Nothing outside a dry run,
    or when it stopped before its jobs were known (its own error says why)."""
    import json

    dag = getattr(workflow, "dag", None)
    if dag is None or not workflow.dryrun:
        return
    try:
        jobs = [job for job in dag.needrun_jobs(exclude_finished=False) if _through_sbatch(job)]
        nodes = cluster_nodes()  # None: only the arrays' requests are checked
        checked = {"nodes": None if nodes is None else len(nodes), "jobs": len(jobs),
                   "problems": request_problems(jobs)}
    except Exception as err:  # a dry run that failed on a job's resources: its own error says so too
        checked = {"error": f"{type(err).__name__}: {err}"[:2000]}
    PLAN_REQUESTS.path.write_text(json.dumps(checked), encoding="utf-8")


def job_threads(kind, gpus=None, overrides=None):
    """The thread count of a job of `kind` (Snakemake caps it at --cores when run locally):
    the kind's CPUs (or the job's own: `overrides`, as in job_resources), times the job's GPUs
    when `gpus` (a number or a function of the wildcards) asks for more than the kind's one."""
    if gpus is None and overrides is None:
        return int(resource_class(kind)["cpus"])
    job_class = _job_class(kind, overrides)
    return lambda wildcards: int(job_class(wildcards)[0]["cpus"]) * (1 if gpus is None else _gpu_count(gpus, wildcards))


def job_resources(kind, gpus=None, overrides=None, own_keys=()):
    """The resources of a job of `kind`. GPU kinds request the kind's GPUs, or `gpus` (a
    number or a function of the wildcards: a multi-GPU job, memory scaled with it), and
    cpus_per_gpu; CPU kinds none. mem_mb and runtime grow with the attempt on retries.
    `overrides` (a function of the wildcards returning (config key, {key: value})): the job's
    own cpus, mem_mb, runtime and max_runtime over the kind's, and of the other keys those of
    `own_keys` (constraint, gpu_model, qos, slurm_extra: some job of the rule sets them; a job
    that does not gets the kind's value, or no request: the callable returns None, which
    Snakemake drops, so the key is not sent empty). Keys outside `own_keys` stay the kind's and,
    where it has none, the profile's default-resources."""
    static = resource_class(kind)
    kind_gpus = int(static["gpu"])
    if gpus is not None and kind_gpus == 0:
        raise WorkflowError(f"resource kind {kind!r} requests no GPU; gpus= is for GPU kinds")
    gpus = kind_gpus if gpus is None else gpus
    job_class = _job_class(kind, overrides)
    # the keys the rule sets itself (the kind's from the config, and own_keys); the profile's
    # default-resources do not reach them
    rule_keys = {key for key in static if key not in ("gpu", *SIZES)} | set(own_keys)

    def gpu_count(wildcards):
        return _gpu_count(gpus, wildcards) if kind_gpus else 0

    def mem_mb(wildcards, attempt, rulename=None):
        # an out-of-memory kill is the usual reason for a retry; each GPU process holds a copy
        values, setting, own = job_class(wildcards)
        count = gpu_count(wildcards)
        nodes = cluster_nodes()
        if nodes is None or _elsewhere(rulename, values):
            return int(values["mem_mb"] * attempt * max(count, 1))
        try:  # never more than the largest node that can run the job has (sbatch would reject it)
            return modsent_cluster.fit_memory(kind, nodes, mem_mb=int(values["mem_mb"]), attempt=attempt,
                                              cpus=int(values["cpus"]) * max(count, 1), gpus=count,
                                              setting=setting,
                                              **_node_choice(kind, values, count, setting, rulename, rule_keys,
                                                             own))
        except modsent_cluster.ClusterFitError as err:
            raise WorkflowError(str(err)) from None

    def runtime(wildcards, attempt, rulename=None):
        values, setting, _ = job_class(wildcards)
        base = int(values["runtime"])
        wanted = min(int(base * RUNTIME_GROWTH ** (attempt - 1)), max(int(values["max_runtime"]), base))
        nodes = cluster_nodes()
        if nodes is None or _elsewhere(rulename, values):
            return wanted
        # never more than the longest time limit of a partition that can run the job (longer,
        # it would wait forever); a training job that times out resumes from its checkpoint
        count = gpu_count(wildcards)
        return modsent_cluster.fit_runtime(nodes, runtime=wanted, cpus=int(values["cpus"]) * max(count, 1),
                                           gpus=count, **{key: value for key, value in
                                                          _node_choice(kind, values, count, setting, rulename,
                                                                       rule_keys).items()
                                                          if key in NODE_KEYS.values()})

    resources = {"mem_mb": mem_mb, "runtime": runtime}
    if kind_gpus > 0:
        gpu = gpu_count if callable(gpus) else int(gpus)
        # one node (--nodes=1): the job's processes run under torchrun on the node its script
        # starts on; SLURM could otherwise spread --gpus=N over several nodes, of which the job
        # would see one (fewer processes, each with a larger share of the global batch)
        cpus_per_gpu = int(static["cpus"])
        if overrides is not None:
            cpus_per_gpu = lambda wildcards: int(job_class(wildcards)[0]["cpus"])
        resources.update(gpu=gpu, cpus_per_gpu=cpus_per_gpu, nodes=1)
    # partition, constraint, gpu_model, ... from the config
    resources.update((key, value) for key, value in static.items() if key not in ("gpu", *SIZES))
    for key in own_keys:  # a job's own, else the kind's, else None (not requested)
        if key in ("gpu", *SIZES):
            raise WorkflowError(f"job_resources(own_keys=...): {key!r} is always the job's own")
        resources[key] = lambda wildcards, key=key: job_class(wildcards)[0].get(key)
    return resources


def language_adapter_gpus(wildcards):
    """language_adapter.gpus: GPUs of one node, trained under torchrun."""
    return modsent_config.runtime_settings(config, "language_adapter", wildcards.lang)["gpus"]


def full_baseline_gpus(wildcards):
    """baselines.gpus: GPUs of one node for each full baseline, trained under torchrun."""
    return config["baselines"].get("gpus", 1)


# host memory of a translation checkpoint's conversion for CTranslate2 per parameter: the float32
# checkpoint (4 bytes) and the converter's copies of the weights it writes (an estimate)
CONVERSION_BYTES_PER_PARAMETER = 8


def conversion_resources(wildcards):
    """The memory of convert_translation_model's job: cpu_heavy's, or more for a
    translation model whose id names its size (facebook/nllb-200-3.3B: 26,400 MB, where a first
    attempt at cpu_heavy's 16 GB is killed); the config's resources.cpu_heavy.mem_mb, when set,
    decides."""
    setting = "resources.cpu_heavy"
    size = modsent_planning.translation_size(str(config["translation"]["model"]))
    if size is None or "mem_mb" in ((config.get("resources") or {}).get("cpu_heavy") or {}):
        return setting, {}
    parameters = float(size[:-1]) * (1e9 if size.endswith("B") else 1e6)
    needed = int(parameters * CONVERSION_BYTES_PER_PARAMETER / 1e6)
    return setting, {"mem_mb": max(int(resource_class("cpu_heavy")["mem_mb"]), needed)}


def method_resources(wildcards):
    """methods.{method}.resources: the method's training job's own resources (over gpu_train's)."""
    return (f"methods.{wildcards.method}.resources",
            modsent_config.method_resources(config, wildcards.method))


def method_resource_keys():
    """The keys besides CPUs, memory and time that some configured method's `resources` sets
    (constraint, gpu_model, qos, slurm_extra): its job_resources' own_keys."""
    return sorted({key for name in (config.get("methods") or {})
                   for key in modsent_config.method_resources(config, name)} - set(SIZES))


def method_gpus(wildcards):
    """methods.{method}.gpus of a data-parallel method (modsent.methods.Method.data_parallel):
    GPUs of one node, trained under torchrun; one GPU for any other method."""
    if not modsent_methods.get(wildcards.method).data_parallel:
        return 1
    return modsent_config.method_runtime_settings(config, wildcards.method).get("gpus", 1)

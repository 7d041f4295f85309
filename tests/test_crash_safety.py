"""Crash safety: outputs replaced without deleting the finished one first, leases that keep a
restart from starting a job a second time, and resource requests that fit the cluster's nodes."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from modsent import cluster, leases
from modsent.io import atomic_path

# ---------------------------------------------------------------------------------------------
# outputs


def _write_adapter(path: Path, text: str) -> None:
    with atomic_path(path, directory=True) as tmp:
        (tmp / "weights.txt").write_text(text)


def test_a_finished_directory_is_replaced_whole_and_survives_a_failed_replacement(tmp_path, monkeypatch):
    out = tmp_path / "adapters" / "ky"
    _write_adapter(out, "first")
    _write_adapter(out, "second")
    assert (out / "weights.txt").read_text() == "second"
    assert sorted(p.name for p in out.parent.iterdir()) == ["ky"]  # nothing left aside
    with pytest.raises(RuntimeError, match="^killed$"):
        with atomic_path(out, directory=True) as tmp:
            (tmp / "weights.txt").write_text("half")
            raise RuntimeError("killed")
    assert (out / "weights.txt").read_text() == "second"
    # the final rename fails (e.g. a full quota): the finished version is put back
    real_replace = os.replace
    calls = []

    def failing(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == 2:
            raise OSError("rename failed")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="rename failed"):
        _write_adapter(out, "third")
    monkeypatch.undo()
    assert calls[0][0] == "ky" and calls[1][1] == "ky"  # moved aside first, never deleted
    assert (out / "weights.txt").read_text() == "second"
    assert sorted(p.name for p in out.parent.iterdir()) == ["ky"]


# ---------------------------------------------------------------------------------------------
# leases

HOLDER = """
import sys, time
from modsent import leases
leases.take(sys.argv[1:], rule="language_adapter")
print("held", flush=True)
time.sleep(60)
"""


def _holder(cwd: Path, *outputs: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, *outputs], cwd=cwd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_lease_held_by_a_running_job_stops_a_second_job_and_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    output = "results/tiny/language_adapters/ky"
    proc = _holder(tmp_path, output)
    try:
        record = json.loads(leases.lease_path(output).read_text())
        assert (record["output"], record["rule"], record["pid"]) == (output, "language_adapter", proc.pid)
        with pytest.raises(leases.LeaseError, match=rf"{output} is still being produced by .*process {proc.pid}"):
            leases.take([output])
        with pytest.raises(leases.LeaseError, match=rf"(?s){output}.*kill {proc.pid}"):
            leases.check_no_running_holders()
    finally:
        proc.kill()
        proc.wait()
    # killed outright: its lease stays, but its holder is gone, so the lease is stale
    assert leases.lease_path(output).is_file()
    assert leases.check_no_running_holders() == []
    assert not leases.lease_path(output).exists()  # cleared
    leases.take([output, "results/tiny/tokenizers/ky"])
    assert leases.take([output])  # a process may take its own lease again


def test_a_job_that_ends_releases_its_leases(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "from modsent import leases; leases.take(['a/b', 'c'])"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert not list((tmp_path / leases.LEASE_DIR).glob("*.json"))


def test_a_reused_process_id_is_not_a_running_holder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    record = {**leases.current_holder("corpus"), "output": "x"}
    assert leases.holder_running(record) is True
    assert leases.holder_running({**record, "pid_start": "1"}) is False
    assert leases.holder_running({**record, "host": "another-node"}) is None  # cannot tell from here


def _fake_squeue(folder: Path, job_states: dict[str, str]) -> None:
    """An squeue that knows ``job_states`` and answers like Slurm's for any other job."""
    script = folder / "squeue"
    script.write_text("#!/bin/sh\ncase \"$3\" in\n"
                      + "".join(f"  {job}) echo '{job} {state}'; exit 0;;\n" for job, state in job_states.items())
                      + "  *) echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1;;\nesac\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_slurm_holders_are_checked_with_the_scheduler(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_squeue(bin_dir, {"101": "RUNNING", "102": "PENDING", "103": "COMPLETED"})
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for job, output in (("101", "results/a"), ("102", "results/b"), ("103", "results/c"), ("104", "results/d")):
        monkeypatch.setenv("SLURM_JOB_ID", job)
        path = leases.lease_path(output)
        path.parent.mkdir(parents=True, exist_ok=True)
        # written by jobs on another node: squeue alone says whether they run
        path.write_text(json.dumps({**leases.current_holder("sentence_adapter"), "output": output,
                                    "host": "node7", "pid": 4242}))
    assert [leases.slurm_job_state(job) for job in ("101", "103", "104")] == ["RUNNING", "COMPLETED", ""]
    monkeypatch.setenv("SLURM_JOB_ID", "200")
    with pytest.raises(leases.LeaseError) as err:
        leases.check_no_running_holders()
    message = str(err.value)
    assert "results/a (rule sentence_adapter: SLURM job 101" in message and "results/b" in message
    assert "results/c" not in message and "results/d" not in message
    assert "scancel 101 102" in message
    remaining = {record["output"] for _, record in leases.read_leases()}
    assert remaining == {"results/a", "results/b"}  # the ended jobs' leases are cleared
    with pytest.raises(leases.LeaseError, match="scancel 101"):
        leases.take(["results/a"])
    leases.take(["results/c"])  # job 103 ended: its output may be redone
    leases.take(["results/e"])
    leases.take(["results/e"])  # a process may take its own lease again
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    leases.take(["results/a"])  # job 101 requeued: a new process; the old lease is its own job's
    # inside one allocation (snakemake --cores under salloc) every job has the allocation's id,
    # which squeue reports running: a dead process's lease there is stale all the same
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = {**leases.current_holder("tokenizer"), "pid": int(dead.stdout), "output": "results/e"}
    assert leases.holder_running(record) is False
    monkeypatch.setenv("SLURM_JOB_ID", "300")
    assert leases.holder_running(record) is True  # from outside the allocation: squeue decides
    # a run checks only its own outputs: another run's running jobs are not orphans
    assert leases.check_no_running_holders(outputs=["results/c", "results/z"]) == []
    with pytest.raises(leases.LeaseError, match="results/b"):
        leases.check_no_running_holders(outputs=["results/b"])


def test_an_array_task_s_state_is_its_own(tmp_path, monkeypatch):
    """squeue -j ARRAY_ID lists every task; only the line of the job itself counts."""
    script = tmp_path / "squeue"
    script.write_text("#!/bin/sh\necho '500 COMPLETED'\necho '501 RUNNING'\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert leases.slurm_job_state("500") == "COMPLETED"
    assert leases.slurm_job_state("502") == ""


def test_every_workflow_script_starts_with_a_lease_on_its_outputs():
    scripts = sorted((REPO / "workflow_scripts").glob("*.py"))
    assert len(scripts) > 20
    for script in scripts:
        text = script.read_text()
        assert re.search(r"^(\w+ = )?start_job\(snakemake\)$", text, flags=re.M), (
            f"{script.name}: call modsent.logs.start_job(snakemake) first (log and leases)")


# ---------------------------------------------------------------------------------------------
# resources that fit the cluster

SINFO = """node1|192000|64|gpu:a100:4(S:0-1)
node1|192000|64|gpu:a100:4(S:0-1)
node2|20000|16|(null)
node3|64000+|32|gpu:2,mps:100
"""


def test_sinfo_nodes_are_parsed():
    nodes = cluster.parse_sinfo(SINFO)
    assert [(n.name, n.mem_mb, n.cpus, n.gpus) for n in nodes] == [
        ("node1", 192000, 64, 4), ("node2", 20000, 16, 0), ("node3", 64000, 32, 2)]
    assert [cluster.gpu_count(g) for g in ("gpu:2", "gpu:a100:4(S:0-1)", "(null)", "mps:100", "gpu:t4:1,gpu:v100:2",
                                           "gpu:a100:4(S:0,2)", "gpu:4(IDX:0,2-3),mps:100")] == [2, 4, 0, 0, 3, 4, 4]


def test_memory_requests_fit_the_largest_node_and_impossible_requests_name_the_key():
    nodes = cluster.parse_sinfo(SINFO)
    fit = cluster.fit_memory
    # a CPU job: retries grow, up to the largest node with its CPUs
    assert [fit("cpu_heavy", nodes, mem_mb=16000, attempt=a, cpus=8, gpus=0) for a in (1, 2, 3, 20)] == [
        16000, 32000, 48000, 192000]
    # a 2-GPU job: memory per GPU, capped at the largest node with 2 GPUs and 16 CPUs
    assert fit("gpu_train", nodes, mem_mb=32000, attempt=3, cpus=16, gpus=2) == 192000
    with pytest.raises(cluster.ClusterFitError, match=r"ask for 250000 MB.*resources\.cpu_heavy\.mem_mb to at most 192000"):
        fit("cpu_heavy", nodes, mem_mb=250000, attempt=1, cpus=8, gpus=0)
    with pytest.raises(cluster.ClusterFitError, match=r"mem_mb \(per GPU\) to at most 96000"):
        fit("gpu_train", nodes, mem_mb=100000, attempt=1, cpus=16, gpus=2)
    # a method's own resources (methods.NAME.resources) are named as such
    with pytest.raises(cluster.ClusterFitError, match=r"set methods\.MEXMA\.resources\.mem_mb \(per GPU\) to at most 96000"):
        fit("gpu_train", nodes, mem_mb=100000, attempt=1, cpus=16, gpus=2, setting="methods.MEXMA.resources")
    with pytest.raises(cluster.ClusterFitError, match=r"8 GPUs on one node.*at most 4"):
        fit("gpu_train", nodes, mem_mb=1000, attempt=1, cpus=64, gpus=8)
    with pytest.raises(cluster.ClusterFitError, match=r"128 CPUs.*resources\.cpu_heavy\.cpus to at most 64"):
        fit("cpu_heavy", nodes, mem_mb=1000, attempt=1, cpus=128, gpus=0)
    with pytest.raises(cluster.ClusterFitError, match=r"need a GPU, but sinfo reports no node with gpu GRES"):
        fit("gpu_train", cluster.parse_sinfo("node2|20000|16|(null)\n"), mem_mb=1000, attempt=1, cpus=8, gpus=1)


# the same nodes with their partitions' time limits (sinfo %l): node1 in a 1-day and a 3-day
# GPU partition, node2 in an unlimited CPU one, node3 in a 12-hour one
SINFO_LIMITS = """node1|192000|64|gpu:a100:4(S:0-1)|1-00:00:00
node1|192000|64|gpu:a100:4(S:0-1)|3-00:00:00
node2|20000|16|(null)|infinite
node3|64000+|32|gpu:2,mps:100|12:00:00
"""


def test_runtimes_fit_the_longest_partition_that_can_run_the_job():
    nodes = cluster.parse_sinfo(SINFO_LIMITS)
    assert [(n.name, n.time_limit) for n in nodes] == [("node1", 3 * 1440), ("node2", None), ("node3", 720)]
    assert [cluster.parse_time_limit(t) for t in ("2-00:00:00", "1-12", "1-12:30", "12:00:00", "30:00", "90",
                                                  "infinite", "UNLIMITED")] == [
        2880, 2160, 2190, 720, 30, 90, None, None]
    fit = cluster.fit_runtime
    assert fit(nodes, runtime=5000, cpus=8, gpus=1) == 3 * 1440  # node1's 3-day partition
    assert fit(nodes, runtime=1440, cpus=8, gpus=1) == 1440  # shorter than the limit: as asked
    only_node3 = [n for n in nodes if n.name == "node3"]
    assert fit(only_node3, runtime=1440, cpus=8, gpus=2) == 720  # a 24-hour job where 12 hours is the most
    assert fit(nodes, runtime=99999, cpus=8, gpus=0) == 99999  # node2 is unlimited
    assert fit(nodes, runtime=1440, cpus=8, gpus=8) == 1440  # no node has 8 GPUs: fit_memory says so
    assert [n.time_limit for n in cluster.parse_sinfo(SINFO)] == [None, None, None]  # no %l: unlimited


# sinfo with partitions (%P): node1 in gpu (1 day) and gpu-long (3 days), node4 (more memory)
# in gpu-long only, node2 in the default partition cpu (unlimited)
SINFO_PARTITIONS = """node1|192000|64|gpu:a100:4|1-00:00:00|a100|gpu
node1|192000|64|gpu:a100:4|3-00:00:00|a100|gpu-long
node4|512000|64|gpu:a100:4|3-00:00:00|a100|gpu-long
node2|20000|16|(null)|infinite|(null)|cpu*
"""


def test_a_job_s_partition_chooses_the_nodes_and_the_time_limit():
    """The job's partition (the profile's or the config's; "" the default one) decides which
    nodes' memory and which partition's time limit bound it; one sinfo does not list stops the
    run; sinfo without partitions: every node, as before."""
    nodes = cluster.parse_sinfo(SINFO_PARTITIONS)
    assert [(n.name, n.time_limit, n.partitions) for n in nodes] == [
        ("node1", 4320, (("gpu", 1440, False), ("gpu-long", 4320, False))),
        ("node4", 4320, (("gpu-long", 4320, False),)), ("node2", None, (("cpu", None, True),))]
    assert cluster.partition_names(nodes) == ["cpu*", "gpu", "gpu-long"]
    fit, runtime = cluster.fit_memory, cluster.fit_runtime
    # the 1-day partition: node1 alone, its limit there (not its 3-day one elsewhere)
    assert runtime(nodes, runtime=5000, cpus=8, gpus=1, partition="gpu") == 1440
    assert fit("gpu_train", nodes, mem_mb=100000, attempt=9, cpus=8, gpus=1, partition="gpu") == 192000
    # the long partition, or both: node4's memory and 3 days
    assert runtime(nodes, runtime=5000, cpus=8, gpus=1, partition="gpu-long") == 4320
    assert fit("gpu_train", nodes, mem_mb=100000, attempt=9, cpus=8, gpus=1, partition="gpu,gpu-long") == 512000
    assert runtime(nodes, runtime=5000, cpus=8, gpus=1, partition="gpu,gpu-long") == 4320
    # "" is the default partition (cpu*): a GPU job there fits no node
    assert fit("cpu", nodes, mem_mb=8000, attempt=9, cpus=1, gpus=0, partition="") == 20000
    assert runtime(nodes, runtime=5000, cpus=1, gpus=0, partition="") == 5000
    with pytest.raises(cluster.ClusterFitError, match="need a GPU"):
        fit("gpu_train", nodes, mem_mb=1000, attempt=1, cpus=8, gpus=1, partition="")
    with pytest.raises(cluster.ClusterFitError, match=r"jobs of kind gpu_train go to the profile's set-resources: "
                                                      r"language_adapter: slurm_partition 'gpus', but sinfo lists no "
                                                      r"node in it \(sinfo %P: cpu\*, gpu, gpu-long\); change it in "
                                                      r"the profile"):
        fit("gpu_train", nodes, mem_mb=1000, attempt=1, cpus=8, gpus=1, partition="gpus",
            partition_setting="the profile's set-resources: language_adapter: slurm_partition")
    # sinfo without %P: the partition is not known, every node counts
    old = cluster.parse_sinfo("\n".join(line.rsplit("|", 1)[0] for line in SINFO_PARTITIONS.splitlines()))
    assert runtime(old, runtime=5000, cpus=8, gpus=1, partition="gpu") == 4320
    assert fit("gpu_train", old, mem_mb=1000, attempt=1, cpus=8, gpus=1, partition="nowhere") == 1000


# sinfo with features (%f): node1 (4 A100s) in a 1-day partition, node4 (2 H100s and 2 A100s of
# another kind) in a 2-day one, node2 without GPUs or features
SINFO_FEATURES = """node1|192000|64|gpu:a100:4(S:0-1)|1-00:00:00|a100,ib
node4|512000|64|gpu:h100:2,gpu:a100_80gb:2|2-00:00:00|h100,a100_80gb,ib
node2|20000|16|(null)|infinite|(null)
"""


def test_constraints_and_gpu_models_choose_the_nodes_and_impossible_ones_name_the_key():
    """A job's constraint (node features) and GPU model decide which nodes can run it: memory
    and time fit those; a constraint or model no node has stops the run, naming the key."""
    nodes = cluster.parse_sinfo(SINFO_FEATURES)
    assert [(n.name, sorted(n.features), n.gpu_models) for n in nodes] == [
        ("node1", ["a100", "ib"], (("a100", 4),)), ("node4", ["a100_80gb", "h100", "ib"], (("h100", 2), ("a100_80gb", 2))),
        ("node2", [], ())]
    features = nodes[1].features
    assert [cluster.satisfies(features, c) for c in ("h100", "a100", "h100&ib", "a100|h100", "(a100|h100)&ib",
                                                    "a100&(h100|ib)")] == [True, False, True, True, True, False]
    # forms it leaves to sbatch (every node kept): counts, matching or, commas, spaces, broken ones
    assert [cluster.satisfies(features, c) for c in ("h100*2", "[h100|a100]", "h100,ib", "h100 & ib", "h100&",
                                                    "(h100", "")] == [None] * 7
    assert cluster.gpu_models("gpu:a100:no_consume:4,gpu:2") == (("a100", 4),)
    untyped = cluster.parse_sinfo("node9|64000|32|gpu:4|infinite|(null)\n")  # not registered yet: no types
    assert cluster.fit_memory("gpu_train", untyped, mem_mb=1000, attempt=1, cpus=8, gpus=1, gpu_model="h100") == 1000
    fit, runtime = cluster.fit_memory, cluster.fit_runtime
    # the 80 GB A100s (node4's) or any node with ib: memory capped at the chosen nodes' largest
    assert fit("gpu_train", nodes, mem_mb=100000, attempt=9, cpus=8, gpus=1, gpu_model="a100_80gb") == 512000
    assert fit("gpu_train", nodes, mem_mb=100000, attempt=9, cpus=8, gpus=1, constraint="a100") == 192000
    assert runtime(nodes, runtime=5000, cpus=8, gpus=1, constraint="a100") == 1440  # node1's partition
    assert runtime(nodes, runtime=5000, cpus=8, gpus=1, gpu_model="h100") == 2880  # node4's
    assert runtime(nodes, runtime=5000, cpus=8, gpus=1, constraint="h100*2") == 2880  # not evaluated: all nodes
    with pytest.raises(cluster.ClusterFitError, match=r"jobs of kind gpu_train ask for 4 GPUs on one node.*at most 2"):
        fit("gpu_train", nodes, mem_mb=1000, attempt=1, cpus=8, gpus=4, gpu_model="h100")
    with pytest.raises(cluster.ClusterFitError, match=r"methods\.MEXMA\.resources\.constraint 'h200', but no node of "
                                                      r"this cluster has those features \(sinfo %f: a100, a100_80gb, h100, ib\)"):
        fit("gpu_train", nodes, mem_mb=1000, attempt=1, cpus=8, gpus=1, constraint="h200",
            setting="methods.MEXMA.resources")
    with pytest.raises(cluster.ClusterFitError, match=r"resources\.gpu_train\.gpu_model 'h100', but no node of this "
                                                      r"cluster with its constraint has GPUs of that type \(sinfo %G: a100\)"):
        fit("gpu_train", nodes, mem_mb=1000, attempt=1, cpus=8, gpus=1, constraint="a100", gpu_model="h100")


def test_the_resource_functions_ask_the_cluster_only_when_they_submit_to_slurm():
    namespace = {"config": {"resources": {"cpu_heavy": {"mem_mb": 300000}}}, "WorkflowError": ValueError}
    exec(compile((REPO / "rules" / "resources.smk").read_text(), "resources.smk", "exec"), namespace)
    heavy = namespace["job_resources"]("cpu_heavy")
    assert heavy["mem_mb"](None, 2) == 600000  # no cluster to ask: as configured
    namespace["_CLUSTER_NODES"].append(cluster.parse_sinfo(SINFO))
    with pytest.raises(ValueError, match=r"resources\.cpu_heavy\.mem_mb to at most 192000"):
        heavy["mem_mb"](None, 1)
    train = namespace["job_resources"]("gpu_train")
    assert [train["mem_mb"](None, a) for a in (1, 2, 9)] == [32000, 64000, 192000]
    assert [train["runtime"](None, a) for a in (1, 2, 3)] == [1440, 2160, 2880]  # no limits known
    namespace["_CLUSTER_NODES"][0] = [n for n in cluster.parse_sinfo(SINFO_LIMITS) if n.name == "node3"]
    assert [train["runtime"](None, a) for a in (1, 2, 3)] == [720, 720, 720]  # node3's 12-hour partition
    # a constraint in the config chooses the nodes (here node1's 1-day partition)
    namespace["config"]["resources"]["gpu_train"] = {"constraint": "a100&ib"}
    namespace["_CLUSTER_NODES"][0] = cluster.parse_sinfo(SINFO_FEATURES)
    train = namespace["job_resources"]("gpu_train")
    assert [train["runtime"](None, a) for a in (1, 2)] == [1440, 1440] and train["mem_mb"](None, 9) == 192000
    namespace["config"]["resources"]["gpu_train"] = {"gpu_model": "v100"}
    with pytest.raises(ValueError, match=r"resources\.gpu_train\.gpu_model 'v100'.*\(sinfo %G: a100, a100_80gb, h100\)"):
        namespace["job_resources"]("gpu_train")["mem_mb"](None, 1)


def _with_profile(config, set_resources=(), default_resources=(), sinfo=SINFO_FEATURES, namespace_out=None):
    """rules/resources.smk's job_resources over ``config``, under a profile with these
    set-resources ("RULE:KEY=VALUE", as Snakemake parses them) and default-resources, on a
    cluster whose sinfo says ``sinfo``."""
    from types import SimpleNamespace

    from snakemake.cli import parse_set_resources
    from snakemake.resources import Resources

    settings = SimpleNamespace(overwrite_resources=parse_set_resources(list(set_resources)),
                               default_resources=Resources.parse(list(default_resources), defaults="bare",
                                                                 allow_expressions=True))
    # each rule's resources as Snakemake merges them (default-resources, then the rule's own:
    # here the rule sets none of the default's keys)
    namespace = {"config": config, "WorkflowError": ValueError,
                 "workflow": SimpleNamespace(resource_settings=settings, executor_settings=None,
                                             get_rule=lambda name: SimpleNamespace(
                                                 resources=settings.default_resources.copy()))}
    exec(compile((REPO / "rules" / "resources.smk").read_text(), "resources.smk", "exec"), namespace)
    namespace["_CLUSTER_NODES"].append(cluster.parse_sinfo(sinfo))
    namespace["_LOCAL_CLUSTER"].append("here")  # scontrol show config's ClusterName
    if namespace_out is not None:
        namespace_out.update(namespace)
    return namespace["job_resources"]


def _fitted(job, rulename, wildcards=None):
    """(memory of the 20th attempt, time of the 3rd) of a rule's job."""
    return job["mem_mb"](wildcards, 20, rulename=rulename), job["runtime"](wildcards, 3, rulename=rulename)


def test_the_profile_s_constraint_and_gpu_model_choose_the_nodes_too():
    """A GPU model or constraint set in the profile (set-resources for a rule: it wins over the
    config's; default-resources: where the config sets none) chooses the nodes the memory and
    time are fitted to, as the config's do, and one no node has names the profile."""
    resources, fitted = _with_profile, _fitted
    big_cpu = {"mem_mb": 50000, "runtime": 2000}  # CPU jobs that reach the caps too
    # nothing in the profile: every GPU node (node4's 512 GB, 2-day partition)
    assert fitted(resources({})("gpu_train"), "language_adapter") == (512000, 2880)
    # the profile's gpu_model for the language adapters (node1's A100s, 1-day partition), quoted or
    # not; another rule's jobs and the CPU jobs are not affected
    job = resources({"resources": {"cpu": big_cpu}}, ["language_adapter:gpu_model=a100",
                                                      "language_adapter:slurm_partition=gpu"])
    assert fitted(job("gpu_train"), "language_adapter") == (192000, 1440)
    assert fitted(job("gpu_train"), "full_baseline") == (512000, 2880)
    assert fitted(job("cpu"), "corpus") == (512000, 2880)
    job = resources({"resources": {"gpu_train": {"constraint": "h100"}}}, ["language_adapter:constraint='a100&ib'"])
    assert fitted(job("gpu_train"), "language_adapter") == (192000, 1440)  # the profile's wins
    assert fitted(job("gpu_train"), "full_baseline") == (512000, 2880)  # the config's
    # default-resources apply where the config sets no constraint
    job = resources({"resources": {"cpu": big_cpu}}, default_resources=["constraint=a100"])
    assert fitted(job("cpu"), "corpus") == (192000, 1440)
    job = resources({"resources": {"cpu": {**big_cpu, "constraint": "a100_80gb"}}}, default_resources=["constraint=a100"])
    assert fitted(job("cpu"), "corpus") == (512000, 2880)
    # one that no node has stops the run, naming the profile's key
    job = resources({}, ["language_adapter:gpu_model=v100"])("gpu_train")
    with pytest.raises(ValueError, match=r"the profile's set-resources: language_adapter: gpu_model 'v100', but no "
                                         r"node of this cluster has GPUs of that type.*change it in the profile"):
        job["mem_mb"](None, 1, rulename="language_adapter")
    job = resources({}, default_resources=["constraint=bigmem"])("cpu_heavy")
    with pytest.raises(ValueError, match=r"the profile's default-resources: constraint 'bigmem', but no node"):
        job["mem_mb"](None, 1, rulename="corpus")
    # the partitions, as the repository's profile sets them: the GPU rules' own, "" (the default
    # partition) for the others; a config's partition for a kind where the profile sets none
    profile = (["language_adapter:slurm_partition=gpu"], ["slurm_partition=''"])
    job = resources({"resources": {"cpu": {**big_cpu, "mem_mb": 10000}}}, *profile, sinfo=SINFO_PARTITIONS)
    assert fitted(job("gpu_train"), "language_adapter") == (192000, 1440)  # node1 in gpu, 1 day
    assert fitted(job("cpu"), "corpus") == (20000, 2880)  # node2 in cpu*: its memory, no time limit
    job = resources({"resources": {"gpu_train": {"slurm_partition": "gpu-long"}}}, [], ["slurm_partition=''"],
                    sinfo=SINFO_PARTITIONS)
    assert fitted(job("gpu_train"), "full_baseline") == (512000, 2880)
    with pytest.raises(ValueError, match=r"go to the profile's set-resources: train_method: slurm_partition 'gpu_a100'"):
        resources({}, ["train_method:slurm_partition=gpu_a100"], sinfo=SINFO_PARTITIONS)("gpu_train")["mem_mb"](
            None, 1, rulename="train_method")


def test_the_node_choice_follows_what_snakemake_and_the_plugin_will_send(monkeypatch):
    """Only what will reach sbatch chooses nodes: a computed profile value, an empty one that
    cancels the config's, a default that a rule's own key (even unset) shadows, no partition
    (the default one), a partition the plugin picks itself; errors name the partition and the
    key a job inherited."""
    class Wildcards(dict):
        method = property(lambda self: self["method"])

    # an expression in the profile is Snakemake's to compute: it chooses no nodes (no refusal)
    job = _with_profile({}, ["language_adapter:gpu_model='v1' + '00'"])("gpu_train")
    assert _fitted(job, "language_adapter") == (512000, 2880)
    # so is an environment variable (Snakemake expands it)
    job = _with_profile({}, ["language_adapter:slurm_partition='$GPU_PARTITION'"], sinfo=SINFO_PARTITIONS)
    assert job("gpu_train")["mem_mb"](None, 99, rulename="language_adapter") == 512000
    # an empty constraint in set-resources replaces the config's (sbatch gets none), as does
    # None (YAML null, or an empty value: Snakemake drops the key)
    config = {"resources": {"gpu_train": {"constraint": "h200"}}}
    with pytest.raises(ValueError, match=r"resources\.gpu_train\.constraint 'h200'"):
        _with_profile(config)("gpu_train")["mem_mb"](None, 1, rulename="language_adapter")
    for empty in ("''", "None"):
        job = _with_profile(config, [f"language_adapter:constraint={empty}"])("gpu_train")
        assert _fitted(job, "language_adapter") == (512000, 2880), empty
    job = _with_profile({}, ["language_adapter:slurm_partition=None", "language_adapter:gpu_model=None"],
                        default_resources=["constraint=None"], sinfo=SINFO_PARTITIONS)
    with pytest.raises(ValueError, match=r"need a GPU, but no node in the default partition"):  # sent to cpu*
        job("gpu_train")["mem_mb"](None, 1, rulename="language_adapter")
    # a number is a partition's name too
    with pytest.raises(ValueError, match=r"slurm_partition '7', but sinfo lists no node in it"):
        _with_profile({}, ["language_adapter:slurm_partition=7"], sinfo=SINFO_PARTITIONS)("gpu_train")["mem_mb"](
            None, 1, rulename="language_adapter")
    # a key the rule sets for some jobs (one method's constraint) shadows default-resources for
    # all its jobs: the method without one sends no constraint, so the default does not count
    config = {"methods": {"A": {"resources": {"constraint": "a100"}}, "B": {}}}
    smk = {}
    _with_profile(config, default_resources=["constraint=bigmem"], namespace_out=smk)
    train = smk["job_resources"]("gpu_train", overrides=smk["method_resources"], own_keys=smk["method_resource_keys"]())
    assert _fitted(train, "train_method", Wildcards(method="A")) == (192000, 1440)
    assert _fitted(train, "train_method", Wildcards(method="B")) == (512000, 2880)
    # a method's job that keeps the kind's constraint: an error names the kind's key, not the method's
    config = {"resources": {"gpu_train": {"constraint": "h200"}},
              "methods": {"A": {"resources": {"gpu_model": "a100"}}, "B": {"resources": {"constraint": "a100"}}}}
    smk = {}
    _with_profile(config, namespace_out=smk)
    train = smk["job_resources"]("gpu_train", overrides=smk["method_resources"], own_keys=smk["method_resource_keys"]())
    with pytest.raises(ValueError, match=r"ask for nodes with resources\.gpu_train\.constraint 'h200'"):
        train["mem_mb"](Wildcards(method="A"), 1, rulename="train_method")
    assert train["mem_mb"](Wildcards(method="B"), 99, rulename="train_method") == 192000
    # no partition anywhere: the default one (node2 in cpu*); a GPU job there names the partition
    job = _with_profile({"resources": {"cpu": {"mem_mb": 10000}}}, sinfo=SINFO_PARTITIONS)
    assert job("cpu")["mem_mb"](None, 20, rulename="corpus") == 20000
    with pytest.raises(ValueError, match=r"need a GPU, but no node in the default partition has one \(sinfo\); send "
                                         r"them to a partition with GPUs \(sinfo %P: cpu\*, gpu, gpu-long\)"):
        job("gpu_encode")["mem_mb"](None, 1, rulename="english_embeddings")
    # a cluster without a default partition: sbatch decides, every node counts
    no_default = SINFO_PARTITIONS.replace("cpu*", "cpu")
    assert _with_profile({}, sinfo=no_default)("gpu_encode")["mem_mb"](None, 99, rulename="english_embeddings") == 512000
    # the plugin's partition config picks a partition for jobs without one: every node counts
    monkeypatch.setenv("SNAKEMAKE_SLURM_PARTITIONS", "partitions.yaml")
    assert _with_profile({}, sinfo=SINFO_PARTITIONS)("gpu_encode")["mem_mb"](
        None, 99, rulename="english_embeddings") == 512000
    monkeypatch.delenv("SNAKEMAKE_SLURM_PARTITIONS")
    # a partition on another cluster (slurm_cluster): local sinfo does not know it
    job = _with_profile({}, ["language_adapter:slurm_partition=remote", "language_adapter:slurm_cluster=other"],
                        sinfo=SINFO_PARTITIONS)
    # (nor its nodes: the memory is not capped at a local node's, as without sinfo)
    assert job("gpu_train")["mem_mb"](None, 99, rulename="language_adapter") == 99 * 32000
    # errors after a partition narrowed the nodes say so; an inherited key names its own section
    job = _with_profile({"resources": {"gpu_train": {"constraint": "h100"}}},
                        ["sentence_adapter:slurm_partition=gpu"], sinfo=SINFO_PARTITIONS)
    with pytest.raises(ValueError, match=r"jobs of kind gpu_adapter ask for nodes with resources\.gpu_train\.constraint "
                                         r"'h100', but no node in partition 'gpu' \(the profile's set-resources: "
                                         r"sentence_adapter: slurm_partition\) has those features \(sinfo %f: a100\)"):
        job("gpu_adapter")["mem_mb"](None, 1, rulename="sentence_adapter")


def test_the_local_cluster_s_name_comes_from_scontrol(tmp_path, monkeypatch):
    script = tmp_path / "scontrol"
    script.write_text("#!/bin/sh\necho 'Configuration data as of 2026-12-01T10:00:00'\n"
                      "echo 'AccountingStorageType   = (null)'\necho 'ClusterName             = gpu-east'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert cluster.local_cluster_name() == "gpu-east"
    script.write_text("#!/bin/sh\necho 'slurm_load_ctl_conf error: Unable to contact slurm controller' >&2\nexit 1\n")
    assert cluster.local_cluster_name() is None


def test_the_profile_s_own_sizes_are_checked_against_the_nodes(monkeypatch):
    """What the profile sets in place of the rule's fitted memory, time and CPUs (set-resources,
    or default-resources the rule does not set), and what Snakemake computes, is checked as
    sbatch will get it (the onstart's check_request): a runtime over the partition's time limit
    (the job would wait forever), memory or CPUs no node has; each error names the key."""
    from types import SimpleNamespace

    def checker(set_resources=(), default_resources=()):
        smk = {}
        _with_profile({}, set_resources, default_resources, sinfo=SINFO_PARTITIONS, namespace_out=smk)
        return smk["job_resources"], smk["check_request"]

    la = {"gpu": 1, "cpus_per_gpu": 8, "nodes": 1, "mem_mb": 32000, "runtime": 1440, "slurm_partition": "gpu"}
    # the rule's own values, fitted by job_resources, pass
    job_resources, check = checker(["language_adapter:slurm_partition=gpu"])
    job = job_resources("gpu_train")
    fitted = {**la, "mem_mb": job["mem_mb"](None, 1, rulename="language_adapter"),
              "runtime": job["runtime"](None, 1, rulename="language_adapter")}
    assert (fitted["mem_mb"], fitted["runtime"]) == (32000, 1440)
    check("language_adapter", fitted, 8)
    # the profile's time for the 1-day partition: two days would never start
    _, check = checker(["language_adapter:slurm_partition=gpu", "language_adapter:runtime=2880"])
    with pytest.raises(ValueError, match=r"^jobs of rule language_adapter ask for 2880 minutes \(the profile's "
                                         r"set-resources: language_adapter: runtime\), but the longest time limit in "
                                         r"partition 'gpu' for a node that can run them is 1440 minutes \(sinfo %l\)"):
        check("language_adapter", {**la, "runtime": 2880}, 8)
    check("language_adapter", {**la, "runtime": 2880, "slurm_partition": "gpu-long"}, 8)  # 3 days there
    check("language_adapter", {**la, "runtime": 2880, "slurm_partition": "gpu,gpu-long"}, 8)
    # the profile's memory: more than gpu-long's largest node
    _, check = checker(["language_adapter:mem_mb=600000"])
    with pytest.raises(ValueError, match=r"ask for 600000 MB of memory \(the profile's set-resources: language_adapter: "
                                         r"mem_mb\), but no node in partition 'gpu-long' that has their 8 CPUs and 1 "
                                         r"GPUs has more than 512000 MB \(sinfo %m\); sbatch would reject them: ask for "
                                         r"at most 512000"):
        check("language_adapter", {**la, "mem_mb": 600000, "slurm_partition": "gpu-long"}, 8)
    # --mem-per-cpu (which the plugin prefers) times the CPUs; CPUs per task from default-resources
    _, check = checker(["corpus:mem_mb_per_cpu=6000"], ["cpus_per_task=4"])
    cpu_job = {"mem_mb": 8000, "runtime": 120}
    check("corpus", {**cpu_job, "mem_mb_per_cpu": 4000, "cpus_per_task": 4}, 1)  # 16000 of node2's 20000
    with pytest.raises(ValueError, match=r"jobs of rule corpus ask for 24000 MB of memory \(the profile's "
                                         r"set-resources: corpus: mem_mb_per_cpu\), but no node in the default "
                                         r"partition that has their 4 CPUs has more than 20000 MB"):
        check("corpus", {**cpu_job, "mem_mb_per_cpu": 6000, "cpus_per_task": 4}, 1)
    with pytest.raises(ValueError, match=r"ask for 32 CPUs \(the profile's default-resources: cpus_per_task\), but "
                                         r"no node in the default partition has more than 16 \(sinfo %c\)"):
        check("corpus", {**cpu_job, "cpus_per_task": 32}, 1)
    with pytest.raises(ValueError, match=r"ask for 32 CPUs \(the rule's threads, or the profile's set-threads\)"):
        check("corpus", cpu_job, 32)
    # a value Snakemake computed (an environment variable), which job_resources let through,
    # is checked as it came out; so are typed GPUs asked for through gres
    job_resources, check = checker(["language_adapter:gpu_model='$GPU_MODEL'",
                                    "language_adapter:slurm_partition=gpu"])
    assert job_resources("gpu_train")["mem_mb"](None, 1, rulename="language_adapter") == 32000
    with pytest.raises(ValueError, match=r"ask for GPUs of type 'v100' \(the profile's set-resources: "
                                         r"language_adapter: gpu_model\), but no node in partition 'gpu' has them "
                                         r"\(sinfo %G: a100\)"):
        check("language_adapter", {**la, "gpu_model": "v100"}, 8)
    _, check = checker()
    with pytest.raises(ValueError, match=r"ask for 8 GPUs on one node \(the rule's gres"):
        check("language_adapter", {"gres": "gpu:a100:8", "mem_mb": 1000, "slurm_partition": "gpu"}, 1)
    check("language_adapter", {"gres": "gpu:a100:4", "mem_mb": 1000, "slurm_partition": "gpu"}, 1)
    # a GPU model for every job (default-resources) would give each CPU job a GPU of that model
    _, check = checker(default_resources=["gpu_model=a100"])
    check("language_adapter", {**la, "gpu_model": "a100"}, 8)
    with pytest.raises(ValueError, match=r"jobs of rule corpus have gpu_model 'a100' \(the profile's default-resources: "
                                         r"gpu_model\) but ask for no GPU; the SLURM plugin would ask for one GPU of "
                                         r"that model for each \(--gpus=a100:1\)"):
        check("corpus", {**cpu_job, "gpu_model": "a100"}, 1)
    # a job for another cluster: local sinfo knows none of its nodes, so nothing is fitted or checked
    job_resources, check = checker(["language_adapter:slurm_cluster=other"])
    assert job_resources("gpu_train")["mem_mb"](None, 20, rulename="language_adapter") == 20 * 32000
    check("language_adapter", {**la, "mem_mb": 10 ** 7, "runtime": 10 ** 5, "slurm_cluster": "other"}, 8)
    check("language_adapter", {**la, "mem_mb": 10 ** 7, "clusters": "here,other"}, 8)  # either
    # this cluster by its name is this cluster; an emptied set-resources value wins over a default
    long = "language_adapter:slurm_partition=gpu-long"
    for profile in (([long, "language_adapter:slurm_cluster=here"], []),
                    ([long, "language_adapter:slurm_cluster=None"], ["slurm_cluster=other"])):
        job_resources, check = checker(*profile)
        assert job_resources("gpu_train")["mem_mb"](None, 20, rulename="language_adapter") == 512000
    with pytest.raises(ValueError, match=r"ask for 10000000 MB of memory"):
        check("language_adapter", {**la, "mem_mb": 10 ** 7, "slurm_cluster": "here"}, 8)
    # a QOS may allow more time than the partition: the runtime is sbatch's to judge
    _, check = checker(["language_adapter:qos=long", "language_adapter:runtime=2880"])
    check("language_adapter", {**la, "runtime": 2880, "qos": "long"}, 8)
    check("language_adapter", {**la, "runtime": 2880, "slurm_extra": "--exclusive -q long"}, 8)
    with pytest.raises(ValueError, match=r"ask for 2880 minutes"):  # not a QOS option
        check("language_adapter", {**la, "runtime": 2880, "slurm_extra": "--exclusive --quiet"}, 8)
    # GPUs through gres, as the plugin reads them: "gpu" is one GPU, whose CPUs are cpus_per_gpu
    _, check = checker(["language_adapter:gres='gpu:v100:1'"])
    check("language_adapter", {"gres": "gpu", "cpus_per_gpu": 8, "slurm_partition": "gpu"}, 128)
    with pytest.raises(ValueError, match=r"ask for GPUs of type 'v100' \(the profile's set-resources: "
                                         r"language_adapter: gres\)"):
        check("language_adapter", {"gres": "gpu:v100:1", "slurm_partition": "gpu"}, 8)
    # a key the rule sets itself wins over default-resources, and the error says so (the rule's
    # resources as Snakemake merges them: default-resources, then the rule's own)
    smk = {}
    _with_profile({}, (), ["cpus_per_task=32"], sinfo=SINFO_PARTITIONS, namespace_out=smk)
    default = smk["workflow"].resource_settings.default_resources
    rules = {"corpus": default.copy(), "fasttext": default.copy()}
    rules["fasttext"].update({"cpus_per_task": 48})
    smk["workflow"].get_rule = lambda name: SimpleNamespace(resources=rules[name])
    for rule, cpus, source in (("corpus", 32, "the profile's default-resources: cpus_per_task"),
                               ("fasttext", 48, "the rule's cpus_per_task")):
        with pytest.raises(ValueError, match=rf"ask for {cpus} CPUs \({source}"):
            smk["check_request"](rule, {**cpu_job, "cpus_per_task": cpus}, 1)
    # no default partition, or the plugin's partition config: every node counts (node4's 3 days)
    monkeypatch.setenv("SNAKEMAKE_SLURM_PARTITIONS", "partitions.yaml")
    check("language_adapter", {**la, "runtime": 4000, "slurm_partition": None}, 8)
    monkeypatch.delenv("SNAKEMAKE_SLURM_PARTITIONS")
    with pytest.raises(ValueError, match=r"ask for 1 GPUs on one node .*no node in the default partition has more than 0"):
        check("language_adapter", {**la, "slurm_partition": None}, 8)

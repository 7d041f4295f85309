"""The workflow on a real SLURM cluster through the profile, as `snakemake --profile slurm`.

The test starts a single-node cluster on this machine (munged, slurmctld, slurmd; Debian's
packages, which .ci/run installs) with two fake GPUs, runs a two-language variant of
configs/test.yaml from a copy of the repository, and checks that every job went through
sbatch, that GPU jobs got a GPU and CPU jobs none, and that the outputs are complete. It needs
root (it writes /etc/slurm/slurm.conf, which srun inside the jobs reads) and is skipped, with
the reason, where that or the SLURM binaries are missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, rule_blocks

SLURM_CONF = Path("/etc/slurm/slurm.conf")
GRES_CONF = Path("/etc/slurm/gres.conf")
MARK = "# test cluster of tests/test_slurm.py: removed when the test ends"
BINARIES = ["munged", "munge", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "srun"]
# what the repository copy needs to run (not outputs, caches or the environment)
NOT_COPIED = {".git", ".venv", ".snakemake", ".pytest_cache", ".ruff_cache", "results",
              "resources", "logs", "benchmarks", "tests", "build", "__pycache__"}

GPU_RULES = {"language_adapter", "sentence_adapter", "english_embeddings", "english_embeddings_provided",
             "alignment_adapter", "train_method"}
BASE = "tiny"
TARGETS = [
    f"results/{BASE}/language_adapters/summary.md",
    f"results/{BASE}/sentence_adapters/summary.md",
    f"results/{BASE}/alignment/summary.md",
    f"results/{BASE}/alignment/merged-0.5/ky",
    "resources/inputs_summary.md",
    f"results/{BASE}/methods/mST5-en",
]
# one method with its own resources (methods.NAME.resources): a node feature, time and CPUs
# that no other job asks for; the node has the feature (FEATURE)
FEATURE = "bigmem_gpu"
METHOD = {"mST5-en": {"datasets": None, "batch_size": 8, "seq_len": 32, "max_steps": 2, "eval_pairs": 10,
                      "resources": {"constraint": FEATURE, "runtime": 77, "cpus": 3}}}


def test_every_rule_declares_its_resources_in_the_profile_s_terms():
    """Every rule takes a kind's resources from rules/resources.smk and no thread count from
    workflow.cores (a SLURM run has no --cores, so it would stop planning), and the profile
    sends exactly the GPU kinds' rules to the GPU partition."""
    blocks = rule_blocks()
    assert len(blocks) > 20
    kinds = {}
    for rule, text in blocks.items():
        assert "workflow.cores" not in text, f"rule {rule}: threads: job_threads(kind), not workflow.cores"
        found = re.findall(r'job_resources\("(\w+)"', text)
        assert len(found) == 1, f"rule {rule}: add resources: **job_resources(kind) (rules/resources.smk)"
        kinds[rule] = found[0]
    profile = yaml.safe_load((REPO / "slurm" / "config.yaml").read_text())
    gpu_rules = {rule for rule, kind in kinds.items() if kind.startswith("gpu_")}
    in_profile = {rule for rule, values in profile["set-resources"].items() if "slurm_partition" in values}
    assert gpu_rules == in_profile, (
        f"GPU rules missing from slurm/config.yaml set-resources (add `RULE: *gpu_jobs`): "
        f"{sorted(gpu_rules - in_profile)}; not GPU rules there: {sorted(in_profile - gpu_rules)}")
    assert profile["executor"] == "slurm" and profile["slurm-status-command"] == "squeue"


def _resources_module(config: dict) -> dict:
    """rules/resources.smk's functions over ``config`` (the file holds plain Python)."""
    namespace = {"config": config, "WorkflowError": ValueError}
    exec(compile((REPO / "rules" / "resources.smk").read_text(), "resources.smk", "exec"), namespace)
    return namespace


def test_resource_kinds_grow_with_the_attempt_and_take_config_overrides():
    smk = _resources_module({})
    train = smk["job_resources"]("gpu_train")
    assert (train["gpu"], train["cpus_per_gpu"], smk["job_threads"]("gpu_train")) == (1, 8, 8)
    assert train["nodes"] == 1  # --nodes=1: SLURM may not spread a job's GPUs over nodes
    assert [train["mem_mb"](None, attempt) for attempt in (1, 2, 3)] == [32000, 64000, 96000]
    assert [train["runtime"](None, attempt) for attempt in (1, 2, 3)] == [1440, 2160, 2880]
    assert smk["job_resources"]("gpu_translate")["runtime"](None, 9) == 48 * 60  # capped
    cpu = smk["job_resources"]("cpu_heavy")
    assert "gpu" not in cpu and "cpus_per_gpu" not in cpu and smk["job_threads"]("cpu_heavy") == 8
    assert "nodes" not in cpu  # the plugin gives a CPU job one task: one node
    with pytest.raises(ValueError, match="unknown resource kind"):
        smk["job_resources"]("gpu")
    # a multi-GPU job (language_adapter.gpus): GPUs, CPUs and memory scale with its GPU count
    two = smk["job_resources"]("gpu_train", gpus=lambda wildcards: wildcards["gpus"])
    assert (two["gpu"]({"gpus": 2}), two["cpus_per_gpu"], two["mem_mb"]({"gpus": 2}, 2)) == (2, 8, 128000)
    assert two["nodes"] == 1
    assert smk["job_threads"]("gpu_train", gpus=lambda wildcards: 2)({}) == 16
    with pytest.raises(ValueError, match="no GPU"):
        smk["job_resources"]("cpu", gpus=2)
    smk = _resources_module({"resources": {"gpu_train": {"mem_mb": 80000, "cpus": 16, "gpu_model": "a100",
                                                         "slurm_partition": "gpu-long"}}})
    train = smk["job_resources"]("gpu_train")
    assert train["mem_mb"](None, 1) == 80000 and train["cpus_per_gpu"] == 16
    assert (train["gpu_model"], train["slurm_partition"]) == ("a100", "gpu-long")
    assert smk["job_threads"]("gpu_train") == 16


def test_the_adapters_jobs_ask_for_less_time_and_follow_the_training_jobs_other_keys():
    """gpu_adapter (SE, CLA and their ablations): gpu_train's request with 4 h instead of 24 h;
    the config's resources.gpu_train reach it except its runtime, resources.gpu_adapter win."""
    smk = _resources_module({})
    adapter, train = smk["job_resources"]("gpu_adapter"), smk["job_resources"]("gpu_train")
    assert [adapter["runtime"](None, attempt) for attempt in (1, 2, 3)] == [240, 360, 540]
    assert [adapter["mem_mb"](None, a) for a in (1, 2)] == [train["mem_mb"](None, a) for a in (1, 2)]
    assert (adapter["gpu"], adapter["cpus_per_gpu"], adapter["nodes"]) == (1, 8, 1)
    smk = _resources_module({"resources": {"gpu_train": {"runtime": 2880, "max_runtime": 600, "cpus": 1,
                                                         "constraint": "a100", "qos": "gpu"}}})
    adapter = smk["job_resources"]("gpu_adapter")
    assert [adapter["runtime"](None, attempt) for attempt in (1, 2, 3)] == [240, 360, 540]
    assert adapter["runtime"](None, 4) == 600  # gpu_train's max_runtime caps its retries too
    assert (adapter["cpus_per_gpu"], smk["job_threads"]("gpu_adapter")) == (1, 1)
    assert (adapter["constraint"], adapter["qos"]) == ("a100", "gpu")
    assert smk["job_resources"]("gpu_train")["runtime"](None, 1) == 2880
    smk = _resources_module({"resources": {"gpu_train": {"constraint": "a100", "cpus": 4},
                                           "gpu_adapter": {"runtime": 30, "constraint": "v100"}}})
    adapter = smk["job_resources"]("gpu_adapter")
    assert (adapter["runtime"](None, 1), adapter["constraint"], adapter["cpus_per_gpu"]) == (30, "v100", 4)
    assert smk["job_resources"]("gpu_train")["constraint"] == "a100"
    # the rules of the adapters take the kind; the language adapter keeps gpu_train's
    blocks = rule_blocks()
    for rule in ("sentence_adapter", "alignment_adapter", "ablation_sentence_adapter", "ablation_alignment_adapter"):
        assert 'job_resources("gpu_adapter")' in blocks[rule], rule
    assert 'job_resources("gpu_train"' in blocks["language_adapter"]
    # the schema accepts the kind's section (and still refuses an unknown one)
    from modsent import config as modsent_config

    schema = modsent_config.load_schema()
    assert not [p for p in modsent_config.schema_errors({"resources": {"gpu_adapter": {"runtime": 60}}}, schema)
                if "resources" in p]
    assert [p for p in modsent_config.schema_errors({"resources": {"gpu_adaptor": {"runtime": 60}}}, schema)
            if "gpu_adaptor" in p]


def test_a_method_s_own_resources_apply_to_its_training_job_only():
    """methods.NAME.resources over the gpu_train kind (and the config's resources.gpu_train), for
    that method's job; a key neither sets (constraint) is not requested (None: Snakemake drops it)."""
    config = {"resources": {"gpu_train": {"mem_mb": 40000, "qos": "normal"}},
              "methods": {"Big": {"resources": {"constraint": "a100_80gb", "gpu_model": "a100", "mem_mb": 90000,
                                                "cpus": 12, "runtime": 600, "qos": "long"}},
                          "Small": {"gpus": 2}}}
    smk = _resources_module(config)

    class Wildcards(dict):
        method = property(lambda self: self["method"])

    big, small = Wildcards(method="Big"), Wildcards(method="Small")
    gpus = {"Big": 1, "Small": 2}
    assert smk["method_resource_keys"]() == ["constraint", "gpu_model", "qos"]
    train = smk["job_resources"]("gpu_train", gpus=lambda w: gpus[w.method], overrides=smk["method_resources"],
                                 own_keys=smk["method_resource_keys"]())
    threads = smk["job_threads"]("gpu_train", gpus=lambda w: gpus[w.method], overrides=smk["method_resources"])
    assert [train[key](big) for key in ("constraint", "gpu_model", "qos", "cpus_per_gpu", "gpu")] == [
        "a100_80gb", "a100", "long", 12, 1]
    assert [train[key](small) for key in ("constraint", "gpu_model", "qos", "cpus_per_gpu", "gpu")] == [
        None, None, "normal", 8, 2]
    assert [train["mem_mb"](big, 1), train["mem_mb"](big, 2), train["mem_mb"](small, 1)] == [90000, 180000, 80000]
    assert [train["runtime"](big, 1), train["runtime"](big, 2), train["runtime"](small, 1)] == [600, 900, 1440]
    assert (threads(big), threads(small), train["nodes"]) == (12, 16, 1)
    # a key no method sets is not the rule's (a profile's default-resources value stays in force)
    del config["methods"]["Big"]
    smk = _resources_module(config)
    train = smk["job_resources"]("gpu_train", overrides=smk["method_resources"],
                                 own_keys=smk["method_resource_keys"]())
    assert "constraint" not in train and "gpu_model" not in train and train["qos"] == "normal"
    # the rule's definition: a method's resources reach its job, none of them its params
    assert "overrides=method_resources, own_keys=method_resource_keys()" in rule_blocks()["train_method"]


def test_a_translation_model_s_conversion_asks_for_memory_by_its_size():
    """convert_translation_model: ~8 bytes a parameter when the model id names its size (a first
    attempt at cpu_heavy's 16 GB is killed converting nllb-200-3.3B), never less than the kind's;
    the config's resources.cpu_heavy.mem_mb decides when set."""
    def memory(model, resources=None):
        smk = _resources_module({"translation": {"model": model}, "resources": resources or {}})
        convert = smk["job_resources"]("cpu_heavy", overrides=smk["conversion_resources"])
        return convert["mem_mb"]({}, 1), convert["mem_mb"]({}, 2), convert["runtime"]({}, 1)

    assert memory("facebook/nllb-200-3.3B") == (26400, 52800, 480)
    assert memory("facebook/nllb-200-distilled-600M") == (16000, 32000, 480)
    assert memory("facebook/nllb-200-distilled-1.3B") == (16000, 32000, 480)  # 10,400 MB: the kind's 16 GB
    assert memory("my/local-nllb") == (16000, 32000, 480)  # no size in the name
    assert memory("facebook/nllb-200-3.3B", {"cpu_heavy": {"mem_mb": 20000}}) == (20000, 40000, 480)
    assert "overrides=conversion_resources" in rule_blocks()["convert_translation_model"]


def _cluster_config(state: Path) -> str:
    # A node that declares what the paper's resource classes ask for (32 CPUs, 250 GB, two
    # GPUs): SlurmdParameters=config_overrides makes slurmd take slurm.conf's word for it, so
    # the jobs request exactly what they would on a cluster. No accounting (slurmdbd): the
    # profile's squeue status checks must work without it; jobcomp/filetxt records every job.
    return f"""{MARK}
ClusterName=modsenttest
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/d
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
MinJobAge=3600
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={state}/jobcomp.txt
GresTypes=gpu
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=32 RealMemory=256000 Gres=gpu:2 Feature={FEATURE} State=UNKNOWN
PartitionName=cpu Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=localhost MaxTime=INFINITE State=UP
"""


GRES = f"""{MARK}
AutoDetect=off
NodeName=localhost Name=gpu File=/dev/null
NodeName=localhost Name=gpu File=/dev/zero
"""


def _running(name: str) -> bool:
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() == name:
                return True
        except OSError:
            pass
    return False


def _skip_reason() -> str | None:
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (f"SLURM is not installed (missing {', '.join(missing)}): apt-get install "
                "slurmctld slurmd slurm-client munge, as .ci/run does")
    if os.geteuid() != 0:
        return "starting a SLURM cluster needs root (/etc/slurm/slurm.conf, the daemons)"
    for conf in (SLURM_CONF, GRES_CONF):
        if conf.exists() and MARK not in conf.read_text(errors="replace"):
            return f"{conf} belongs to another SLURM installation; not overwriting it"
    for daemon in ("slurmctld", "slurmd"):
        if _running(daemon):
            return f"a {daemon} is already running on this machine"
    return None


def _wait_for(what: str, check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise TimeoutError(f"timed out waiting for {what}")


def _node_idle() -> bool:
    proc = subprocess.run(["sinfo", "-h", "-n", "localhost", "-o", "%T"], capture_output=True, text=True)
    return proc.returncode == 0 and proc.stdout.split() != [] and proc.stdout.split()[0] == "idle"


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """munged (unless one runs already), slurmctld and slurmd; stopped by PID afterwards."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("slurm")
    started: list[subprocess.Popen] = []
    logs = []
    try:
        SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SLURM_CONF.write_text(_cluster_config(state))
        GRES_CONF.write_text(GRES)
        if not _running("munged"):
            run_dir = Path("/run/munge")
            run_dir.mkdir(parents=True, exist_ok=True)
            shutil.chown(run_dir, "munge", "munge")
            if not Path("/etc/munge/munge.key").exists() and shutil.which("mungekey"):
                subprocess.run(["mungekey", "--create"], check=True, user="munge", group="munge")
            logs.append(open(state / "munged.err", "w"))
            started.append(subprocess.Popen(["munged", "--foreground"], user="munge", group="munge",
                                            stdout=subprocess.DEVNULL, stderr=logs[-1]))
            _wait_for("munged", lambda: subprocess.run(["munge", "-n"], capture_output=True).returncode == 0)
        for command in (["slurmctld", "-D", "-c", "-i"], ["slurmd", "-D", "-N", "localhost"]):
            logs.append(open(state / f"{command[0]}.err", "w"))
            started.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=logs[-1]))
            time.sleep(1)
        _wait_for("the node to be idle", _node_idle)
        yield state
    finally:
        for name in ("squeue", "scancel"):
            if shutil.which(name) is None:
                break
        else:  # cancel what is left of this cluster's jobs before its daemons go
            ids = subprocess.run(["squeue", "-h", "-o", "%i", "-t", "PENDING,RUNNING"],
                                 capture_output=True, text=True).stdout.split()
            if ids:
                subprocess.run(["scancel", *ids], capture_output=True)
        for proc in reversed(started):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
        for conf in (SLURM_CONF, GRES_CONF):
            if conf.exists() and MARK in conf.read_text(errors="replace"):
                conf.unlink()


def _copy_repository(dest: Path) -> Path:
    """The workflow and the profile, as a user's checkout (no outputs, no caches)."""
    ignore = shutil.ignore_patterns(*NOT_COPIED, "*.egg-info", "report.html")
    for item in REPO.iterdir():
        if item.name in NOT_COPIED or item.name.endswith(".egg-info"):
            continue
        if item.is_dir():
            shutil.copytree(item, dest / item.name, ignore=ignore)
        else:
            shutil.copy2(item, dest / item.name)
    return dest


@pytest.fixture(scope="module")
def slurm_run(slurm_cluster, tmp_path_factory):
    root = _copy_repository(tmp_path_factory.mktemp("checkout"))
    config = yaml.safe_load((root / "configs" / "test.yaml").read_text())
    config["languages"] = ["en", "ky"]
    config["alignment"]["merge_weights"] = [0.5]
    config["language_adapter"]["gpus"] = 2  # a multi-GPU job: both GPUs of the node
    config["methods"] = METHOD
    (root / "slurm-test.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "CUDA_VISIBLE_DEVICES"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    # `--profile slurm` as typed from the repository root; only the first status check is
    # made sooner than the profile's 40 s, for a test of many seconds-long jobs
    command = [shutil.which("snakemake", path=env["PATH"]), "--profile", "slurm",
               "--configfile", "slurm-test.yaml", "--slurm-init-seconds-before-status-checks", "2",
               *TARGETS]
    started = time.monotonic()
    proc = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - started
    output = proc.stdout + proc.stderr
    (slurm_cluster / "snakemake.out").write_text(output)
    assert proc.returncode == 0, f"snakemake --profile slurm failed after {seconds:.0f} s:\n{output[-8000:]}"
    print(f"snakemake --profile slurm: {seconds:.0f} s")
    return root, output, slurm_cluster, env


def _submissions(output: str) -> dict[str, str]:
    """SLURM job id -> rule, from the plugin's 'submitted with SLURM jobid' lines."""
    found = re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*/slurm_logs/rule_(\w+)/", output)
    return {job_id: rule for job_id, rule in found}


def _job_records(state: Path) -> dict[str, dict[str, str]]:
    records = {}
    for line in (state / "jobcomp.txt").read_text().splitlines():
        fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
        records[fields["JobId"]] = fields
    return records


@pytest.mark.workflow
def test_every_job_went_through_sbatch(slurm_run):
    root, output, state, env = slurm_run
    planned = subprocess.run([shutil.which("snakemake", path=env["PATH"]), "--configfile", "slurm-test.yaml",
                              "-n", "--forceall", *TARGETS],
                             cwd=root, env=env, capture_output=True, text=True)
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", planned.stdout, flags=re.M))
    expected = sum(int(n) for rule, n in counts.items() if rule != "total")
    submitted = _submissions(output)
    run_id = re.search(r"SLURM run ID: (\S+)", output).group(1)
    records = _job_records(state)
    ours = {job_id: r for job_id, r in records.items() if r["Name"] == run_id}
    assert len(submitted) == expected > 20
    assert set(submitted) == set(ours)  # each submission is a job slurmctld ran, and no other
    assert {r["JobState"] for r in ours.values()} == {"COMPLETED"}
    for job_id, rule in submitted.items():
        partition = "gpu" if rule in GPU_RULES else "cpu"  # the profile's set-resources
        assert ours[job_id]["Partition"] == partition, (rule, ours[job_id])
    assert GPU_RULES <= set(submitted.values())


def _job_line(log: Path) -> str:
    """The first record of a rule's log: host, SLURM job, CUDA_VISIBLE_DEVICES."""
    for line in log.read_text(encoding="utf-8").splitlines():
        if "CUDA_VISIBLE_DEVICES=" in line:
            return line
    raise AssertionError(f"{log} does not say where it ran")


@pytest.mark.workflow
def test_gpu_jobs_got_a_gpu_and_cpu_jobs_none(slurm_run):
    root, _, _, _ = slurm_run
    logs = root / "logs"
    for lang in ["en", "ky"]:  # language_adapter.gpus: 2
        line = _job_line(logs / BASE / "language_adapters" / f"{lang}.log")
        assert re.search(r"SLURM job \d+, CUDA_VISIBLE_DEVICES=(0,1|1,0)$", line), line
    gpu_logs = [logs / BASE / "sentence_adapters" / "en.log", logs / BASE / "sentence_adapters" / "ky.log",
                logs / BASE / "alignment" / "english_embeddings.log", logs / BASE / "alignment" / "pp" / "ky.log", logs / BASE / "alignment" / "pl" / "ky.log"]
    cpu_logs = [logs / "corpora" / "ky.log", logs / BASE / "tokenizers" / "ky.log",
                logs / BASE / "embeddings" / "ky.log", logs / BASE / "alignment" / "merged-0.5" / "ky.log",
                logs / BASE / "alignment" / "summary.log"]
    for log in gpu_logs:
        line = _job_line(log)
        assert re.search(r"SLURM job \d+, CUDA_VISIBLE_DEVICES=[01]$", line), (log, line)
    for log in cpu_logs:
        line = _job_line(log)
        assert re.search(r"SLURM job \d+, CUDA_VISIBLE_DEVICES=unset$", line), (log, line)


def _job_details(job_id: str) -> dict[str, str]:
    """scontrol's record of a job (kept MinJobAge seconds after it ends)."""
    line = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True,
                          check=True).stdout
    return dict(item.split("=", 1) for item in line.split() if "=" in item)


@pytest.mark.workflow
def test_a_method_s_own_resources_reach_sbatch_and_no_other_job(slurm_run):
    """methods.mST5-en.resources: its job asked for the node feature, 77 minutes and 3 CPUs; the
    other GPU jobs for their kind's time (gpu_train's 24 h, gpu_adapter's 4 h) and no feature (a
    key a job does not set is left out of its sbatch call, not sent empty)."""
    root, output, _, _ = slurm_run
    submitted = _submissions(output)
    method = [job_id for job_id, rule in submitted.items() if rule == "train_method"]
    limits = {"language_adapter": "1-00:00:00", "sentence_adapter": "04:00:00"}
    others = [(job_id, rule) for job_id, rule in submitted.items() if rule in limits]
    assert len(method) == 1 and {rule for _, rule in others} == set(limits)
    details = _job_details(method[0])
    assert (details["Features"], details["TimeLimit"], details["NumCPUs"]) == (FEATURE, "01:17:00", "3"), details
    for job_id, rule in others:
        details = _job_details(job_id)
        assert (details["Features"], details["TimeLimit"]) == ("(null)", limits[rule]), (rule, details)


@pytest.mark.workflow
def test_outputs_complete_and_nothing_left_to_do(slurm_run):
    import json

    root, _, _, env = slurm_run
    for target in TARGETS:
        assert (root / target).exists(), target
    for lang in ["en", "ky"]:
        assert json.loads((root / f"results/{BASE}/sentence_adapters/{lang}/metrics.json").read_text())["steps"] == 4
    for kind in ["pp", "pl"]:
        assert (root / f"results/{BASE}/alignment/{kind}/ky/metrics.json").is_file()
    leases = root / ".modsent" / "leases"
    assert leases.is_dir() and not list(leases.glob("*.json"))  # the jobs took leases, and released them
    proc = subprocess.run([shutil.which("snakemake", path=env["PATH"]), "--configfile", "slurm-test.yaml",
                           "-n", *TARGETS], cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]


def _snakemake_slurm(root: Path, env: dict, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("snakemake", path=env["PATH"]), "--profile", "slurm",
                           "--slurm-init-seconds-before-status-checks", "2", *args],
                          cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


ORPHAN = """
import sys, time
from modsent import leases
leases.take([sys.argv[1]], rule="merge_alignment")
time.sleep(600)
"""


@pytest.mark.workflow
def test_a_restart_does_not_submit_a_job_whose_earlier_job_still_runs(slurm_run):
    """A job of an earlier run that Snakemake lost still runs on the cluster: the restart stops
    before removing its output or submitting anything, names the job and how to cancel it, and
    runs once the job is cancelled."""
    root, _, _, env = slurm_run
    merged = f"results/{BASE}/alignment/merged-0.5/ky"
    before = sorted(p.name for p in (root / merged).iterdir())
    job = subprocess.run(["sbatch", "--parsable", "-p", "cpu", "-o", str(root / "orphan.out"), "--wrap",
                          f"cd {root} && {sys.executable} -c '{ORPHAN}' {merged}"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        from modsent.leases import lease_path

        _wait_for("the orphaned job's lease", lambda: (root / lease_path(merged)).is_file(), timeout=120)
        proc = _snakemake_slurm(root, env, merged, "--configfile", "slurm-test.yaml", "--forcerun", "merge_alignment")
        output = proc.stdout + proc.stderr
        assert proc.returncode != 0, output[-3000:]
        assert f"{merged} (rule merge_alignment: SLURM job {job}" in output and f"scancel {job}" in output
        assert "submitted with SLURM jobid" not in output
        assert sorted(p.name for p in (root / merged).iterdir()) == before  # not removed
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    _wait_for("the cancelled job to leave the queue",
              lambda: subprocess.run(["squeue", "-h", "-j", job, "-t", "PENDING,RUNNING,COMPLETING"],
                                     capture_output=True, text=True).stdout.strip() == "", timeout=120)
    proc = _snakemake_slurm(root, env, merged, "--configfile", "slurm-test.yaml", "--forcerun", "merge_alignment")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert len(_submissions(proc.stdout + proc.stderr)) == 1
    assert sorted(p.name for p in (root / merged).iterdir()) == before


def _refused(root: Path, env: dict, config: dict, target: str, rule: str, *messages: str, args=()) -> None:
    """A run with ``config`` (and command-line ``args``) that forces ``rule`` for ``target``
    stops before anything is submitted, with ``messages`` in its output, and leaves ``target``
    in place."""
    (root / "slurm-refused.yaml").write_text(yaml.safe_dump(config))
    proc = _snakemake_slurm(root, env, target, "--configfile", "slurm-refused.yaml", "--forcerun", rule, *args,
                            timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    for message in messages:
        assert message in output, (message, output[-3000:])
    assert "submitted with SLURM jobid" not in output
    assert (root / target).is_dir()


@pytest.mark.workflow
def test_a_request_no_node_can_meet_stops_the_run_naming_the_key(slurm_run):
    """More memory than any node has, or a node feature none has: an error naming the kind and
    the config key (or the profile's) before anything is submitted, not a rejected sbatch
    retried with even more memory (or, for the feature, rejected when the job's turn comes)."""
    root, _, _, env = slurm_run
    config = yaml.safe_load((root / "slurm-test.yaml").read_text())
    config["resources"] = {"cpu_heavy": {"mem_mb": 300000}}  # the test node has 256000 MB
    _refused(root, env, config, f"results/{BASE}/tokenizers/ky", "tokenizer",
             "jobs of kind cpu_heavy ask for 300000 MB of memory", "resources.cpu_heavy.mem_mb to at most 256000")
    config = yaml.safe_load((root / "slurm-test.yaml").read_text())
    config["methods"]["mST5-en"]["resources"]["constraint"] = "h200"
    _refused(root, env, config, f"results/{BASE}/methods/mST5-en", "train_method",
             f"methods.mST5-en.resources.constraint 'h200', but no node of this cluster has those features "
             f"(sinfo %f: {FEATURE})")
    # the partition and GPU model the profile gives a rule are checked too (sinfo %P, %G)
    config = yaml.safe_load((root / "slurm-test.yaml").read_text())
    _refused(root, env, config, f"results/{BASE}/methods/mST5-en", "train_method",
             "jobs of kind gpu_train go to the profile's set-resources: train_method: slurm_partition 'gpu_a100', "
             "but sinfo lists no node in it (sinfo %P: cpu*, gpu); change it in the profile",
             args=("--set-resources", "train_method:slurm_partition=gpu_a100"))
    # and the memory the profile gives a rule in place of the rule's own (which is fitted to the
    # nodes): sbatch would reject it at every retry; this cluster named by its name
    # (scontrol's ClusterName) is still the one sinfo describes
    _refused(root, env, config, f"results/{BASE}/tokenizers/ky", "tokenizer",
             "jobs of rule tokenizer ask for 300000 MB of memory (the profile's set-resources: tokenizer: mem_mb), "
             "but no node", "has more than 256000 MB (sinfo %m); sbatch would reject them: ask for at most 256000",
             args=("--set-resources", "tokenizer:mem_mb=300000", "tokenizer:slurm_cluster=modsenttest"))


@pytest.mark.workflow
def test_the_plan_of_a_slurm_profile_checks_every_request_against_this_cluster(slurm_run):
    """`modsent plan --profile slurm` (a dry run, which runs no onstart) checks every job's
    request against this cluster's sinfo as the run does before it submits anything
    (tests/test_planning.py checks the cases against a scripted sinfo)."""
    root, _, _, env = slurm_run

    def plan(profile):
        return subprocess.run([sys.executable, "-m", "modsent.cli", "plan", "--configfile", "slurm-test.yaml",
                               "--profile", profile], cwd=root, env=env, capture_output=True, text=True, timeout=300)

    proc = plan("slurm")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    total = next(line.split() for line in proc.stdout.splitlines() if line.startswith("total"))
    assert (f"SLURM (the profile slurm): every job's request ({int(total[1]) - 1} jobs) fits a node of the 1 "
            "sinfo lists") in proc.stdout  # every job but rule all's, which runs in Snakemake's process
    profile = yaml.safe_load((root / "slurm" / "config.yaml").read_text())
    profile["set-resources"]["tokenizer"] = {"mem_mb": 300000}  # the node has 256000 MB and 32 CPUs
    profile["set-resources"]["corpus"] = {"cpus_per_task": 64}
    (root / "slurm-wrong").mkdir()
    (root / "slurm-wrong" / "config.yaml").write_text(yaml.safe_dump(profile))
    proc = plan("slurm-wrong")
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    problems = [line for line in proc.stdout.splitlines() if line.startswith("  - ")]
    assert [line.split(" ask for ")[0] for line in problems] == ["  - jobs of rule corpus", "  - jobs of rule tokenizer"]


@pytest.mark.workflow
def test_the_jobs_of_a_rule_go_as_one_array_job(slurm_run):
    """slurm-array-jobs (the plugin's job arrays, a line of the profile): both languages'
    tokenizer jobs, rerun, go to sbatch once, as an array of two tasks; each task writes its
    output and log and releases its lease, as a job of its own does. Jobs that ask differently
    (an array's tasks would all get the first one's request) stop the run before it submits
    anything."""
    root, _, state, env = slurm_run
    targets = [f"results/{BASE}/tokenizers/{lang}" for lang in ("en", "ky")]
    proc = _snakemake_slurm(root, env, *targets, "--configfile", "slurm-test.yaml", "--forcerun", "tokenizer",
                            "--slurm-array-jobs", "tokenizer",
                            "--set-resources", "tokenizer:mem_mb=1000 + 200 * (wildcards.lang == 'ky')")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and not _submissions(output) and "Submitted" not in output, output[-3000:]
    assert re.search(r"jobs of rule tokenizer ask differently \(mem_mb (1000 for lang=en, 1200 for lang=ky|"
                     r"1200 for lang=ky, 1000 for lang=en)\)", output), output[-3000:]
    started = time.time()
    proc = _snakemake_slurm(root, env, *targets, "--configfile", "slurm-test.yaml", "--forcerun", "tokenizer",
                            "--slurm-array-jobs", "tokenizer")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert not _submissions(output)  # no job of its own
    arrays = re.findall(r"Submitted array job with Snakemake IDs \S+ and SLURM job ID (\d+)\. The individual task "
                        r"IDs are 1-2\.", output)
    assert len(arrays) == 1, output[-3000:]
    tasks = {r["ArrayTaskId"]: r["JobState"] for r in _job_records(state).values() if r.get("ArrayJobId") == arrays[0]}
    assert tasks == {"1": "COMPLETED", "2": "COMPLETED"}  # slurmctld's record of each task
    for target in targets:
        assert (root / target / "tokenizer.json").stat().st_mtime > started
        log = root / f"logs/{BASE}/tokenizers/{Path(target).name}.log"
        assert log.stat().st_mtime > started and log.stat().st_size > 0
    assert not list((root / ".modsent" / "leases").glob("*.json"))

"""Local GPU placement (modsent.devices): each GPU job run without SLURM on GPUs of its own."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from modsent import devices

HOLDER = """
import sys
from modsent import devices
print(",".join(devices.claim(int(sys.argv[1]), timeout=30) or []), flush=True)
sys.stdin.read()  # hold the claim until the test closes stdin
"""


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A host whose visible GPUs are 0-3 (CUDA_VISIBLE_DEVICES), with its own lock directory."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv("MODSENT_GPU_LOCKS", str(tmp_path / "locks"))
    yield tmp_path
    devices.release()


def hold(count):
    """Another process that claims ``count`` GPUs and keeps them until its stdin closes."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(count)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip().split(",")


def test_claims_exclude_the_gpus_other_processes_hold_and_end_with_them(host):
    other, held = hold(2)
    try:
        assert held == ["0", "1"]
        assert devices.claim(1) == ["2"]
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"
        # this process's own claim counts too: the next process gets the last free GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"
        third, got = hold(1)
        assert got == ["3"]
        third.stdin.close(), third.wait()
    finally:
        other.stdin.close(), other.wait()
    # the holder has exited: its GPUs are free again, whatever way it ended
    os.environ["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"
    devices.release()
    assert devices.claim(3) == ["0", "1", "2"]


def test_a_job_that_cannot_get_enough_gpus_waits_then_times_out(host, caplog):
    other, held = hold(3)
    try:
        with pytest.raises(TimeoutError, match="2 of the GPUs 0,1,2,3 did not become free"):
            devices.claim(2, poll_seconds=0.1, timeout=0.3)
        assert "waiting for 2 free GPU(s) of 0,1,2,3" in caplog.text
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"  # unchanged: nothing was claimed
    finally:
        other.stdin.close(), other.wait()


def test_nothing_to_choose_leaves_the_environment_alone(host, monkeypatch):
    assert devices.claim(0) is None
    assert devices.claim(4) is None  # a job given exactly its GPUs (a SLURM job)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert devices.visible_gpus() == [] and devices.claim(1) is None  # no GPU: CPU jobs run as before
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("PATH", str(host))  # no nvidia-smi
    assert devices.visible_gpus() == []
    assert not (host / "locks").exists()


def test_gpus_numbered_by_nvidia_smi_are_claimed_in_its_order(host, monkeypatch):
    """Without CUDA_VISIBLE_DEVICES the GPUs are nvidia-smi's indices, which follow the PCI bus;
    CUDA numbers fastest first unless told otherwise, so a claim says which order it means."""
    smi = host / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA A100 (UUID: GPU-a)'\necho 'GPU 1: NVIDIA H100 (UUID: GPU-b)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{host}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    assert devices.visible_gpus() == ["0", "1"]
    assert devices.claim(1) == ["0"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0" and os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    devices.release()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # the user's indices: their order is left as it is
    monkeypatch.delenv("CUDA_DEVICE_ORDER")
    assert devices.claim(1) == ["0"] and "CUDA_DEVICE_ORDER" not in os.environ


SNAKEFILE = """
rule all:
    input: expand("out/{name}.json", name=["a", "b", "c", "pair"])

rule one_gpu:
    output: "out/{name}.json"
    wildcard_constraints: name="[abc]"
    resources: gpu=1
    log: "logs/{name}.log"
    script: "job.py"

rule two_gpus:
    output: "out/pair.json"
    resources: gpu=2
    log: "logs/pair.log"
    script: "job.py"
"""

JOB = """
import json, os, time
from modsent.logs import start_job
start_job(snakemake)
start = time.time()
time.sleep(4)  # the jobs overlap: all four run at once
with open(snakemake.output[0], "w") as out:
    json.dump({"gpus": os.environ["CUDA_VISIBLE_DEVICES"], "start": start, "end": time.time()}, out)
"""


def test_snakemake_local_gpu_jobs_run_at_once_on_distinct_gpus(tmp_path):
    """`snakemake --cores 4 --resources gpu=5` on a five-GPU host: three one-GPU jobs and a
    two-GPU job run together, and no two share a GPU."""
    from conftest import snakemake_exe

    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1,2,3,4", "MODSENT_GPU_LOCKS": str(tmp_path / "locks")}
    proc = subprocess.run([snakemake_exe(), "--cores", "4", "--resources", "gpu=5"], cwd=tmp_path,
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = {name: json.loads((tmp_path / "out" / f"{name}.json").read_text()) for name in ("a", "b", "c", "pair")}
    assert len(jobs["pair"]["gpus"].split(",")) == 2
    claimed = [gpu for job in jobs.values() for gpu in job["gpus"].split(",")]
    assert sorted(claimed) == ["0", "1", "2", "3", "4"]
    assert max(job["start"] for job in jobs.values()) < min(job["end"] for job in jobs.values())  # concurrent
    assert "placed on GPU" in (tmp_path / "logs" / "pair.log").read_text()

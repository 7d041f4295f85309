"""A rule's log: every attempt kept, and the traceback of the exception that ended a job."""

import os
import subprocess
import sys

SCRIPT = """
import logging, sys
from modsent.logs import setup_logging
setup_logging(sys.argv[1])
logging.getLogger("modsent.stage").info("working on %s", sys.argv[2])
raise ValueError("corpus.txt, line 3: not UTF-8")
"""


def test_each_attempt_is_kept_and_the_failure_is_in_the_log(tmp_path):
    log = tmp_path / "logs" / "job.log"
    for attempt in ("first", "second"):
        proc = subprocess.run([sys.executable, "-c", SCRIPT, str(log), attempt], capture_output=True, text=True)
        assert proc.returncode == 1 and "ValueError" in proc.stderr  # still on stderr, as before
    text = log.read_text(encoding="utf-8")
    first, second = text.split("==== attempt 2 ====\n")
    assert first.startswith("==== attempt 1 ====\n")
    for part, attempt in ((first, "first"), (second, "second")):
        assert f"working on {attempt}" in part
        assert "CRITICAL modsent: the job failed: ValueError: corpus.txt, line 3: not UTF-8" in part
        assert "Traceback (most recent call last):" in part and 'line 6, in <module>' in part


BAD_INPUT = """
import sys
from modsent.io import InputError
from modsent.logs import setup_logging
setup_logging(sys.argv[1])
raise InputError("pairs.tsv: missing column 'positive'")
"""


def test_bad_input_is_one_line_on_the_console_and_keeps_its_traceback_in_the_log(tmp_path):
    log = tmp_path / "job.log"
    proc = subprocess.run([sys.executable, "-c", BAD_INPUT, str(log)], capture_output=True, text=True)
    assert proc.returncode == 1
    failed = [line for line in proc.stderr.splitlines() if "missing column" in line]
    assert failed and failed[0].endswith("CRITICAL modsent: the job failed: InputError: pairs.tsv: missing "
                                         "column 'positive'")
    assert len(failed) == 1 and "Traceback" not in proc.stderr
    text = log.read_text(encoding="utf-8")
    assert "the job failed: InputError: pairs.tsv" in text and "Traceback (most recent call last):" in text


GPU_MEMORY = """
import sys
import torch
from modsent.logs import setup_logging
setup_logging(sys.argv[1])
raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
"""


def test_a_gpu_out_of_memory_failure_says_a_retry_will_not_help(tmp_path):
    log = tmp_path / "job.log"
    proc = subprocess.run([sys.executable, "-c", GPU_MEMORY, str(log)], capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" in proc.stderr
    text = log.read_text(encoding="utf-8")
    assert "the job failed: OutOfMemoryError: CUDA out of memory" in text
    assert "the GPU ran out of memory: a retry with the same settings fails the same way" in text
    other = tmp_path / "other.log"
    subprocess.run([sys.executable, "-c", SCRIPT, str(other), "x"], capture_output=True, text=True)
    assert "the job failed: ValueError" in other.read_text() and "ran out of memory" not in other.read_text()


WARNS = """
import sys, warnings
import transformers
from peft import LoraConfig, get_peft_model
from modsent.logs import setup_logging
setup_logging(sys.argv[1])
config = transformers.BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=16)
get_peft_model(transformers.BertModel(config), LoraConfig(r=2, target_modules=["query"]))
warnings.warn("min_count 3 keeps no word", UserWarning)
"""


def test_warnings_reach_the_log_but_the_libraries_noise(tmp_path):
    """PEFT wrapping a model warns about a renamed transformers method (in every LoRA job's log,
    78 times in the demo's logs); other warnings are still logged."""
    log = tmp_path / "job.log"
    proc = subprocess.run([sys.executable, "-W", "default", "-c", WARNS, str(log)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = log.read_text(encoding="utf-8")
    assert "WARNING py.warnings:" in text and "UserWarning: min_count 3 keeps no word" in text
    assert "is_gradient_checkpointing" not in text and "is_gradient_checkpointing" not in proc.stderr


FROZEN = """
import atexit, gc, json, sys, weakref
from types import SimpleNamespace
import torch  # what a job imports before its work
from modsent.logs import start_job
snakemake = SimpleNamespace(log=[sys.argv[1]], output=["out.txt"], rule="job", resources={}, wildcards={}, config={})
report = {"tracked_before": len(gc.get_objects())}
start_job(snakemake)
report.update(frozen=gc.get_freeze_count(), tracked_after=len(gc.get_objects()))
class Node:
    pass
first, second = Node(), Node()
first.other, second.other = second, first
alive = weakref.ref(first)
del first, second
gc.collect()
report["cycle_collected"] = alive() is None
held = [Node() for _ in range(5000)]
atexit._run_exitfuncs()  # what the interpreter runs before it tears the modules down
report["tracked_at_exit"] = len(gc.get_objects())
print(json.dumps(report))
"""


def test_a_job_keeps_its_imports_and_what_it_holds_at_exit_out_of_the_collector_s_walks(tmp_path):
    """start_job freezes the objects the script's imports made, and the exit hook freezes what
    the process holds at its end (the interpreter's shutdown collections then walk none of
    them: ~2 s a job, benchmarks/job_overhead.py); garbage made later is still collected."""
    import json

    log = tmp_path / "logs" / "job.log"
    proc = subprocess.run([sys.executable, "-c", FROZEN, str(log)], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["tracked_before"] > 50_000  # torch's objects
    assert report["frozen"] >= report["tracked_before"]
    assert report["tracked_after"] < report["tracked_before"] / 20
    assert report["cycle_collected"]
    assert report["tracked_at_exit"] < 1000  # the 5,000 objects held at the end are frozen too
    assert "INFO modsent: host" in log.read_text(encoding="utf-8")


RETRIED = """
rule failing:
    output: "out.txt"
    log: "logs/failing.log"
    script: "job.py"
"""

JOB = """
from modsent.logs import start_job
start_job(snakemake)
raise ValueError(f"{snakemake.output[0]}: the job fails")
"""


def test_snakemake_retries_keep_every_attempt_s_log_and_release_their_leases(tmp_path):
    """Snakemake removes a job's log before each attempt: the history next to it keeps them all."""
    from conftest import snakemake_exe
    from modsent.leases import LEASE_DIR

    (tmp_path / "Snakefile").write_text(RETRIED)
    (tmp_path / "job.py").write_text(JOB)
    proc = subprocess.run([snakemake_exe(), "--cores", "1", "--retries", "2"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode != 0
    log = (tmp_path / "logs" / "failing.log").read_text(encoding="utf-8")
    history = (tmp_path / "logs" / "failing.attempts.log").read_text(encoding="utf-8")
    assert log.startswith("==== attempt 3 ====\n") and log.count("==== attempt") == 1
    assert "ValueError: out.txt: the job fails" in log
    parts = history.split("==== attempt ")[1:]
    assert [part.split(" ", 1)[0] for part in parts] == ["1", "2", "3"]
    for part in parts:
        assert "ValueError: out.txt: the job fails" in part and "Traceback" in part
    assert not list((tmp_path / LEASE_DIR).glob("*.json"))  # a failed job leaves no lease


def test_every_training_loop_reports_to_the_log_and_the_configured_tracker(tmp_path, monkeypatch, caplog):
    """tracking.report_to: tensorboard — a TrainingLog's logged steps are in the rule's log and
    in TensorBoard event files beside it, with the values recorded."""
    import logging

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from modsent.training import tracking
    from modsent.training.loop import TrainingLog

    monkeypatch.delenv(tracking.ENV, raising=False)
    log_path = tmp_path / "logs" / "tiny" / "sentence_adapters" / "de.log"
    tracking.configure_job({"report_to": "tensorboard"}, log_path, "sentence_adapter[lang=de]")
    losses = [2.0, 1.5, 1.25, 1.0, 0.75]
    with caplog.at_level(logging.INFO, logger="modsent.training.loop"):
        training = TrainingLog(len(losses), 0, "SE de", progress=False, log_every=2)
        for step, loss in enumerate(losses):
            training.record(step, loss, 1e-3 * (step + 1), 4)
        training.close()
    logged = [r.getMessage() for r in caplog.records if r.name == "modsent.training.loop"]
    assert logged == [f"SE de: step {s}/5, loss {losses[s - 1]:.4f}, lr {1e-3 * s:.3g}" for s in (1, 2, 4, 5)]
    events = EventAccumulator(str(log_path.parent / "tensorboard" / "de" / "SE_de"))
    events.Reload()
    scalars = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert scalars == [(s, losses[s - 1]) for s in (1, 2, 4, 5)]
    tracking.configure_job({"report_to": "none"}, log_path, "x")
    assert tracking.job_tracker("SE de") is None and tracking.ENV not in os.environ


BAD_PEAK = """
import sys
from types import SimpleNamespace
from modsent.logs import start_job
snakemake = SimpleNamespace(log=[sys.argv[1]], output=["out.txt"], rule="job", resources={}, wildcards={}, config={})
start_job(snakemake)
print("the job's work")
"""


def test_a_job_with_a_bad_peak_in_its_environment_stops_before_its_work(tmp_path):
    """MODSENT_PEAK_TFLOPS is read when a training run ends (modsent.training.efficiency): a value
    that is no number stops the job as it starts, naming the variable, not hours later."""
    import os

    for value, ok in (("fast", False), ("-1", False), ("989.4", True)):
        proc = subprocess.run([sys.executable, "-c", BAD_PEAK, str(tmp_path / "job.log")], cwd=tmp_path,
                              capture_output=True, text=True, env={**os.environ, "MODSENT_PEAK_TFLOPS": value})
        assert (proc.returncode == 0) == ok and ("the job's work" in proc.stdout) == ok, proc.stderr
        if not ok:
            assert f"MODSENT_PEAK_TFLOPS='{value}'" in proc.stderr and "InputError" in proc.stderr

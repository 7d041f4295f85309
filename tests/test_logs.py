"""A rule's log: every attempt kept, and the traceback of the exception that ended a job."""

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

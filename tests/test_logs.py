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

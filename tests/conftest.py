import os
import sys
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# deepfocus (the FOCUS reference implementation) lives outside site-packages: see ./run
sys.path.append(str(REPO / ".venv" / "reference"))

# Nothing in the tests may reach the Hugging Face Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


def snakemake_exe() -> str:
    exe = shutil.which("snakemake")
    if exe is None:
        pytest.fail("snakemake is not on PATH: run the tests through ./run test")
    return exe


def reversed_keys(value):
    """``value`` with every mapping's keys in reverse order: the same configuration, spelled otherwise."""
    if isinstance(value, dict):
        return {key: reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(item) for item in value]
    return value

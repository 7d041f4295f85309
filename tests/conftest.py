import os
import sys
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def rule_blocks() -> dict[str, str]:
    """rule name -> its text, for every rule in rules/*.smk and rules/methods/*.smk."""
    import re

    blocks = {}
    for smk in sorted((REPO / "rules").glob("*.smk")) + sorted((REPO / "rules" / "methods").glob("*.smk")):
        parts = re.split(r"^[ \t]*rule (\w+):", smk.read_text(), flags=re.M)
        blocks.update(zip(parts[1::2], parts[2::2]))
    return blocks

# deepfocus (the FOCUS reference implementation) lives outside site-packages: see ./run
sys.path.append(str(REPO / ".venv" / "reference"))

# Nothing in the tests may reach the Hugging Face Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Off a GPU, Triton kernels (modsent.training.kernels) run in Triton's interpreter on the CPU;
# it must be chosen before Triton is first imported. With a GPU they run compiled, and so does
# Inductor's own Triton code.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

# torch.compile's Inductor keeps compiled kernels in one cache per user (/tmp/torchinductor_$USER)
# and loads what it finds there: a run killed mid-compile can leave a zero-byte .so behind that
# fails every later compile test on the machine. Each test run compiles into a cache of its own
# (inherited by the workflow tests' Snakemake jobs), removed when the run ends; a cache set by the
# caller is used as it is.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import atexit
    import tempfile

    _INDUCTOR_CACHE = tempfile.mkdtemp(prefix="modsent-tests-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE
    atexit.register(shutil.rmtree, _INDUCTOR_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


def snakemake_exe() -> str:
    exe = shutil.which("snakemake")
    if exe is None:
        pytest.fail("snakemake is not on PATH: run the tests through ./run test")
    return exe


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (its tests hold what the script times)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def run_card_usage(card: str, path, texts, **encode) -> dict:
    """Run the ``## Usage`` code of model card text ``card`` on the model at ``path``, its one
    ``model.encode([...])`` encoding ``texts`` (with ``encode``'s options): the code's variables
    (``model``, ``embeddings``), and the code as it ran under ``CODE``."""
    import re

    code = re.search(r"## Usage\n\n```python\n(.*?)```", card, re.S).group(1)
    assert code.count("model.encode([...])") == 1, code
    code = re.sub(r'"(PATH_OR_HUB_ID|PATH)"', repr(str(path)), code).replace("model.encode([...])",
                                                                             "model.encode(TEXTS, **ENCODE)")
    scope = {"TEXTS": texts, "ENCODE": encode, "CODE": code}
    exec(compile(code, "the model card's usage", "exec"), scope)
    return scope


def reversed_keys(value):
    """``value`` with every mapping's keys in reverse order: the same configuration, spelled otherwise."""
    if isinstance(value, dict):
        return {key: reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(item) for item in value]
    return value


@pytest.fixture
def traced_compile(monkeypatch):
    """``nn.Module.compile`` (what ``fastpath.compile_in_place`` calls) with torch.compile's
    ``eager`` backend: Dynamo captures the module's forwards into graphs as it does for Inductor,
    and the graphs run as eager PyTorch, with no code generation (seconds, not the minute an
    Inductor compile of each test model costs). A training with ``compile: true`` then routes
    every forward of the compiled module through Dynamo's graphs and trains what the eager one
    does, up to float rounding: the tests of the methods' ``compile`` settings compare so, and
    the LA's and SE's tests compile with Inductor itself. Not with gradient checkpointing: this
    backend runs Dynamo's checkpointed regions without AOTAutograd, which is what draws their
    dropout again as the forward did (pytorch/pytorch#160773), so the tests of that pair compile
    with Inductor or aot_eager. Yields ``(modules, graphs)``:
    the modules compiled, in order, and a callable giving the number of graphs captured. Skips
    the test where the trainers' compile check refuses the CPU (no C++ compiler), as the tests
    that compile with Inductor skip (``tiny_modules.needs_cpu_compiler``)."""
    import torch
    import torch._dynamo

    from tiny_modules import needs_cpu_compiler

    if needs_cpu_compiler.args[0]:  # its condition: the trainers' compile check refuses the CPU
        pytest.skip(needs_cpu_compiler.kwargs["reason"])

    compiled = []
    original = torch.nn.Module.compile

    def compile_traced(module, *args, **kwargs):
        compiled.append(module)
        kwargs.pop("options", None)  # Inductor's options (compile_in_place's eager_random): none here
        return original(module, *args, **{**kwargs, "backend": "eager"})

    monkeypatch.setattr(torch.nn.Module, "compile", compile_traced)
    torch._dynamo.reset()  # no graph or recompile limit carried over from an earlier test
    torch._dynamo.utils.counters.clear()
    try:
        yield compiled, lambda: torch._dynamo.utils.counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()


def simulated_gpus(monkeypatch, bf16_units: list[bool]) -> None:
    """GPUs 0, 1, ... of which ``bf16_units[i]`` says whether GPU i has bf16 units; torch's
    ``is_bf16_supported`` answers for the current device, as it does on a node."""
    import contextlib

    import torch

    current = [0]

    @contextlib.contextmanager
    def device(index):
        before, current[0] = current[0], index
        try:
            yield
        finally:
            current[0] = before

    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16_units[current[0]])

"""benchmarks/gpu.sh's blocks: every benchmark command parses with its script's own options and
passes the checks its script makes of them after parsing (``check_options``), and every
``--only`` names a variant that script times on a GPU. A GPU lease has minutes, and a
block that stops at its options loses them; this checks them here, without a GPU."""

import argparse
import importlib
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def blocks() -> list[tuple[str, str, list[str]]]:
    """(block name, the module it runs, its arguments) of each ``bench``/``recipe_block`` line whose
    arguments are literal (not the workflow block's, which take shell variables; nor pytest's)."""
    text = (ROOT / "benchmarks" / "gpu.sh").read_text().replace("\\\n", " ")
    found = []
    for line in text.splitlines():
        match = re.match(r"\s*(?:bench|recipe_block)\s+([\w.]+)\s+\d+\s+(.*)", line)
        if not match or "$" in match.group(2):
            continue
        args = shlex.split(match.group(2))
        while args[0] == "-X":  # the interpreter's own options
            args = args[2:]
        if args[0] == "-m":
            module, args = args[1], args[2:]
        else:
            module, args = args[0].removesuffix(".py").replace("/", "."), args[1:]
        if module != "pytest":
            found.append((match.group(1), module, args))
    return found


BLOCKS = blocks()


class Parsed(Exception):
    pass


PARSE_ARGS = argparse.ArgumentParser.parse_args  # argparse's own, whatever a test patched since


def parsed(module_name: str, argv: list[str], monkeypatch) -> tuple:
    """The script's module, its parsed options and its parser, stopping its main() right after
    parsing."""
    module = importlib.import_module(module_name)
    def stop_after_parsing(self, args=None, namespace=None):
        raise Parsed(PARSE_ARGS(self, args, namespace), self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop_after_parsing)
    monkeypatch.setattr(sys, "argv", [module_name, *argv])
    try:
        with pytest.raises(Parsed) as caught:
            module.main(*([argv] if module_name.endswith(("recipe_throughput", "gpu_workflow")) else []))
    except SystemExit as error:  # argparse's error exit: its message went to stderr
        pytest.fail(f"{module_name} {shlex.join(argv)}: its options do not parse ({error})")
    return module, *caught.value.args


def checked(module_name: str, argv: list[str], monkeypatch) -> tuple:
    """:func:`parsed`, then the script's own checks of its options (``check_options``, which ends
    in argparse's error exit where one fails)."""
    script, args, parser = parsed(module_name, argv, monkeypatch)
    if hasattr(script, "check_options"):
        try:
            script.check_options(parser, args)
        except SystemExit as error:
            pytest.fail(f"{module_name} {shlex.join(argv)}: its options fail its checks ({error})")
    return script, args


def test_the_blocks_are_found():
    names = {name for name, _, _ in BLOCKS}
    assert {"triton_kernels", "mlm_triton", "profile_la_triton", "pair_throughput_triton",
            "recipe_throughput", "recipe_throughput_xxl", "translation_speed"} <= names
    assert len(BLOCKS) >= 25


@pytest.mark.parametrize("name, module, argv", BLOCKS, ids=[name for name, _, _ in BLOCKS])
def test_each_block_parses_and_names_variants_its_script_has_on_a_gpu(name, module, argv, monkeypatch):
    script, args = checked(module, argv, monkeypatch)
    assert getattr(args, "device", "cuda").startswith("cuda"), (name, "a GPU block on the CPU")
    if getattr(args, "only", None):
        variants = script.variant_table(args, cuda=True)
        assert set(args.only) <= set(variants), (name, sorted(set(args.only) - set(variants)))


def test_a_misspelt_variant_is_caught():
    from benchmarks import mlm_throughput

    parser_args = argparse.Namespace(bf16_residual=True, fused=False, triton=True, compile=False, graphs=False)
    variants = mlm_throughput.variant_table(parser_args, cuda=True)
    assert "masked, bf16, fused, fast, Triton LoRA alone, bf16 residual" in variants
    assert "masked, bf16, fused, fast, Triton LoRA alone" in variants
    assert "masked, bf16, fused, fast, Triton LoRAs, bf16 residual" not in variants
    assert "masked, fp32, fast, Triton LoRA" not in variants  # the CPU's name


@pytest.mark.parametrize("module, argv", [
    ("benchmarks.mlm_throughput", ["--device", "cuda", "--compile", "--seq-len", "128", "256"]),
    ("benchmarks.mexma_throughput", ["--device", "cuda", "--compile", "--seq-len", "128", "256"]),
    ("benchmarks.pair_throughput", ["--device", "cuda", "--rounds", "0"]),
    ("benchmarks.recipe_throughput", ["--device", "cuda", "--join", "6", "0"]),
])
def test_options_that_parse_but_fail_their_scripts_checks_are_caught(module, argv, monkeypatch):
    parsed(module, argv, monkeypatch)  # argparse takes them
    with pytest.raises(pytest.fail.Exception, match="fail its checks"):
        checked(module, argv, monkeypatch)

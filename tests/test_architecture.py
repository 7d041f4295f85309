"""The shape of the package: production code does not import the test helpers, and no module
imports itself through others (function-level imports included)."""

import ast
import os
import subprocess
import sys

from conftest import REPO

PACKAGE = REPO / "modsent"
TEST_HELPERS = "modsent.testing"


def module_names() -> dict[str, object]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names[name] = path
    return names


def imported_modules(path, known) -> set[str]:
    """The modsent modules ``path`` imports anywhere (functions included). ``from pkg import
    submodule`` imports the submodule: the package's __init__ runs, but it is no dependency."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & set(known)
            found |= submodules
            if len(submodules) < len(node.names):
                found.add(node.module)
    return {name for name in found if name in known}


def test_no_production_module_imports_the_test_helpers():
    known = module_names()
    offenders = sorted(name for name, path in known.items()
                       if name != TEST_HELPERS and TEST_HELPERS in imported_modules(path, known))
    assert offenders == []
    # and importing every production module loads none of them
    production = sorted(name for name in known if name != TEST_HELPERS and not name.endswith("__main__"))
    code = ("import importlib, sys\n"
            f"for name in {production!r}:\n"
            "    importlib.import_module(name)\n"
            f"print({TEST_HELPERS!r} in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"


def test_no_import_cycles():
    known = module_names()
    graph = {name: imported_modules(path, known) - {name} for name, path in known.items()}
    cycles = []

    def visit(name, stack, done):
        for dependency in sorted(graph[name]):
            if dependency in stack:
                cycles.append(stack[stack.index(dependency):] + [dependency])
            elif dependency not in done:
                done.add(dependency)
                visit(dependency, stack + [dependency], done)

    for name in sorted(graph):
        visit(name, [name], {name})
    assert cycles == []


def test_loading_the_methods_imports_no_torch():
    """The workflow registers the methods while planning: a method subpackage's __init__ must
    not import torch (or transformers), or every dry run pays for it; nor may the helper that
    makes a full-parameter method (modsent.methods.full), which method modules import."""
    import subprocess
    import sys

    code = ("import sys; from modsent import methods; import modsent.methods.full; registry = methods.load(); "
            "print(len(registry), sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(None, 1)
    assert int(out[0]) >= 4 and out[1].strip() == "[]", out


def test_the_wheel_holds_every_file_the_package_reads(tmp_path):
    """A non-editable install (a wheel) ships every tracked file of the package, the config
    schema among them: the training library reads its defaults (checkpoint fingerprints, the
    methods' settings) wherever modsent is installed, not only from a clone."""
    import shutil
    import zipfile

    import pytest

    pytest.importorskip("setuptools")
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    tracked = subprocess.run(["git", "ls-files", "modsent"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    for name in tracked:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "--no-index", str(source), "-w", str(tmp_path / "wheel")],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("modsent-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "modsent/schemas/config.schema.yaml" in names
    assert sorted(set(tracked) - names) == []
    # installed from it, away from the clone: the schema's later defaults and a method's settings
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    probe = ("import modsent.schema, modsent.training.checkpoints as c, modsent.methods as m; "
             "print(modsent.schema.SCHEMA_PATH); print(c.later_defaults()['length_groups']); "
             "m.load(); print(m.get('MEXMA').schema()['properties']['length_groups']['default'])")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                         env={**env, "PYTHONPATH": str(tmp_path / "site")})
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.splitlines() == [str(tmp_path / "site" / "modsent" / "schemas" / "config.schema.yaml"), "1", "1"]
    # its command line: a config checked against the shipped schema; the workflow's commands say
    # where the workflow is (a clone), before Snakemake is run
    cli = "import sys; from modsent.cli import main; sys.exit(main(sys.argv[1:]))"
    for args, status, said in ((["check-config", str(REPO / "config.yaml")], 0, "config.yaml: ok"),
                               (["plan", "--configfile", str(REPO / "config.yaml")], 2, "no Snakefile")):
        ran = subprocess.run([sys.executable, "-c", cli, *args], cwd=tmp_path, capture_output=True, text=True,
                             env={**env, "PYTHONPATH": str(tmp_path / "site"), "HF_HUB_OFFLINE": "1"})
        assert ran.returncode == status and said in ran.stdout + ran.stderr, (args, ran.stdout, ran.stderr[-2000:])

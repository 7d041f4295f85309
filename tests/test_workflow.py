"""The whole workflow on configs/test.yaml, run by Snakemake in a scratch directory."""

import copy
import json
import os
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from modsent.schema import SCHEMA_PATH
from conftest import REPO, load_benchmark, reversed_keys, run_card_usage, snakemake_exe

pytestmark = pytest.mark.workflow
CONFIG = REPO / "configs" / "test.yaml"
GPU_WORKFLOW = load_benchmark("gpu_workflow")  # its reading of Snakemake's log and the jobs' device lines
TESTS = Path(__file__).resolve().parent
TATOEBA_FILES = TESTS / "fixtures" / "eval" / "mteb-tatoeba-bitext-mining"
# The whole-DAG run also trains a method registered by a test module (tests/toy_method.py): a
# new method is one module and two config keys, and it lands in the same evaluation and summary.
TOY_METHOD = {"method_modules": ["toy_method"],
              "methods": {"Toy-cos": {"batch_size": 8, "seq_len": 32, "learning_rate": 0.001, "max_steps": 2,
                                      "eval_pairs": 10, "log_every": 1}}}
# and one system of each recipe, two steps each, so that every recipe's rules, scripts and
# outputs run for real in the same DAG (the recipes' own tests call their training directly)
_TINY = {"max_steps": 2, "eval_pairs": 10, "log_every": 1}
RECIPES = {
    "mST5-en": {**_TINY, "datasets": None, "batch_size": 8, "seq_len": 32},
    "DuEAM-weak": {**_TINY, "datasets": None, "max_pairs": 60, "batch_size": 8, "seq_len": 32, "warmup_steps": 1,
                   "gpus": 2},  # a runtime key: one process without CUDA
    "MEXMA": {**_TINY, "provided_translations": True, "head_layers": 1, "head_heads": 2, "batch_size": 8,
              "grad_accum": 1, "seq_len": 32},
    # InteMATs stored in float16, as the demo stores its recipes (storage_dtype)
    "InteMATs-ST": {**_TINY, "batch_size": 8, "gradient_accumulation": 1, "max_length": 32, "warmup_steps": 1,
                    "storage_dtype": "float16"},
    "InteMATs-DT": {**_TINY, "batch_size": 4, "gradient_accumulation": 1, "max_length": 64, "warmup_steps": 1,
                    "document_sentences": 3, "storage_dtype": "float16"},
    "InteMATs": {**_TINY, "batch_size": 8, "gradient_accumulation": 1, "max_length": 32, "warmup_steps": 1,
                 "storage_dtype": "float16"},
}


# An English-only paraphrase dataset (paraphrases.{name}.english_only): SNLI's triplets, read from
# the Hub fixture into a local file of the run directory; not translated, mST5-en trains on it
ENGLISH_ONLY_FILE = "snli-triplets.jsonl"


def write_english_only_file(workdir: Path) -> Path:
    """``workdir``/ENGLISH_ONLY_FILE: the triplets modsent reads from the stanfordnlp/snli fixture."""
    from modsent.sources import hub

    path = workdir / ENGLISH_ONLY_FILE
    if not path.exists():
        records = hub.iter_hub_records(hub.with_location(hub.SNLI, TESTS / "fixtures" / "hub" / "stanfordnlp-snli"))
        path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def workflow_config() -> dict:
    """configs/test.yaml with the toy method, a tiny system of each recipe and an English-only
    dataset (a file of the run directory: write_english_only_file): the configuration of the
    whole-DAG run."""
    config = {**yaml.safe_load(CONFIG.read_text()), **copy.deepcopy(TOY_METHOD)}
    config["methods"].update(copy.deepcopy(RECIPES))
    config["paraphrases"]["snli"] = {"source": f"local:{ENGLISH_ONLY_FILE}", "english_only": True}
    # an evaluation set that is also an mteb task (local files of its Hub layout, German only):
    # the paper's xsim and the mteb result files of every system
    config["evaluation"]["datasets"]["tatoeba"] = {"source": f"local:{TATOEBA_FILES}"}
    return config


def environment() -> dict:
    """The tests' environment, with tests/ importable (the toy method's module)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}


def snakemake(workdir, *args, check=True, cores=2):
    config = workdir / "workflow.yaml"
    if not config.exists():
        config.write_text(yaml.safe_dump(workflow_config(), sort_keys=False))
    write_english_only_file(workdir)
    proc = subprocess.run(
        [snakemake_exe(), "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
         "--configfile", str(config), "--cores", str(cores), *args],
        capture_output=True, text=True, env=environment(),
    )
    if check and proc.returncode != 0:
        pytest.fail(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}")
    return proc


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("workflow")
    snakemake(workdir)
    return workdir


def test_all_outputs_exist_and_reload(run):
    from sentence_transformers import SentenceTransformer

    config = yaml.safe_load(CONFIG.read_text())
    languages = config["languages"]
    model = SentenceTransformer(str(run / "resources/base_models/tiny"), device="cpu")
    assert model.encode(["a test"]).shape == (1, 32)
    for lang in languages:
        lines = (run / f"resources/corpora/{lang}.txt").read_text("utf-8").splitlines()
        assert 0 < len(lines) <= config["corpora"]["max_sentences"]
        assert (run / f"logs/corpora/{lang}.log").stat().st_size > 0
        for dataset in ["builtin_parallel", "builtin_topics"]:
            assert len(pd.read_parquet(run / f"resources/eval/{dataset}/{lang}.parquet")) > 0
    pairs = pd.read_parquet(run / "resources/paraphrases/builtin.parquet")
    assert len(pairs) == config["paraphrases"]["builtin"]["max_pairs"]
    for lang in languages:
        if lang == "en":
            assert not (run / "resources/translations/en.parquet").exists()
            continue
        translations = pd.read_parquet(run / f"resources/translations/{lang}.parquet")
        assert set(pairs["anchor"]) <= set(translations["english"])
    summary = (run / "resources/inputs_summary.md").read_text()
    assert "resources/corpora/ky.txt" in summary


def test_every_training_and_encoding_job_logs_its_device(run, capsys):
    """Each job of a GPU rule (a ``gpu_`` resource class: the training stages, baselines, methods
    and encoding) says in its log where it ran: here the CPU, or the GPU of a machine with CUDA.
    benchmarks/gpu_workflow.py reads the same lines, from the jobs Snakemake's log lists, to
    check a run on a GPU."""
    import torch

    jobs = _first_run_jobs(run)
    gpu_rules = set(GPU_WORKFLOW.gpu_rules(run, prepared_too=True))
    assert {"language_adapter", "sentence_adapter", "alignment_adapter", "full_baseline", "train_method",
            "evaluation_embeddings", "english_embeddings", "dueam_wmd"} <= gpu_rules
    assert not any(job["failed"] for job in jobs) and all(job["seconds"] is not None for job in jobs)
    on_gpu_rules = [job for job in jobs if job["rule"] in gpu_rules]
    assert {job["rule"] for job in on_gpu_rules} == gpu_rules
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert {job["log"]: GPU_WORKFLOW.device_of(run, job) for job in on_gpu_rules} == {
        job["log"]: device for job in on_gpu_rules}
    # every LA, SE, CLA, full baseline, ablation and recipe recorded its model FLOPs (and on a GPU
    # its memory), as gpu_workflow.py reports them
    capsys.readouterr()
    assert GPU_WORKFLOW.stage_efficiency(run, torch.cuda.is_available()) == []
    reported = {line.split()[0] for line in capsys.readouterr().out.splitlines()[1:] if line.startswith("results/")}
    stages = {path.parent.relative_to(run).as_posix() for pattern in (
        "results/*/language_adapters/*/metrics.json", "results/*/sentence_adapters/*/metrics.json",
        "results/*/alignment/*/*/metrics.json", "results/*/baselines/*/metrics.json",
        "results/*/ablations/*/*/metrics.json", *(f"results/*/methods/{name}/metrics.json" for name in RECIPES))
        for path in run.glob(pattern)}
    assert len(stages) > 10 + len(RECIPES) and stages <= reported


def test_language_adapters_reload_and_are_summarised(run):
    import json

    from modsent.modular.language_adapter import load_language_model

    config = yaml.safe_load(CONFIG.read_text())
    summary = (run / "results/tiny/language_adapters/summary.md").read_text()
    for lang in config["languages"]:
        la_dir = run / f"results/tiny/language_adapters/{lang}"
        metrics = json.loads((la_dir / "metrics.json").read_text())
        assert metrics["steps"] == config["language_adapter"]["steps"]
        assert 0 < metrics["heldout_mlm_loss_after"] < metrics["heldout_mlm_loss_before"]  # finite, and learned
        model, tokenizer = load_language_model(run / "resources/base_models/tiny", la_dir)
        assert len(tokenizer) == model.get_input_embeddings().weight.shape[0]
        assert f"| {lang} |" in summary
    assert (run / "results/tiny/language_adapters/summary.png").read_bytes()[:4] == b"\x89PNG"
    report = (run / "results/translation/quality.md").read_text()
    assert "| ky |" in report and "| de |" in report


def test_sentence_adapters_reload_and_encode(run):
    import json

    import numpy as np

    from modsent.modular.sentence_adapter import load_sentence_encoder

    config = yaml.safe_load(CONFIG.read_text())
    summary = (run / "results/tiny/sentence_adapters/summary.md").read_text()
    base = run / "resources/base_models/tiny"
    for lang in config["languages"]:
        se_dir = run / f"results/tiny/sentence_adapters/{lang}"
        metrics = json.loads((se_dir / "metrics.json").read_text())
        assert metrics["steps"] == config["sentence_adapter"]["max_steps"]
        encoder = load_sentence_encoder(base, run / f"results/tiny/language_adapters/{lang}", se_dir)
        vectors = encoder.encode(["Hallo Welt", "Guten Tag"])
        assert vectors.shape == (2, 32)
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
        assert f"| {lang} | yes |" in summary


def test_alignment_adapters_and_merges(run):
    import json

    import numpy as np

    from modsent.modular.alignment import load_aligned_encoder
    from modsent.modular.sentence_adapter import load_sentence_encoder

    base = run / "resources/base_models/tiny"
    for lang in ["de", "ky"]:
        for kind in ["pp", "pl"]:
            metrics = json.loads((run / f"results/tiny/alignment/{kind}/{lang}/metrics.json").read_text())
            assert metrics["steps"] == 3 and metrics["kind"] == kind
        la, se = run / f"results/tiny/language_adapters/{lang}", run / f"results/tiny/sentence_adapters/{lang}"
        plain = load_sentence_encoder(base, la, se).encode(["Hallo Welt"])
        for weight in ["0.5", "0.7"]:
            merged = load_aligned_encoder(base, la, se, run / f"results/tiny/alignment/merged-{weight}/{lang}")
            vectors = merged.encode(["Hallo Welt"])
            assert vectors.shape == plain.shape and not np.allclose(vectors, plain)
    assert not (run / "results/tiny/alignment/pp/en").exists()  # English is the fixed side
    assert "| ky | pl |" in (run / "results/tiny/alignment/summary.md").read_text()


def test_full_baselines_and_ablations_train_and_reload(run):
    """The full baselines (Full_mc from Full_m's weights) and the ablations' adapters of the run:
    their steps and languages, logs and timings, checkpoints removed once written, the summary."""
    from sentence_transformers import SentenceTransformer

    config = yaml.safe_load(CONFIG.read_text())
    languages, baselines = config["languages"], run / "results/tiny/baselines"
    for name in ("Full_en", "Full_m", "Full_c", "Full_mc"):
        metrics = json.loads((baselines / name / "metrics.json").read_text())
        assert metrics["steps"] == config["baselines"]["max_steps"]
        assert metrics["languages"] == (["en"] if name == "Full_en" else sorted(languages))  # they take them sorted
        assert SentenceTransformer(str(baselines / name), device="cpu").encode(["a"]).shape == (1, 32)
        assert (run / f"logs/tiny/baselines/{name}.log").stat().st_size > 0
        assert (run / f"logs/tiny/benchmarks/baselines/{name}.tsv").is_file()
    assert json.loads((baselines / "Full_mc/metrics.json").read_text())["initialised_from"] == "results/tiny/baselines/Full_m"
    assert "| Full_c |" in (baselines / "summary.md").read_text()
    assert not list(baselines.glob("*.checkpoint"))  # written (checkpoint_every: 1), then removed
    for lang in languages:  # Mod_m-LA: the sentence adapter on the base model, no LA
        metrics = json.loads((run / f"results/tiny/ablations/sentence_adapters_base/{lang}/metrics.json").read_text())
        assert metrics["language_adapter"] is None


def test_selecting_fewer_baselines_retrains_none(run, tmp_path):
    """baselines.full without Full_en: no baseline retrains; only what lists the systems (the
    summaries, the full group's evaluation) is planned again."""
    config = workflow_config()
    config["baselines"]["full"] = ["Full_m", "Full_c", "Full_mc"]
    planned = _planned(_dry_run(run, config, tmp_path / "fewer.yaml"))
    assert "full_baseline_summary" in planned and "evaluation_summary" in planned
    assert set(planned) <= {"full_baseline_summary", "evaluation_embeddings", "evaluation_scores", "mteb_results",
                            "evaluation_summary", "all"}, planned


def test_encode_command_line(run, tmp_path):
    import sys

    import numpy as np

    from modsent.encoders.modular import ModularEncoder

    sentences = ["Салам дүйнө", "Кош келиңиз"]
    cli = [sys.executable, "-m", "modsent.cli", "encode", "--model", str(run / "results/tiny"), "--quiet"]
    proc = subprocess.run(cli + ["--lang", "ky"], input=("\n".join(sentences) + "\n").encode(),
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    out = tmp_path / "ky.npy"
    out.write_bytes(proc.stdout)
    vectors = np.load(out)
    encoder = ModularEncoder(run / "resources/base_models/tiny")
    encoder.add_language("ky", language_adapter=run / "results/tiny/language_adapters/ky",
                         sentence_adapter=run / "results/tiny/sentence_adapters/ky",
                         alignment=run / "results/tiny/alignment/merged-0.5/ky")
    assert np.allclose(vectors, encoder.encode(sentences, lang="ky"), atol=1e-5)
    parquet = tmp_path / "in.parquet"
    pd.DataFrame({"text": sentences}).to_parquet(parquet)
    proc = subprocess.run(cli + ["--lang", "ky", "--input", str(parquet), "--input-format", "parquet",
                                 "--output", str(tmp_path / "out.jsonl"), "--output-format", "jsonl"],
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert len((tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()) == 2
    proc = subprocess.run(cli + ["--lang", "fr"], input=b"x\n", capture_output=True)
    assert proc.returncode == 2 and b"available: de, en, ky" in proc.stderr
    # without --lang: a sentence in a language without modules (French) is an error, or goes to
    # an explicit fallback, recorded per sentence
    from modsent.sources.builtin import builtin_corpus

    french = [line for line in builtin_corpus("fr") if len(line) >= 45][:2]
    mixed = (tmp_path / "mixed.txt")
    mixed.write_text("\n".join(sentences + french) + "\n", encoding="utf-8")
    proc = subprocess.run(cli + ["--input", str(mixed)], capture_output=True)
    assert proc.returncode == 2 and b"without modules: fr (2)" in proc.stderr
    proc = subprocess.run(cli + ["--input", str(mixed), "--fallback-lang", "en", "--output-format", "jsonl",
                                 "--output", str(tmp_path / "routed.jsonl")], capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    import json

    rows = [json.loads(line) for line in (tmp_path / "routed.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [(row["lang"], row["detected_lang"]) for row in rows[2:]] == [("en", "fr"), ("en", "fr")]
    assert all(row["lang"] == row["detected_lang"] for row in rows[:2])
    # another system of the same tree: Mod_m (no alignment adapter) encodes ky differently
    proc = subprocess.run(cli + ["--lang", "ky", "--variant", "Mod_m"], input=("\n".join(sentences) + "\n").encode(),
                          capture_output=True)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    (tmp_path / "m.npy").write_bytes(proc.stdout)
    assert not np.allclose(np.load(tmp_path / "m.npy"), vectors, atol=1e-3)


def added_tokens_recorded(directory: Path) -> list[str]:
    """The tokenizer directories under ``directory`` whose tokenizer_config.json does not list
    tokenizer.json's added tokens as they are there (modsent.io.record_added_tokens)."""
    wrong = []
    for config_path in sorted(directory.rglob("tokenizer_config.json")):
        config = json.loads(config_path.read_text(encoding="utf-8"))
        added = json.loads((config_path.parent / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
        if config.get("added_tokens_decoder") != {str(t["id"]): {k: v for k, v in t.items() if k != "id"}
                                                  for t in added}:
            wrong.append(str(config_path.parent.relative_to(directory)))
    return wrong


def test_every_tokenizer_the_workflow_saves_lists_its_added_tokens(run):
    """So that loading it does not parse tokenizer.json a second time: the base model, the
    trained tokenizers, the language adapters, the baselines and every recipe's system."""
    saved = [p.parent for p in run.rglob("tokenizer_config.json")]
    assert {"tokenizers", "language_adapters", "baselines", "methods", "base_models"} <= {
        part for p in saved for part in p.parts}, saved
    assert added_tokens_recorded(run) == []


def test_export_writes_a_model_card_and_push_uses_the_hub_s_upload(run, tmp_path, monkeypatch):
    import numpy as np
    from huggingface_hub import HfApi, ModelCard
    from sentence_transformers import SentenceTransformer

    from modsent.cli import main
    from modsent.encoders.modular import ModularEncoder

    results = run / "results/tiny"
    out = tmp_path / "ky-encoder"
    assert main(["export", "--model", str(results), "--lang", "ky", "--out", str(out), "--license", "apache-2.0"]) == 0
    assert added_tokens_recorded(out) == [] and list(out.rglob("tokenizer_config.json"))
    card = ModelCard.load(out / "README.md")  # the Hub's own parser
    data = card.data.to_dict()
    assert data["language"] == ["ky"] and data["license"] == "apache-2.0"
    assert (data["library_name"], data["pipeline_tag"]) == ("sentence-transformers", "sentence-similarity")
    assert "modsent-Mod_mc" in data["tags"] and "base_model" not in data  # a random test model has no Hub id
    text = card.text
    for module in ["language_adapters/ky", "sentence_adapters/ky", "alignment/pp/ky", "alignment/pl/ky"]:
        steps = json.loads((results / module / "metrics.json").read_text())["steps"]
        assert f"`{module.rsplit('/', 2)[-2]}/ky`" in text and f"| steps | {steps} |" in text
    summary = pd.read_csv(results / "summary.csv").set_index("variant").loc["Mod_mc-0.5"]
    lines = text.splitlines()
    row = lines[lines.index("| " + " | ".join(summary.index) + " |") + 2]
    assert [float(v) for v in row.strip("| ").split(" | ")] == pytest.approx(summary.tolist(), rel=1e-3)
    assert ("## Data notices" in text) == (run / "resources/paraphrases/builtin.parquet").is_file()
    # the export is the system: plain sentence-transformers computes what modsent does
    encoder = ModularEncoder(run / "resources/base_models/tiny")
    encoder.add_language("ky", language_adapter=results / "language_adapters/ky",
                         sentence_adapter=results / "sentence_adapters/ky", alignment=results / "alignment/merged-0.5/ky")
    sentences = ["Салам дүйнө", "Кош келиңиз"]
    exported = SentenceTransformer(str(out), device="cpu").encode(sentences)
    assert np.allclose(exported, encoder.encode(sentences, lang="ky"), atol=1e-4)
    assert main(["export", "--model", str(results), "--lang", "ky", "--out", str(out)]) == 2  # exists: --force
    assert main(["export", "--model", str(results), "--variant", "Mod_m", "--out", str(tmp_path / "m")]) == 2  # --lang
    # a monolithic system: its directory with a card, for every language it was trained on
    full = tmp_path / "full-m"
    assert main(["export", "--model", str(results), "--variant", "Full_m", "--out", str(full)]) == 0
    full_card = ModelCard.load(full / "README.md")
    trained = json.loads((results / "baselines/Full_m/metrics.json").read_text())
    assert full_card.data.to_dict()["language"] == trained["languages"] and "modsent-Full_m" in full_card.data.tags
    summary_full = pd.read_csv(results / "summary.csv").set_index("variant").loc["Full_m"]
    lines = full_card.text.splitlines()
    row = lines[lines.index("| " + " | ".join(summary_full.index) + " |") + 2]
    assert [float(v) for v in row.strip("| ").split(" | ")] == pytest.approx(summary_full.tolist(), rel=1e-3)
    assert np.allclose(SentenceTransformer(str(full), device="cpu").encode(sentences),
                       SentenceTransformer(str(results / "baselines/Full_m"), device="cpu").encode(sentences))
    # push: huggingface_hub's create_repo + upload_folder, nothing else
    calls = []
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: calls.append(("create", repo_id, kw)) or f"https://hub/{repo_id}")
    monkeypatch.setattr(HfApi, "upload_folder", lambda self, **kw: calls.append(("upload", kw)))
    assert main(["push", str(out), "--repo-id", "org/ky-encoder", "--private"]) == 0
    assert calls[0] == ("create", "org/ky-encoder", {"private": True, "exist_ok": True, "repo_type": "model"})
    assert calls[1][1]["folder_path"] == str(out) and calls[1][1]["repo_id"] == "org/ky-encoder"
    (out / "README.md").unlink()
    assert main(["push", str(out), "--repo-id", "org/ky-encoder"]) == 2 and len(calls) == 2  # no card, no upload


def test_every_kind_of_exported_system_encodes_what_the_evaluation_stored(run, tmp_path, capsys):
    """Exports equal what was evaluated: for each kind of system (the base; a merged modular system
    of a weight other than the default; the two ablations; a full baseline stored in float16 and
    one trained on from another; each recipe, InteMATs stored in float16 with a module of modsent's
    own), `modsent export` and the card's own usage code give the vectors the evaluation stored
    for Kyrgyz (each row's cosine >= 1 - 1e-5), not merely the vectors of the directory it copies."""
    import numpy as np

    from modsent.cli import main
    from modsent.evaluation.suite import read_embeddings

    results = run / "results/tiny"
    systems = ["base", "Mod_mc-0.7", "Mod_m-LA", "Mod_c", "Full_m", "Full_mc", *RECIPES]
    for system in systems:
        stored = list(results.glob(f"eval/embeddings/*/ky/{system}/builtin_parallel.parquet"))
        assert len(stored) == 1, (system, stored)
        table = read_embeddings(stored[0])
        texts = table.texts[:12]
        out = tmp_path / system
        assert main(["export", "--model", str(results), "--variant", system, "--lang", "ky", "--out", str(out),
                     "--device", "cpu"]) == 0, capsys.readouterr().err
        card = (out / "README.md").read_text(encoding="utf-8")
        exported = np.asarray(run_card_usage(card, out, texts)["embeddings"], dtype=np.float32)
        evaluated = table.embeddings[:12]
        cosines = (exported * evaluated).sum(1) / np.linalg.norm(exported, axis=1) / np.linalg.norm(evaluated, axis=1)
        # tight: the tiny systems are close to each other (Mod_mc-0.5 against -0.7: 0.99992 here)
        assert cosines.min() >= 1 - 1e-5, (system, cosines)


HEAVY_MODULES = ("torch", "transformers", "sentence_transformers", "peft", "scipy", "sklearn")


def test_rerun_has_nothing_to_do_and_planning_imports_nothing_heavy(run):
    """Nothing to do after the run; and planning it (every snakemake start, every job of a
    cluster run) imports no training or scoring library, also with a method module of the
    config (the toy method) registered. Snakemake runs in a Python that lists its modules at exit."""
    import sys

    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('MODULES', *sorted(sys.modules), file=sys.stderr))\n"
            "from snakemake.cli import main\n"
            "sys.argv = ['snakemake', *sys.argv[1:]]\n"
            "main()\n")
    proc = subprocess.run(
        [sys.executable, "-c", code, "--snakefile", str(REPO / "Snakefile"), "--directory", str(run),
         "--configfile", str(run / "workflow.yaml"), "--cores", "2", "-n"],
        capture_output=True, text=True, env=environment())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr
    modules = set(proc.stderr.rsplit("MODULES ", 1)[1].split())
    assert {"modsent.methods.mexma", "toy_method", "modsent.sources.evaluation"} <= modules  # planned for real
    assert sorted(modules & set(HEAVY_MODULES)) == []


def _planned(output: str) -> dict[str, int]:
    """rule -> job count of a dry run's job stats."""
    stats = output.split("Job stats:", 1)[1].split("total", 1)[0]
    return {line.split()[0]: int(line.split()[1]) for line in stats.splitlines()
            if len(line.split()) == 2 and line.split()[1].isdigit()}


# a module of the finished run -> the rule that rebuilds it (and nothing else of its stage)
MODULES = {"tokenizers/de": "tokenizer", "fasttext/ky": "fasttext", "embeddings/de": "focus_embeddings",
           "language_adapters/ky": "language_adapter", "sentence_adapters/en": "sentence_adapter",
           "alignment/pl/de": "alignment_adapter", "alignment/merged-0.5/ky": "merge_alignment",
           "ablations/sentence_adapters_base/de": "ablation_sentence_adapter",
           "ablations/alignment_la/pp/ky": "ablation_alignment_adapter", "baselines/Full_m": "full_baseline",
           "methods/Toy-cos": "train_method"}


def test_a_removed_module_is_always_rebuilt(run):
    """Remove any module of a finished run: a dry run plans its rebuild (one job of its rule,
    two for Full_m, whose weights Full_mc starts from) and what depends on it, every time —
    also when the summaries above it exist."""
    results = next((run / "results").glob("*/summary.md")).parent
    for module, rule in MODULES.items():
        path = results / module
        assert path.is_dir(), module
        aside = path.with_name(path.name + ".aside")
        path.rename(aside)
        try:
            planned = _planned(snakemake(run, "-n").stdout)
        finally:
            aside.rename(path)
        assert planned.get(rule) == (2 if module == "baselines/Full_m" else 1), (module, planned)
        assert planned.get("evaluation_summary") == 1, (module, planned)


def _dry_run(run, config, path):
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    proc = subprocess.run(
        [snakemake_exe(), "--snakefile", str(REPO / "Snakefile"), "--directory", str(run),
         "--configfile", str(path), "--cores", "2", "-n"], capture_output=True, text=True, env=environment())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_the_same_configuration_spelled_otherwise_plans_nothing(run, tmp_path):
    """Every mapping's keys in reverse order, and a number written as an integer: the same
    meaning, so the same params (Snakemake compares their repr)."""
    config = reversed_keys(workflow_config())
    config["sentence_adapter"]["scale"] = 20  # the schema's default, 20.0
    output = _dry_run(run, config, tmp_path / "reversed.yaml")
    assert "Nothing to be done" in output, output[-3000:]


def test_reordering_the_languages_retrains_and_reencodes_nothing(run, tmp_path):
    """The monolithic systems (full baselines, every method, DuEAM's WMD) take their languages
    sorted, and their trainers do not depend on the order: a reordered `languages` plans only
    the scores, whose tables and heatmaps follow the config's order (CPU, seconds)."""
    config = workflow_config()
    config["languages"] = list(reversed(config["languages"]))
    output = _dry_run(run, config, tmp_path / "reordered.yaml")
    planned = set(re.findall(r"^(?:local)?rule (\w+):", output, flags=re.M))
    assert planned and planned <= {"all", "evaluation_scores", "evaluation_summary", "mteb_results"}, planned


# A changed value for every key the schema marks `x-role: runtime` (how a job runs)
RUNTIME_CHANGES = {
    "translation.batch_size": 7, "translation.batch_tokens": 512, "translation.checkpoint_every": 3,
    "resources": {"gpu_train": {"cpus": 3}},
    "evaluation.batch_size": 5, "fasttext.threads": 2, "language_adapter.checkpoint_every": 5,
    "language_adapter.log_every": 3, "language_adapter.tracking": "tensorboard", "language_adapter.gpus": 2,
    "sentence_adapter.log_every": 3, "sentence_adapter.checkpoint_every": 5, "alignment.log_every": 3,
    "alignment.checkpoint_every": 5, "baselines.log_every": 3, "baselines.checkpoint_every": 5,
    "baselines.gpus": 2, "tracking": {"report_to": "tensorboard"},
    "language_adapter.compile": True, "sentence_adapter.compile": True, "alignment.compile": True,
    "baselines.compile": True, "language_adapter.kernels": "triton",
}


def _set(config, key, value):
    section, _, name = key.partition(".")
    if name:
        config.setdefault(section, {})[name] = value
    else:
        config[section] = value


def test_changing_how_jobs_run_retrains_nothing(run, tmp_path):
    """Every runtime key of every section changed at once plans no job (a key in any job's params
    would replan that job); a changed training key, the control, does replan."""
    from modsent.config import RUNTIME, key_roles

    assert set(RUNTIME_CHANGES) == {key for key, role in key_roles().items() if role == RUNTIME}
    config = workflow_config()
    for key, value in RUNTIME_CHANGES.items():
        _set(config, key, value)
    config["methods"]["Toy-cos"].update(log_every=2, checkpoint_every=7, compile=True,  # a method's runtime keys
                                        resources={"constraint": "a100_80gb", "mem_mb": 90000, "cpus": 3})
    output = _dry_run(run, config, tmp_path / "runtime.yaml")
    assert "Nothing to be done" in output, output[-3000:]
    config["sentence_adapter"]["learning_rate"] = 0.002
    output = _dry_run(run, config, tmp_path / "training.yaml")
    assert "Params have changed since last execution" in output
    planned = set(re.findall(r"^(?:local)?rule (\w+):", output, flags=re.M))
    assert {"sentence_adapter", "alignment_adapter", "evaluation_embeddings"} <= planned
    assert not {"language_adapter", "tokenizer", "full_baseline", "corpus"} & planned


def test_the_gpu_workflow_sets_runtime_keys_in_its_copy_of_the_config(tmp_path):
    """benchmarks/gpu_workflow.py run --set section.key=VALUE (gpu.sh's workflow_triton block):
    the value read as YAML, nested keys created, the rest of the config kept; a malformed one refused."""
    path = tmp_path / "workflow.yaml"
    path.write_text(yaml.safe_dump({"languages": ["de"], "language_adapter": {"steps": 2}}))
    done = GPU_WORKFLOW.set_keys(path, ["language_adapter.kernels=triton", "sentence_adapter.compile=true"])
    assert done == ["language_adapter.kernels: 'triton'", "sentence_adapter.compile: True"]
    assert yaml.safe_load(path.read_text()) == {"languages": ["de"],
                                                "language_adapter": {"steps": 2, "kernels": "triton"},
                                                "sentence_adapter": {"compile": True}}
    with pytest.raises(SystemExit, match="expected section.key=VALUE"):
        GPU_WORKFLOW.set_keys(path, ["language_adapter.kernels"])


# the rules that read the user's inputs (priority 5) and the trainings they must all precede
INPUT_RULES = {"base_model", "corpus", "paraphrase_source", "provided_translations", "evaluation_subset"}
TRAINING_RULES = {"tokenizer", "language_adapter", "sentence_adapter", "alignment_adapter", "full_baseline",
                  "ablation_sentence_adapter", "ablation_alignment_adapter", "train_method"}


def _first_run_jobs(workdir: Path) -> list[dict]:
    """The jobs of the first Snakemake run in ``workdir`` (the whole DAG's; later tests run more),
    in the order they started, as benchmarks/gpu_workflow.py reads them from its log."""
    return GPU_WORKFLOW.jobs_of_run(workdir, sorted((workdir / ".snakemake" / "log").glob("*.snakemake.log"))[0])


def _started(workdir: Path) -> list[str]:
    """The rules of the first run's jobs, in the order they started."""
    return [job["rule"] for job in _first_run_jobs(workdir)]


def test_every_input_is_read_before_any_training_starts(run):
    started = _started(run)
    assert INPUT_RULES <= set(started) and TRAINING_RULES <= set(started)
    first_training = min(i for i, rule in enumerate(started) if rule in TRAINING_RULES)
    assert all(i < first_training for i, rule in enumerate(started) if rule in INPUT_RULES)


def test_a_bad_local_evaluation_file_stops_the_run_before_any_training(tmp_path):
    """The German Tatoeba file without its English column: the run fails in its first jobs, naming
    the file and the column, and no training job has started (the evaluation reads it hours in
    otherwise). On one core, so that the claim is exact: on more, a training job may start beside
    the last input job (every input job starts before any training, as the test above checks) and
    runs to its end when that one fails."""
    import gzip

    broken = tmp_path / "tatoeba"
    (broken / "test").mkdir(parents=True)
    for path in TATOEBA_FILES.glob("test/*.jsonl.gz"):
        rows = [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")]
        if path.name.startswith("deu"):
            rows = [{k: v for k, v in row.items() if k != "sentence2"} for row in rows]
        with gzip.open(broken / "test" / path.name, "wt", encoding="utf-8") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)
    work = tmp_path / "work"
    work.mkdir()
    config = workflow_config()
    config["evaluation"]["datasets"]["tatoeba"] = {"source": f"local:{broken}"}
    (work / "workflow.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    proc = snakemake(work, check=False, cores=1)
    assert proc.returncode != 0
    logs = "".join(p.read_text() for p in (work / "logs" / "eval" / "tatoeba").glob("*.log"))
    assert "deu-eng.jsonl.gz" in logs and "sentence2" in logs
    started = _started(work)
    assert "evaluation_subset" in started and not set(started) & TRAINING_RULES
    assert not (work / "results").exists()


def test_no_temporaries_checkpoints_or_partials_left(run):
    leftovers = [p for folder in ("resources", "results") for pattern in (".*.tmp-*", "*.checkpoint", "*.partial")
                 for p in (run / folder).rglob(pattern)]
    assert leftovers == []


def test_machine_translation_path_scatters_and_gathers(tmp_path):
    """engine: transformers with a tiny random NLLB, 2 shards per language: the shards run as
    separate jobs, every unit comes back exactly once, and the pair files stay parallel."""
    from modsent.testing import make_random_nllb, sample_texts

    model = make_random_nllb(tmp_path / "nllb", sample_texts(300), vocab_size=400)
    config = yaml.safe_load(CONFIG.read_text())
    config["languages"] = ["en", "ky"]
    config["translation"] = {"engine": "transformers", "model": f"local:{model}", "shards": 2,
                             "batch_size": 16, "batch_tokens": 64, "beam_size": 1, "max_length": 8}
    config["alignment"]["provided_translations"] = False  # no provided translations here
    path = tmp_path / "mt.yaml"
    path.write_text(yaml.safe_dump(config))
    workdir = tmp_path / "work"
    proc = subprocess.run(
        [snakemake_exe(), "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
         "--configfile", str(path), "--cores", "2", "results/paraphrase/ky.parquet",
         "results/translation/quality.md"],
        capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    shards = sorted(p.name for p in (workdir / "results/translation/ky/shards").iterdir())
    assert shards == ["1-of-2.parquet", "2-of-2.parquet"]
    assert "at most 16 sentences and 64 padded tokens" in (workdir / "logs/translation/ky/1-of-2.log").read_text()
    units = pd.read_parquet(workdir / "results/translation/units.parquet")
    ky = pd.read_parquet(workdir / "results/translation/ky.parquet")
    assert sorted(ky["unit_id"]) == sorted(units["unit_id"])
    en = pd.read_parquet(workdir / "results/paraphrase/en.parquet")
    assert pd.read_parquet(workdir / "results/paraphrase/ky.parquet")["pair_id"].tolist() == en["pair_id"].tolist()


def test_variants_assemble_from_the_results_tree(run):
    import numpy as np

    from modsent.io import InputError
    from modsent.encoders.systems import build_encoder, variant, variant_names

    assert variant_names([0.5, 0.7]) == ["Mod_en", "Mod_m", "Mod_mc-pp", "Mod_mc-pl", "Mod_mc-0.5", "Mod_mc-0.7"]
    assert variant("Mod_mc").cla == "merged-0.5"
    with pytest.raises(InputError, match="unknown variant"):
        variant("Full_x")
    base, results = run / "resources/base_models/tiny", run / "results/tiny"
    sentence = ["Салам дүйнө"]
    vectors = {name: build_encoder(name, results, base, ["en", "ky"]).encode(sentence, lang="ky")
               for name in ["Mod_en", "Mod_m", "Mod_mc-pp", "Mod_mc-0.5"]}
    # each recipe activates other modules for ky, so the embeddings differ
    names = list(vectors)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not np.allclose(vectors[a], vectors[b]), (a, b)
    english = {name: build_encoder(name, results, base, ["en"]).encode(["Hello"], lang="en")
               for name in ["Mod_m", "Mod_mc-0.5"]}
    assert np.allclose(english["Mod_m"], english["Mod_mc-0.5"])  # English has no CLA adapter


def test_evaluation_summary_has_every_system_and_task(run, monkeypatch):
    import json

    import numpy as np

    from modsent.encoders import systems as variants

    config = workflow_config()
    monkeypatch.chdir(run)  # its local paths are the run directory's, as the jobs see them
    from modsent.config import check_config  # fills nothing: the schema defaults come from validate

    check_config(config)
    from snakemake.utils import validate

    validate(config, str(SCHEMA_PATH))
    systems = variants.evaluated_variants(config)
    assert systems[0] == "base" and "Full_mc" in systems and "Mod_c" in systems and "Mod_mc-0.7" in systems
    assert systems[-len(TOY_METHOD["methods"]) - len(RECIPES):] == ["Toy-cos", *RECIPES]  # after the paper's
    # the workflow runs the canonical config (keys sorted): the methods' rows in name order
    from modsent.config import normalize_config

    systems = variants.evaluated_variants(normalize_config(config))
    table = pd.read_csv(run / "results/tiny/summary.csv", index_col=0)
    assert list(table.index) == systems
    assert {"BM builtin_parallel xsim err ↓", "RSIM builtin_parallel", "TC builtin_topics mono",
            "TC builtin_topics zero-shot", "PM builtin_paraphrase err ↓"} <= set(table.columns)
    assert table["BM builtin_parallel xsim err ↓"].between(0, 100).all()
    assert table["PM builtin_paraphrase err ↓"].between(0, 100).all()
    assert table["TC builtin_topics mono"].between(0, 100).all()
    assert table["RSIM builtin_parallel"].between(-1, 1).all()
    for system in systems:
        scores = json.loads((run / f"results/tiny/eval/scores/{system}/builtin_parallel.json").read_text())
        pairs = scores["scores"]["xsim"]["values"]
        assert set(pairs) == {f"{a}-{b}" for a in ["en", "de", "ky"] for b in ["en", "de", "ky"] if a != b}
        assert np.mean(list(pairs.values())) == pytest.approx(table.loc[system, "BM builtin_parallel xsim err ↓"], abs=1e-3)
    # English is encoded once for every system whose English modules are equal
    en = run / "results/tiny/eval/embeddings/modular/en"
    assert (en / "Mod_m" / "builtin_parallel.parquet").read_bytes() == (en / "Mod_mc-0.5" / "builtin_parallel.parquet").read_bytes()
    assert (run / "results/tiny/eval/per_language/builtin_parallel_xsim.md").is_file()
    assert "<table>" in (run / "results/tiny/eval/per_language/builtin_parallel_xsim.html").read_text()
    for png in ("summary.png", "xsim_heatmaps.png"):
        assert (run / "results/tiny/eval" / png).read_bytes()[:4] == b"\x89PNG"


def test_report_has_the_summary(run, tmp_path):
    """The report holds Table 1 and the training diagnostics as HTML pages (each beside its
    Markdown in the results, with the same rows), the plots, grouped by category."""
    report = tmp_path / "report.html"
    snakemake(run, "--report", str(report))
    html = report.read_text(encoding="utf-8", errors="replace")
    assert report.stat().st_size > 10_000
    for name in ("summary.html", "xsim_heatmaps.png", "summary.png", "builtin_parallel_xsim.html", "quality.html",
                 "inputs_summary.html"):
        assert name in html, name
    for category in ("1. Evaluation", "2. Training", "3. Data", "Language adapters", "Sentence adapters",
                     "Alignment adapters", "Full baselines", "Translation quality"):
        assert category in html, category
    for md in ("summary.md", "language_adapters/summary.md", "sentence_adapters/summary.md",
               "alignment/summary.md", "baselines/summary.md"):
        text = (run / "results/tiny" / md).read_text(encoding="utf-8")
        page = (run / "results/tiny" / md).with_suffix(".html").read_text(encoding="utf-8")
        table_rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("|---")]
        assert page.count("<tr>") == len(table_rows) > 1, md


def test_a_method_registered_once_trains_evaluates_and_is_a_summary_row(run):
    """tests/toy_method.py (a new loss over the existing pairs, registered once) and two config
    keys: the method trained every weight, its system reloads with plain sentence-transformers,
    and the same evaluation scored it into the same summary."""
    import json

    import numpy as np
    from sentence_transformers import SentenceTransformer

    out = run / "results/tiny/methods/Toy-cos"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["baseline"] == "Toy-cos" and metrics["steps"] == 2 and metrics["languages"] == ["de", "en", "ky"]
    assert metrics["trainable_parameters"] == metrics["total_parameters"]  # every weight
    assert (out / "loss_curve.png").is_file() or list(out.glob("*.png"))
    trained = SentenceTransformer(str(out), device="cpu").encode(["Hallo Welt"], prompt="")
    base = SentenceTransformer(str(run / "resources/base_models/tiny"), device="cpu").encode(["Hallo Welt"], prompt="")
    assert trained.shape == base.shape and not np.allclose(trained, base, atol=1e-4)
    table = pd.read_csv(run / "results/tiny/summary.csv", index_col=0)
    assert table.loc["Toy-cos", "BM builtin_parallel xsim err ↓"] == pytest.approx(
        np.mean(list(json.loads((run / "results/tiny/eval/scores/Toy-cos/builtin_parallel.json").read_text())
                     ["scores"]["xsim"]["values"].values())), abs=1e-3)
    assert table.loc["Toy-cos"].notna().all()
    assert "Toy-cos" in (run / "results/tiny/summary.md").read_text()


def test_every_recipe_trains_evaluates_and_is_a_summary_row(run, tmp_path):
    """One tiny system of each recipe ran through its own rules (DuEAM's WMD job, InteMATs'
    fusion after its ST and DT systems, MEXMA on the provided translations too), was scored by
    the same suite and is a row of the same summary. ``modsent export`` (a process of its own,
    as a user runs it) writes a recipe's system and a system of a method outside modsent."""
    import sys

    import numpy as np
    import torch
    from safetensors.torch import load_file

    from modsent.encoders.systems import load_sentence_transformer

    table = pd.read_csv(run / "results/tiny/summary.csv", index_col=0)
    for name in RECIPES:
        out = run / f"results/tiny/methods/{name}"
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["steps"] == 2, name
        assert table.loc[name].notna().all(), name
        assert load_sentence_transformer(out, device="cpu").encode(["Hallo Welt"]).shape[0] == 1
        assert (run / f"logs/tiny/methods/{name}.log").stat().st_size > 0
    assert list((run / "results/tiny/methods/DuEAM.wmd").glob("*/0-of-1.parquet"))
    assert json.loads((run / "results/tiny/methods/MEXMA/metrics.json").read_text())["config"]["provided_translations"]
    # the fusion's export: the evaluated float16 weights, a card that loads them in float32
    for name in ("InteMATs", "Toy-cos"):  # the toy method's module is not imported by that process
        subprocess.run([sys.executable, "-m", "modsent.cli", "export", "--model", str(run / "results/tiny"),
                        "--variant", name, "--out", str(tmp_path / name)], check=True, env=environment())
    card = (tmp_path / "InteMATs/README.md").read_text()
    assert 'model = load_sentence_transformer("PATH")' in card and "trust_remote_code=True)`" in card
    weights = load_file(str(tmp_path / "InteMATs/model.safetensors"))
    assert {v.dtype for v in weights.values() if v.is_floating_point()} == {torch.float16}
    texts = ["Hallo Welt", "Салам дүйнө"]
    exported, evaluated = (load_sentence_transformer(d, device="cpu").encode(texts)
                           for d in (tmp_path / "InteMATs", run / "results/tiny/methods/InteMATs"))
    assert np.array_equal(exported, evaluated)
    assert "modsent-Toy-cos" in (tmp_path / "Toy-cos/README.md").read_text()
    # `modsent encode` of the results tree finds that method's system by its name too
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "modsent.cli", "encode", "--model", str(run / "results/tiny"),
                    "--variant", "Toy-cos", "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "toy.npy"),
                    "--quiet"], check=True, env=environment())
    toy = load_sentence_transformer(run / "results/tiny/methods/Toy-cos", device="cpu").encode(texts)
    toy = toy / np.linalg.norm(toy, axis=1, keepdims=True)
    assert np.allclose(np.load(tmp_path / "toy.npy"), toy, atol=1e-6)


def test_an_english_only_dataset_is_not_translated_and_mst5_en_trains_on_it(run):
    """paraphrases.snli.english_only: its pairs are in no language's pair file and no sentence of
    it is a translation unit; mST5-en (datasets: null) trained on results/paraphrase/en.all.parquet,
    the English pairs followed by SNLI's."""
    from modsent.methods import baselines as bl
    from modsent.methods.mst5.training import english_triplets, read_frames

    snli = pd.read_parquet(run / "resources/paraphrases/snli.parquet")
    english = pd.read_parquet(run / "results/paraphrase/en.parquet")
    every = pd.read_parquet(run / "results/paraphrase/en.all.parquet")
    units = set(pd.read_parquet(run / "results/translation/units.parquet")["text"])
    assert len(snli) == 2 and set(snli["dataset"]) == {"snli"}
    assert not units & set(snli[["anchor", "positive", "negative"]].stack())
    for lang in workflow_config()["languages"]:
        assert "snli" not in set(pd.read_parquet(run / f"results/paraphrase/{lang}.parquet")["dataset"]), lang
    assert list(every["pair_id"]) == list(english["pair_id"]) + list(snli["pair_id"])

    def train_triplets(path):  # mST5-en's training triplets from a pair file, as run_training takes them
        return len(english_triplets(bl.split_heldout_by_pivot(read_frames({"en": path}, None, "datasets"),
                                                              RECIPES["mST5-en"]["eval_pairs"])[0]["en"]))

    metrics = json.loads((run / "results/tiny/methods/mST5-en/metrics.json").read_text())
    assert metrics["train_triplets"] == train_triplets(run / "results/paraphrase/en.all.parquet")
    assert metrics["train_triplets"] > train_triplets(run / "results/paraphrase/en.parquet")


def test_every_system_has_mteb_result_files_that_mteb_reads(run):
    """Every system's Tatoeba scores as mteb result files, read by mteb's own ResultCache; the
    accuracy is that of cosine nearest neighbours German -> English computed here from the
    system's embedding files."""
    import numpy as np

    mteb = pytest.importorskip("mteb")
    from modsent.config import normalize_config
    from modsent.encoders import systems as variants
    from modsent.evaluation.suite import read_embeddings

    systems = variants.evaluated_variants(normalize_config(workflow_config()))
    results = mteb.ResultCache(run / "results/tiny/mteb").load_results(include_remote=False)
    loaded = {model.model_name: model for model in results.model_results}
    assert set(loaded) == {f"modsent-tiny/{system}" for system in systems}
    rows = pd.read_json(TATOEBA_FILES / "test" / "deu-eng.jsonl.gz", lines=True)
    for system in systems:
        [task] = loaded[f"modsent-tiny/{system}"].task_results
        assert task.task_name == "Tatoeba" and task.dataset_revision == f"local:{TATOEBA_FILES}"
        [entry] = task.scores["test"]
        assert entry["hf_subset"] == "deu-eng" and entry["languages"] == ["deu-Latn", "eng-Latn"]
        group = run / "results/tiny/eval/embeddings" / variants.group_of(system)
        german = read_embeddings(group / "de" / system / "tatoeba.parquet")(rows["sentence1"].tolist())
        english = read_embeddings(group / "en" / system / "tatoeba.parquet")(rows["sentence2"].tolist())
        german /= np.linalg.norm(german, axis=1, keepdims=True)
        english /= np.linalg.norm(english, axis=1, keepdims=True)
        found = np.argmax(german @ english.T, axis=1) == np.arange(len(rows))
        assert entry["accuracy"] == pytest.approx(found.mean()), system


def test_a_seed_replicate_retrains_with_each_seed_plus_r_on_the_same_base_model(run):
    """seeds: N — replicate r is the same tree under results/tiny@seed{r} trained with every seed
    plus r, from the one base model; the plan ends in the mean ± std summary over the replicates."""
    import torch
    from safetensors.torch import load_file

    plan = snakemake(run, "-n", "--config", "seeds=3").stdout
    planned = _planned(plan)
    assert planned["seeds_summary"] == 1 and "base_model" not in planned
    # DuEAM's pairs depend on its seed: a replicate's WMD jobs are those of its own pairs
    first = {path.name for path in (run / "results/tiny/methods/DuEAM.wmd").iterdir() if path.name != "cache"}
    replicate_wmd = set(re.findall(r"results/tiny@seed1/methods/DuEAM\.wmd/([0-9a-f]+)/", plan))
    assert first and replicate_wmd and not first & replicate_wmd
    assert planned["language_adapter"] == 2 * len(workflow_config()["languages"])  # two more replicates
    target = "results/tiny@seed1/ablations/sentence_adapters_base/en"
    snakemake(run, target, "--config", "seeds=2")
    replicate, first = run / target, run / "results/tiny/ablations/sentence_adapters_base/en"
    seeds = [json.loads((d / "metrics.json").read_text())["config"]["seed"] for d in (first, replicate)]
    assert seeds == [0, 1]
    a, b = (load_file(str(d / "adapter" / "adapter_model.safetensors")) for d in (first, replicate))
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)
    assert sorted(p.name for p in (run / "resources/base_models").iterdir()) == ["tiny"]
    proc = snakemake(run, "-n")  # the one-seed config: replicate 0 untouched by the replicate's jobs
    assert "Nothing to be done" in proc.stdout + proc.stderr


"""modsent fetch: what a run reads from the Hub, fetched ahead for compute nodes without
internet access (modsent.fetch)."""

import re

import pytest

from conftest import REPO, rule_blocks
from modsent import fetch, planning
from modsent.cli import main
from modsent.io import InputError


def test_the_input_rules_are_the_rules_that_read_the_user_s_inputs():
    """INPUT_RULES: the rules that run first (priority 5: they read the Hub, local files and
    built-in data) and the translation model's conversion, which downloads it."""
    blocks = rule_blocks()
    first = {name for name, text in blocks.items() if re.search(r"^\s*priority: 5\s*$", text, flags=re.M)}
    assert first == set(fetch.INPUT_RULES) - {"convert_translation_model"}
    assert "convert_translation_model" in blocks


def test_the_hub_models_a_config_s_jobs_load_by_id(tmp_path):
    """Each method's model/*_model (with revision/*_revision) and the transformers engine's
    translation model, each once; not a local directory, local:, builtin: or an unset one;
    not the base model or a model the ctranslate2 engine converts (input rules)."""
    mexma = fetch.hub_models(planning.load_filled_config(REPO / "configs" / "mexma.yaml"))
    assert [(m.key, m.repo_id) for m in mexma] == [
        ("translation.model", "facebook/nllb-200-3.3B"), ("methods.MEXMA-base.model", "FacebookAI/xlm-roberta-base"),
        ("methods.MEXMA.model", "FacebookAI/xlm-roberta-large")]
    assert all(m.revision and len(m.revision) == 40 for m in mexma)  # the config pins commits
    assert fetch.hub_models(planning.load_filled_config(REPO / "configs" / "paper-labse.yaml")) == []  # ctranslate2

    (tmp_path / "models" / "mine").mkdir(parents=True)
    config = {"translation": {"engine": "transformers", "model": "hf:facebook/nllb-200-distilled-600M",
                              "revision": "abc"},
              "methods": {"A": {"model": "models/mine", "anchor_model": "org/anchor", "anchor_revision": "r1"},
                          "B": {"model": "local:/somewhere", "revision": "x"},
                          "C": {"model": None, "anchor_model": "org/anchor", "anchor_revision": "r1"},
                          "D": {"model": "builtin:me5-small", "teacher_model": "org/teacher"},
                          "E": {"model": str(tmp_path / "models" / "mine")}}}
    assert fetch.hub_models(config, tmp_path) == [
        fetch.HubModel("facebook/nllb-200-distilled-600M", "abc", "translation.model"),
        fetch.HubModel("org/anchor", "r1", "methods.A.anchor_model"),
        fetch.HubModel("org/teacher", None, "methods.D.teacher_model")]
    # the same model directory named from elsewhere is a Hub id there (the loaders' reading too)
    assert fetch.HubModel("models/mine", None, "methods.A.model") in fetch.hub_models(config, tmp_path / "elsewhere")


def test_download_reads_safetensors_and_no_pickles_and_names_the_key_of_a_model_without_them(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []

    def snapshot_download(repo_id, revision, allow_patterns):
        calls.append((repo_id, revision, tuple(allow_patterns)))
        folder = tmp_path / repo_id.replace("/", "--")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text("{}")
        if repo_id != "org/pickled":
            (folder / "model.safetensors").write_bytes(b"")
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    good = fetch.HubModel("org/good", "r1", "methods.M.model")
    assert fetch.download([good]) == [tmp_path / "org--good"]
    assert calls == [("org/good", "r1", tuple(fetch.HUB_PATTERNS))]
    assert not any(pattern.endswith((".bin", ".pt", ".pkl", ".py")) for pattern in fetch.HUB_PATTERNS)
    with pytest.raises(InputError, match=r"^methods\.X\.model: org/pickled \(revision main\) has no safetensors"):
        fetch.download([fetch.HubModel("org/pickled", None, "methods.X.model")])

    def offline(**kwargs):
        raise OSError("no connection")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(InputError, match=r"^translation\.model: org/good \(revision r1\) is no local directory "
                                         r"\(in .*\) and could not be downloaded from the Hub: OSError: no connection"):
        fetch.download([fetch.HubModel("org/good", "r1", "translation.model")], tmp_path)


def test_fetch_runs_the_input_rules_so_that_the_run_starts_with_the_training(tmp_path, capsys, monkeypatch):
    """modsent fetch on the tests' config (no Hub model; built-in inputs): the input rules run
    here and nothing else, even with a cluster profile in $SNAKEMAKE_PROFILE (it would submit
    them to the compute nodes); the run that follows plans no input job and every training job."""
    configfile = REPO / "configs" / "test.yaml"
    assert main(["fetch", "--configfile", str(configfile), "--directory", str(tmp_path), "--dry-run"]) == 0
    assert not (tmp_path / "resources").exists()  # a dry run writes nothing
    monkeypatch.setenv("SNAKEMAKE_PROFILE", str(REPO / "slurm"))
    assert main(["fetch", "--configfile", str(configfile), "--directory", str(tmp_path), "--cores", "2"]) == 0
    out = capsys.readouterr().out
    assert "no Hub model that a job loads by id" in out and "HF_HUB_OFFLINE=1 snakemake --profile slurm" in out
    assert (tmp_path / "resources" / "base_models").is_dir()
    rules = {rule for rule, _, _ in planning.planned_jobs(configfile, tmp_path)}
    assert not rules & set(fetch.INPUT_RULES), rules
    assert {"tokenizer", "language_adapter", "sentence_adapter", "evaluation_embeddings"} <= rules, rules


def test_the_input_rules_run_here_under_the_cluster_run_s_profile():
    """--profile: the cluster run's profile (its software deployment), the local executor."""
    cmd = fetch.input_command("c.yaml", "d", 4, ["corpus"], profile="slurm")
    assert cmd[cmd.index("--profile") + 1] == "slurm" and cmd[cmd.index("--executor") + 1] == "local"
    assert cmd[-2:] == ["--until", "corpus"] and cmd[cmd.index("--cores") + 1] == "4"

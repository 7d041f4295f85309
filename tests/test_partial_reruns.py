"""Rerunning one language, and adding one, run only that language's jobs and the summaries.

A run of configs/test.yaml with English and Kyrgyz (the training stages and their summaries),
then: forcing Kyrgyz's outputs (`modsent outputs --lang ky`) plans every Kyrgyz job and the
summaries, nothing of English; adding German leaves every existing output but the summaries
up to date (`--summary`), plans only German's jobs and the summaries, and running it leaves
every other output byte for byte and mtime for mtime as it was.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO, snakemake_exe

pytestmark = pytest.mark.workflow
BASE = "tiny"
# jobs with no {lang} that read several languages' outputs: they rerun when one changes
SUMMARIES = {"inputs_summary", "language_adapter_summary", "sentence_adapter_summary",
             "translation_quality_summary", "alignment_summary"}


def snakemake_command() -> str:
    """The environment's snakemake (also when pytest runs as .venv/bin/python -m pytest)."""
    beside = Path(sys.executable).parent / "snakemake"
    return str(beside) if beside.exists() else snakemake_exe()


def targets(languages: list[str]) -> list[str]:
    """The training stages' summaries and merged adapters (not the evaluation)."""
    return ([f"results/{BASE}/{stage}/summary.md" for stage in ["language_adapters", "sentence_adapters", "alignment"]]
            + ["results/translation/quality.md", "resources/inputs_summary.md"]
            + [f"results/{BASE}/alignment/merged-0.5/{lang}" for lang in languages if lang != "en"])


def write_config(workdir, languages: list[str]):
    config = yaml.safe_load((REPO / "configs" / "test.yaml").read_text())
    config["languages"] = languages
    config["alignment"]["merge_weights"] = [0.5]
    path = workdir / f"config-{'-'.join(languages)}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def snakemake(workdir, config, *args):
    proc = subprocess.run(
        [snakemake_command(), "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
         "--configfile", str(config), "--cores", "2", *args],
        capture_output=True, text=True)
    assert proc.returncode == 0, f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout + proc.stderr


def planned_jobs(output: str) -> list[tuple[str, dict[str, str], list[str]]]:
    """(rule, wildcards, outputs) of every job a dry run plans."""
    jobs = []
    for rule, body in re.findall(r"^(?:local)?rule (\w+):\n((?:    .*\n?)*)", output, flags=re.M):
        fields = dict(re.findall(r"^    (\w+): (.*)$", body, flags=re.M))
        wildcards = dict(item.split("=", 1) for item in fields.get("wildcards", "").split(", ") if "=" in item)
        jobs.append((rule, wildcards, fields.get("output", "").split(", ")))
    return jobs


def snapshot(workdir) -> dict[str, tuple[str, int]]:
    """path -> (sha256, mtime_ns) of every file under resources/ and results/."""
    files = {}
    for folder in ("resources", "results"):
        for path in (workdir / folder).rglob("*"):
            if path.is_file():
                files[str(path.relative_to(workdir))] = (hashlib.sha256(path.read_bytes()).hexdigest(),
                                                         path.stat().st_mtime_ns)
    return files


def belongs_to(path: str, lang: str) -> bool:
    """Whether ``path`` is an output of ``lang`` (a path component named lang or lang.ext)."""
    return any(part == lang or part.split(".", 1)[0] == lang for part in path.split("/"))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("partial")
    config = write_config(workdir, ["en", "ky"])
    snakemake(workdir, config, *targets(["en", "ky"]))
    assert "Nothing to be done" in snakemake(workdir, config, "-n", *targets(["en", "ky"]))
    return workdir


def test_outputs_command_lists_one_language(workdir):
    proc = subprocess.run([sys.executable, "-m", "modsent.cli", "outputs", "--lang", "ky", "--directory", str(workdir)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    paths = proc.stdout.split()
    assert all(belongs_to(path, "ky") and not belongs_to(path, "en") for path in paths)
    for expected in ["resources/corpora/ky.txt", "results/translation/ky.parquet", "results/paraphrase/ky.parquet",
                     f"results/{BASE}/language_adapters/ky", f"results/{BASE}/sentence_adapters/ky",
                     f"results/{BASE}/alignment/pp/ky", f"results/{BASE}/alignment/merged-0.5/ky"]:
        assert expected in paths
    missing = subprocess.run([sys.executable, "-m", "modsent.cli", "outputs", "--lang", "de", "--directory",
                              str(workdir)], capture_output=True, text=True)
    assert missing.returncode == 1 and "no outputs of de" in missing.stderr


def test_rerunning_one_language_plans_its_jobs_and_the_summaries(workdir):
    config = workdir / "config-en-ky.yaml"
    every_job = planned_jobs(snakemake(workdir, config, "-n", "--forceall", *targets(["en", "ky"])))
    ky_jobs = {(rule, tuple(sorted(w.items()))) for rule, w, _ in every_job if w.get("lang") == "ky"}
    paths = subprocess.run([sys.executable, "-m", "modsent.cli", "outputs", "--lang", "ky", "--directory",
                            str(workdir)], capture_output=True, text=True, check=True).stdout.split()
    plan = planned_jobs(snakemake(workdir, config, "-n", *targets(["en", "ky"]), "--forcerun", *paths))
    assert {(rule, tuple(sorted(w.items()))) for rule, w, _ in plan if "lang" in w} == ky_jobs
    assert {rule for rule, w, _ in plan if "lang" not in w} == SUMMARIES
    assert len(ky_jobs) > 10


def test_adding_a_language_runs_only_its_jobs_and_the_summaries(workdir):
    languages = ["en", "ky", "de"]
    config = write_config(workdir, languages)
    # --summary: every output's status and plan (--list-changes params of Snakemake 9.27
    # lists every output whose params were recorded, changed or not)
    rows = [line.split("\t") for line in snakemake(workdir, config, "--summary", *targets(languages)).splitlines()]
    status = {row[0]: (row[2], row[4], row[5]) for row in rows if len(row) == 6 and row[0] != "output_file"}
    for path, (rule, state, plan) in status.items():
        if belongs_to(path, "de"):
            assert (state, plan) == ("missing", "update pending"), path
        elif rule in SUMMARIES:
            assert plan == "update pending", path
        else:  # English and Kyrgyz outputs, and the shared ones: no parameter or input changed
            assert (state, plan) == ("ok", "no update"), (path, rule, state)
    assert sum(belongs_to(path, "ky") for path in status) > 10
    plan = planned_jobs(snakemake(workdir, config, "-n", *targets(languages)))
    assert {w["lang"] for _, w, _ in plan if "lang" in w} == {"de"}
    assert {rule for rule, w, _ in plan if "lang" not in w} == SUMMARIES
    rerun_outputs = [out for rule, _, outs in plan if rule in SUMMARIES for out in outs]

    before = snapshot(workdir)
    snakemake(workdir, config, *targets(languages))
    after = snapshot(workdir)
    touched = {path for path in after if before.get(path) != after[path]}
    assert all(belongs_to(path, "de") or any(path == out or path.startswith(out + "/") for out in rerun_outputs)
               for path in touched), sorted(touched)
    untouched = {path for path in before if not belongs_to(path, "de")} - touched
    assert {path for path in before if belongs_to(path, "ky")} <= untouched
    assert f"results/{BASE}/language_adapters/ky/metrics.json" in untouched
    assert any(belongs_to(path, "de") for path in touched)
    assert "Nothing to be done" in snakemake(workdir, config, "-n", *targets(languages))


def test_adding_a_merge_weight_trains_nothing(workdir):
    """A new merge weight is a new weighted average of the trained pp and pl adapters: only the
    merges run, no adapter retrains (the CLA rules' params leave merge_weights out)."""
    languages = ["en", "ky", "de"]
    config = yaml.safe_load(write_config(workdir, languages).read_text())
    config["alignment"]["merge_weights"] = [0.5, 0.7]
    path = workdir / "config-two-weights.yaml"
    path.write_text(yaml.safe_dump(config))
    wanted = targets(languages) + [f"results/{BASE}/alignment/merged-0.7/{lang}" for lang in ("ky", "de")]
    plan = planned_jobs(snakemake(workdir, path, "-n", *wanted))
    assert {(rule, w.get("weight")) for rule, w, _ in plan} == {("merge_alignment", "0.7")}
    assert {w["lang"] for _, w, _ in plan} == {"ky", "de"}


def test_provided_translations_for_alignment_rerun_pl_not_pp(workdir):
    """How many provided translations pl trains on (alignment.max_provided; test.yaml has
    provided_translations on) changes pl's data and the English sentences embedded, not pp's: a
    dry run plans the English embeddings, the pl adapter, the merge and the summary."""
    config = yaml.safe_load((workdir / "config-en-ky.yaml").read_text())
    assert config["alignment"]["provided_translations"] is True
    config["alignment"]["max_provided"] = 20
    path = workdir / "config-provided.yaml"
    path.write_text(yaml.safe_dump(config))
    plan = planned_jobs(snakemake(workdir, path, "-n", *targets(["en", "ky"])))
    # (the summaries may also be planned: an earlier test of the module may have added German)
    planned = sorted({(rule, w.get("kind", ""), w.get("lang", "")) for rule, w, _ in plan if rule not in SUMMARIES})
    assert planned == [("alignment_adapter", "pl", "ky"), ("english_embeddings_provided", "", "ky"),
                       ("merge_alignment", "", "ky")], planned
    assert "alignment_summary" in {rule for rule, _, _ in plan}


def test_an_english_only_dataset_added_later_translates_and_retrains_nothing(workdir):
    """paraphrases.snli with english_only (SNLI's triplets, from the Hub fixture, as a local file):
    a finished tree plans that dataset's file, the English-only methods' pairs
    (results/paraphrase/en.all.parquet) and the inputs' summary, no translation, pair file or
    adapter; running them leaves every earlier file as it was. The English-only method whose
    datasets names it (mST5-en-all's [builtin-countries, snli]; null, in tests/test_workflow.py)
    trains on en.all.parquet; one whose datasets names none of it (mST5-en's [builtin-countries])
    and the cross-lingual ones (mST5-xnli) on what they read before."""
    import json

    from modsent.sources import hub

    records = hub.iter_hub_records(hub.with_location(hub.SNLI, REPO / "tests/fixtures/hub/stanfordnlp-snli"))
    (workdir / "snli.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    config = yaml.safe_load((workdir / "config-en-ky.yaml").read_text())
    config["paraphrases"]["snli"] = {"source": "local:snli.jsonl", "english_only": True}
    path = workdir / "config-english-only.yaml"
    path.write_text(yaml.safe_dump(config))
    every = "results/paraphrase/en.all.parquet"
    plan = planned_jobs(snakemake(workdir, path, "-n", *targets(["en", "ky"]), every))
    # (the summaries may also be planned: an earlier test of the module may have added German)
    planned = sorted((rule, w.get("dataset", "")) for rule, w, _ in plan if rule not in SUMMARIES)
    assert planned == [("english_training_pairs", ""), ("paraphrase_source", "snli")], planned
    assert "inputs_summary" in {rule for rule, _, _ in plan}

    before = snapshot(workdir)
    snakemake(workdir, path, *targets(["en", "ky"]), every)
    after = snapshot(workdir)
    summaries = ("resources/inputs_summary", f"results/{BASE}/language_adapters/summary",
                 f"results/{BASE}/sentence_adapters/summary", f"results/{BASE}/alignment/summary",
                 "results/translation/quality.")
    assert {p for p in after if before.get(p) != after[p] and not p.startswith(summaries)} == {
        "resources/paraphrases/snli.parquet", every}
    english, snli, pairs = (pd.read_parquet(workdir / p) for p in (
        "results/paraphrase/en.parquet", "resources/paraphrases/snli.parquet", every))
    assert list(pairs["pair_id"]) == list(english["pair_id"]) + list(snli["pair_id"]) and len(snli) == 2
    units = set(pd.read_parquet(workdir / "results/translation/units.parquet")["text"])
    assert not units & set(snli[["anchor", "positive", "negative"]].stack())

    # labels the config's files hold (check-config refuses others): the built-in countries, SNLI's key
    config["methods"] = {"mST5-en": {"datasets": ["builtin-countries"]},
                         "mST5-en-all": {"datasets": ["builtin-countries", "snli"]}, "mST5-xnli": {"datasets": None}}
    path.write_text(yaml.safe_dump(config))
    methods = [f"results/{BASE}/methods/{name}" for name in config["methods"]]
    out = snakemake(workdir, path, "-n", *methods)
    inputs = {fields["output"]: fields["input"].split(", ") for fields in (
        dict(re.findall(r"^    (\w+): (.*)$", body, flags=re.M))
        for rule, body in re.findall(r"^(?:local)?rule (\w+):\n((?:    .*\n?)*)", out, flags=re.M)
        if rule == "train_method")}
    assert "results/paraphrase/en.parquet" in inputs[methods[0]] and every not in inputs[methods[0]]
    assert every in inputs[methods[1]] and "results/paraphrase/en.parquet" not in inputs[methods[1]]
    assert "results/paraphrase/ky.parquet" in inputs[methods[2]] and every not in inputs[methods[2]]

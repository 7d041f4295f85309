"""modsent plan: Snakemake's own job counts, and GPU-hours computed from each job's settings."""

import os
import re

import pytest

from modsent import config as modsent_config
from modsent import planning
from modsent.cli import main
from modsent.io import InputError

from conftest import REPO, rule_blocks


def test_the_plan_counts_snakemake_s_jobs_and_prices_each_training_job_from_its_settings(tmp_path, capsys):
    configfile = REPO / "configs" / "test.yaml"
    config = planning.load_filled_config(configfile)
    jobs = planning.planned_jobs(configfile, tmp_path / "work")
    rates = planning.RATES["a100-paper"]
    estimates = {e.rule: e for e in planning.estimate(config, jobs, tmp_path / "work", rates, scale=2.0)}
    # the jobs are the dry run's: one LA per language that has one, every rule of the DAG once counted
    la_languages = sorted(w["lang"] for rule, w, _ in jobs if rule == "language_adapter")
    assert la_languages == sorted(modsent_config.specialized_languages(config))
    assert estimates["all"].jobs == 1 and estimates["language_adapter"].jobs == len(la_languages)
    # GPU-hours: steps x batch x seq_len tokens per language at the paper's rate (A100: 20 h for
    # 200K x 128 x 256 tokens), times the scale
    expected = 0.0
    for lang in la_languages:
        la = modsent_config.language_adapter_settings(config, lang)
        expected += la["steps"] * la["batch_size"] * la["seq_len"] / (200_000 * 128 * 256) * 20 * 2.0
    assert estimates["language_adapter"].gpu_hours == pytest.approx(expected)
    # SE: epochs x pairs at 600K pairs per 20 min; nothing prepared yet, so the paper's 600K are assumed
    se = modsent_config.job_settings(config, "sentence_adapter")
    n_se = estimates["sentence_adapter"].jobs
    per_job = (se["max_steps"] * se["batch_size"] if se.get("max_steps") else se["epochs"] * 600_000)
    assert estimates["sentence_adapter"].gpu_hours == pytest.approx(n_se * per_job / 600_000 * (20 / 60) * 2.0)
    assert estimates["corpus"].gpu_hours is None  # no rate: listed with its jobs only
    # each job's time against the time its first attempt asks for (the dry run's resources)
    assert estimates["sentence_adapter"].longest_hours == pytest.approx(per_job / 600_000 * (20 / 60) * 2.0)
    assert (estimates["language_adapter"].runtime_minutes, estimates["sentence_adapter"].runtime_minutes) == (1440, 240)
    assert estimates["corpus"].longest_hours is None and estimates["sentence_adapter"].over_runtime == 0
    blocks = rule_blocks()
    kinds = {rule: re.search(r'job_resources\("(\w+)"', blocks[rule]).group(1) for rule in planning.RULE_KINDS}
    assert kinds == planning.RULE_KINDS  # the kind a warning names is the rule's own
    # a language adapter of 30 GPU-hours on one GPU outgrows its first attempt's 24 h, on 2 GPUs not
    la_jobs = [job for job in jobs if job[0] == "language_adapter"]
    one = la_jobs[0][2]
    hours = planning.estimate(config, la_jobs[:1], tmp_path / "work", rates)[0].gpu_hours
    (slow,) = planning.estimate(config, la_jobs[:1], tmp_path / "work", rates, scale=30 / hours)
    assert (slow.longest_hours, slow.over_runtime) == (pytest.approx(30), 1)
    text = planning.format_plan([slow], rates, "c.yaml", "d", 1.0)
    assert "warning: 1 language_adapter job(s) need more time than their first attempt asks for (one: 30.0 h " \
           "at these rates, against 24 h)" in text
    assert "resources.gpu_train.runtime (or the rule's runtime in the profile's set-resources) to at least 2160 " \
           "minutes" in text and "under SLURM" not in text
    # under SLURM the run caps that time at the partitions' limits: the warning says what gives more
    text = planning.format_plan([slow], rates, "c.yaml", "d", 1.0, profile="slurm",
                                cluster=planning.ClusterCheck(1, 1, ()))
    assert "beyond that, only a partition or a QOS that allows more" in text
    two = [(rule, w, {**r, "gpu": 2}) for rule, w, r in la_jobs[:1]]
    (fits,) = planning.estimate(config, two, tmp_path / "work", rates, scale=30 / hours)
    assert (fits.longest_hours, fits.over_runtime, one["gpu"]) == (pytest.approx(15), 0, 1)
    assert "warning" not in planning.format_plan([fits], rates, "c.yaml", "d", 1.0)
    # under the profile, its set-resources decide what a job asks for (a rule's runtime there)
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "config.yaml").write_text("set-resources:\n  sentence_adapter:\n    runtime: 17\n")
    under = {job[0]: job[2] for job in planning.planned_jobs(configfile, tmp_path / "work2", profile=str(profile))}
    assert (under["sentence_adapter"]["runtime"], under["alignment_adapter"]["runtime"]) == (17, 240)

    assert main(["plan", "--configfile", str(configfile), "--rates", "h200"]) == 0
    out = capsys.readouterr().out
    assert "rates: h200" in out
    total = next(line.split() for line in out.splitlines() if line.startswith("total"))
    assert int(total[1]) == len(jobs)  # every job of the dry run, once
    h200 = planning.estimate(config, jobs, tmp_path / "work", planning.RATES["h200"])
    assert float(total[2]) == pytest.approx(sum(e.gpu_hours or 0 for e in h200), abs=0.01)
    assert main(["plan", "--configfile", str(tmp_path / "missing.yaml")]) == 2

    # language_adapter.residual_stream: bf16 is priced at its own measured rate (H200), and at the
    # fp32 stream's where none was measured (H100), saying so
    bf16 = {**config, "language_adapter": {**config["language_adapter"], "residual_stream": "bf16"}}
    h200_la = {e.rule: e for e in h200}["language_adapter"]
    faster = {e.rule: e for e in planning.estimate(bf16, jobs, tmp_path / "work", planning.RATES["h200"])}
    assert faster["language_adapter"].gpu_hours == pytest.approx(h200_la.gpu_hours * 524_300 / 625_900)
    assert "bf16 residual stream" in faster["language_adapter"].note
    h100 = {e.rule: e for e in planning.estimate(config, jobs, tmp_path / "work", planning.RATES["h100"])}
    h100_bf16 = {e.rule: e for e in planning.estimate(bf16, jobs, tmp_path / "work", planning.RATES["h100"])}
    assert h100_bf16["language_adapter"].gpu_hours == h100["language_adapter"].gpu_hours
    assert "no rate measured" in h100_bf16["language_adapter"].note
    # compiled SE (a runtime setting) at its measured rate (H200); the CLA's compiled step has none
    compiled = {**config, "sentence_adapter": {**config["sentence_adapter"], "compile": True},
                "alignment": {**config["alignment"], "compile": True}}
    h200_rules = {e.rule: e for e in h200}
    fast = {e.rule: e for e in planning.estimate(compiled, jobs, tmp_path / "work", planning.RATES["h200"])}
    assert fast["sentence_adapter"].gpu_hours == pytest.approx(h200_rules["sentence_adapter"].gpu_hours * 1_998 / 3_400)
    assert "compiled" in fast["sentence_adapter"].note and "compiled" in fast["ablation_sentence_adapter"].note
    assert fast["alignment_adapter"].gpu_hours == pytest.approx(h200_rules["alignment_adapter"].gpu_hours)
    assert "priced eager" in fast["alignment_adapter"].note


def test_translation_is_priced_from_the_units_and_the_measured_rate_of_its_engine_and_size(tmp_path):
    import pandas as pd

    config = planning.load_filled_config(REPO / "configs" / "paper-labse.yaml")
    assert (config["translation"]["engine"], planning.translation_size(config["translation"]["model"])) \
        == ("ctranslate2", "3.3B")
    shards = config["translation"]["shards"]
    jobs = [("translate_shard", {"lang": lang, "scatteritem": f"{i + 1}-of-{shards}"})
            for lang in ("de", "zh") for i in range(shards)]
    rates = planning.RATES["h200"]
    rate = rates.translation_sentences_per_s[("ctranslate2", "3.3B")]
    (item,) = planning.estimate(config, jobs, tmp_path, rates)
    # nothing prepared: twice the paper's pairs of English sentences per language, each translated once
    assert item.jobs == 2 * shards
    assert item.gpu_hours == pytest.approx(2 * 2 * planning.PAPER_PAIRS / rate / 3600)
    assert "assumed" in item.note
    # prepared units are counted
    units = tmp_path / "results" / "translation" / "units.parquet"
    units.parent.mkdir(parents=True)
    pd.DataFrame({"text": [f"sentence {i}" for i in range(36_000)]}).to_parquet(units)
    (item,) = planning.estimate(config, jobs, tmp_path, rates)
    assert item.gpu_hours == pytest.approx(2 * 36_000 / rate / 3600) and "assumed" not in item.note
    # transformers' generate is priced at its own (slower) rate; an unmeasured size or GPU is not priced
    config["translation"]["engine"] = "transformers"
    assert planning.estimate(config, jobs, tmp_path, rates)[0].gpu_hours == pytest.approx(
        2 * 36_000 / rates.translation_sentences_per_s[("transformers", "3.3B")] / 3600)
    config["translation"]["model"] = "facebook/nllb-200-1.3B"
    (item,) = planning.estimate(config, jobs, tmp_path, rates)
    assert item.gpu_hours is None and "no measured rate" in item.note
    assert planning.estimate(config, jobs, tmp_path, planning.RATES["h100"])[0].gpu_hours is None


SINFO = """#!/bin/sh
# sinfo -h -N --all -o "%N|%m|%c|%G|%l|%f|%P" of a one-node cluster: its GPU partition allows 12 h
echo "node1|256000|32|gpu:2|infinite|bigmem|cpu*"
echo "node1|256000|32|gpu:2|12:00:00|bigmem|gpu"
"""


@pytest.fixture
def scripted_sinfo(tmp_path, monkeypatch):
    """SINFO as the sinfo on PATH; yields its folder (a test rewrites the script to change it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text(SINFO)
    (bin_dir / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir


def test_the_plan_of_a_slurm_profile_fits_and_checks_every_request_as_the_run_does(tmp_path, monkeypatch,
                                                                                     scripted_sinfo):
    """Under a SLURM profile the plan's dry run asks sinfo (here a script) for the nodes as the
    run does: each rule's time is fitted to its partition's limit, and every job's request is
    checked as the run checks it before it submits anything (the Snakefile's onstart, which a
    dry run skips): every rule's problem at once, exit status 1; a rule's own request that no
    node fits stops the dry run itself, as it stops the run; without sinfo, a line says so."""
    import yaml

    configfile = REPO / "configs" / "test.yaml"
    settings = yaml.safe_load((REPO / "slurm" / "config.yaml").read_text())

    def profile(name, executor="slurm", **set_resources):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.yaml").write_text(yaml.safe_dump(
            {**settings, "executor": executor, "set-resources": {**settings["set-resources"], **set_resources}}))
        return str(folder)

    jobs, cluster = planning.dry_run(configfile, tmp_path / "w1", profile=profile("good"))
    runtime = {rule: resources["runtime"] for rule, _, resources in jobs}
    # the GPU partition's 12 h, not the kind's 24 h; the CPU jobs' partition has no limit
    assert (runtime["language_adapter"], runtime["tokenizer"]) == (720, 480)
    assert cluster == planning.ClusterCheck(1, len(jobs) - 1, ())  # all: Snakemake's own job
    text = "\n".join(planning.format_cluster_check(cluster, "good"))
    assert f"every job's request ({len(jobs) - 1} jobs) fits a node of the 1 sinfo lists" in text

    # the profile's values that replace the rules' fitted ones: every rule's problem at once
    # (a SLURM run does not cap threads at any --cores, a dry run at one: the plan's is given many)
    wrong = profile("wrong", tokenizer={"mem_mb": 300000}, corpus={"cpus_per_task": 64},
                    language_adapter={"slurm_partition": "gpu", "runtime": 1000})
    (tmp_path / "wrong" / "config.yaml").write_text((tmp_path / "wrong" / "config.yaml").read_text()
                                                    + "set-threads:\n  fasttext: 40\n")
    monkeypatch.chdir(tmp_path)  # the profile by its name, as Snakemake finds it
    _, cluster = planning.dry_run(configfile, tmp_path / "w2", profile="wrong")
    assert [problem.split(" (")[0] for problem in cluster.problems] == [
        "jobs of rule corpus ask for 64 CPUs", "jobs of rule fasttext ask for 40 CPUs",
        "jobs of rule language_adapter ask for 1000 minutes", "jobs of rule tokenizer ask for 300000 MB of memory"]
    assert "the profile's set-resources: tokenizer: mem_mb" in cluster.problems[-1]
    assert main(["plan", "--configfile", str(configfile), "--profile", "wrong"]) == 1
    # a QOS (the profile's slurm-qos) may allow more than the partition: that time is not judged
    text = (tmp_path / "wrong" / "config.yaml").read_text()
    (tmp_path / "wrong" / "config.yaml").write_text(text + "slurm-qos: long\n")
    _, cluster = planning.dry_run(configfile, tmp_path / "w2", profile="wrong")
    assert [problem.split(" ask")[0] for problem in cluster.problems] == [
        "jobs of rule corpus", "jobs of rule fasttext", "jobs of rule tokenizer"]
    (tmp_path / "wrong" / "config.yaml").write_text(text)

    with pytest.raises(InputError, match=r"sentence_adapter: slurm_partition 'gpu_a100', but sinfo lists no node in"):
        planning.dry_run(configfile, tmp_path / "w3", profile=profile("partition", sentence_adapter={
            "slurm_partition": "gpu_a100"}))

    (scripted_sinfo / "sinfo").write_text("#!/bin/sh\necho 'sinfo: error: Could not establish a configuration' >&2\n"
                                          "exit 1\n")  # no controller answers
    jobs, cluster = planning.dry_run(configfile, tmp_path / "w4", profile=wrong)
    assert cluster == planning.ClusterCheck(None, len(jobs) - 1, ())
    assert "sinfo did not answer here" in planning.format_cluster_check(cluster, "wrong")[0]
    # another executor's profile: nothing asked, nothing checked
    assert planning.dry_run(configfile, tmp_path / "w5", profile=profile("local", executor="local"))[1] is None
    # a profile that is a yte template is read as Snakemake reads it
    (tmp_path / "templated").mkdir()
    (tmp_path / "templated" / "config.yaml").write_text(
        '__use_yte__: true\nexecutor: ?"slur" + "m"\nslurm-qos: ?"lo" + "ng"\n')
    assert planning.profile_settings(str(tmp_path / "templated")) == {"executor": "slurm", "slurm-qos": "long"}


def test_the_plan_checks_the_retries_the_profile_sizes_by_attempt_and_the_rules_it_submits_as_arrays(
        tmp_path, scripted_sinfo):
    """A profile value computed from the attempt (`mem_mb: 100000 * attempt`) is checked at
    every retry the profile allows, not at the first attempt alone; a rule listed in
    slurm-array-jobs whose jobs ask differently is named (an array's tasks all get its first
    job's request), one whose jobs ask alike is not. The run's onstart checks the same."""
    import yaml

    configfile = REPO / "configs" / "test.yaml"
    settings = yaml.safe_load((REPO / "slurm" / "config.yaml").read_text())
    assert settings["retries"] == 2
    folder = tmp_path / "retried"
    folder.mkdir()
    set_resources = {**settings["set-resources"],
                     "tokenizer": {"mem_mb": "100000 * attempt"},  # the third attempt: 300000 MB
                     "focus_embeddings": {"mem": "90000 * attempt"},  # 270000 MB, given as mem
                     "evaluation_subset": {"mem_mb": "[8000, 16000][attempt - 1]"},  # no third value
                     "fasttext": {"mem_mb": "50000 * attempt"},  # 150000 at most: fits
                     "corpus": {"mem_mb": "4000 if wildcards.lang == 'de' else 8000"},
                     # sbatch gets no disk: jobs that differ only there go as one array
                     "evaluation_scores": {"disk_mb": "1000 + len(str(wildcards))"}}
    (folder / "config.yaml").write_text(yaml.safe_dump(
        {**settings, "set-resources": set_resources, "set-threads": {"fasttext": "12 * attempt"},
         "slurm-array-jobs": "corpus; fasttext, evaluation_scores"}))
    jobs, cluster = planning.dry_run(configfile, tmp_path / "w", profile=str(folder))
    assert sum(rule == "corpus" for rule, _, _ in jobs) > 1 and sum(rule == "fasttext" for rule, _, _ in jobs) > 1
    assert cluster.nodes == 1 and len(cluster.problems) == 5, cluster
    corpus, subset, fasttext, focus, tokenizer = cluster.problems
    assert re.match(r"jobs of rule corpus ask differently \(mem_mb (4000 for lang=de, 8000 for lang=\w+|"
                    r"8000 for lang=\w+, 4000 for lang=de)\)", corpus), corpus
    assert "leave corpus out of slurm-array-jobs" in corpus
    assert subset.startswith("jobs of rule evaluation_subset have resources that cannot be computed for their "
                             "attempt 3 (the profile's retries), which sbatch would need; "), subset
    assert focus.startswith("jobs of rule focus_embeddings on their attempt 3 (the profile's retries) ask for "
                            "270000 MB of memory"), focus
    assert fasttext.startswith("jobs of rule fasttext on their attempt 3 (the profile's retries) ask for 36 CPUs "
                               "(the rule's threads, or the profile's set-threads)"), fasttext
    assert tokenizer.startswith("jobs of rule tokenizer on their attempt 3 (the profile's retries) ask for "
                                "300000 MB of memory (the profile's set-resources: tokenizer: mem_mb)")
    lines = planning.format_cluster_check(cluster, str(folder))
    assert lines[0].startswith("error: SLURM") and lines[1:] == [f"  - {problem}" for problem in cluster.problems]

    # one retry: the second attempt's values fit; corpus left out of the arrays, or every rule in them
    (folder / "config.yaml").write_text(yaml.safe_dump(
        {**settings, "retries": 1, "set-resources": set_resources, "slurm-array-jobs": "fasttext"}))
    _, cluster = planning.dry_run(configfile, tmp_path / "w", profile=str(folder))
    assert cluster.problems == (), cluster
    (folder / "config.yaml").write_text(yaml.safe_dump(
        {**settings, "retries": 1, "set-resources": set_resources, "slurm-array-jobs": "all"}))
    _, cluster = planning.dry_run(configfile, tmp_path / "w", profile=str(folder))
    assert [problem.split(" (")[0] for problem in cluster.problems] == ["jobs of rule corpus ask differently"], cluster
    assert "replace 'all' in slurm-array-jobs by the rules whose jobs ask alike, without corpus" in cluster.problems[0]

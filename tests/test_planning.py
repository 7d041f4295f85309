"""modsent plan: Snakemake's own job counts, and GPU-hours computed from each job's settings."""

import pytest

from modsent import config as modsent_config
from modsent import planning
from modsent.cli import main

from conftest import REPO


def test_the_plan_counts_snakemake_s_jobs_and_prices_each_training_job_from_its_settings(tmp_path, capsys):
    configfile = REPO / "configs" / "test.yaml"
    config = planning.load_filled_config(configfile)
    jobs = planning.planned_jobs(configfile, tmp_path / "work")
    rates = planning.RATES["a100-paper"]
    estimates = {e.rule: e for e in planning.estimate(config, jobs, tmp_path / "work", rates, scale=2.0)}
    # the jobs are the dry run's: one LA per language that has one, every rule of the DAG once counted
    la_languages = sorted(w["lang"] for rule, w in jobs if rule == "language_adapter")
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

    assert main(["plan", "--configfile", str(configfile), "--rates", "h200"]) == 0
    out = capsys.readouterr().out
    assert "rates: h200" in out
    total = next(line.split() for line in out.splitlines() if line.startswith("total"))
    assert int(total[1]) == len(jobs)  # every job of the dry run, once
    h200 = planning.estimate(config, jobs, tmp_path / "work", planning.RATES["h200"])
    assert float(total[2]) == pytest.approx(sum(e.gpu_hours or 0 for e in h200), abs=0.01)
    assert main(["plan", "--configfile", str(tmp_path / "missing.yaml")]) == 2

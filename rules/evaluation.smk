# Evaluation: dataset subsets → embeddings per (variant, language) → scores per (variant,
# dataset) → the summary tables, plots and report (modsent/evaluation/suite.py).


rule evaluation_subset:
    """One subset (a language or a language pair) of an evaluation dataset, normalised."""
    input:
        local=evaluation_local_files,
    output:
        layout.EVALUATION_SUBSET,
    params:
        settings=evaluation_subset_settings,
    resources:
        **job_resources("cpu"),
    priority: 5
    log:
        "logs/eval/{dataset}/{subset}.log",
    conda:
        ENV
    script:
        "../workflow_scripts/evaluation_subset.py"


rule evaluation_embeddings:
    """Every evaluation sentence in one language, encoded once by each evaluated system of a
    group: ``modular`` (the base model and every Mod_* variant on one shared body) or ``full``
    (the monolithic baselines)."""
    input:
        unpack(embedding_inputs),
    output:
        directory(layout.EVALUATION_EMBEDDINGS),
    params:
        variants=embedding_variants,
        datasets=embedding_datasets,
        merge_weights=embedding_merge_weights,
    threads: job_threads("gpu_encode")
    resources:
        **job_resources("gpu_encode"),
    log:
        "logs/{base}/eval/embeddings/{group}/{lang}.log",
    benchmark:
        "logs/{base}/benchmarks/eval_embeddings/{group}/{lang}.tsv"
    conda:
        ENV
    script:
        "../workflow_scripts/evaluation_embeddings.py"


rule evaluation_scores:
    """One variant on one dataset, by the paper's protocol: one JSON."""
    input:
        unpack(score_inputs),
    output:
        layout.EVALUATION_SCORES,
    params:
        settings=score_settings,
    resources:
        **job_resources("cpu"),
    log:
        "logs/{base}/eval/scores/{variant}/{dataset}.log",
    conda:
        ENV
    script:
        "../workflow_scripts/evaluation_scores.py"


rule evaluation_summary:
    """The paper's Table 1 (variants × task and dataset), per-language tables and plots."""
    input:
        score_paths,
    output:
        csv=layout.SUMMARY_CSV,
        md=layout.SUMMARY,
        html=report(layout.SUMMARY_HTML, category="1. Evaluation", subcategory="Summary",
                    caption="../report/summary.rst"),
        plot=report(layout.SUMMARY_PLOT, category="1. Evaluation", subcategory="Summary",
                    caption="../report/summary_plot.rst"),
        heatmap=report(layout.XSIM_HEATMAPS, category="1. Evaluation", subcategory="Bitext mining",
                       caption="../report/xsim_heatmaps.rst"),
        per_language=report(directory(layout.PER_LANGUAGE), patterns=["{name}.html"],
                            category="1. Evaluation", subcategory="Per language",
                            caption="../report/per_language.rst", labels={"table": "{name}"}),
    params:
        variants=evaluated_variants(),
        missing=evaluation_missing(),
    resources:
        **job_resources("cpu"),
    log:
        "logs/{base}/eval/summary.log",
    conda:
        ENV
    script:
        "../workflow_scripts/evaluation_summary.py"


rule mteb_results:
    """One system's scores on the datasets that are mteb tasks, as mteb result files (mteb's
    metric definitions on the same embeddings; modsent.evaluation.mteb_results)."""
    input:
        unpack(mteb_inputs),
    output:
        directory(layout.MTEB_RESULTS),
    params:
        settings=mteb_settings,
    resources:
        **job_resources("cpu"),
    log:
        "logs/{base}/eval/mteb/{variant}.log",
    conda:
        ENV
    script:
        "../workflow_scripts/mteb_results.py"


rule seeds_summary:
    """Each score's mean ± sample std over the config's seed replicates (config `seeds`)."""
    input:
        lambda wildcards: [layout.SUMMARY_CSV.format(base=layout.replicate_base(wildcards.base, r))
                           for r in range(config["seeds"])],
    output:
        csv=layout.SEEDS_SUMMARY_CSV,
        md=layout.SEEDS_SUMMARY,
        html=report(layout.SEEDS_SUMMARY_HTML, category="1. Evaluation", subcategory="Summary",
                    caption="../report/summary_seeds.rst"),
    wildcard_constraints:
        base=SLUG_REGEX,  # over the replicates of one config: results/{base} and results/{base}@seed{r}
    resources:
        **job_resources("cpu"),
    log:
        "logs/{base}/eval/summary_seeds.log",
    conda:
        ENV
    script:
        "../workflow_scripts/seeds_summary.py"

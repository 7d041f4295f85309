# Monolithic baselines and ablations, on the same paraphrase pairs as the modular encoders.
#   Full_en, Full_m, Full_c, Full_mc   every weight of the base model (modsent.methods.baselines)
#   Mod_m-LA                           SE adapters directly on the base model (no LA)
#   Mod_c                              CLA adapters on the LA alone (no SE), merged
# The ablations reuse the sentence_adapter and alignment settings and scripts.

# Their input functions are in rules/common.smk.

rule full_baseline:
    """Every weight of the base model, MNRL on its own tokenizer: Full_en (English pairs),
    Full_m (monolingual batches of every language), Full_c (cross-lingual pairs), Full_mc
    (Full_c's pairs from Full_m's weights). A sentence-transformers directory.
    Resumes from results/{base}/baselines/{name}.checkpoint when rerun after a kill;
    baselines.gpus GPUs of one node (torchrun, data-parallel)."""
    input:
        unpack(full_baseline_inputs),
    output:
        directory(layout.BASELINE),
    wildcard_constraints:
        name="|".join(modsent_variants.FULL_BASELINES),
    params:
        settings=full_baseline_settings,
        languages=full_baseline_languages,
    threads: job_threads("gpu_train", gpus=full_baseline_gpus)
    resources:
        **job_resources("gpu_train", gpus=full_baseline_gpus),
    priority: 1
    log:
        "logs/{base}/baselines/{name}.log",
    benchmark:
        "logs/{base}/benchmarks/baselines/{name}.tsv"
    conda:
        ENV
    script:
        "../workflow_scripts/full_baseline.py"


rule full_baseline_summary:
    """Held-out retrieval accuracy before and after each full baseline, per language."""
    input:
        full_baseline_dirs,
    output:
        table=layout.BASELINE_SUMMARY,
        html=report(layout.BASELINE_SUMMARY_HTML, category="2. Training", subcategory="Full baselines",
                    caption="../report/baselines.rst"),
    resources:
        **job_resources("cpu"),
    log:
        "logs/{base}/baselines/summary.log",
    conda:
        ENV
    script:
        "../workflow_scripts/baseline_summary.py"


rule ablation_sentence_adapter:
    """Mod_m-LA: the SE adapter directly on the base model (no tokenizer, FOCUS or LA).
    Resumes from results/{base}/ablations/sentence_adapters_base/{lang}.checkpoint when rerun
    after a kill."""
    input:
        base=base_model_input,
        pairs=layout.PAIRS,
    output:
        directory(layout.ABLATION_SENTENCE_ADAPTER),
    params:
        settings=sentence_adapter_settings,
    threads: job_threads("gpu_adapter")
    resources:
        **job_resources("gpu_adapter"),
    priority: 1
    log:
        "logs/{base}/ablations/sentence_adapters_base/{lang}.log",
    benchmark:
        "logs/{base}/benchmarks/ablations/sentence_adapters_base/{lang}.tsv"
    conda:
        ENV
    script:
        "../workflow_scripts/sentence_adapter.py"


rule ablation_alignment_adapter:
    """Mod_c: the pp or pl CLA adapter on L's LA alone (no SE adapter), aligned to the same
    frozen English LA + SE embeddings as the modular CLA adapters. Resumes from
    results/{base}/ablations/alignment_la/{kind}/{lang}.checkpoint when rerun after a kill."""
    input:
        unpack(ablation_alignment_inputs),
        english=layout.ENGLISH_EMBEDDINGS,
    output:
        directory(layout.ABLATION_ALIGNMENT_ADAPTER),
    params:
        settings=ablation_alignment_settings,
    threads: job_threads("gpu_adapter")
    resources:
        **job_resources("gpu_adapter"),
    priority: 1
    log:
        "logs/{base}/ablations/alignment_la/{kind}/{lang}.log",
    benchmark:
        "logs/{base}/benchmarks/ablations/alignment_la/{kind}/{lang}.tsv"
    conda:
        ENV
    script:
        "../workflow_scripts/alignment_adapter.py"


rule ablation_merge_alignment:
    """Mod_c: w * pp + (1 - w) * pl of the CLA adapters trained without SE."""
    input:
        pp=layout.ABLATION_ALIGNMENT_ADAPTER.replace("{kind}", "pp"),
        pl=layout.ABLATION_ALIGNMENT_ADAPTER.replace("{kind}", "pl"),
    output:
        directory(layout.ABLATION_MERGED_ALIGNMENT),
    resources:
        **job_resources("cpu"),
    priority: 1
    log:
        "logs/{base}/ablations/alignment_la/merged-{weight}/{lang}.log",
    conda:
        ENV
    script:
        "../workflow_scripts/merge_alignment.py"

# Monolithic baselines and ablations, on the same paraphrase pairs as the modular encoders.
#   Full_en, Full_m, Full_c, Full_mc   every weight of the base model (modsent.baselines)
#   Mod_m-LA                           SE adapters directly on the base model (no LA)
#   Mod_c                              CLA adapters on the LA alone (no SE), merged
# The ablations reuse the sentence_adapter and alignment settings and scripts.

# ---- helpers ------------------------------------------------------------------------------
# They belong in rules/common.smk with the other stages' helpers (`snakemake --lint` flags a
# file holding both rules and functions); everything down to the rules moves there unchanged.

from modsent import variants as modsent_variants


def full_baseline_languages(wildcards):
    """The languages whose pairs a full baseline trains on (Full_en: English only)."""
    return modsent_variants.FULL_BASELINES[wildcards.name].training_languages(languages())


def full_baseline_inputs(wildcards):
    """The base model (Full_mc: Full_m's output instead) and the pairs it trains on."""
    recipe = modsent_variants.FULL_BASELINES[wildcards.name]
    inputs = {
        "pairs": expand("results/paraphrase/{lang}.parquet", lang=full_baseline_languages(wildcards)),
    }
    if recipe.init is None:
        inputs["base"] = f"resources/base_models/{wildcards.base}"
    else:
        inputs["init"] = f"results/{wildcards.base}/baselines/{recipe.init}"
    return inputs


def full_baseline_dirs(wildcards):
    return expand("results/{base}/baselines/{name}", base=wildcards.base,
                  name=config["baselines"]["full"])


def ablation_alignment_inputs(wildcards):
    """alignment_adapter's inputs without the SE adapter: base, L's LA (unless skipped), pairs."""
    inputs = alignment_inputs(wildcards)
    del inputs["sentence_adapter"]
    return inputs


def full_baseline_settings(wildcards):
    """The training settings without the choice of systems: selecting another baseline or
    ablation must not rerun the trained ones (Snakemake reruns a job whose params change)."""
    return {k: v for k, v in config["baselines"].items() if k not in ("full", "ablations")}


def ablation_alignment_settings(wildcards):
    """The alignment settings, trained at the SE adapter's sequence length (the modular CLA
    adapters read it from the SE adapter, which this ablation has not); without the merge
    weights, so that adding one reruns no training."""
    settings = {k: v for k, v in config["alignment"].items() if k != "merge_weights"}
    return {**settings, "seq_len": config["sentence_adapter"]["seq_len"]}


def baseline_targets():
    """Every output of the baseline and ablation rules (rules/baselines.smk) the config asks for."""
    section, base = config["baselines"], base_name()
    targets = expand("results/{base}/baselines/{name}", base=base, name=section["full"])
    if section["full"]:
        targets.append(f"results/{base}/baselines/summary.md")
    if "Mod_m-LA" in section["ablations"]:
        targets += expand("results/{base}/ablations/sentence_adapters_base/{lang}", base=base,
                          lang=languages())
    if "Mod_c" in section["ablations"]:
        targets += expand("results/{base}/ablations/alignment_la/merged-{weight}/{lang}", base=base,
                          weight=merge_weight_names()[0], lang=non_english())
    return targets


# ---- rules --------------------------------------------------------------------------------


rule full_baseline:
    """Every weight of the base model, MNRL on its own tokenizer: Full_en (English pairs),
    Full_m (monolingual batches of every language), Full_c (cross-lingual pairs), Full_mc
    (Full_c's pairs from Full_m's weights). A sentence-transformers directory."""
    input:
        unpack(full_baseline_inputs),
    output:
        directory("results/{base}/baselines/{name}"),
    wildcard_constraints:
        name="|".join(modsent_variants.FULL_BASELINES),
    params:
        settings=full_baseline_settings,
        languages=full_baseline_languages,
    threads: job_threads("gpu_train")
    resources:
        **job_resources("gpu_train"),
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
        "results/{base}/baselines/summary.md",
    resources:
        **job_resources("cpu"),
    log:
        "logs/{base}/baselines/summary.log",
    conda:
        ENV
    script:
        "../workflow_scripts/baseline_summary.py"


rule ablation_sentence_adapter:
    """Mod_m-LA: the SE adapter directly on the base model (no tokenizer, FOCUS or LA)."""
    input:
        base="resources/base_models/{base}",
        pairs="results/paraphrase/{lang}.parquet",
    output:
        directory("results/{base}/ablations/sentence_adapters_base/{lang}"),
    params:
        settings=config["sentence_adapter"],
    threads: job_threads("gpu_train")
    resources:
        **job_resources("gpu_train"),
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
    frozen English LA + SE embeddings as the modular CLA adapters."""
    input:
        unpack(ablation_alignment_inputs),
        english="results/{base}/alignment/english_embeddings.safetensors",
    output:
        directory("results/{base}/ablations/alignment_la/{kind}/{lang}"),
    params:
        settings=ablation_alignment_settings,
    threads: job_threads("gpu_train")
    resources:
        **job_resources("gpu_train"),
    log:
        "logs/{base}/ablations/alignment_la/{kind}/{lang}.log",
    benchmark:
        "logs/{base}/benchmarks/ablations/alignment_la/{kind}/{lang}.tsv"
    conda:
        ENV
    script:
        "../workflow_scripts/ablation_alignment_adapter.py"


rule ablation_merge_alignment:
    """Mod_c: w * pp + (1 - w) * pl of the CLA adapters trained without SE."""
    input:
        pp="results/{base}/ablations/alignment_la/pp/{lang}",
        pl="results/{base}/ablations/alignment_la/pl/{lang}",
    output:
        directory("results/{base}/ablations/alignment_la/merged-{weight}/{lang}"),
    resources:
        **job_resources("cpu"),
    log:
        "logs/{base}/ablations/alignment_la/merged-{weight}/{lang}.log",
    conda:
        ENV
    script:
        "../workflow_scripts/merge_alignment.py"

# Paraphrase data: the English set, translation into every language (scattered shards or
# provided human translations), per-language multi-parallel files and a quality report.
# Nothing here depends on the base model: translations are shared by every base.


rule english_paraphrases:
    """The configured English datasets merged into one contract file (stable pair_ids)."""
    input:
        paraphrase_source_paths(),
    output:
        "results/paraphrase/en.parquet",
    resources:
        **job_resources("cpu"),
    log:
        "logs/paraphrase/en.log",
    conda:
        ENV
    script:
        "../workflow_scripts/english_paraphrases.py"


rule translation_units:
    """The distinct English sentences (content-hash ids): each is translated once per language."""
    input:
        "results/paraphrase/en.parquet",
    output:
        "results/translation/units.parquet",
    resources:
        **job_resources("cpu"),
    log:
        "logs/translation/units.log",
    conda:
        ENV
    script:
        "../workflow_scripts/translation_units.py"


if config["translation"]["engine"] == "provided":

    rule provided_translation:
        """Human translations aligned on the English text; units without one are dropped."""
        input:
            units="results/translation/units.parquet",
            provided="resources/translations/{lang}.parquet",
        output:
            "results/translation/{lang}.parquet",
        resources:
            **job_resources("cpu"),
        log:
            "logs/translation/{lang}.log",
        conda:
            ENV
        script:
            "../workflow_scripts/provided_translation.py"

else:

    rule translate_shard:
        """Machine-translate one shard of the units; resumes finished batches after a crash."""
        input:
            units="results/translation/units.parquet",
            model=translation_model_input,
        output:
            "results/translation/{lang}/shards/{scatteritem}.parquet",
        params:
            settings=job_settings("translation"),
        threads: job_threads("gpu_translate")
        resources:
            **job_resources("gpu_translate"),
        log:
            "logs/translation/{lang}/{scatteritem}.log",
        benchmark:
            "logs/benchmarks/translation/{lang}/{scatteritem}.tsv"
        conda:
            ENV
        script:
            "../workflow_scripts/translate_shard.py"

    rule gather_translations:
        """One language's shards joined; every unit exactly once."""
        input:
            units="results/translation/units.parquet",
            shards=gather.translation("results/translation/{{lang}}/shards/{scatteritem}.parquet"),
        output:
            "results/translation/{lang}.parquet",
        resources:
            **job_resources("cpu"),
        log:
            "logs/translation/{lang}.log",
        conda:
            ENV
        script:
            "../workflow_scripts/gather_translations.py"


if config["translation"]["engine"] == "ctranslate2":

    rule convert_translation_model:
        """The translation checkpoint converted for CTranslate2 (ct2-transformers-converter)."""
        output:
            directory("resources/mt_models/ct2"),
        params:
            model=config["translation"]["model"],
            compute_type=config["translation"]["compute_type"],
            revision=config["translation"]["revision"],
        resources:
            **job_resources("cpu_heavy"),
        log:
            "logs/translation/convert.log",
        benchmark:
            "logs/benchmarks/translation/convert.tsv"
        conda:
            ENV
        script:
            "../workflow_scripts/convert_translation_model.py"


rule paraphrase_language:
    """The English pairs in language L: every sentence replaced by its translation."""
    input:
        english="results/paraphrase/en.parquet",
        translations="results/translation/{lang}.parquet",
    output:
        "results/paraphrase/{lang}.parquet",
    resources:
        **job_resources("cpu"),
    log:
        "logs/paraphrase/{lang}.log",
    conda:
        ENV
    script:
        "../workflow_scripts/paraphrase_language.py"


rule translation_quality:
    """Empty, untranslated, short outputs, length ratios, copy rate, language-ID agreement."""
    input:
        translations="results/translation/{lang}.parquet",
        units="results/translation/units.parquet",
    output:
        report="results/translation/quality/{lang}.json",
        plot="results/translation/quality/{lang}.png",
    resources:
        **job_resources("cpu"),
    log:
        "logs/translation/quality/{lang}.log",
    conda:
        ENV
    script:
        "../workflow_scripts/translation_quality.py"


rule translation_quality_summary:
    """The quality reports of all languages in one table."""
    input:
        expand("results/translation/quality/{lang}.json", lang=non_english()),
    output:
        "results/translation/quality.md",
    resources:
        **job_resources("cpu"),
    log:
        "logs/translation/quality.log",
    conda:
        ENV
    script:
        "../workflow_scripts/translation_quality_summary.py"

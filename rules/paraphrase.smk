# Paraphrase data: the English set, translation into every language (scattered shards or
# provided human translations), per-language multi-parallel files and a quality report; the
# English-only methods' pairs with the datasets that are not translated (english_only).
# Nothing here depends on the base model: translations are shared by every base.


rule english_paraphrases:
    """The configured English datasets merged into one contract file (stable pair_ids): those that
    are translated, not those marked english_only."""
    input:
        translated_paraphrase_paths(),
    output:
        layout.ENGLISH_PAIRS,
    resources:
        **job_resources("cpu"),
    log:
        "logs/paraphrase/en.log",
    conda:
        ENV
    script:
        "../workflow_scripts/english_paraphrases.py"


if english_only_datasets():

    rule english_training_pairs:
        """The English pairs and the datasets that are not translated (paraphrases.{name}.english_only):
        what the English-only methods train on."""
        input:
            english=layout.ENGLISH_PAIRS,
            english_only=expand(layout.PARAPHRASE_SOURCE, dataset=english_only_datasets()),
        output:
            layout.ENGLISH_TRAINING_PAIRS,
        resources:
            **job_resources("cpu"),
        log:
            "logs/paraphrase/en.all.log",
        conda:
            ENV
        script:
            "../workflow_scripts/english_training_pairs.py"


rule translation_units:
    """The distinct English sentences (content-hash ids): each is translated once per language."""
    input:
        layout.ENGLISH_PAIRS,
    output:
        layout.TRANSLATION_UNITS,
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
            units=layout.TRANSLATION_UNITS,
            provided=layout.PROVIDED_TRANSLATIONS,
        output:
            layout.TRANSLATIONS,
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
            units=layout.TRANSLATION_UNITS,
            model=translation_model_input,
        output:
            layout.TRANSLATION_SHARD,
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
            units=layout.TRANSLATION_UNITS,
            shards=gather.translation("results/translation/{{lang}}/shards/{scatteritem}.parquet"),
        output:
            layout.TRANSLATIONS,
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
            directory(layout.MT_MODEL),
        params:
            model=config["translation"]["model"],
            compute_type=config["translation"]["compute_type"],
            revision=config["translation"]["revision"],
        resources:
            **job_resources("cpu_heavy", overrides=conversion_resources),
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
        english=layout.ENGLISH_PAIRS,
        translations=layout.TRANSLATIONS,
    output:
        layout.PAIRS,
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
        translations=layout.TRANSLATIONS,
        units=layout.TRANSLATION_UNITS,
    output:
        report=layout.TRANSLATION_QUALITY,
        plot=report(layout.TRANSLATION_QUALITY_PLOT, category="3. Data", subcategory="Translation quality",
                    caption="../report/translation_quality.rst", labels={"language": "{lang}"}),
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
        expand(layout.TRANSLATION_QUALITY, lang=non_english()),
    output:
        table=layout.TRANSLATION_QUALITY_SUMMARY,
        html=report(layout.TRANSLATION_QUALITY_SUMMARY_HTML, category="3. Data", subcategory="Translation quality",
                    caption="../report/translation_quality.rst", labels={"language": "all"}),
    resources:
        **job_resources("cpu"),
    log:
        "logs/translation/quality.log",
    conda:
        ENV
    script:
        "../workflow_scripts/translation_quality_summary.py"

"""The workflow's file layout, in one place: where each stage's outputs live, relative to the
working directory, as Snakemake patterns (``{lang}``, ``{base}``, ... are wildcards).

The rules name their outputs with these patterns, their input functions build paths with the
functions below, the systems (:mod:`modsent.encoders.systems`) find their modules with the
``*_DIR`` names, and ``modsent outputs`` finds a language's outputs with
:func:`language_outputs`; so no code rebuilds another stage's paths by hand. Moving an output is
an edit here (and a rerun).

The results tree of one base model, ``results/{base}``::

    tokenizers/{lang}  fasttext/{lang}  embeddings/{lang}     the language's vocabulary (LA inputs)
    language_adapters/{lang}                                 LA
    sentence_adapters/{lang}                                 SE
    alignment/{kind}/{lang}, alignment/merged-{weight}/{lang}  CLA (pp, pl) and their merge
    ablations/sentence_adapters_base/{lang}                  Mod_m-LA's SE adapters (no LA)
    ablations/alignment_la/...                               Mod_c's CLA adapters (no SE)
    baselines/{name}                                         Full_* (sentence-transformers)
    methods/{method}                                         registered training methods
    eval/embeddings/{group}/{lang}, eval/scores/{variant}/{dataset}.json
    summary.csv, summary.md
"""

from __future__ import annotations

RESULTS = "results/{base}"

# ---- inputs and the shared, base-independent data ----------------------------------------------
BASE_MODEL = "resources/base_models/{base}"
CORPUS = "resources/corpora/{lang}.txt"
PARAPHRASE_SOURCE = "resources/paraphrases/{dataset}.parquet"
PROVIDED_TRANSLATIONS = "resources/translations/{lang}.parquet"
EVALUATION_SUBSET = "resources/eval/{dataset}/{subset}.parquet"
INPUTS_SUMMARY = "resources/inputs_summary.md"
INPUTS_SUMMARY_HTML = "resources/inputs_summary.html"  # each summary's HTML twin: modsent.reporting
MT_MODEL = "resources/mt_models/ct2"
ENGLISH_PAIRS = "results/paraphrase/en.parquet"
# ENGLISH_PAIRS and the paraphrases marked english_only: the English-only methods' pairs
ENGLISH_TRAINING_PAIRS = "results/paraphrase/en.all.parquet"
PAIRS = "results/paraphrase/{lang}.parquet"
TRANSLATION_UNITS = "results/translation/units.parquet"
TRANSLATIONS = "results/translation/{lang}.parquet"
TRANSLATION_SHARD = "results/translation/{lang}/shards/{scatteritem}.parquet"
TRANSLATION_QUALITY = "results/translation/quality/{lang}.json"
TRANSLATION_QUALITY_PLOT = "results/translation/quality/{lang}.png"
TRANSLATION_QUALITY_SUMMARY = "results/translation/quality.md"
TRANSLATION_QUALITY_SUMMARY_HTML = "results/translation/quality.html"

# ---- one base model's modules, relative to its results tree (the systems' module paths) --------
TOKENIZER_DIR = "tokenizers/{lang}"
FASTTEXT_DIR = "fasttext/{lang}"
EMBEDDINGS_DIR = "embeddings/{lang}"
LANGUAGE_ADAPTERS = "language_adapters"
SENTENCE_ADAPTERS = "sentence_adapters"
ALIGNMENT = "alignment"
ABLATION_SENTENCE_ADAPTERS = "ablations/sentence_adapters_base"
ABLATION_ALIGNMENT = "ablations/alignment_la"
BASELINES = "baselines"
METHODS = "methods"


def _tree(relative: str) -> str:
    return f"{RESULTS}/{relative}"


# ---- one base model's outputs ------------------------------------------------------------------
TOKENIZER = _tree(TOKENIZER_DIR)
FASTTEXT = _tree(FASTTEXT_DIR)
EMBEDDINGS = _tree(EMBEDDINGS_DIR)
LANGUAGE_ADAPTER = _tree(f"{LANGUAGE_ADAPTERS}/{{lang}}")
LANGUAGE_ADAPTER_SUMMARY = _tree(f"{LANGUAGE_ADAPTERS}/summary.md")
LANGUAGE_ADAPTER_SUMMARY_HTML = _tree(f"{LANGUAGE_ADAPTERS}/summary.html")
LANGUAGE_ADAPTER_PLOT = _tree(f"{LANGUAGE_ADAPTERS}/summary.png")
SENTENCE_ADAPTER = _tree(f"{SENTENCE_ADAPTERS}/{{lang}}")
SENTENCE_ADAPTER_SUMMARY = _tree(f"{SENTENCE_ADAPTERS}/summary.md")
SENTENCE_ADAPTER_SUMMARY_HTML = _tree(f"{SENTENCE_ADAPTERS}/summary.html")
SENTENCE_ADAPTER_PLOT = _tree(f"{SENTENCE_ADAPTERS}/summary.png")
ENGLISH_EMBEDDINGS = _tree(f"{ALIGNMENT}/english_embeddings.safetensors")
ENGLISH_EMBEDDING_UNITS = _tree(f"{ALIGNMENT}/english_embeddings.units.parquet")
# alignment.provided_translations: the English sentences of one language's provided translations,
# files of their own (per language, apart from the units') so that switching the option reruns no
# pp adapter and adding a language reruns no other language's pl adapter
ENGLISH_EMBEDDINGS_PROVIDED = _tree(f"{ALIGNMENT}/english_provided/{{lang}}.safetensors")
ENGLISH_EMBEDDING_UNITS_PROVIDED = _tree(f"{ALIGNMENT}/english_provided/{{lang}}.units.parquet")
ALIGNMENT_ADAPTER = _tree(f"{ALIGNMENT}/{{kind}}/{{lang}}")
MERGED_ALIGNMENT = _tree(f"{ALIGNMENT}/merged-{{weight}}/{{lang}}")
ALIGNMENT_SUMMARY = _tree(f"{ALIGNMENT}/summary.md")
ALIGNMENT_SUMMARY_HTML = _tree(f"{ALIGNMENT}/summary.html")
ABLATION_SENTENCE_ADAPTER = _tree(f"{ABLATION_SENTENCE_ADAPTERS}/{{lang}}")
ABLATION_ALIGNMENT_ADAPTER = _tree(f"{ABLATION_ALIGNMENT}/{{kind}}/{{lang}}")
ABLATION_MERGED_ALIGNMENT = _tree(f"{ABLATION_ALIGNMENT}/merged-{{weight}}/{{lang}}")
BASELINE = _tree(f"{BASELINES}/{{name}}")
BASELINE_SUMMARY = _tree(f"{BASELINES}/summary.md")
BASELINE_SUMMARY_HTML = _tree(f"{BASELINES}/summary.html")
METHOD = _tree(f"{METHODS}/{{method}}")
EVALUATION_GROUP = _tree("eval/embeddings/{group}")  # one directory per language
EVALUATION_EMBEDDINGS = f"{EVALUATION_GROUP}/{{lang}}"
EVALUATION_SCORES = _tree("eval/scores/{variant}/{dataset}.json")
# mteb's result layout: ResultCache("results/{base}/mteb") reads it (modsent.evaluation.mteb_results)
MTEB_RESULTS = _tree("mteb/results/modsent-{base}__{variant}/no_revision_available")
SUMMARY_CSV = _tree("summary.csv")
SUMMARY = _tree("summary.md")
SUMMARY_HTML = _tree("summary.html")
SUMMARY_PLOT = _tree("eval/summary.png")
XSIM_HEATMAPS = _tree("eval/xsim_heatmaps.png")
PER_LANGUAGE = _tree("eval/per_language")  # {name}.csv, .md and .html per dataset

# Everything one language owns: what ``modsent outputs --lang``
# lists. Downstream outputs shared by every language (summaries, evaluation scores) are not
# listed: Snakemake reruns them when their inputs go.
LANGUAGE_OUTPUTS = (
    CORPUS, PROVIDED_TRANSLATIONS, EVALUATION_SUBSET.replace("{subset}", "{lang}"),
    TRANSLATION_SHARD, TRANSLATIONS, TRANSLATION_QUALITY, PAIRS,
    TOKENIZER, FASTTEXT, EMBEDDINGS, LANGUAGE_ADAPTER, SENTENCE_ADAPTER,
    ALIGNMENT_ADAPTER.replace("{kind}", "*"), ENGLISH_EMBEDDINGS_PROVIDED, ENGLISH_EMBEDDING_UNITS_PROVIDED,
    ABLATION_SENTENCE_ADAPTER,
    ABLATION_ALIGNMENT_ADAPTER.replace("{kind}", "*"), EVALUATION_EMBEDDINGS,
)


def language_outputs(lang: str, base: str = "*") -> list[str]:
    """The glob patterns of ``lang``'s outputs (``lang`` and ``base`` already glob-escaped);
    every other wildcard is ``*``."""
    import re

    return [re.sub(r"\{[a-z]+\}", "*", pattern.replace("{lang}", lang).replace("{base}", base))
            for pattern in LANGUAGE_OUTPUTS]


# ---- seed replicates (config `seeds: N`) -------------------------------------------------------
# Replicate r > 0 of a config is the same results tree under ``results/{base}@seed{r}``: every
# stage retrained with each seed of the config plus r. Replicate 0 is ``results/{base}`` itself.
SEED_SEPARATOR = "@seed"
SEEDS_SUMMARY_CSV = _tree("summary_seeds.csv")
SEEDS_SUMMARY = _tree("summary_seeds.md")
SEEDS_SUMMARY_HTML = _tree("summary_seeds.html")


def replicate_base(base: str, replicate: int) -> str:
    """The ``base`` wildcard of seed replicate ``replicate`` (0: ``base`` itself)."""
    return base if replicate == 0 else f"{base}{SEED_SEPARATOR}{replicate}"


def split_replicate(base: str) -> tuple[str, int]:
    """(the config's base name, the replicate) of a ``base`` wildcard: ``me5@seed2`` → (me5, 2)."""
    name, separator, replicate = base.partition(SEED_SEPARATOR)
    return (name, int(replicate)) if separator else (base, 0)


def base_model(base: str) -> str:
    """The base model as a sentence-transformers directory (one for every seed replicate)."""
    return BASE_MODEL.format(base=split_replicate(base)[0])


def pairs(lang: str) -> str:
    """The paraphrase pairs in ``lang`` (the same pair_ids in every language)."""
    return PAIRS.format(lang=lang)


def translations(lang: str) -> str:
    """``unit_id, text, translation`` of every English sentence, translated into ``lang``."""
    return TRANSLATIONS.format(lang=lang)


def results(base: str) -> str:
    """The results tree of one base model."""
    return RESULTS.format(base=base)


def method_output(base: str, system: str) -> str:
    """A training method's trained system (a sentence-transformers directory)."""
    return METHOD.format(base=base, method=system)


def method_relative(system: str) -> str:
    """:func:`method_output` relative to the results tree (``results/{base}``)."""
    return f"{METHODS}/{system}"


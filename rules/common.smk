# Helpers shared by all stages (config checking, names, input functions, targets).
# No rule lives here; each stage has its own file.

import functools
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir)))  # import modsent from this checkout

from modsent import config as modsent_config
from modsent import languages as registry
from modsent import layout
from modsent import methods as modsent_methods
from modsent.encoders import systems as modsent_variants

LANGUAGE_REGEX = registry.wildcard_regex()
SLUG_REGEX = r"[A-Za-z0-9][A-Za-z0-9._-]*"
BASE_REGEX = rf"{SLUG_REGEX}(?:{re.escape(layout.SEED_SEPARATOR)}[1-9][0-9]*)?"  # base, or base@seed{r}
SUBSET_REGEX = f"(?:{LANGUAGE_REGEX})(?:-(?:{LANGUAGE_REGEX}))?"  # a language or a pair
ENV = "../envs/modsent.yaml"


def config_origin():
    """Where the config came from, for its error messages: the --configfile files (the embedded
    config.yaml when none is given), and --config when it set keys too."""
    files = [str(path) for path in workflow.overwrite_configfiles] or ["config.yaml (the embedded demo's)"]
    return ", ".join(files) + (" and --config" if workflow.config_settings.config else "")


def check_and_fill_config(config):
    """Fail before planning when the config is wrong; messages name the file and the key."""
    try:
        for path in workflow.overwrite_configfiles:  # what YAML lets pass: a key given twice
            modsent_config.read_config_file(path)
        modsent_config.check_config(config)
    except modsent_config.ConfigError as err:
        message = str(err).replace("invalid configuration:", f"invalid configuration in {config_origin()}:", 1)
        raise WorkflowError(message) from None


def fill_method_settings(config):
    """Register the configured training methods (method_modules) and fill in their settings'
    defaults (modsent.config.fill_method_settings)."""
    modsent_methods.load(config["method_modules"])
    modsent_config.fill_method_settings(config)


def normalize_config(config):
    """Replace the (schema-filled) config by its canonical spelling in place: keys sorted,
    numbers typed as the schema says. Params derived from it compare equal across spellings."""
    normalized = modsent_config.normalize_config(config)
    config.clear()
    config.update(normalized)


def canonical(value):
    """A rule's params value in canonical form (modsent.config.canonical: mapping keys sorted)."""
    return modsent_config.canonical(value)


def job_settings(section, lang=None):
    """A rule's training settings: the section without the keys the schema marks `x-role:
    runtime` or `selection`, canonical (modsent.config.job_settings). Changing a runtime key
    (GPUs, checkpoint cadence, logging) or a selection key therefore reruns no finished job."""
    return modsent_config.job_settings(config, section, lang)


def base_name():
    return config["base_model"]["name"]


def seed_replicates():
    """The ``base`` wildcards of the config's seed replicates (config ``seeds``; layout.replicate_base):
    ``[base]`` with one seed."""
    return [layout.replicate_base(base_name(), r) for r in range(config["seeds"])]


def seeded(settings, wildcards):
    """A training job's settings in its seed replicate: seed + r in replicate r (the ``base``
    wildcard ``{name}@seed{r}``), unchanged in replicate 0."""
    return canonical(modsent_config.seeded_settings(settings, layout.split_replicate(wildcards.base)[1]))


def replicate_methods(wildcards):
    """config["methods"] with each method's seed plus the replicate (modsent.config.replicate_methods)."""
    return modsent_config.replicate_methods(config["methods"], layout.split_replicate(wildcards.base)[1])


def focus_seed(wildcards):
    return config["focus"]["seed"] + layout.split_replicate(wildcards.base)[1]


def base_model_input(wildcards):
    """The base model of a job of any seed replicate (there is one)."""
    return layout.base_model(wildcards.base)


def languages():
    return list(config["languages"])


def non_english():
    return [lang for lang in languages() if lang != modsent_config.PIVOT_LANGUAGE]


# ---- inputs -------------------------------------------------------------------------------


def base_model_dir():
    """The base model as a local sentence-transformers directory (made by base_model)."""
    return layout.base_model(base_name())


def corpus_path(lang):
    return layout.CORPUS.format(lang=lang)


def corpus_settings(wildcards):
    return modsent_config.corpus_settings(config, wildcards.lang)


# ---- local sources are inputs: editing a local file in place reruns the rule that reads it ----


def corpus_local_files(wildcards):
    return modsent_config.corpus_local_files(config, wildcards.lang)


def paraphrase_local_files(wildcards):
    return modsent_config.local_source_files(config["paraphrases"][wildcards.dataset])


def provided_translation_local_files(wildcards):
    return modsent_config.local_source_files(config["translation"]["provided"], lang=wildcards.lang)


def base_model_local_files(wildcards):
    return modsent_config.local_source_files(config["base_model"]["source"])


def evaluation_local_files(wildcards):
    settings = config["evaluation"]["datasets"][wildcards.dataset]
    return modsent_config.local_source_files(settings, subset=wildcards.subset, lang=wildcards.subset)


def paraphrase_spec(wildcards):
    """What the dataset's file is made from: english_only says who reads it, not what it holds."""
    spec = config["paraphrases"][wildcards.dataset]
    return canonical({key: value for key, value in spec.items() if key != "english_only"})


def paraphrase_source_paths():
    """Every configured paraphrase dataset's file (the inputs' summary)."""
    return expand(layout.PARAPHRASE_SOURCE, dataset=list(config["paraphrases"]))


def english_only_datasets():
    """The paraphrases keys marked english_only (modsent.config.english_only_datasets)."""
    return modsent_config.english_only_datasets(config)


def translated_paraphrase_paths():
    """The files of the datasets that are translated: the English pairs of every language."""
    only = set(english_only_datasets())
    return expand(layout.PARAPHRASE_SOURCE, dataset=[name for name in config["paraphrases"] if name not in only])


def translation_targets():
    if config["translation"]["engine"] != "provided":
        return []
    return expand(layout.PROVIDED_TRANSLATIONS, lang=non_english())


def input_targets():
    return (
        [base_model_dir()]
        + [corpus_path(lang) for lang in languages()]
        + paraphrase_source_paths()
        + translation_targets()
        + [layout.INPUTS_SUMMARY]
    )


# ---- paraphrase data and translation ------------------------------------------------------


def translation_model_input(wildcards):
    """The converted CTranslate2 model for that engine; nothing for transformers (it loads
    the checkpoint itself, from the Hub or a local path)."""
    if config["translation"]["engine"] == "ctranslate2":
        return [layout.MT_MODEL]
    return []


def paraphrase_targets():
    targets = expand(layout.PAIRS, lang=languages())
    if non_english():
        targets.append(layout.TRANSLATION_QUALITY_SUMMARY)
    return targets


# ---- monolingual specialization -----------------------------------------------------------


def tokenizer_settings(wildcards):
    return modsent_config.tokenizer_settings(config, wildcards.lang)


def language_adapter_settings(wildcards):
    return seeded(job_settings("language_adapter", wildcards.lang), wildcards)


def language_adapter_dirs(wildcards):
    return expand(
        layout.LANGUAGE_ADAPTER,
        base=wildcards.base,
        lang=modsent_config.specialized_languages(config),
    )


def specialization_targets():
    if not modsent_config.specialized_languages(config):
        return []
    return [layout.LANGUAGE_ADAPTER_SUMMARY.format(base=base_name())]


# ---- sentence encoding -----------------------------------------------------------------------


def sentence_adapter_settings(wildcards):
    """The SE training settings (the script reads the runtime keys from the config)."""
    return seeded(job_settings("sentence_adapter"), wildcards)


def sentence_adapter_inputs(wildcards):
    """Base model, the language's pairs and, unless the language skips it, its LA."""
    inputs = {
        "base": layout.base_model(wildcards.base),
        "pairs": layout.pairs(wildcards.lang),
    }
    if wildcards.lang in modsent_config.specialized_languages(config):
        inputs["language_adapter"] = layout.LANGUAGE_ADAPTER.format(**wildcards)
    return inputs


def sentence_adapter_dirs(wildcards):
    return expand(layout.SENTENCE_ADAPTER, base=wildcards.base, lang=languages())


def sentence_encoding_targets():
    return [layout.SENTENCE_ADAPTER_SUMMARY.format(base=base_name())]


# ---- cross-lingual alignment -------------------------------------------------------------------


def _language_modules(base, lang):
    """The inputs naming a language's frozen encoder: its LA (unless skipped) and SE adapter."""
    inputs = {
        "base": layout.base_model(base),
        "sentence_adapter": layout.SENTENCE_ADAPTER.format(base=base, lang=lang),
    }
    if lang in modsent_config.specialized_languages(config):
        inputs["language_adapter"] = layout.LANGUAGE_ADAPTER.format(base=base, lang=lang)
    return inputs


def provided_alignment_translations():
    """alignment.provided_translations: pl also trains on the human translations of
    translation.provided (their English sentences get embeddings too)."""
    return bool(config["alignment"].get("provided_translations"))


def english_encoder_inputs(wildcards):
    return _language_modules(wildcards.base, modsent_config.PIVOT_LANGUAGE)


def alignment_inputs(wildcards):
    inputs = _language_modules(wildcards.base, wildcards.lang)
    if wildcards.kind == "pp":
        inputs["english_pairs"] = layout.pairs(modsent_config.PIVOT_LANGUAGE)
        inputs["pairs"] = layout.pairs(wildcards.lang)
    else:
        inputs["translations"] = layout.translations(wildcards.lang)
        if provided_alignment_translations():
            inputs["provided"] = layout.PROVIDED_TRANSLATIONS.format(lang=wildcards.lang)
            inputs["english_provided"] = layout.ENGLISH_EMBEDDINGS_PROVIDED.format(base=wildcards.base,
                                                                                  lang=wildcards.lang)
    return inputs


def provided_alignment_limit(wildcards=None):
    return config["alignment"].get("max_provided")


# modsent.modular.alignment.PL_ONLY_KEYS (not imported here: it would import torch into every plan)
ALIGNMENT_DATA_KEYS = ("provided_translations", "max_provided", "max_parallel")


def _alignment_kind_settings(settings, kind):
    """provided_translations, max_provided and max_parallel concern pl's data only: a pp adapter's
    settings leave them out, so switching them reruns no pp adapter."""
    if kind == "pp":
        settings = {key: value for key, value in settings.items() if key not in ALIGNMENT_DATA_KEYS}
    return canonical(settings)


def alignment_settings(wildcards):
    """The CLA training settings: merge_weights (a selection, used by the merges only) and the
    runtime keys (read by the script from the config) are not among them."""
    return _alignment_kind_settings(seeded(job_settings("alignment"), wildcards), wildcards.kind)


def merge_weight_names():
    return [modsent_variants.weight_name(w) for w in config["alignment"]["merge_weights"]]


def alignment_dirs(wildcards):
    return expand(layout.ALIGNMENT_ADAPTER, base=wildcards.base,
                  kind=["pp", "pl"], lang=non_english())


def alignment_targets():
    if not non_english():
        return []
    return [layout.ALIGNMENT_SUMMARY.format(base=base_name())] + expand(
        layout.MERGED_ALIGNMENT, base=base_name(),
        weight=merge_weight_names(), lang=non_english())


# ---- baselines and ablations --------------------------------------------------------------


def training_languages():
    """The configured languages sorted: what the monolithic systems' jobs (full baselines,
    methods, DuEAM's WMD) take, in params and inputs alike, so that the order of `languages`
    (spelling) replans none of them; the trainers do not depend on it."""
    return sorted(languages())


def full_baseline_languages(wildcards):
    """The languages whose pairs a full baseline trains on (Full_en: English only), sorted."""
    return modsent_variants.FULL_BASELINES[wildcards.name].training_languages(training_languages())


def full_baseline_inputs(wildcards):
    """The base model (Full_mc: Full_m's output instead) and the pairs it trains on."""
    recipe = modsent_variants.FULL_BASELINES[wildcards.name]
    inputs = {
        "pairs": expand(layout.PAIRS, lang=full_baseline_languages(wildcards)),
    }
    if recipe.init is None:
        inputs["base"] = layout.base_model(wildcards.base)
    else:
        inputs["init"] = layout.BASELINE.format(base=wildcards.base, name=recipe.init)
    return inputs


def full_baseline_dirs(wildcards):
    return expand(layout.BASELINE, base=wildcards.base,
                  name=config["baselines"]["full"])


def ablation_alignment_inputs(wildcards):
    """alignment_adapter's inputs without the SE adapter: base, L's LA (unless skipped), pairs."""
    inputs = alignment_inputs(wildcards)
    del inputs["sentence_adapter"]
    return inputs


def full_baseline_settings(wildcards):
    """The training settings without the choice of systems (selection keys) or how the job
    runs (runtime keys: gpus, checkpoint_every, log_every; the script reads them from the
    config). monolingual_epoch only where it decides the batches, Full_m's: Full_en has one
    language, Full_c and Full_mc's own training are cross-lingual (Full_mc follows Full_m
    through its weights)."""
    settings = job_settings("baselines")
    if wildcards.name != "Full_m":
        settings.pop("monolingual_epoch", None)
    return seeded(settings, wildcards)


def ablation_alignment_settings(wildcards):
    """The alignment settings, trained at the SE adapter's sequence length (the modular CLA
    adapters read it from the SE adapter, which this ablation has not)."""
    return _alignment_kind_settings(seeded({**job_settings("alignment"), "seq_len": config["sentence_adapter"]["seq_len"]},
                                           wildcards), wildcards.kind)


def baseline_targets():
    """Every output of the baseline and ablation rules (rules/baselines.smk) the config asks for."""
    section, base = config["baselines"], base_name()
    targets = expand(layout.BASELINE, base=base, name=section["full"])
    if section["full"]:
        targets.append(layout.BASELINE_SUMMARY.format(base=base))
    merge_weights, specialized = config["alignment"]["merge_weights"], modsent_config.specialized_languages(config)
    for name in section["ablations"]:  # each ablation's modules, in every language
        targets += [f"{layout.results(base)}/{path}" for lang in languages()
                    for path in modsent_variants.module_paths(name, lang, merge_weights, specialized)]
    return targets


# ---- rules --------------------------------------------------------------------------------


# ---- evaluation -----------------------------------------------------------------------------


def evaluation_datasets():
    """Configured evaluation dataset name → {source, revision}."""
    return config["evaluation"]["datasets"]


@functools.cache
def _dataset_subsets(name):
    from modsent.sources import evaluation as evaluation_data

    return evaluation_data.subsets(name, languages(), evaluation_datasets()[name].get("source"))


def dataset_subsets(name):
    """The subsets of a dataset that the configured languages have (language or pair names)."""
    return _dataset_subsets(name)[0]


def dataset_missing(name):
    """The configured languages a dataset lacks (listed in the summary, not an error)."""
    return _dataset_subsets(name)[1]


def dataset_languages(name):
    from modsent.evaluation.suite import subset_languages

    found = {lang for subset in dataset_subsets(name) for lang in subset_languages(subset, name)}
    return [lang for lang in languages() if lang in found]


def subset_path(name, subset):
    return layout.EVALUATION_SUBSET.format(dataset=name, subset=subset)


def evaluation_subset_settings(wildcards):
    settings = evaluation_datasets()[wildcards.dataset] or {}
    return canonical({"source": settings.get("source"), "revision": settings.get("revision")})


def evaluated_variants():
    from modsent.encoders import systems as variants

    chosen = config["evaluation"]["variants"]  # Mod_mc and Mod_mc-0.50 are Mod_mc-0.5 (one score directory)
    return [variants.canonical_name(name) for name in chosen] if chosen is not None \
        else variants.evaluated_variants(config)


def _language_datasets(lang):
    """dataset → the subset files that hold sentences in ``lang``."""
    from modsent.evaluation.suite import subset_languages

    out = {}
    for name in evaluation_datasets():
        paths = [subset_path(name, subset) for subset in dataset_subsets(name)
                 if lang in subset_languages(subset, name)]
        if paths:
            out[name] = paths
    return out


def group_variants(group):
    """The evaluated systems of an embedding group: ``modular`` (base, Mod_*) or ``full``."""
    from modsent.encoders import systems as variants

    return [name for name in evaluated_variants() if variants.group_of(name) == group]


def embedding_inputs(wildcards):
    from modsent.encoders import systems as variants

    modules = {
        f"{layout.results(wildcards.base)}/{path}"
        for name in group_variants(wildcards.group)
        for path in variants.module_paths(name, wildcards.lang, config["alignment"]["merge_weights"],
                                          modsent_config.specialized_languages(config))
    }
    return {
        "base": base_model_dir(),
        "modules": sorted(modules),
        "subsets": [path for paths in _language_datasets(wildcards.lang).values() for path in paths],
    }


def embedding_datasets(wildcards):
    return canonical(_language_datasets(wildcards.lang))


def embedding_variants(wildcards):
    return group_variants(wildcards.group)


def embedding_merge_weights(wildcards):
    """Only Mod_c reads a merge weight (its CLA merge uses the first)."""
    return config["alignment"]["merge_weights"][:1] if "Mod_c" in group_variants(wildcards.group) else None


def score_inputs(wildcards):
    name = wildcards.dataset
    return {
        "subsets": [subset_path(name, subset) for subset in dataset_subsets(name)],
        "embeddings": expand(layout.EVALUATION_EMBEDDINGS, base=wildcards.base,
                             group=_group_of(wildcards.variant), lang=dataset_languages(name)),
    }


def _group_of(name):
    from modsent.encoders import systems as variants

    return variants.group_of(name)


def score_settings(wildcards):
    name = wildcards.dataset
    return canonical({
        "subsets": {subset: subset_path(name, subset) for subset in dataset_subsets(name)},
        "languages": dataset_languages(name),
        "embeddings": layout.EVALUATION_GROUP.format(base=wildcards.base, group=_group_of(wildcards.variant)),
        "k": config["evaluation"]["xsim_k"],
        "margin": config["evaluation"]["xsim_margin"],
        "seed": config["evaluation"]["seed"],
    })


def evaluation_missing():
    """dataset → the configured languages it lacks (listed in the summary)."""
    return canonical({name: dataset_missing(name) for name in evaluation_datasets()})


def score_paths(wildcards):
    return expand(layout.EVALUATION_SCORES, base=wildcards.base,
                  variant=evaluated_variants(), dataset=list(evaluation_datasets()))


# ---- training methods (modsent.methods) -----------------------------------------------------


def configured_methods():
    return modsent_methods.configured(config)


def method_regex():
    """The wildcard constraint of a method name: the configured ones (none: matches nothing)."""
    names = configured_methods()
    return "|".join(re.escape(name) for name in names) if names else "(?!)"


def method_inputs(wildcards):
    """The contract files a method reads (modsent.methods.Method.uses)."""
    method = modsent_methods.get(wildcards.method)
    inputs = {"base": layout.base_model(wildcards.base)}
    if "pairs" in method.uses:
        inputs["pairs"] = [layout.pairs(lang) for lang in method_languages(wildcards)]
        if method.english_only and modsent_config.reads_english_only(config, replicate_methods(wildcards)[wildcards.method]):
            inputs["pairs"] = [layout.ENGLISH_TRAINING_PAIRS]  # the English pairs and the English-only datasets
    if "translations" in method.uses:  # sorted, as workflow_scripts/train_method.py names them
        inputs["translations"] = [layout.translations(lang) for lang in training_languages()
                                  if lang != modsent_config.PIVOT_LANGUAGE]
    if method.extra_inputs is not None:  # made by the method's own rules (rules/methods/)
        inputs.update(method.extra_inputs(wildcards.base, replicate_methods(wildcards)[wildcards.method],
                                          training_languages()))
    return inputs


def method_languages(wildcards):
    """The languages of the method's pair files, in their order (sorted: training_languages)."""
    return modsent_methods.get(wildcards.method).training_languages(training_languages())


def method_settings(wildcards):
    """The method's settings without its runtime keys (the script reads them from the config)."""
    return seeded(modsent_config.method_job_settings(config, wildcards.method), wildcards)


def method_targets():
    return [layout.method_output(base_name(), name) for name in configured_methods()]


def evaluation_targets():
    if not evaluation_datasets():
        return []
    return [layout.SUMMARY_CSV.format(base=base_name()), layout.SUMMARY.format(base=base_name())] + mteb_targets()


def mteb_datasets():
    """The configured evaluation datasets that are mteb tasks (none when evaluation.mteb_results
    is off)."""
    from modsent.evaluation import mteb_results

    if not config["evaluation"]["mteb_results"]:
        return []
    return mteb_results.mapped_datasets(list(evaluation_datasets()))


def mteb_targets():
    if not mteb_datasets():
        return []
    return expand(layout.MTEB_RESULTS, base=base_name(), variant=evaluated_variants())


def _for_dataset(wildcards, name):
    from types import SimpleNamespace

    return SimpleNamespace(base=wildcards.base, variant=wildcards.variant, dataset=name)


def mteb_inputs(wildcards):
    inputs = {}
    for name in mteb_datasets():
        for key, paths in score_inputs(_for_dataset(wildcards, name)).items():
            inputs[f"{name}_{key}"] = paths
    return inputs


def mteb_settings(wildcards):
    """Per mteb dataset: its subsets, languages, the system's embeddings and the configured source."""
    settings = {}
    for name in mteb_datasets():
        scoring = score_settings(_for_dataset(wildcards, name))
        settings[name] = {"subsets": scoring["subsets"], "languages": scoring["languages"],
                          "embeddings": scoring["embeddings"],
                          "source": evaluation_subset_settings(_for_dataset(wildcards, name))}
    return canonical({"datasets": settings, "languages": languages()})


def module_targets():
    """Every module directory of every configured system in every language, and what each is
    built from (a language adapter's tokenizer, fastText vectors and embeddings; a merged
    adapter's pp and pl adapters). Listed in rule all because Snakemake checks a file only when
    a job that runs asks for it: a module removed under a finished summary would otherwise
    never be rebuilt."""
    from modsent.encoders import systems as variants

    merge_weights = config["alignment"]["merge_weights"]
    specialized = modsent_config.specialized_languages(config)
    targets = []
    for base in seed_replicates():  # every seed replicate's tree (config seeds)
        results = layout.results(base)
        for name in variants.evaluated_variants(config):
            for lang in languages():
                for path in variants.module_paths(name, lang, merge_weights, specialized):
                    targets.append(f"{results}/{path}")
                    module_dir = Path(path)
                    if module_dir.parent.name.startswith("merged-"):  # {root}/merged-{w}/{lang}: its pp and pl
                        targets += [f"{results}/{module_dir.parent.parent}/{kind}/{lang}" for kind in ("pp", "pl")]
        for lang in specialized:
            targets += [pattern.format(base=base, lang=lang)
                        for pattern in (layout.TOKENIZER, layout.FASTTEXT, layout.EMBEDDINGS)]
    return list(dict.fromkeys(targets))


def seed_targets():
    """With ``seeds: N`` > 1: each further replicate's summary (which pulls in its whole tree)
    and the mean ± std table over the replicates."""
    if config["seeds"] < 2 or not evaluation_datasets():
        return []
    return ([layout.SUMMARY_CSV.format(base=base) for base in seed_replicates()[1:]]
            + [pattern.format(base=base_name()) for pattern in (layout.SEEDS_SUMMARY_CSV, layout.SEEDS_SUMMARY)])


def all_targets():
    """Everything the configured run produces: the target list of the default target."""
    return (
        seed_targets() +
        module_targets()
        + input_targets()
        + paraphrase_targets()
        + specialization_targets()
        + sentence_encoding_targets()
        + alignment_targets()
        + baseline_targets()
        + method_targets()
        + evaluation_targets()
    )

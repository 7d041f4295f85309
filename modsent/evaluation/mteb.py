"""Let the mteb package evaluate a modsent encoder (optional extra: ``pip install modsent[mteb]``).

mteb (>= 2) calls ``encode(inputs, task_metadata=, hf_split=, hf_subset=, prompt_type=)`` on an
encoder and gives it no language; a modular encoder needs one to pick the language's tokenizer,
embeddings and adapters. :class:`MtebEncoder` takes it from the task's metadata: the subset's
``eval_langs`` (``deu-Latn`` and the like, mapped to modsent codes by the language registry).

* one language in the subset (monolingual STS, classification, retrieval …): every sentence is
  encoded by that language's modules;
* several (a cross-lingual subset such as STS17 ``en-de`` or a bitext pair): mteb encodes each
  side in a separate call without saying which side it is, so each sentence's language is
  identified (modsent.data.language_id, offline) among the subset's languages only;
* a subset with a language that has no modules (STS17 ``en-ar`` without Arabic modules) is an
  error listing the languages available, unless ``fallback=`` names the language whose modules
  encode it instead (logged, and recorded in ``MtebEncoder.fallbacks``). Select the subsets of
  your languages with ``mteb.get_tasks(..., languages=[...])`` or ``task.filter_languages``.

Any object with ``encode(sentences, lang=, batch_size=)`` works (a :class:`ModularEncoder`, a
variant from :func:`modsent.encoders.systems.build_encoder`); embeddings are compared by cosine.

    import mteb
    from modsent.evaluation.mteb import MtebEncoder
    model = MtebEncoder(encoder, languages=["en", "de"], name="modsent/Mod_mc-labse")
    mteb.evaluate(model, mteb.get_tasks(tasks=["STS17"]), cache=None)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from modsent.data import language_id
from modsent import languages as registry
from modsent.io import InputError

try:
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta, ScoringFunction
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("modsent.evaluation.mteb needs the mteb package: pip install 'modsent[mteb]'") from error

log = logging.getLogger(__name__)


def modsent_code(langscript: str) -> str | None:
    """The registered code of an mteb language (``deu-Latn``, ``cmn-Hans``, ``eng``), or None."""
    flores = langscript.replace("-", "_")
    for candidate in (flores, langscript.split("-")[0]):
        try:
            return registry.resolve(candidate).code
        except registry.UnknownLanguageError:
            continue
    if flores.startswith("cmn_"):  # mteb writes Mandarin as cmn, FLORES as zho
        return modsent_code("zho" + flores[3:])
    return None


class MtebEncoder(AbsEncoder):
    """mteb's encoder protocol around a modsent encoder (see the module docstring).

    ``fallback``: the language whose modules encode a subset's languages that have none (for
    example ``"en"`` to run STS17 ``en-ar`` without Arabic modules). Without it such a subset is
    an InputError; with it every substitution is logged and kept in :attr:`fallbacks`."""

    def __init__(self, encoder: Any, languages: Sequence[str], *, name: str = "modsent/modular-encoder",
                 revision: str | None = None, batch_size: int = 32, fallback: str | None = None):
        self.model = encoder
        self.languages = list(languages)
        if not self.languages:
            raise InputError("MtebEncoder: no languages given")
        if fallback is not None and fallback not in self.languages:
            raise InputError(f"MtebEncoder: fallback {fallback!r} is not among the languages ({', '.join(self.languages)})")
        self.fallback = fallback
        self.fallbacks: dict[tuple[str, str], dict[str, str]] = {}  # (task, subset) -> {language: used}
        self.batch_size = batch_size
        self._identifiers: dict[tuple[str, ...], language_id.LanguageIdentifier] = {}
        meta = ModelMeta.create_empty()
        self.mteb_model_meta = meta.model_copy(update={
            "name": name, "revision": revision or "local", "similarity_fn_name": ScoringFunction.COSINE,
            "framework": ["PyTorch"]})

    def subset_languages(self, task_metadata, hf_subset: str) -> list[str]:
        """The modsent codes of ``hf_subset``'s languages, each of which must have modules here
        (or is replaced by the fallback, logged)."""
        langscripts = task_metadata.hf_subsets_to_langscripts.get(hf_subset) or task_metadata.eval_langs
        if isinstance(langscripts, dict):
            langscripts = [code for codes in langscripts.values() for code in codes]
        wanted = list(dict.fromkeys(modsent_code(code) or code for code in langscripts))
        missing = [code for code in wanted if code not in self.languages]
        if missing and self.fallback is None:
            raise InputError(f"mteb task {task_metadata.name}, subset {hf_subset!r}: language(s) "
                             f"{', '.join(missing)} have no modules here; available: {', '.join(self.languages)} "
                             "(evaluate only subsets of these languages, or pass fallback=)")
        if missing:
            self.fallbacks[(task_metadata.name, hf_subset)] = {code: self.fallback for code in missing}
            log.warning("mteb task %s, subset %r: %s encoded with the fallback %s's modules",
                        task_metadata.name, hf_subset, ", ".join(missing), self.fallback)
        return wanted

    def _route(self, sentences: list[str], langs: list[str]) -> list[str]:
        """Each sentence's language among the subset's ``langs`` (mteb does not say which side
        a sentence is on), then its modules' language (the fallback for one without)."""
        key = tuple(langs)
        if key not in self._identifiers:
            identifier = language_id.LanguageIdentifier(langs)
            if identifier.unknown:
                raise InputError(f"cannot tell the sides of a subset of {', '.join(langs)} apart: the "
                                 f"language identifier does not know {', '.join(identifier.unknown)}")
            self._identifiers[key] = identifier
        found = self._identifiers[key].identify(sentences)
        return [lang if lang in self.languages else self.fallback for lang in found]

    def encode(self, inputs, *, task_metadata, hf_split: str, hf_subset: str, prompt_type=None,
               **kwargs) -> np.ndarray:
        sentences = [text for batch in inputs for text in batch["text"]]
        langs = self.subset_languages(task_metadata, hf_subset)
        batch_size = int(kwargs.get("batch_size") or self.batch_size)
        if len(langs) == 1:
            used = langs[0] if langs[0] in self.languages else self.fallback
            return self.model.encode(sentences, lang=used, batch_size=batch_size)
        per_sentence = self._route(sentences, langs)
        out = None
        for lang in dict.fromkeys(per_sentence):
            rows = [i for i, found in enumerate(per_sentence) if found == lang]
            emb = self.model.encode([sentences[i] for i in rows], lang=lang, batch_size=batch_size)
            if out is None:
                out = np.zeros((len(sentences), emb.shape[1]), dtype=np.float32)
            out[rows] = emb
        return out if out is not None else self.model.encode([], lang=self.languages[0], batch_size=batch_size)

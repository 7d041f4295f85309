"""Let the mteb package evaluate a modsent encoder (optional extra: ``pip install modsent[mteb]``).

mteb (>= 2) calls ``encode(inputs, task_metadata=, hf_split=, hf_subset=, prompt_type=)`` on an
encoder and gives it no language; a modular encoder needs one to pick the language's tokenizer,
embeddings and adapters. :class:`MtebEncoder` takes it from the task's metadata: the subset's
``eval_langs`` (``deu-Latn`` and the like, mapped to modsent codes by the language registry).

* one language in the subset (monolingual STS, classification, retrieval …): every sentence is
  encoded by that language's modules;
* several (a cross-lingual subset such as STS17 ``en-de`` or a bitext pair): mteb encodes each
  side in a separate call without saying which side it is, so each sentence's language is
  identified (py3langid, offline) among the subset's languages only;
* a subset whose languages have no modules is an error listing the languages available.

Any object with ``encode(sentences, lang=, batch_size=)`` works (a :class:`ModularEncoder`, a
variant from :func:`modsent.variants.build_encoder`); embeddings are compared by cosine.

    import mteb
    from modsent.mteb_adapter import MtebEncoder
    model = MtebEncoder(encoder, languages=["en", "de"], name="modsent/Mod_mc-labse")
    mteb.evaluate(model, mteb.get_tasks(tasks=["STS17"]), cache=None)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from modsent import languages as registry
from modsent.io import InputError

try:
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta, ScoringFunction
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("modsent.mteb_adapter needs the mteb package: pip install 'modsent[mteb]'") from error

LANGID_CODES = {"zh-Hant": "zh", "nb": "no", "nn": "no"}


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
    """mteb's encoder protocol around a modsent encoder (see the module docstring)."""

    def __init__(self, encoder: Any, languages: Sequence[str], *, name: str = "modsent/modular-encoder",
                 revision: str | None = None, batch_size: int = 32):
        self.model = encoder
        self.languages = list(languages)
        if not self.languages:
            raise InputError("MtebEncoder: no languages given")
        self.batch_size = batch_size
        self._identifiers: dict[tuple[str, ...], Any] = {}
        meta = ModelMeta.create_empty()
        self.mteb_model_meta = meta.model_copy(update={
            "name": name, "revision": revision or "local", "similarity_fn_name": ScoringFunction.COSINE,
            "framework": ["PyTorch"]})

    def subset_languages(self, task_metadata, hf_subset: str) -> list[str]:
        """The modsent codes of ``hf_subset``'s languages that have modules here."""
        langscripts = task_metadata.hf_subsets_to_langscripts.get(hf_subset) or task_metadata.eval_langs
        if isinstance(langscripts, dict):
            langscripts = [code for codes in langscripts.values() for code in codes]
        wanted = [modsent_code(code) for code in langscripts]
        found = list(dict.fromkeys(code for code in wanted if code in self.languages))
        if not found:
            raise InputError(f"mteb task {task_metadata.name}, subset {hf_subset!r}: languages "
                             f"{', '.join(langscripts)} have no modules here; available: {', '.join(self.languages)}")
        return found

    def _identify(self, sentences: list[str], candidates: list[str]) -> list[str]:
        key = tuple(candidates)
        if key not in self._identifiers:
            from py3langid import langid

            identifier = langid._load_identifier()  # a private one: the module's global stays as is
            known = set(identifier.labels)
            mapping = {}
            for lang in candidates:
                code = LANGID_CODES.get(lang, lang).split("-")[0]
                if code in known:
                    mapping[code] = lang
            if len(mapping) < 2:
                self._identifiers[key] = None
            else:
                identifier.set_languages(sorted(mapping))
                self._identifiers[key] = (identifier, mapping)
        found = self._identifiers[key]
        if found is None:  # the identifier cannot tell these apart: the first known language
            return [candidates[0]] * len(sentences)
        identifier, mapping = found
        return [mapping[identifier.classify(sentence)[0]] for sentence in sentences]

    def encode(self, inputs, *, task_metadata, hf_split: str, hf_subset: str, prompt_type=None,
               **kwargs) -> np.ndarray:
        sentences = [text for batch in inputs for text in batch["text"]]
        langs = self.subset_languages(task_metadata, hf_subset)
        batch_size = int(kwargs.get("batch_size") or self.batch_size)
        if len(langs) == 1:
            return self.model.encode(sentences, lang=langs[0], batch_size=batch_size)
        per_sentence = self._identify(sentences, langs)
        out = None
        for lang in dict.fromkeys(per_sentence):
            rows = [i for i, found in enumerate(per_sentence) if found == lang]
            emb = self.model.encode([sentences[i] for i in rows], lang=lang, batch_size=batch_size)
            if out is None:
                out = np.zeros((len(sentences), emb.shape[1]), dtype=np.float32)
            out[rows] = emb
        return out if out is not None else np.zeros((0, 0), dtype=np.float32)

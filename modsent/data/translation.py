"""Machine translation of the English paraphrase sentences: NLLB and M2M100, two engines.

Units. Every distinct English sentence is translated once per language. A *unit* is such a
sentence with a content-hash id (``unit_id``: the first 16 hex digits of the SHA-256 of its
UTF-8 text); units are stored as parquet ``unit_id, text``, sorted by ``unit_id``. A language's
units are split into ``n_shards`` shards that run as separate (GPU) jobs: a unit belongs to
shard ``int(unit_id, 16) % n_shards``. Its shard depends on its own id only, so adding units to
the data set never moves an existing unit to another shard (changing ``n_shards`` does).

Engines, one interface (:func:`translate_shard`, or :func:`load_translator` for a
:class:`Translator` object):

- ``transformers``: ``AutoModelForSeq2SeqLM`` + ``AutoTokenizer`` on an NLLB (default
  ``facebook/nllb-200-3.3B``) or M2M100 checkpoint; bfloat16 on a GPU (float16 on one without
  bf16 units: V100, T4), float32 on a CPU.
- ``ctranslate2``: the same checkpoint converted by :func:`convert_checkpoint` (CTranslate2's
  ``TransformersConverter``, the Python API behind ``ct2-transformers-converter``), translated
  with ``ctranslate2.Translator``.

Both encode the source with the checkpoint's own tokenizer, as the model was trained:
``[source language token] tokens </s>`` (NLLB's current, non-legacy layout; M2M100's too), and
force the target language token as the first generated token (``forced_bos_token_id`` with
transformers, ``target_prefix`` with CTranslate2, as CTranslate2's NLLB/M2M100 guide does). Batches
are sorted by source length (longest first, so a batch that does not fit in memory fails at
once) and the results put back in input order. A batch holds a fixed number of sentences, or,
with a token budget (:func:`length_batches`), as many as fit: many short sentences or a few
long ones, both engines alike. The budget counts source tokens only: the last batches, short
sentences in the largest numbers, also hold ``beam_size`` hypotheses per sentence, so
``batch_size`` still caps their sentences.

Resumption. :func:`translate_shard` appends finished batches to parquet parts in
``<out_path>.partial/`` (each part written atomically); a rerun after a crash, a time limit or a
``kill`` translates only the units that no part holds. The output, one row per input unit in
input order, is written atomically once every unit is done, and the partial folder removed.

Language codes: our registry codes (``de``, ``zh-Hant``) are mapped to the model's codes — NLLB:
the registry's ``nllb`` column; M2M100: its two-letter-ish codes (see
:func:`model_language_code`). A language the model lacks is an :class:`InputError` raised by
:func:`check_languages`, which needs no model files for NLLB or a Hub M2M100 id, so the
workflow calls it when it plans the jobs.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import logging
import math
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import pandas as pd

from modsent import languages
from modsent.io import InputError, atomic_open, atomic_path, record_added_tokens

log = logging.getLogger(__name__)

ENGINES = ("transformers", "ctranslate2")
FAMILIES = ("nllb", "m2m100")
DEFAULT_MODEL = "facebook/nllb-200-3.3B"
UNIT_COLUMNS = ("unit_id", "text")
OUTPUT_COLUMNS = ("unit_id", "translation")
UNIT_ID_LENGTH = 16
_UNIT_ID = re.compile(r"[0-9a-f]{16}")

# Our registry code -> M2M100's code where they differ (M2M100 calls Norwegian "no" and Northern
# Sotho "ns"); every other M2M100 code is our ISO 639-1 (or 639-3: ast, ceb, ilo) code itself.
M2M100_CODE_FOR = {"nb": "no", "nso": "ns"}
# Written by convert_checkpoint into the converted directory: what it was converted from.
CONVERSION_INFO = "modsent_conversion.json"
# convert_checkpoint saves the checkpoint's tokenizer here, inside the converted directory.
CONVERTED_TOKENIZER_DIR = "tokenizer"
CT2_QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                     "float16", "bfloat16", "float32")
TORCH_COMPUTE_TYPES = ("float32", "bfloat16", "float16")
_DEFAULT_COMPUTE = (None, "auto", "default")  # "let the engine choose" spellings


# ---- units and shards ---------------------------------------------------------------------


def unit_id(text: str) -> str:
    """The content-hash id of a sentence: the first 16 hex digits of SHA-256 of its UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:UNIT_ID_LENGTH]


def make_units(sentences: Iterable[str | None]) -> pd.DataFrame:
    """The distinct sentences as units: ``DataFrame[unit_id, text]`` sorted by ``unit_id``.

    Nulls (``None``/NaN, e.g. a missing negative) are skipped; texts are kept exactly as given
    (the id hashes that exact text). An empty or blank string, or a non-string, is an
    :class:`InputError` naming its position: cleaning belongs to the stage that made the data.
    """
    by_id: dict[str, str] = {}
    for position, text in enumerate(sentences):
        if text is None or (isinstance(text, float) and math.isnan(text)):
            continue
        if not isinstance(text, str):
            raise InputError(f"sentence {position}: expected a string, got {type(text).__name__} {text!r}")
        if not text.strip():
            raise InputError(f"sentence {position}: empty or blank sentence {text!r}")
        uid = unit_id(text)
        seen = by_id.setdefault(uid, text)
        if seen != text:  # 64-bit ids: about 3e-8 for a million sentences, but never silently
            raise InputError(f"unit id collision: {seen!r} and {text!r} both hash to {uid}")
    ids = sorted(by_id)
    return pd.DataFrame({"unit_id": pd.Series(ids, dtype="str"),
                         "text": pd.Series([by_id[i] for i in ids], dtype="str")})


def shard_of(uid: str, n_shards: int) -> int:
    """The shard of a unit: its id read as a 64-bit number, modulo ``n_shards``."""
    return int(uid, 16) % n_shards


def shard_units(units: pd.DataFrame, n_shards: int, shard: int) -> pd.DataFrame:
    """The units of shard ``shard`` (0-based) of ``n_shards``, in their order in ``units``.

    Deterministic and stable: a unit's shard is ``int(unit_id, 16) % n_shards``, a function of
    its own id, so adding units never moves others; the shards partition the units.
    """
    if not isinstance(n_shards, int) or isinstance(n_shards, bool) or n_shards < 1:
        raise InputError(f"n_shards must be a positive integer, not {n_shards!r}")
    if not isinstance(shard, int) or isinstance(shard, bool) or not 0 <= shard < n_shards:
        raise InputError(f"shard must be an integer in 0..{n_shards - 1}, not {shard!r}")
    _check_unit_ids(units["unit_id"], "units")
    mask = [shard_of(uid, n_shards) == shard for uid in units["unit_id"]]
    return units.loc[mask].reset_index(drop=True)


def _check_unit_ids(ids: pd.Series, where: str) -> None:
    bad = [u for u in ids if not (isinstance(u, str) and _UNIT_ID.fullmatch(u))]
    if bad:
        raise InputError(f"{where}: unit_id must be {UNIT_ID_LENGTH} lowercase hex digits; "
                         f"{len(bad)} are not, e.g. {bad[0]!r}")
    duplicated = ids[ids.duplicated()]
    if len(duplicated):
        raise InputError(f"{where}: {len(duplicated)} duplicated unit_id, e.g. {duplicated.iloc[0]!r}")


def read_units(path: str | os.PathLike) -> pd.DataFrame:
    """Read and check a units parquet: columns ``unit_id, text``, unique ids, string texts."""
    path = Path(path)
    try:
        frame = pd.read_parquet(path, columns=list(UNIT_COLUMNS))
    except (KeyError, ValueError) as err:
        raise InputError(f"{path}: expected a parquet file with columns {', '.join(UNIT_COLUMNS)} ({err})") from None
    _check_unit_ids(frame["unit_id"], str(path))
    bad = [i for i, t in enumerate(frame["text"]) if not isinstance(t, str)]
    if bad:
        raise InputError(f"{path}: text must be a string in every row; row {bad[0]} is {frame['text'].iloc[bad[0]]!r}")
    return frame.reset_index(drop=True)


# ---- models and language codes ------------------------------------------------------------


def _model_location(model: str | os.PathLike) -> str:
    """``local:PATH`` → PATH; a Hub id or a path as it is. There is no built-in MT model."""
    text = str(model)
    if text.startswith("local:"):
        return text.split(":", 1)[1]
    if text.startswith("builtin:"):
        raise InputError(f"translation model {text!r}: there is no built-in translation model; "
                         f"use a Hub id (e.g. {DEFAULT_MODEL}) or local:PATH")
    return text.removeprefix("hf:")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}


def model_family(model: str | os.PathLike) -> str:
    """``"nllb"`` or ``"m2m100"``: which code scheme a checkpoint uses, without loading it.

    A local directory tells by its files (the conversion record :func:`convert_checkpoint`
    writes, then ``tokenizer_class`` in config.json or tokenizer_config.json); a Hub id by its
    name (``nllb`` / ``m2m100``, ``wmt21``).
    """
    location = _model_location(model)
    path = Path(location)
    if path.is_dir():
        info = _read_json(path / CONVERSION_INFO)
        if info.get("family") in FAMILIES:
            return info["family"]
        for candidate in (path / "config.json", path / "tokenizer_config.json",
                          path / CONVERTED_TOKENIZER_DIR / "tokenizer_config.json"):
            tokenizer_class = str(_read_json(candidate).get("tokenizer_class") or "")
            if tokenizer_class.startswith("Nllb"):
                return "nllb"
            if tokenizer_class.startswith("M2M100"):
                return "m2m100"
    name = location.rstrip("/").rsplit("/", 1)[-1].lower()
    if "nllb" in name:
        return "nllb"
    if "m2m100" in name or "m2m_100" in name or "wmt21" in name:
        return "m2m100"
    raise InputError(f"translation model {str(model)!r}: cannot tell whether it is an NLLB or an "
                     f"M2M100 checkpoint (no tokenizer_class NllbTokenizer/M2M100Tokenizer in its "
                     f"config, and neither 'nllb' nor 'm2m100' in its name)")


def m2m100_codes(model: str | os.PathLike) -> list[str]:
    """The language codes of an M2M100 checkpoint (transformers' FAIRSEQ_LANGUAGE_CODES):
    the ``language_codes`` set its tokenizer_config.json names, else by its name."""
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    location = _model_location(model)
    path = Path(location)
    code_set = None
    for candidate in (path / "tokenizer_config.json", path / CONVERTED_TOKENIZER_DIR / "tokenizer_config.json"):
        code_set = code_set or _read_json(candidate).get("language_codes")
    if code_set is None:
        code_set = "wmt21" if "wmt21" in location.lower() else "m2m100"
    if code_set not in FAIRSEQ_LANGUAGE_CODES:
        raise InputError(f"translation model {str(model)!r}: unknown M2M100 language_codes {code_set!r}")
    return list(FAIRSEQ_LANGUAGE_CODES[code_set])


def _registered(code: str) -> languages.Language:
    try:
        return languages.get(code)
    except languages.UnknownLanguageError as err:
        raise InputError(str(err)) from None


def model_language_code(family: str, lang: str, *, model: str | os.PathLike = DEFAULT_MODEL) -> str:
    """The model's code for our language code ``lang``: NLLB ``deu_Latn``, M2M100 ``de``.

    NLLB: the registry's ``nllb`` column (None for the two FLORES-200 languages NLLB-200 lacks,
    ``ar-Latn`` and ``min-Arab``). M2M100: our code itself where M2M100 has it, with
    ``nb`` → ``no`` and ``nso`` → ``ns``; a second script (``zh-Hant``) has no M2M100 code.
    A language the model lacks raises :class:`InputError` naming the code and the model.
    """
    entry = _registered(lang)
    if family == "nllb":
        if entry.nllb is None:
            raise InputError(
                f"language {lang!r} ({entry.name}, FLORES-200 {entry.flores}) is not covered by NLLB-200, "
                f"so the translation model {str(model)!r} cannot translate into or from it; remove it "
                f"from the languages or give its translations with translation.engine: provided")
        return entry.nllb
    if family == "m2m100":
        code = M2M100_CODE_FOR.get(lang, lang)
        if code not in m2m100_codes(model):
            raise InputError(
                f"language {lang!r} ({entry.name}) is not a language of the M2M100 model {str(model)!r} "
                f"(its codes: {', '.join(m2m100_codes(model))}); use an NLLB model or "
                f"translation.engine: provided for it")
        return code
    raise InputError(f"unknown model family {family!r}; expected one of {', '.join(FAMILIES)}")


def check_languages(engine: str, model: str | os.PathLike, langs: Iterable[str]) -> dict[str, str]:
    """Check, before anything is loaded, that ``model`` covers every language of ``langs``.

    Returns ``{our code: model's code}``. For NLLB checkpoints it needs no model files (the
    registry knows NLLB-200's codes); for M2M100 it uses transformers' code list. Engine
    ``provided`` needs no model: nothing to check, ``{}``. Raises :class:`InputError` naming the
    first language the model lacks (and the model).
    """
    if engine == "provided":
        return {}
    _check_engine(engine)
    family = model_family(model)
    return {lang: model_language_code(family, lang, model=model) for lang in langs}


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise InputError(f"translation engine {engine!r}: expected one of {', '.join(ENGINES)}")


# ---- the engines --------------------------------------------------------------------------


def _default_device(engine: str) -> str:
    if engine == "ctranslate2":
        import ctranslate2

        return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
    from modsent.training.precision import default_device

    return default_device()


class Translator:
    """One checkpoint, one language direction: ``translate(texts) -> translations``.

    The steps are public so that tests can look at the tokens: :meth:`encode` (source ids,
    ``[source language] ... </s>``), :meth:`generate` (target ids, starting with the target
    language token; no decoder-start token, no ``</s>``, no padding) and :meth:`decode`.
    """

    engine = ""

    def __init__(self, tokenizer, family: str, src_code: str, tgt_code: str, *, beam_size: int,
                 max_length: int, max_input_length: int, min_length: int = 0):
        self.tokenizer = tokenizer
        self.family = family
        self.src_code, self.tgt_code = src_code, tgt_code
        self.beam_size, self.max_length, self.min_length = beam_size, max_length, min_length
        self.max_input_length = max_input_length
        if family == "nllb":
            self.src_token, self.tgt_token = src_code, tgt_code
        else:
            self.src_token, self.tgt_token = tokenizer.get_lang_token(src_code), tokenizer.get_lang_token(tgt_code)
        self.src_id = self._token_id(self.src_token)
        self.tgt_id = self._token_id(self.tgt_token)
        self.tokenizer.src_lang = src_code  # sets the source template: [src_lang] ... </s>
        probe = self.encode(["probe"])[0]
        if probe[0] != self.src_id or probe[-1] != tokenizer.eos_token_id:
            raise InputError(
                f"the tokenizer encodes a source as {tokenizer.convert_ids_to_tokens(probe)}; expected "
                f"[{self.src_token}, ..., {tokenizer.eos_token}] (NLLB's non-legacy layout)")

    def _token_id(self, token: str) -> int:
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == self.tokenizer.unk_token_id:
            raise InputError(f"the tokenizer has no language token {token!r}")
        return token_id

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Source ids with the special tokens the model expects, cut at ``max_input_length``."""
        encoded = self.tokenizer(list(texts), add_special_tokens=True, truncation=True,
                                 max_length=self.max_input_length)
        return [list(ids) for ids in encoded["input_ids"]]

    def generate(self, sources: Sequence[Sequence[int]]) -> list[list[int]]:
        raise NotImplementedError

    def decode(self, targets: Sequence[Sequence[int]]) -> list[str]:
        """Text of target ids; special tokens (the target language token, ``</s>``) dropped."""
        return self.tokenizer.batch_decode([list(t) for t in targets], skip_special_tokens=True)

    def translate(self, texts: Sequence[str]) -> list[str]:
        return self.decode(self.generate(self.encode(texts)))


class TransformersTranslator(Translator):
    """``AutoModelForSeq2SeqLM.generate`` with the target language forced as first token."""

    engine = "transformers"

    def __init__(self, model, tokenizer, family, src_code, tgt_code, **options):
        super().__init__(tokenizer, family, src_code, tgt_code, **options)
        self.model = model
        # Checkpoints carry max_length (NLLB: 200) in their generation config; max_new_tokens
        # replaces it here, and transformers warns on every batch when both are set.
        model.generation_config.max_length = None
        # NLLB: the language token's id; M2M100: tokenizer.get_lang_id(code), the same id.
        self.forced_bos_token_id = self.tgt_id if family == "nllb" else tokenizer.get_lang_id(tgt_code)

    def generate(self, sources):
        import torch

        from modsent.training.fastpath import attention_for_varying_shapes

        if not sources:
            return []
        batch = self.tokenizer.pad({"input_ids": [list(s) for s in sources]}, return_tensors="pt")
        batch = {key: value.to(self.model.device) for key, value in batch.items()}
        # every decoding step attends over one more position: without cuDNN's attention kernel,
        # which would build a plan for each of those shapes on Hopper GPUs
        with torch.inference_mode(), attention_for_varying_shapes():
            output = self.model.generate(
                **batch, forced_bos_token_id=self.forced_bos_token_id, num_beams=self.beam_size,
                do_sample=False, max_new_tokens=self.max_length,
                **({"min_new_tokens": self.min_length} if self.min_length else {}),
            )
        start = self.model.generation_config.decoder_start_token_id
        eos, pad, unk = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id, self.tokenizer.unk_token_id
        n_tokens = len(self.tokenizer)
        targets = []
        for row in output.tolist():
            if row and row[0] == start:
                row = row[1:]  # the decoder-start token (</s> for NLLB), not generated
            if eos in row[1:]:
                row = row[:row.index(eos, 1)]
            # Ids past the tokenizer (M2M100's "madeup words", vocabulary padding) are <unk>,
            # as CTranslate2 makes them.
            targets.append([t if t < n_tokens else unk for t in row if t != pad])
        return targets


class CTranslate2Translator(Translator):
    """``ctranslate2.Translator.translate_batch`` with ``target_prefix=[[target language]]``."""

    engine = "ctranslate2"

    def __init__(self, translator, tokenizer, family, src_code, tgt_code, **options):
        super().__init__(tokenizer, family, src_code, tgt_code, **options)
        self.translator = translator

    def source_tokens(self, sources: Sequence[Sequence[int]]) -> list[list[str]]:
        """CTranslate2 takes token strings: the tokenizer's, special tokens included (it adds
        none itself for Transformers models)."""
        return [self.tokenizer.convert_ids_to_tokens(list(s)) for s in sources]

    def generate(self, sources):
        if not sources:
            return []
        results = self.translator.translate_batch(
            self.source_tokens(sources), target_prefix=[[self.tgt_token]] * len(sources),
            beam_size=self.beam_size, max_decoding_length=self.max_length,
            min_decoding_length=self.min_length, max_input_length=0, max_batch_size=0,
        )
        # Hypotheses start with the target prefix and leave out </s>; CTranslate2 pads the
        # vocabulary with "madeupwordN" tokens, which map to <unk> here.
        return [self.tokenizer.convert_tokens_to_ids(r.hypotheses[0]) for r in results]


def _load_tokenizer(location: str, family: str, src_code: str, revision: str | None = None):
    from transformers import AutoTokenizer

    options = {"src_lang": src_code}
    if revision:
        options["revision"] = revision
    if family == "nllb":
        options["legacy_behaviour"] = False  # [src_lang] tokens </s>: the layout NLLB was trained on
    return AutoTokenizer.from_pretrained(location, **options)


def _gpu_half(device: str, engine: str = "transformers") -> str:
    """The half type a GPU computes natively: ``bfloat16`` where it has bf16 units (A100, H100),
    ``float16`` where it has not (V100, T4: PyTorch emulates bf16 there at about fp32's speed,
    CTranslate2 refuses it). Asked of the engine that will run: CTranslate2 for its own
    (``get_supported_compute_types``, the device's index included, whatever torch was built
    for), else torch, as the training stages decide (modsent.training.precision.resolve)."""
    if engine == "ctranslate2":
        import ctranslate2

        index = int(device.partition(":")[2] or 0)
        return "bfloat16" if "bfloat16" in ctranslate2.get_supported_compute_types("cuda", index) else "float16"
    from modsent.training import precision

    return "bfloat16" if precision.resolve(device, "auto") == "bf16" else "float16"


def _torch_dtype(compute_type: str | None, device: str):
    import torch

    if compute_type in _DEFAULT_COMPUTE:
        return getattr(torch, _gpu_half(device)) if device.startswith("cuda") else torch.float32
    if compute_type not in TORCH_COMPUTE_TYPES:
        raise InputError(f"compute_type {compute_type!r}: the transformers engine runs "
                         f"{', '.join(TORCH_COMPUTE_TYPES)} (or auto); int8 types are ctranslate2's")
    return getattr(torch, compute_type)


def load_translator(engine: str, model: str | os.PathLike, *, src_lang: str, tgt_lang: str,
                    tokenizer: str | os.PathLike | None = None, beam_size: int = 4,
                    max_length: int = 256, max_input_length: int = 512, min_length: int = 0,
                    device: str | None = None, compute_type: str | None = None,
                    revision: str | None = None) -> Translator:
    """Load a :class:`Translator` for ``src_lang`` → ``tgt_lang`` (our registry codes).

    ``model``: for ``transformers`` a checkpoint (Hub id, path or ``local:PATH``); for
    ``ctranslate2`` a directory made by :func:`convert_checkpoint`. ``tokenizer``: where to load
    the tokenizer from (default: the checkpoint; for ``ctranslate2`` the copy the conversion
    saved). ``max_length``: most generated tokens, the target language token included;
    ``max_input_length``: source tokens kept. ``device``: ``cuda`` when there is a GPU, else
    ``cpu``. ``compute_type``: transformers ``float32``/``bfloat16``/``float16`` (default: bfloat16
    on a GPU with bf16 units, float16 on one without, such as a V100 or T4; float32 on a CPU);
    ctranslate2 any of its compute types (default: the same half type on a GPU, the converted
    weights' type on a CPU; ``auto`` lets CTranslate2 pick the fastest).
    ``revision``: the Hub revision of the checkpoint. Weights are read from safetensors only
    (facebook/nllb-200-3.3B has them on revision refs/pr/10; its main branch has pickles only).
    """
    _check_engine(engine)
    codes = check_languages(engine, tokenizer or model, [src_lang, tgt_lang])
    family = model_family(tokenizer or model)
    device = device or _default_device(engine)
    options = dict(beam_size=beam_size, max_length=max_length, max_input_length=max_input_length,
                   min_length=min_length)
    location = _model_location(model)
    if engine == "transformers":
        from transformers import AutoModelForSeq2SeqLM

        tok = _load_tokenizer(_model_location(tokenizer or model), family, codes[src_lang],
                              None if tokenizer else revision)
        dtype = _torch_dtype(compute_type, device)
        log.info("loading %s (%s) on %s as %s", location, family, device, dtype)
        seq2seq = AutoModelForSeq2SeqLM.from_pretrained(
            location, dtype=dtype, use_safetensors=True, revision=revision).to(device).eval()
        return TransformersTranslator(seq2seq, tok, family, codes[src_lang], codes[tgt_lang], **options)

    import ctranslate2
    import torch

    path = Path(location)
    if not (path / "model.bin").is_file():
        raise InputError(f"{location}: not a CTranslate2 model directory (no model.bin); convert the "
                         f"checkpoint first (modsent.data.translation.convert_checkpoint)")
    tokenizer_location = _model_location(tokenizer) if tokenizer else str(path / CONVERTED_TOKENIZER_DIR)
    if not Path(tokenizer_location).is_dir() and tokenizer is None:
        raise InputError(f"{location}: no {CONVERTED_TOKENIZER_DIR}/ inside; pass tokenizer= (the checkpoint)")
    tok = _load_tokenizer(tokenizer_location, family, codes[src_lang])
    if compute_type is None:
        compute_type = _gpu_half(device, engine) if device.startswith("cuda") else "default"
    log.info("loading CTranslate2 model %s (%s) on %s, compute type %s", location, family, device, compute_type)
    kind, _, index = device.partition(":")  # CTranslate2 takes "cuda" and an index, not "cuda:1"
    translator = ctranslate2.Translator(
        str(path), device=kind, device_index=int(index or 0), compute_type=compute_type,
        intra_threads=torch.get_num_threads() if device == "cpu" else 0,
    )
    return CTranslate2Translator(translator, tok, family, codes[src_lang], codes[tgt_lang], **options)


# ---- CTranslate2 conversion ---------------------------------------------------------------


# what a conversion reads of a checkpoint: never pickled weights (pytorch_model*.bin)
_CONVERTED_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt")


def convert_checkpoint(model_dir: str | os.PathLike, out_dir: str | os.PathLike,
                       quantization: str | None = None, revision: str | None = None) -> Path:
    """Convert an NLLB/M2M100 checkpoint for CTranslate2 into ``out_dir``, atomically.

    Runs ``ctranslate2.converters.TransformersConverter`` (what ``ct2-transformers-converter``
    runs). ``quantization``: the weights' type on disk, one of CTranslate2's (``int8``,
    ``int8_float16``, ``float16``, ``bfloat16``, ...); ``None``/``auto``/``default`` keep the
    checkpoint's. The directory also gets the checkpoint's tokenizer (``tokenizer/``) and
    ``modsent_conversion.json`` (source, family, quantization, versions), so it is all a
    translation job needs.
    """
    import ctranslate2
    import transformers
    from ctranslate2.converters import TransformersConverter
    from transformers import AutoTokenizer

    location = _model_location(model_dir)
    family = model_family(model_dir)
    if quantization in _DEFAULT_COMPUTE:
        quantization = None
    elif quantization not in CT2_QUANTIZATIONS:
        raise InputError(f"quantization {quantization!r}: expected one of {', '.join(CT2_QUANTIZATIONS)} "
                         f"(or auto: keep the checkpoint's weights type)")
    with atomic_path(out_dir, directory=True) as tmp:
        # safetensors only: the converter would otherwise unpickle pytorch_model*.bin
        if not Path(location).is_dir():
            from huggingface_hub import snapshot_download

            log.info("downloading %s (revision %s), safetensors only", location, revision)
            location = snapshot_download(
                repo_id=location, revision=revision, local_dir=tmp / ".download",
                allow_patterns=list(_CONVERTED_PATTERNS))
            if not list(Path(location).glob("*.safetensors")):
                raise InputError(f"{model_dir} (revision {revision}) has no safetensors weights; set "
                                 "translation.revision to one that has (facebook/nllb-200-3.3B: refs/pr/10)")
        else:  # a local directory: the converter sees links to its safetensors, configs and vocabularies only
            source, location = Path(location), tmp / ".download"
            location.mkdir()
            for path in sorted(source.iterdir()):
                if path.is_file() and any(fnmatch.fnmatch(path.name, p) for p in _CONVERTED_PATTERNS):
                    (location / path.name).symlink_to(path.resolve())
            if not list(location.glob("*.safetensors")):
                from modsent.encoders.base_models import PICKLE_SUFFIXES

                pickles = sorted(p.name for p in source.iterdir() if p.suffix in PICKLE_SUFFIXES)
                raise InputError(f"{source}: no safetensors weights" + (
                    f" (found pickled weights {pickles}, which modsent does not load: save the model with "
                    "save_pretrained(..., safe_serialization=True))" if pickles else ""))
        log.info("converting %s for CTranslate2 %s (quantization %s)", location, ctranslate2.__version__,
                 quantization or "none")
        start = time.perf_counter()
        TransformersConverter(str(location), low_cpu_mem_usage=True).convert(
            str(tmp / "ct2"), quantization=quantization, force=True)
        for item in (tmp / "ct2").iterdir():
            item.rename(tmp / item.name)
        (tmp / "ct2").rmdir()
        AutoTokenizer.from_pretrained(str(location)).save_pretrained(tmp / CONVERTED_TOKENIZER_DIR)
        record_added_tokens(tmp / CONVERTED_TOKENIZER_DIR)
        shutil.rmtree(tmp / ".download", ignore_errors=True)
        info = {"source": str(model_dir), "family": family, "quantization": quantization,
                "ctranslate2": ctranslate2.__version__, "transformers": transformers.__version__}
        (tmp / CONVERSION_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        log.info("converted in %.1f s", time.perf_counter() - start)
    return Path(out_dir)


# ---- shards, with resumption --------------------------------------------------------------


class _Terminated(Exception):
    """SIGTERM (SLURM's time limit, scancel, Snakemake stopping) turned into an exception, so
    that finished batches are saved before the process ends."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield  # someone else handles SIGTERM (or we cannot): leave it to them
        return

    def handler(signum, frame):
        raise _Terminated(f"terminated by signal {signum}")

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def partial_dir(out_path: str | os.PathLike) -> Path:
    """Where :func:`translate_shard` keeps finished batches of ``out_path`` until it is done."""
    return Path(f"{out_path}.partial")


def _write_table(frame: pd.DataFrame, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(c, pa.string()) for c in OUTPUT_COLUMNS])
    table = pa.Table.from_pandas(frame[list(OUTPUT_COLUMNS)], schema=schema, preserve_index=False)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def _part_paths(partial: Path) -> list[Path]:
    return sorted(partial.glob("part-*.parquet"))  # atomic_path's temporaries start with "."


def _model_files(model: str | os.PathLike) -> dict[str, list[int]] | None:
    """A model directory's files, each with its size and modification time (None for a Hub id,
    whose ``revision`` names it): a directory converted, copied or downloaded anew under the same
    path (``resources/mt_models/ct2`` after the model, its revision or quantization changed) is
    another model, so a partial shard made with the old one starts over. Cheap: no file is read."""
    location = Path(_model_location(model))
    if not location.is_dir():
        return None
    files = {}
    for path in sorted(location.rglob("*")):
        if path.is_file():
            stat = path.stat()
            files[path.relative_to(location).as_posix()] = [stat.st_size, stat.st_mtime_ns]
    return files


def _load_partial(partial: Path, settings: dict) -> dict[str, str]:
    """Translations already done under the same settings: ``{unit_id: translation}``.

    A partial folder made with other settings (model, languages, beam, lengths) is removed:
    its translations are not what is asked for now.
    """
    if not partial.exists():
        return {}
    if _read_json(partial / "settings.json") != settings:
        log.warning("%s: made with other settings; starting over", partial)
        shutil.rmtree(partial)
        return {}
    done: dict[str, str] = {}
    for part in _part_paths(partial):
        frame = pd.read_parquet(part, columns=list(OUTPUT_COLUMNS))
        for uid, translation in zip(frame["unit_id"], frame["translation"]):
            done.setdefault(uid, translation)
    return done


def translate_shard(
    units_path: str | os.PathLike,
    out_path: str | os.PathLike,
    *,
    engine: str,
    model: str | os.PathLike,
    tgt_lang: str,
    src_lang: str = "en",
    tokenizer: str | os.PathLike | None = None,
    shard: int | None = None,
    n_shards: int | None = None,
    batch_size: int = 64,
    batch_tokens: int | None = None,
    beam_size: int = 4,
    max_length: int = 256,
    max_input_length: int = 512,
    device: str | None = None,
    compute_type: str | None = None,
    checkpoint_every: int = 20,
    on_batch: Callable[[list[str]], None] | None = None,
    revision: str | None = None,
) -> Path:
    """Translate the units of ``units_path`` into ``tgt_lang``; write ``out_path`` (parquet).

    The output has columns ``unit_id, translation``, exactly one row per input unit, in input
    order. With ``shard``/``n_shards`` only that shard of the file's units is translated
    (:func:`shard_units`). Engines, models and options: :func:`load_translator`.

    Units are sorted by source length (longest first) and translated in batches of at most
    ``batch_size`` sentences and, with ``batch_tokens``, at most that many padded source tokens
    (:func:`length_batches`): short sentences then fill larger batches than long ones.
    Every ``checkpoint_every`` batches — and whenever the run stops on an exception or SIGTERM —
    the finished batches go to a new part in ``<out_path>.partial/``; a rerun with the same
    model (its name and revision; a directory's files as :func:`_model_files` lists them),
    languages, ``beam_size``, ``max_length`` and ``max_input_length`` skips every unit a
    part holds (batch size, device and compute type may change between runs: after an
    out-of-memory error, rerun with smaller batches). ``on_batch`` is called with the unit ids of
    each finished batch (progress reporting; tests raise from it to simulate a crash).

    Languages are checked before anything is loaded (:func:`check_languages`). A shard with no
    units writes an empty output without loading the model.
    """
    _check_engine(engine)
    for name, value in (("batch_size", batch_size), ("beam_size", beam_size), ("max_length", max_length),
                        ("max_input_length", max_input_length), ("checkpoint_every", checkpoint_every)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"{name} must be a positive integer, not {value!r}")
    if batch_tokens is not None and (not isinstance(batch_tokens, int) or isinstance(batch_tokens, bool)
                                     or batch_tokens < 1):
        raise InputError(f"batch_tokens must be a positive integer or None, not {batch_tokens!r}")
    check_languages(engine, tokenizer or model, [src_lang, tgt_lang])
    units = read_units(units_path)
    if shard is not None or n_shards is not None:
        if shard is None or n_shards is None:
            raise InputError("shard and n_shards go together")
        units = shard_units(units, n_shards, shard)
    out_path = Path(out_path)
    partial = partial_dir(out_path)
    settings = {"engine": engine, "model": str(model), "tokenizer": None if tokenizer is None else str(tokenizer),
                "src_lang": src_lang, "tgt_lang": tgt_lang, "beam_size": beam_size,
                "max_length": max_length, "max_input_length": max_input_length,
                "model_files": _model_files(model), "revision": None if engine == "ctranslate2" else revision}
    done = _load_partial(partial, settings)
    todo = units.loc[~units["unit_id"].isin(done)].reset_index(drop=True)
    log.info("%s → %s, %s: %d units, %d already translated, %d to do", src_lang, tgt_lang, out_path,
             len(units), len(units) - len(todo), len(todo))

    if len(todo):
        translator = load_translator(
            engine, model, src_lang=src_lang, tgt_lang=tgt_lang, tokenizer=tokenizer,
            beam_size=beam_size, max_length=max_length, max_input_length=max_input_length,
            device=device, compute_type=compute_type,
            revision=None if engine == "ctranslate2" else revision)
        if not partial.exists():
            partial.mkdir(parents=True)
            with atomic_open(partial / "settings.json") as handle:
                json.dump(settings, handle, indent=2)
        _translate_todo(translator, todo, partial, batch_size=batch_size, batch_tokens=batch_tokens,
                        checkpoint_every=checkpoint_every, on_batch=on_batch, done=done)

    missing = [uid for uid in units["unit_id"] if uid not in done]
    if missing:  # cannot happen unless a part was removed under our feet
        raise RuntimeError(f"{out_path}: {len(missing)} units have no translation, e.g. {missing[0]}")
    result = pd.DataFrame({"unit_id": units["unit_id"], "translation": [done[u] for u in units["unit_id"]]})
    _write_table(result, out_path)
    shutil.rmtree(partial, ignore_errors=True)
    log.info("wrote %s: %d translations", out_path, len(result))
    return out_path


def length_batches(lengths: Sequence[int], *, batch_size: int, batch_tokens: int | None = None) -> list[list[int]]:
    """Positions of ``lengths`` in generation batches: longest first (stable: ties keep their
    order), each batch at most ``batch_size`` sentences and, with ``batch_tokens``, at most
    ``batch_tokens`` padded tokens (its sentences times its longest, the first); a sentence
    longer than ``batch_tokens`` goes alone.

    Batches are cut greedily from the front, so the batches of the order without its first k
    batches are the remaining batches: a resumed run forms the batches an uninterrupted run would.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, start = [], 0
    while start < len(order):
        size = batch_size
        if batch_tokens is not None:
            size = min(size, max(1, batch_tokens // max(1, lengths[order[start]])))
        batches.append(order[start:start + size])
        start += size
    return batches


def padding_fraction(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Share of the padded source tokens of ``batches`` that are padding."""
    padded = sum(len(batch) * max(lengths[i] for i in batch) for batch in batches if batch)
    return 1 - sum(lengths[i] for batch in batches for i in batch) / padded if padded else 0.0


def _translate_todo(translator: Translator, todo: pd.DataFrame, partial: Path, *, batch_size: int,
                    batch_tokens: int | None, checkpoint_every: int, on_batch, done: dict[str, str]) -> None:
    ids = todo["unit_id"].tolist()
    sources = translator.encode(todo["text"].tolist())
    truncated = sum(len(s) >= translator.max_input_length for s in sources)
    if truncated:
        log.warning("%d sources reach max_input_length=%d tokens and are cut there", truncated,
                    translator.max_input_length)
    # A resumed run sees the same order minus whole finished batches, so it forms the same
    # remaining batches as an uninterrupted run (length_batches).
    lengths = [len(s) for s in sources]
    batches = length_batches(lengths, batch_size=batch_size, batch_tokens=batch_tokens)
    log.info("%d batches of at most %d sentences%s; padding: %.1f%% of source tokens", len(batches),
             batch_size, f" and {batch_tokens} padded tokens" if batch_tokens else "",
             100 * padding_fraction(lengths, batches))
    existing = _part_paths(partial)
    next_part = int(existing[-1].stem.split("-")[1]) + 1 if existing else 0
    pending: list[tuple[str, str]] = []
    start, translated = time.perf_counter(), 0

    def flush() -> None:
        nonlocal next_part, pending
        if pending:
            frame = pd.DataFrame(pending, columns=list(OUTPUT_COLUMNS))
            _write_table(frame, partial / f"part-{next_part:05d}.parquet")
            next_part += 1
            pending = []

    try:
        with _sigterm_raises():
            for number, batch in enumerate(batches, start=1):
                outputs = translator.decode(translator.generate([sources[i] for i in batch]))
                batch_ids = [ids[i] for i in batch]
                pending.extend(zip(batch_ids, outputs))
                done.update(zip(batch_ids, outputs))
                translated += len(batch)
                if number % checkpoint_every == 0 or number == len(batches):
                    flush()
                    elapsed = time.perf_counter() - start
                    log.info("%d/%d units translated (%.1f units/s)", translated, len(ids),
                             translated / elapsed if elapsed else float("nan"))
                if on_batch is not None:
                    on_batch(batch_ids)
    except BaseException:
        try:
            flush()  # keep every finished batch for the rerun
        except Exception:  # noqa: BLE001 - the original error matters more
            log.exception("could not save the finished batches")
        raise

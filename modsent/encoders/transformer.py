"""Any Hugging Face encoder as a sentence encoder: loading its body, mean pooling, and saving a
trained body as a plain sentence-transformers directory.

The rest of modsent reads its base model through ``AutoModelForMaskedLM`` (an MLM head is part
of the language adapter); a method that only needs token embeddings loads the body here, which
also covers encoder-decoder checkpoints:

    T5 / mT5 / UMT5 (an encoder-decoder config)   the encoder alone (``AutoModelForTextEncoding``:
                                                   T5EncoderModel, MT5EncoderModel, UMT5EncoderModel);
                                                   the decoder's weights are never materialised
    anything else (BERT, XLM-R, ...)               ``AutoModel``

Model code from the Hub is never run (no ``trust_remote_code``), weights are read from
safetensors only (no pickles), and a local directory is read without asking the Hub.

The sentence vector is the mean of the token embeddings over the real (non-pad) tokens
(:func:`mean_pool`; Sentence-T5's and m-ST5's pooling). A source that is already a
sentence-transformers directory (``modules.json``) keeps its own modules after the transformer
(Pooling, Dense, Normalize), read by :func:`modsent.modular.sentence_adapter._sentence_head`.

:func:`save_sentence_transformer` writes the classic sentence-transformers layout around a
trained body: the body and tokenizer at the top (``model.safetensors``), ``modules.json``,
``sentence_bert_config.json`` and one folder per head module; ``SentenceTransformer(path)``
loads it and encodes as the trained model does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from modsent.io import InputError, record_added_tokens
from modsent.modular import sentence_adapter as sa
from modsent.schema import STORAGE_DTYPES

# transformers' model types whose checkpoints hold an encoder and a decoder, the encoder loadable
# alone; other encoder-decoder models are refused rather than loaded whole
T5_FAMILY = ("t5", "mt5", "umt5")
MODULES_JSON = "modules.json"
NO_LIMIT = 10**6  # a tokenizer's model_max_length at or above this means "not set"


def is_sentence_transformers_dir(source: str | Path) -> bool:
    """Whether ``source`` is a local sentence-transformers directory (it has ``modules.json``)."""
    return (Path(source) / MODULES_JSON).is_file()


def transformer_subfolder(model_dir: str | Path) -> str:
    """The folder of a sentence-transformers directory that holds its Hugging Face model (the
    first module's path: usually the directory itself, "")."""
    entries = json.loads((Path(model_dir) / MODULES_JSON).read_text(encoding="utf-8"))
    entries = sorted(entries, key=lambda e: e.get("idx", 0))
    return entries[0].get("path", "") if entries else ""


def _is_local(source: str | Path) -> bool:
    return Path(source).is_dir()


def load_encoder_body(model_dir_or_hub_id: str | Path, *, dtype: torch.dtype = torch.float32,
                      revision: str | None = None) -> tuple[nn.Module, object]:
    """(body, tokenizer) of a Hugging Face model: the encoder of a T5/mT5/UMT5 checkpoint, the
    ``AutoModel`` of any other, in ``dtype``, in training mode, every parameter trainable (the
    caller freezes). ``model_dir_or_hub_id``: a local directory (a sentence-transformers one:
    its transformer's folder) or a Hub id (downloaded by transformers into its cache;
    ``revision`` pins a commit, tag or branch)."""
    import transformers

    from modsent.encoders import tf_checkpoint

    source = str(model_dir_or_hub_id)
    local = _is_local(source)
    converted = None if local else tf_checkpoint.converted_folder(source, revision)
    if converted is not None:  # a Hub model without safetensors, converted from its TensorFlow weights
        source, local = str(converted), True
    kwargs = {"local_files_only": local, "trust_remote_code": False}
    if local and is_sentence_transformers_dir(source):
        subfolder = transformer_subfolder(source)
        source = str(Path(source) / subfolder) if subfolder else source
    elif not local and revision is not None:
        kwargs["revision"] = revision
    try:
        config = transformers.AutoConfig.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as err:
        raise InputError(f"{model_dir_or_hub_id}: not a Hugging Face model directory or Hub id "
                         f"transformers can read ({err})") from None
    encoder_decoder = getattr(config, "is_encoder_decoder", False) or config.model_type in T5_FAMILY
    if encoder_decoder:
        from transformers.models.auto.modeling_auto import MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES

        if config.model_type not in MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES:
            raise InputError(f"{model_dir_or_hub_id}: an encoder-decoder model of type {config.model_type!r} "
                             "whose encoder transformers cannot load alone (supported: T5, mT5, UMT5 "
                             "and the encoder-only models)")
        model_class = transformers.AutoModelForTextEncoding
    else:
        model_class = transformers.AutoModel
    transformers.logging.set_verbosity_error()  # "unused decoder / LM head weights" is expected
    # no conversion by the Hub's service behind the config's back (transformers asks it for a
    # repository without safetensors on main): its own revision, or modsent's TF conversion below
    previous = os.environ.get("DISABLE_SAFETENSORS_CONVERSION")
    os.environ["DISABLE_SAFETENSORS_CONVERSION"] = "1"
    try:
        try:
            body = model_class.from_pretrained(source, config=config, dtype=dtype, use_safetensors=True, **kwargs)
        except OSError as err:
            if local or config.model_type not in tf_checkpoint.MODEL_TYPES:
                raise InputError(f"{model_dir_or_hub_id}: no safetensors weights found ({err}); modsent reads no "
                                 "pickled weights: give a revision that has model.safetensors (the Hub's "
                                 "safetensors conversion, refs/pr/N) or a directory converted locally") from None
            # a T5/mT5 Hub model with TensorFlow weights only (google/mt5-xxl): converted once
            source = str(tf_checkpoint.hub_encoder(source, revision))
            kwargs = {"local_files_only": True, "trust_remote_code": False}
            body = model_class.from_pretrained(source, config=config, dtype=dtype, use_safetensors=True, **kwargs)
    finally:
        transformers.logging.set_verbosity_warning()
        if previous is None:
            os.environ.pop("DISABLE_SAFETENSORS_CONVERSION", None)
        else:
            os.environ["DISABLE_SAFETENSORS_CONVERSION"] = previous
    tokenizer = transformers.AutoTokenizer.from_pretrained(source, **kwargs)
    body.train()
    return body, tokenizer


def mean_pool(token_embeddings: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[batch, dim] means of the token embeddings over the real tokens: padding zeroed, the sum
    divided by the count of real tokens (sentence-transformers' ``Pooling("mean")``)."""
    mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
    return (token_embeddings * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


def sentence_head(source: str | Path, body: nn.Module) -> tuple[nn.Sequential, int | None]:
    """(the modules after the transformer, the source's own maximum sequence length or None).

    A sentence-transformers directory keeps its own (Pooling, [Dense], [Normalize]) and its
    ``max_seq_length``; any other model gets mean pooling (no normalisation: cosine similarity
    does not need it) and the limit its tokenizer or position embeddings set, if any (T5's
    relative positions set none)."""
    from sentence_transformers.sentence_transformer.modules import Pooling

    if _is_local(source) and is_sentence_transformers_dir(source):
        return sa._sentence_head(source)
    head = nn.Sequential(Pooling(body.config.hidden_size, "mean"))
    head.requires_grad_(False)
    return head, None


def max_sequence_length(tokenizer, body: nn.Module, source_limit: int | None) -> int | None:
    """The longest input the model takes: the source's own setting, else the tokenizer's
    ``model_max_length`` and the position embeddings' size, whichever is smaller; None: no limit."""
    if source_limit:
        return int(source_limit)
    limits = [getattr(tokenizer, "model_max_length", None), getattr(body.config, "max_position_embeddings", None)]
    limits = [int(v) for v in limits if isinstance(v, (int, float)) and 0 < v < NO_LIMIT]
    return min(limits) if limits else None


def _class_path(module: nn.Module | type) -> str:
    cls = module if isinstance(module, type) else type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def save_sentence_transformer(body: nn.Module, tokenizer, head: Sequence[nn.Module], max_seq_length: int,
                              out_dir: str | Path, *, source: str | Path | None = None,
                              dtype: str = "float32") -> None:
    """Write ``body`` (a plain Hugging Face model: LoRA merged), ``tokenizer`` and ``head`` into
    the existing directory ``out_dir`` as a sentence-transformers model (classic layout: the
    transformer at the top, ``{i}_{Module}/`` per head module). ``source``: the directory the
    model came from; when it is a sentence-transformers one its prompts and similarity function
    are kept, with no default prompt (modsent trains without prompts). ``dtype``: the saved
    weights' (a method's ``storage_dtype``); another than float32 casts ``body`` and ``head``
    to it in place (no copy of a large model: the caller saves them last), and the config names
    it, as ``SentenceTransformer(...).to(dtype).save(...)`` would."""
    from sentence_transformers.sentence_transformer.modules import Transformer

    out_dir = Path(out_dir)
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(STORAGE_DTYPES)}, got {dtype!r}")
    if dtype != "float32":
        stored = getattr(torch, dtype)
        body.to(stored)
        for module in head:
            module.to(stored)
    body.save_pretrained(str(out_dir))  # safetensors (transformers 5 writes no pickles)
    tokenizer.model_max_length = max_seq_length
    tokenizer.save_pretrained(str(out_dir))
    record_added_tokens(out_dir)
    (out_dir / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}, indent=2) + "\n", encoding="utf-8")
    modules = [{"idx": 0, "name": "0", "path": "", "type": _class_path(Transformer)}]
    for idx, module in enumerate(head, start=1):
        path = f"{idx}_{type(module).__name__}"
        (out_dir / path).mkdir()
        module.save(str(out_dir / path))
        modules.append({"idx": idx, "name": str(idx), "path": path, "type": _class_path(module)})
    (out_dir / MODULES_JSON).write_text(json.dumps(modules, indent=2) + "\n", encoding="utf-8")
    st_config = {"prompts": {}, "similarity_fn_name": "cosine"}
    source_config = Path(source) / "config_sentence_transformers.json" if source is not None else None
    if source_config is not None and _is_local(source) and source_config.is_file():
        st_config = json.loads(source_config.read_text(encoding="utf-8"))
        st_config.pop("__version__", None)
    st_config["default_prompt_name"] = None
    (out_dir / "config_sentence_transformers.json").write_text(json.dumps(st_config, indent=2) + "\n",
                                                               encoding="utf-8")


def model_source(model: str | None, base: str | Path | None, key: str) -> str:
    """The encoder a method trains: its ``model`` setting (a Hub id or directory), else the
    workflow's base model; an InputError naming ``key`` when there is neither."""
    source = model if model is not None else base
    if source is None:
        raise InputError(f"{key}.model: null trains the base model, and no base model was given")
    return str(source)

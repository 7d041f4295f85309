"""Padded batches of token ids with less Python on the host: what
``tokenizer(texts, padding=True, truncation=True, max_length=n, return_tensors="pt")`` gives,
about three times faster for a fast (Rust) tokenizer.

modsent's own sentence encoders tokenise through this (``SentenceEncoderModel.tokenize``): the
SE, CLA and Full_* stages, m-ST5, DuEAM and InteMATs in training, and the modular systems in
evaluation (systems loaded as sentence-transformers models tokenise with sentence-transformers;
MEXMA masks its own batches). On a GPU the host's
work is part of every step: at the paper's 128 pairs per batch the SE step is bound by the host
(benchmarks/results/README.md), and tokenising its 256 sentences took 21 ms on a 2-core machine,
of which the Rust tokenizer's own work is 4 ms: the rest is transformers turning each
``Encoding`` into Python lists and dictionaries (``_convert_encoding``, ``BatchEncoding``) and
those lists into tensors. :func:`padded_batch` asks the same Rust tokenizer, configured by
transformers' own ``set_truncation_and_padding`` exactly as the call above configures it, and
reads the ids, type ids and attention masks straight into int64 tensors (7 ms).

Only tokenizers that take transformers' plain path are read this way: a ``TokenizersBackend``
(fast tokenizer) whose class overrides neither ``__call__``, ``_encode_plus`` nor
``set_truncation_and_padding``, with a padding token (the input mode set as the call sets it:
``_switch_to_input_mode``, NLLB's and mBART's source-language tokens). For anything else
:func:`padded_batch` returns None and the caller calls the tokenizer. :class:`BatchTokenizer`
also compares the two on the first batch of each tokenizer and keeps the tokenizer's own call
if they differ (logged): a safety net for tokenizers not covered by tests/test_tokenizing.py
(BERT, XLM-R, T5 and NLLB kinds), not a proof for every input.

Thread-safety is the tokenizer's: both paths set the Rust tokenizer's padding and truncation
before encoding, so one tokenizer must not be used from two threads at once.

:func:`encoder_attention_mask` hands the encoder a batch's padding mask in the form that spares
the host a wait for the GPU at every forward (transformers otherwise asks the device whether the
batch has padding at all), decided from the mask the host tokenised.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence

import numpy as np
import torch

from modsent.training.fastpath import OUTSIDE_GRAPH_ATTENTION

log = logging.getLogger(__name__)

_FIELDS = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask"}


def _plain_fast(tokenizer) -> bool:
    """Whether ``tokenizer`` takes transformers' plain fast-tokenizer path for a batch of texts."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers: its tokenizers are called as they are
        return False
    kind = type(tokenizer)
    return (isinstance(tokenizer, TokenizersBackend) and tokenizer.pad_token is not None
            and kind.__call__ is PreTrainedTokenizerBase.__call__
            and kind._encode_plus is TokenizersBackend._encode_plus
            and kind.set_truncation_and_padding is TokenizersBackend.set_truncation_and_padding)


def padded_batch(tokenizer, texts: Sequence[str], max_length: int) -> dict[str, torch.Tensor] | None:
    """``texts`` as the tokenizer's call pads and truncates them to at most ``max_length`` tokens
    (``input_ids`` and, where the model takes them, ``token_type_ids`` and ``attention_mask``:
    int64 tensors [batch, longest]); None where the tokenizer is not a plain fast one."""
    texts = list(texts)
    if not texts or not _plain_fast(tokenizer):
        return None
    from transformers.tokenization_utils_base import TruncationStrategy
    from transformers.utils import PaddingStrategy

    if not getattr(tokenizer, "_in_target_context_manager", False) and hasattr(tokenizer, "_switch_to_input_mode"):
        tokenizer._switch_to_input_mode()  # as the call does
    tokenizer.set_truncation_and_padding(padding_strategy=PaddingStrategy.LONGEST,
                                         truncation_strategy=TruncationStrategy.LONGEST_FIRST,
                                         max_length=max_length, stride=0, pad_to_multiple_of=None, padding_side=None)
    backend = tokenizer._tokenizer
    if backend.encode_special_tokens != tokenizer.split_special_tokens:
        backend.encode_special_tokens = tokenizer.split_special_tokens
    encodings = backend.encode_batch(texts, add_special_tokens=True, is_pretokenized=False)
    names = ["input_ids"] + [name for name in ("token_type_ids", "attention_mask")
                             if name in tokenizer.model_input_names]
    return {name: torch.from_numpy(np.array([getattr(e, _FIELDS[name]) for e in encodings], dtype=np.int64))
            for name in names}


_VERDICTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # tokenizer -> lean path equal?


class BatchTokenizer:
    """``tokenizer(texts, padding=True, truncation=True, max_length=max_length,
    return_tensors="pt")`` as a dict of tensors, through :func:`padded_batch` where that gives the
    same tensors (checked on the first batch of the tokenizer, remembered while it lives), else
    through the call itself."""

    def __init__(self, tokenizer, max_length: int):
        self.tokenizer, self.max_length = tokenizer, max_length
        try:
            self.lean: bool | None = _VERDICTS.get(tokenizer)  # None: decided at the first batch
        except TypeError:  # not weakly referable
            self.lean = None

    def _decide(self, lean: bool) -> None:
        self.lean = lean
        try:
            _VERDICTS[self.tokenizer] = lean
        except TypeError:
            pass

    def call(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """The tokenizer's own call."""
        return dict(self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                                   return_tensors="pt"))

    def __call__(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        texts = list(texts)
        if self.lean is False:
            return self.call(texts)
        batch = padded_batch(self.tokenizer, texts, self.max_length)
        if batch is None:
            if len(texts):  # an empty batch decides nothing
                self._decide(False)
            return self.call(texts)
        if self.lean is None:
            reference = self.call(texts)
            self._decide(batch.keys() == reference.keys() and all(torch.equal(batch[k], reference[k]) for k in batch))
            if not self.lean:
                log.warning("%s: the lean tokenising path differs from the tokenizer's call; using the call",
                            type(self.tokenizer).__name__)
                return reference
        return batch


# ---- the padding mask, without the host waiting for the GPU ------------------------------------

# model types whose transformers encoder builds its SDPA mask with masking_utils'
# create_bidirectional_mask, which takes a ready 4D mask as it is (tests/test_tokenizing.py; T5's
# SDPA path folds a boolean mask into its position bias)
_BIDIRECTIONAL_SDPA = frozenset({"bert", "roberta", "xlm-roberta", "t5", "mt5"})
# transformers' SDPA attention, and the same under torch.compiler.disable (fastpath.attention_outside_graph)
_SDPA_NAMES = frozenset({"sdpa", OUTSIDE_GRAPH_ATTENTION})


def encoder_attention_mask(config, host_mask: torch.Tensor, device_mask: torch.Tensor) -> torch.Tensor | None:
    """The attention mask to give an encoder for one batch, where ``host_mask`` is the batch's 2D
    padding mask (1 = token) still on the host and ``device_mask`` the same on the model's device.

    Given the 2D mask, transformers' SDPA path asks ``padding_mask.all()`` to decide whether it
    may drop the mask (masking_utils' ``_ignore_bidirectional_mask_sdpa``): on a GPU the host
    then waits for every step queued before, once per forward, and cannot queue the next step's
    kernels while the GPU runs this one. The host knows the answer from its own copy: no padding
    gives ``None`` (what transformers would choose: no mask, so SDPA may use its flash kernel),
    padding gives the mask as the 4D boolean ``[batch, 1, 1, length]`` that transformers takes as
    it is and SDPA broadcasts over heads and queries (the mask transformers builds: every query
    attends to the batch row's tokens). Other model types, other attention implementations,
    decoders and a mask not on the host keep ``device_mask``: transformers prepares it."""
    if (host_mask.device.type != "cpu" or host_mask.dim() != 2 or config is None
            or getattr(config, "model_type", None) not in _BIDIRECTIONAL_SDPA
            or getattr(config, "_attn_implementation", None) not in _SDPA_NAMES or getattr(config, "is_decoder", False)):
        return device_mask
    if bool(host_mask.all()):
        return None
    return device_mask.bool()[:, None, None, :]

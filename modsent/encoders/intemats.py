"""The InteMATs encoder: a frozen backbone with serial adapters (MATs-ST or MATs-DT) or both and
their AdapterFusion (:mod:`modsent.modular.serial_adapter`), its sentence vector the mean over the
real tokens of the average of chosen hidden states (``pooling_layers``; the paper: the
penultimate layer, ``[-2]``; its STS evaluation: the first and last layers).

Two faces of one computation:

- :class:`InteMATsBody` — what training runs: ``forward(**tokenizer_output)`` returns an object
  whose ``last_hidden_state`` is the layer average, so
  :class:`modsent.modular.sentence_adapter.SentenceEncoderModel` with a mean ``Pooling`` head
  encodes with it like any other modsent model;
- :class:`InteMATsTransformer` — the first module of the saved sentence-transformers directory (a
  subclass of sentence-transformers' ``Transformer``): it loads the backbone as ``Transformer``
  does, then the adapters and fusion from ``serial_adapters.safetensors`` and the pooling
  layers from ``intemats_config.json`` beside it, and computes the same token embeddings.

A ReLU serial adapter inside the residual stream and a per-token softmax over adapters cannot be
folded into a BERT/XLM-R checkpoint's weights (there is no slot for a second nonlinearity
between a sublayer's projection and its LayerNorm), so the directory needs this class:
``modules.json`` names ``modsent.encoders.intemats.InteMATsTransformer`` and loading needs
modsent installed. modsent loads it without trusting remote code
(:func:`modsent.encoders.systems.load_sentence_transformer`); plain sentence-transformers (6+)
refuses any module class outside its namespace unless ``trust_remote_code=True``, which then
imports this class from the installed package but also lets transformers run code that the
directory's ``config.json`` names (``auto_map``): the export's card shows modsent's loader.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from sentence_transformers.base.modules.transformer import Transformer
from torch import nn
from transformers.modeling_outputs import BaseModelOutput

from modsent.io import InputError, record_added_tokens
from modsent.modular import serial_adapter as sad

POOLING_CONFIG = "intemats_config.json"
FORMAT = "modsent-intemats/1"


def check_pooling_layers(layers: Sequence[int], num_layers: int, key: str = "pooling_layers") -> tuple[int, ...]:
    """``layers`` as hidden-state indices of a model of ``num_layers`` layers (0: the embeddings,
    i: after layer i, -1: the last), checked; an InputError naming ``key`` otherwise."""
    layers = tuple(layers)
    bad = [i for i in layers
           if isinstance(i, bool) or not isinstance(i, int) or not -(num_layers + 1) <= i <= num_layers]
    if not layers or bad or len({i % (num_layers + 1) for i in layers}) != len(layers):
        raise InputError(f"{key}: {list(layers)}: a non-empty list of distinct hidden-state indices of a "
                         f"{num_layers}-layer model (0 = the embeddings, i = after layer i, -1 = the last; "
                         f"from {-(num_layers + 1)} to {num_layers})")
    return layers


def average_layers(hidden_states: Sequence[torch.Tensor], layers: Sequence[int]) -> torch.Tensor:
    """The mean of ``hidden_states[i]`` over ``layers`` (a single layer: that state itself)."""
    if len(layers) == 1:
        return hidden_states[layers[0]]
    return torch.stack([hidden_states[i] for i in layers]).mean(dim=0)


class InteMATsBody(nn.Module):
    """The backbone ``body`` (a Hugging Face encoder) with ``stack`` attached; ``forward`` returns
    the average of the hidden states ``pooling_layers`` as ``last_hidden_state``."""

    def __init__(self, body: nn.Module, stack: sad.SerialAdapterStack, pooling_layers: Sequence[int]):
        super().__init__()
        self.body = body
        self.stack = stack.attach(body)
        self.pooling_layers = check_pooling_layers(pooling_layers, body.config.num_hidden_layers)

    @property
    def config(self):
        return self.body.config

    @property
    def layers_used(self) -> int:
        """How many of the backbone's layers the vector needs: those up to the highest pooled
        hidden state (the layers above it run, but nothing reads their output)."""
        return max(i % (self.body.config.num_hidden_layers + 1) for i in self.pooling_layers)

    def forward(self, **features) -> BaseModelOutput:
        out = self.body(**features, output_hidden_states=True, return_dict=True)
        return BaseModelOutput(last_hidden_state=average_layers(out.hidden_states, self.pooling_layers))


def write_pooling_config(directory: str | Path, pooling_layers: Sequence[int], metadata: dict | None = None) -> None:
    record = {"format": FORMAT, "pooling_layers": list(pooling_layers), **({"metadata": metadata} if metadata else {})}
    (Path(directory) / POOLING_CONFIG).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def read_pooling_config(directory: str | Path) -> dict:
    path = Path(directory) / POOLING_CONFIG
    if not path.is_file():
        raise InputError(f"{directory}: no {POOLING_CONFIG}: not an InteMATs model directory")
    record = json.loads(path.read_text(encoding="utf-8"))
    if record.get("format") != FORMAT:
        raise InputError(f"{path}: not an InteMATs config of format {FORMAT}")
    return record


class InteMATsTransformer(Transformer):
    """sentence-transformers' ``Transformer`` with the InteMATs adapters: token embeddings are
    the average of the hidden states ``pooling_layers`` of the backbone with the serial adapters
    (and fusion) saved beside it. A local directory only (the adapters are read from it)."""

    stack: sad.SerialAdapterStack
    pooling_layers: tuple[int, ...]

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs) -> "InteMATsTransformer":
        directory = Path(model_name_or_path) / subfolder
        if not directory.is_dir():
            raise InputError(f"{model_name_or_path}: InteMATs models load from a local directory only")
        if not list(directory.glob("*.safetensors")):
            raise InputError(f"{directory}: no safetensors weights (modsent reads no pickled weights)")
        module = super().load(model_name_or_path, subfolder=subfolder, **kwargs)
        module.attach_adapters(directory)
        return module

    def attach_adapters(self, directory: str | Path) -> None:
        """Read the adapters (and fusion) and the pooling layers of ``directory`` and attach them."""
        adapters, fusion = sad.load_serial_adapters(self.model, directory)
        self.stack = sad.SerialAdapterStack(adapters, fusion).attach(self.model)
        self.stack.requires_grad_(False)
        self.pooling_layers = check_pooling_layers(read_pooling_config(directory)["pooling_layers"],
                                                   self.model.config.num_hidden_layers,
                                                   f"{directory / POOLING_CONFIG}: pooling_layers")

    def forward(self, features: dict, **kwargs) -> dict:
        """Keyword arguments override features in the model's call, as in sentence-transformers'
        Transformer (modsent passes the attention mask decided on the host this way)."""
        inputs = {key: features[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in features}
        inputs.update({key: kwargs[key] for key in ("attention_mask",) if key in kwargs})
        out = self.model(**inputs, output_hidden_states=True, return_dict=True)
        features["token_embeddings"] = average_layers(out.hidden_states, self.pooling_layers)
        return features

    def save(self, output_path: str, *args, safe_serialization: bool = True, **kwargs) -> None:
        super().save(output_path, *args, safe_serialization=safe_serialization, **kwargs)
        record_added_tokens(output_path)
        sad.write_serial_adapters(self.stack, self.model, output_path)
        write_pooling_config(output_path, self.pooling_layers)


def class_path() -> str:
    """The ``modules.json`` type of :class:`InteMATsTransformer`."""
    return f"{InteMATsTransformer.__module__}.{InteMATsTransformer.__qualname__}"


def save_system(model, out_dir: str | Path, *, source: str | Path | None = None, metadata: dict | None = None,
                dtype: str = "float32") -> None:
    """Write a trained InteMATs model (:class:`~modsent.modular.sentence_adapter.SentenceEncoderModel`
    around an :class:`InteMATsBody`, mean pooling head) into the existing directory ``out_dir``
    as a sentence-transformers directory whose first module is :class:`InteMATsTransformer`: the
    backbone (frozen, ``model.safetensors``), tokenizer, ``modules.json`` (InteMATsTransformer,
    Pooling), the adapters (``serial_adapters.*``) and ``intemats_config.json``. ``dtype``: the
    backbone's saved weights (:func:`modsent.encoders.transformer.save_sentence_transformer`,
    which casts it in place) and the fusion's; the adapters stay float32 (a few MB; the fusion
    of an InteMATs system trains on the saved ST and DT adapters)."""
    from modsent.encoders import transformer as tf

    inner: InteMATsBody = model.encoder
    tf.save_sentence_transformer(inner.body, model.tokenizer, model.head, model.max_seq_length, out_dir,
                                 source=source, dtype=dtype)
    modules_path = Path(out_dir) / tf.MODULES_JSON
    modules = json.loads(modules_path.read_text(encoding="utf-8"))
    modules[0]["type"] = class_path()
    modules_path.write_text(json.dumps(modules, indent=2) + "\n", encoding="utf-8")
    sad.write_serial_adapters(inner.stack, inner.body, out_dir, metadata, fusion_dtype=dtype)
    write_pooling_config(out_dir, inner.pooling_layers, metadata)

"""The cross-lingual alignment (CLA) adapter: a parallel bottleneck adapter beside every FFN.

He et al. (2022), "Towards a Unified View of Parameter-Efficient Transfer Learning" (ICLR;
arXiv:2110.04366), add to a transformer layer's feed-forward block (FFN) a small network that
reads the FFN's *input* and whose output is added, scaled, to the FFN's *output*:

    h      the FFN block's input: the attention output after its residual + LayerNorm
    FFN(h) = dropout(W2 · GELU(W1 · h))                      (BertIntermediate, BertOutput.dense)
    PA(h)  = W_up · dropout(ReLU(W_down · h))                 (this module: hidden → r → hidden)
    out    = LayerNorm(FFN(h) + s · PA(h) + h)                (the block's own residual + LayerNorm)

The paper behind this project trains one such adapter per non-English language on top of the
language's frozen model (language adapter + sentence-encoding adapter, both PEFT LoRA), two of
them (``pp`` and ``pl``), and averages their weights (:func:`merge_parallel_adapters`). PEFT has no
parallel adapter, hence this module. Its defaults are those of the authors' code, which calls
the `adapters` library's ``ParBnConfig()`` unchanged (UKPLab/arxiv2024-modular-sentence-encoders,
train_cla_adapter.py): ReLU, bottleneck = hidden size / 2, scaling s = 4.0, adapter dropout 0,
the FFN of every layer, down-projection Kaiming-uniform and up-projection zero ("mam_adapter"
initialisation), so that a fresh adapter adds exactly zero.

Placement. transformers' ``BertOutput.forward(hidden_states, input_tensor)`` (and the identical
``XLMRobertaOutput``) computes ``LayerNorm(dropout(dense(hidden_states)) + input_tensor)``, where
``hidden_states`` is the intermediate activation and ``input_tensor`` is h, the FFN's input. The
adapter is a child module of that output module (``…layer.{i}.output.parallel_adapter``) and a
forward pre-hook replaces ``input_tensor`` by ``input_tensor + s · PA(input_tensor)``. The module
then computes ``LayerNorm(FFN(h) + (h + s · PA(h)))``: by commutativity of the sum this is He et
al.'s ``LayerNorm(FFN(h) + s · PA(h) + h)`` — the adapter reads what the FFN reads and its output
joins the FFN's output before the block's residual and LayerNorm, i.e. it runs in parallel to the
FFN. (The `adapters` library's ParBnConfig computes the same: adapter input = the residual input,
output added before the original LayerNorm.) A hook rather than a replacement module keeps every
existing parameter name (PEFT's ``output.dense.lora_A…`` included) and runs transformers' own
forward code; the only additions to the state dict are the ``parallel_adapter.{down,up}`` tensors.

Files written by :func:`save_parallel_adapters` (and :func:`merge_parallel_adapters`):

    parallel_adapter.safetensors    layers.{i}.down.weight [r, H], .down.bias [r],
                                    layers.{i}.up.weight [H, r], .up.bias [H]
    parallel_adapter_config.json    {"format", "config", "base_model", "metadata"}

``base_model`` records the architecture (model type, hidden size, layers, FFN size) and a
fingerprint of the base (see :func:`base_model_identity`); loading onto a model whose identity
differs is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from modsent.io import InputError, atomic_path, read_json, read_safetensors

WEIGHTS_NAME = "parallel_adapter.safetensors"
CONFIG_NAME = "parallel_adapter_config.json"
FORMAT = "modsent-parallel-adapter/1"
ADAPTER_ATTRIBUTE = "parallel_adapter"  # the child's name inside each layer's FFN output module


@dataclasses.dataclass(frozen=True)
class ParallelAdapterConfig:
    """Shape of the parallel adapters of one model (defaults: the paper's code, see the module doc).

    reduction_factor  bottleneck r = hidden_size // reduction_factor (2: 384 for LaBSE's 768)
    bottleneck_size   an explicit r; overrides reduction_factor when given
    scaling           s, the factor on the adapter's output (He et al.'s "scaled PA"; 4.0)
    dropout           on the bottleneck activations, training mode only (0.0)
    layers            indices of the layers that get an adapter; None = every layer
    """

    reduction_factor: float = 2.0
    bottleneck_size: int | None = None
    scaling: float = 4.0
    dropout: float = 0.0
    layers: tuple[int, ...] | None = None

    def __post_init__(self):
        def bad(key, value, expected):
            raise InputError(f"parallel adapter config: {key}={value!r}: expected {expected}")

        if isinstance(self.reduction_factor, bool) or not isinstance(self.reduction_factor, (int, float)) \
                or not math.isfinite(self.reduction_factor) or self.reduction_factor <= 0:
            bad("reduction_factor", self.reduction_factor, "a number > 0")
        if self.bottleneck_size is not None and (
                isinstance(self.bottleneck_size, bool) or not isinstance(self.bottleneck_size, int)
                or self.bottleneck_size < 1):
            bad("bottleneck_size", self.bottleneck_size, "an integer >= 1 or null")
        if isinstance(self.scaling, bool) or not isinstance(self.scaling, (int, float)) \
                or not math.isfinite(self.scaling):
            bad("scaling", self.scaling, "a finite number")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0 <= self.dropout < 1:
            bad("dropout", self.dropout, "a number in [0, 1)")
        if self.layers is not None:
            layers = tuple(self.layers) if isinstance(self.layers, (list, tuple)) else None
            if (not layers or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in layers)
                    or len(set(layers)) != len(layers)):
                bad("layers", self.layers, "null (every layer) or a non-empty list of distinct layer indices >= 0")
            object.__setattr__(self, "layers", tuple(sorted(layers)))
        object.__setattr__(self, "reduction_factor", float(self.reduction_factor))
        object.__setattr__(self, "scaling", float(self.scaling))
        object.__setattr__(self, "dropout", float(self.dropout))

    def bottleneck(self, hidden_size: int) -> int:
        """r for a model of this hidden size."""
        if self.bottleneck_size is not None:
            return self.bottleneck_size
        return max(1, int(hidden_size // self.reduction_factor))

    def to_dict(self) -> dict:
        """JSON-ready: ``layers`` as a list or null."""
        out = dataclasses.asdict(self)
        out["layers"] = None if self.layers is None else list(self.layers)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ParallelAdapterConfig":
        """The inverse of :meth:`to_dict`; unknown keys are an error, missing ones take defaults."""
        return config_from_dict(cls, data, "parallel adapter config", mapping_type=dict)


def config_from_dict(cls, data, what: str, *, mapping_type: type | None = None):
    """Dataclass ``cls`` from ``data`` (an adapter config's ``to_dict``; an instance of
    ``mapping_type``, default any Mapping): unknown keys are an InputError naming them and the
    allowed ones (``what``: whose config), missing ones take the defaults. Shared by the parallel
    and the serial adapters' configs."""
    from collections.abc import Mapping

    if not isinstance(data, mapping_type or Mapping):
        raise InputError(f"{what}: expected a mapping, got {type(data).__name__}")
    known = [field.name for field in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise InputError(f"{what}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(known)}")
    return cls(**data)


class ParallelAdapter(nn.Module):
    """``s · up(dropout(relu(down(h))))`` for hidden states h of size ``hidden_size``.

    Initialised as He et al.'s code and the adapters library ("mam_adapter"): down Kaiming-uniform
    (a=√5, what ``nn.Linear`` uses), every bias and the up-projection zero, so the output is exactly
    zero until training moves ``up``. Random numbers come from torch's global generator.
    """

    def __init__(self, hidden_size: int, config: ParallelAdapterConfig):
        super().__init__()
        self.config = config
        self.down = nn.Linear(hidden_size, config.bottleneck(hidden_size))
        self.up = nn.Linear(config.bottleneck(hidden_size), hidden_size)
        self.dropout = nn.Dropout(config.dropout)
        self.scaling = config.scaling
        self._hook = None  # the RemovableHandle of the pre-hook on the FFN output module
        with torch.no_grad():
            nn.init.kaiming_uniform_(self.down.weight, a=math.sqrt(5))
            nn.init.zeros_(self.down.bias)
            nn.init.zeros_(self.up.weight)
            nn.init.zeros_(self.up.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.scaling * self.up(self.dropout(torch.relu(self.down(hidden_states))))

    def add_to_residual(self, ffn_output: nn.Module, args: tuple, kwargs: dict):
        """Forward pre-hook of ``BertOutput``: ``input_tensor`` (h) becomes ``h + s · PA(h)``."""
        if "input_tensor" in kwargs:
            h = kwargs["input_tensor"]
            kwargs = {**kwargs, "input_tensor": h + self(h)}
        else:
            h = args[1]
            args = (args[0], h + self(h), *args[2:])
        return args, kwargs

    def extra_repr(self) -> str:
        return f"scaling={self.scaling}"


# ---- finding the encoder ---------------------------------------------------------------------


def _encoder(model: nn.Module) -> nn.Module:
    """The BERT-layout encoder inside ``model``: the one submodule with ``embeddings`` and
    ``encoder.layer``. Finds it in a BertModel/XLMRobertaModel itself, a *ForMaskedLM, a PEFT
    model, or a SentenceTransformer (``st[0].auto_model``) alike."""
    found = []
    for module in model.modules():
        children = dict(module.named_children())  # own children: PEFT wrappers forward getattr
        if "embeddings" in children and isinstance(getattr(children.get("encoder"), "layer", None), nn.ModuleList):
            found.append(module)
    if len(found) != 1:
        raise TypeError(f"{type(model).__name__}: expected exactly one BERT-like encoder (a module with "
                        f"`embeddings` and `encoder.layer`, as BertModel and XLMRobertaModel), found {len(found)}")
    return found[0]


def _ffn_output(layer: nn.Module, index: int) -> nn.Module:
    """``layer.output`` after checking it is BertOutput-shaped: ``forward(hidden_states, input_tensor)``
    with ``dense`` and ``LayerNorm``, and the layer has ``intermediate``."""
    output = getattr(layer, "output", None)
    parameters = list(inspect.signature(type(output).forward).parameters) if output is not None else []
    if (not hasattr(layer, "intermediate") or not hasattr(output, "dense") or not hasattr(output, "LayerNorm")
            or parameters[1:3] != ["hidden_states", "input_tensor"]):
        raise TypeError(f"layer {index} ({type(layer).__name__}) does not have the BERT layout "
                        "(intermediate + output(hidden_states, input_tensor) with dense and LayerNorm)")
    return output


def parallel_adapters(model: nn.Module) -> dict[int, ParallelAdapter]:
    """The inserted adapters by layer index (empty when there are none)."""
    layers = _encoder(model).encoder.layer
    return {i: getattr(layer.output, ADAPTER_ATTRIBUTE) for i, layer in enumerate(layers)
            if isinstance(getattr(getattr(layer, "output", None), ADAPTER_ATTRIBUTE, None), ParallelAdapter)}


def _config_of(model: nn.Module) -> ParallelAdapterConfig:
    """The config the model's adapters were inserted with (each adapter keeps it)."""
    adapters = parallel_adapters(model)
    if not adapters:
        raise ValueError(f"{type(model).__name__} has no parallel adapters")
    return next(iter(adapters.values())).config


# ---- inserting, freezing, removing ------------------------------------------------------------


def add_parallel_adapters(model: nn.Module, config: ParallelAdapterConfig | None = None) -> nn.Module:
    """Insert a fresh :class:`ParallelAdapter` beside the FFN of each configured layer; return ``model``.

    ``model`` is changed in place (and returned): a BertModel/XLMRobertaModel, a *ForMaskedLM,
    a PEFT model around one, or a SentenceTransformer whose first module holds one. A fresh
    adapter adds exactly zero, so the model's outputs are bit-identical to before. Adapters are
    created on the device and in the dtype of each layer's LayerNorm.
    """
    config = config or ParallelAdapterConfig()
    encoder = _encoder(model)
    layers = encoder.encoder.layer
    if parallel_adapters(model):
        raise ValueError("the model already has parallel adapters: remove_parallel_adapters() first")
    indices = range(len(layers)) if config.layers is None else config.layers
    outside = [i for i in indices if i >= len(layers)]
    if outside:
        raise InputError(f"parallel adapter config: layers {outside} do not exist; the model has "
                         f"{len(layers)} layers (0..{len(layers) - 1})")
    hidden = encoder.config.hidden_size
    outputs = {i: _ffn_output(layers[i], i) for i in indices}  # check every layer before changing any
    for i, output in outputs.items():
        reference = output.LayerNorm.weight
        adapter = ParallelAdapter(hidden, config).to(device=reference.device, dtype=reference.dtype)
        adapter.train(output.training)
        output.add_module(ADAPTER_ATTRIBUTE, adapter)
        adapter._hook = output.register_forward_pre_hook(adapter.add_to_residual, with_kwargs=True)
    return model


def remove_parallel_adapters(model: nn.Module) -> nn.Module:
    """Undo :func:`add_parallel_adapters`: hooks and adapter modules go, the rest is as before."""
    layers = _encoder(model).encoder.layer
    for i, adapter in parallel_adapters(model).items():
        adapter._hook.remove()
        delattr(layers[i].output, ADAPTER_ATTRIBUTE)
    return model


def freeze_all_but_adapters(model: nn.Module) -> nn.Module:
    """Make the parallel adapters the only trainable parameters of ``model`` (all of it: a
    SentenceTransformer's Dense head, PEFT's LoRA weights and embeddings are frozen too)."""
    adapters = parallel_adapters(model)
    if not adapters:
        raise ValueError(f"{type(model).__name__} has no parallel adapters to train")
    model.requires_grad_(False)
    for adapter in adapters.values():
        adapter.requires_grad_(True)
    return model


# ---- identity of the base model ---------------------------------------------------------------


def base_model_identity(model: nn.Module) -> dict:
    """What an adapter must sit on: the encoder's architecture and a fingerprint of its base.

    The fingerprint is a SHA-256 of the embedding tensors other than the word embeddings
    (position and token-type embeddings, embedding LayerNorm: names, shapes, values). They are
    pre-trained tensors that no stage of the method changes — FOCUS replaces the word embeddings,
    the language and sentence-encoding adapters are LoRA on linear layers, merging LoRA into the
    weights leaves them alone — so every language's model of one base shares the fingerprint,
    while two different pre-trained (or randomly initialised) bases differ in it. Values are
    rounded to bfloat16 first, so an fp32 and a bf16 copy of one model agree.
    ``name_or_path`` is informational only and not compared.
    """
    encoder = _encoder(model)
    digest = hashlib.sha256()
    for name, param in sorted(encoder.embeddings.named_parameters(), key=lambda item: item[0]):
        if "word_embeddings" in name or "lora_" in name:
            continue
        name = name.replace(".base_layer", "")
        values = param.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy()
        digest.update(f"{name}:{list(param.shape)};".encode())
        digest.update(values.tobytes())
    cfg = encoder.config
    return {
        "model_type": cfg.model_type, "hidden_size": cfg.hidden_size,
        "num_hidden_layers": len(encoder.encoder.layer), "intermediate_size": cfg.intermediate_size,
        "fingerprint": digest.hexdigest()[:32], "name_or_path": getattr(cfg, "_name_or_path", "") or "",
    }


def _identity_mismatch(first: dict, second: dict, labels: tuple[str, str]) -> list[str]:
    """The compared keys of two identities that differ, as readable phrases."""
    keys = ("model_type", "hidden_size", "num_hidden_layers", "intermediate_size", "fingerprint")
    return [f"{key}: {first.get(key)!r} ({labels[0]}) vs {second.get(key)!r} ({labels[1]})"
            for key in keys if first.get(key) != second.get(key)]


# ---- saving, loading, merging ----------------------------------------------------------------


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {f"layers.{i}.{name}": value.detach().to("cpu").contiguous()
            for i, adapter in parallel_adapters(model).items()
            for name, value in adapter.state_dict().items()}


def _write(out_dir: Path, tensors: dict[str, torch.Tensor], config: ParallelAdapterConfig,
           base_model: dict, metadata: dict | None) -> Path:
    from safetensors.torch import save_file

    record = {"format": FORMAT, "config": config.to_dict(), "base_model": base_model,
              "metadata": metadata or {}}
    text = json.dumps(record, indent=2, ensure_ascii=False) + "\n"  # fails before anything is written
    with atomic_path(out_dir, directory=True) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_NAME), metadata={"format": "pt"})
        (tmp / CONFIG_NAME).write_text(text, encoding="utf-8")
    return Path(out_dir)


def save_parallel_adapters(model: nn.Module, out_dir: str | Path, metadata: dict | None = None) -> Path:
    """Write the model's adapters to ``out_dir`` (atomically): weights, config, base identity and
    ``metadata`` (any JSON object: language, objective, training metrics …). Returns ``out_dir``.

    The config is the one the adapters were inserted with, so it cannot disagree with the weights.
    """
    return _write(Path(out_dir), _state(model), _config_of(model), base_model_identity(model), metadata)


def read_adapter_config(adapter_dir: str | Path) -> dict:
    """``parallel_adapter_config.json`` of ``adapter_dir``, with ``config`` as a ParallelAdapterConfig."""
    path = Path(adapter_dir) / CONFIG_NAME
    record = read_json(path, "a parallel adapter directory")
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("base_model"), dict):
        raise InputError(f"{path}: not a parallel adapter config of format {FORMAT}")
    try:
        record["config"] = ParallelAdapterConfig.from_dict(record.get("config"))
    except (InputError, TypeError) as err:
        raise InputError(f"{path}: {err}") from None
    return record


def _read_weights(adapter_dir: Path) -> dict[str, torch.Tensor]:
    return read_safetensors(adapter_dir / WEIGHTS_NAME)


def load_parallel_adapters(model: nn.Module, adapter_dir: str | Path) -> nn.Module:
    """Insert the adapters saved in ``adapter_dir`` into ``model`` and load their weights (strict).

    Raises :class:`InputError` naming the directory when the adapter was trained on another base
    model (architecture or fingerprint differ, see :func:`base_model_identity`) or when its
    tensors do not fit the model (missing, unexpected or differently shaped); the model is then
    left without adapters, as it was. Returns ``model``.
    """
    adapter_dir = Path(adapter_dir)
    record = read_adapter_config(adapter_dir)
    identity = base_model_identity(model)
    mismatch = _identity_mismatch(record["base_model"], identity, ("adapter", "model"))
    if mismatch:
        raise InputError(
            f"{adapter_dir}: an adapter trained on another base model "
            f"({record['base_model'].get('name_or_path') or 'unnamed'}) than this model's "
            f"({identity['name_or_path'] or 'unnamed'}): {'; '.join(mismatch)}")
    tensors = _read_weights(adapter_dir)
    add_parallel_adapters(model, record["config"])
    try:
        expected = {key: tuple(value.shape) for key, value in _state(model).items()}
        found = {key: tuple(value.shape) for key, value in tensors.items()}
        if expected != found:
            problems = [f"missing {k}" for k in sorted(expected.keys() - found.keys())]
            problems += [f"unexpected {k}" for k in sorted(found.keys() - expected.keys())]
            problems += [f"{k}: {list(found[k])} in the file, {list(expected[k])} in the model"
                         for k in sorted(expected.keys() & found.keys()) if expected[k] != found[k]]
            raise InputError(f"{adapter_dir}: an adapter trained on another base model, or a damaged "
                             f"file: its tensors do not fit this model: {'; '.join(problems[:5])}"
                             + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""))
        with torch.no_grad():
            for i, adapter in parallel_adapters(model).items():
                for name, value in adapter.state_dict().items():
                    value.copy_(tensors[f"layers.{i}.{name}"])
    except BaseException:
        remove_parallel_adapters(model)
        raise
    return model


def merge_parallel_adapters(adapter_dirs: Sequence[str | Path], weights: Sequence[float],
                            out_dir: str | Path, metadata: dict | None = None) -> Path:
    """Weighted average ``Σ wᵢ · adapterᵢ`` of adapters of one configuration on one base model.

    The paper merges the ``pp`` and ``pl`` CLA adapters of a language this way (0.5/0.5 by
    default). ``weights`` are used as given — not renormalised — and must sum to 1 (within 1e-6);
    they may be any finite numbers. The sum is computed in float64 and stored in the dtype of
    the first adapter. ``out_dir`` becomes an ordinary adapter directory (atomically) whose
    metadata lists the sources and their weights. Returns ``out_dir``.
    """
    adapter_dirs = [Path(d) for d in adapter_dirs]
    weights = [float(w) for w in weights]
    if not adapter_dirs:
        raise InputError("merge_parallel_adapters: no adapter directories given")
    if len(weights) != len(adapter_dirs):
        raise InputError(f"merge_parallel_adapters: {len(weights)} weights for {len(adapter_dirs)} adapters")
    if not all(math.isfinite(w) for w in weights) or abs(math.fsum(weights) - 1.0) > 1e-6:
        raise InputError(f"merge_parallel_adapters: the weights {weights} must be finite and sum to 1 "
                         f"(they sum to {math.fsum(weights)!r})")
    records = [read_adapter_config(d) for d in adapter_dirs]
    first = records[0]
    for directory, record in zip(adapter_dirs[1:], records[1:]):
        if record["config"] != first["config"]:
            raise InputError(f"{directory}: its configuration {record['config'].to_dict()} differs from "
                             f"{adapter_dirs[0]}'s {first['config'].to_dict()}: only adapters of one "
                             "configuration can be averaged")
        mismatch = _identity_mismatch(first["base_model"], record["base_model"],
                                      (str(adapter_dirs[0]), str(directory)))
        if mismatch:
            raise InputError(f"{directory}: trained on another base model than {adapter_dirs[0]}: "
                             f"{'; '.join(mismatch)}")
    states = [_read_weights(d) for d in adapter_dirs]
    for directory, state in zip(adapter_dirs[1:], states[1:]):
        shapes = {k: tuple(v.shape) for k, v in state.items()}
        if shapes != {k: tuple(v.shape) for k, v in states[0].items()}:
            raise InputError(f"{directory}: its tensors differ in names or shapes from {adapter_dirs[0]}'s")
    merged = {}
    for key, value in states[0].items():
        total = sum(w * state[key].double() for w, state in zip(weights, states))
        merged[key] = total.to(value.dtype).contiguous()
    sources = [{"path": str(d), "weight": w, "metadata": r.get("metadata", {})}
               for d, w, r in zip(adapter_dirs, weights, records)]
    return _write(Path(out_dir), merged, first["config"], first["base_model"],
                  {**(metadata or {}), "merged_from": sources})

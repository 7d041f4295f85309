"""Serial bottleneck adapters (Houlsby et al. 2019) and AdapterFusion (Pfeiffer et al. 2021), the
modules of the InteMATs recipe (:mod:`modsent.methods.intemats`).

A serial adapter sits *in* the residual stream of a transformer sublayer:

    z      a sublayer's output after its projection and dropout, before its residual + LayerNorm
    A(z) = z + W_up · dropout(ReLU(W_down · z))                     (hidden → r → hidden)
    out  = LayerNorm(A(z) + x)                                      (the sublayer's own residual x)

InteMATs (MATs-ST, MATs-DT) puts one at two sites of every layer, Houlsby's placement:

    attention   after the self-attention output projection: ``layer.attention.output``
    ffn         after the feed-forward output projection:   ``layer.output``

Both sites are transformers' ``BertSelfOutput``/``BertOutput`` (and XLM-R's identical classes),
whose ``forward(hidden_states, input_tensor)`` computes ``LayerNorm(dropout(dense(hidden_states))
+ input_tensor)``. The adapter is applied by a forward hook on that module's ``dropout``
submodule, whose output is z: the hook returns A(z), so the module computes
``LayerNorm(A(z) + input_tensor)``, the adapters library's ``HoulsbyConfig``/``DoubleSeqBnConfig``
placement (adapter after the dropout, before the residual and LayerNorm). A hook rather than a
replaced module keeps every parameter name of the backbone (``save_pretrained`` writes the
backbone alone) and runs transformers' own forward code. Defaults: reduction factor 16
(r = hidden / 16: 64 for XLM-R large), ReLU, no dropout, both sites of every layer; sites and
layers are settings. ``W_down`` is ``nn.Linear``'s Kaiming-uniform, ``W_up`` and both biases are
zero, so a fresh adapter adds exactly 0.0 and the model's outputs are bit-identical to the
backbone's.

AdapterFusion combines the adapter sets at each site, per token (the InteMATs paper's Eq. 6–9,
which follows Pfeiffer et al.):

    a_i  = W_up,i · ReLU(W_down,i · z)        adapter i's output *without* its residual
    q    = z W_q;  k_i = a_i W_k;  v_i = a_i W_v
    w    = softmax_i(q · k_i / sqrt(d))      one weight per adapter, summing to 1
    out  = z + sum_i w_i v_i                  the residual to z once

Keys and values are the adapters' outputs without their own residual, as the adapters library
implements Pfeiffer et al. (``BertFusion`` over the ``up`` outputs, ``residual_before=False``):
read literally, the paper's h_st and h_dt would each carry z and the output would count it twice
(with ``W_v`` = I, z + sum_i w_i (z + a_i) = 2z + sum_i w_i a_i). ``W_v`` starts as the identity (Pfeiffer et al.'s ``value_initialized``), so the fusion
starts as ``z + sum_i w_i a_i = sum_i w_i A_i(z)``, a convex combination of the adapted states;
``W_q``, ``W_k`` start N(0, 0.02) (BERT's init, as the adapters library does): small scores,
weights near 1/n, and a gradient (zero matrices would give q·k = 0 and no gradient to either).
No biases (the paper's W are d × d matrices); temperature sqrt(d) as the paper's Eq. 9.

Files (:func:`save_serial_adapters`, :func:`write_serial_adapters`)::

    serial_adapters.safetensors    {name}.layers.{i}.{site}.down.weight [r, H], .down.bias [r],
                                   .up.weight [H, r], .up.bias [H];
                                   fusion.layers.{i}.{site}.{query,key,value}.weight [H, H]
    serial_adapters_config.json    {"format", "adapters": {name: config}, "fusion": null or
                                   {"adapters": [names]}, "base_model", "metadata"}

``base_model`` is :func:`modsent.modular.parallel_adapter.base_model_identity`: adapters trained on
another base are refused.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from modsent.io import InputError, atomic_path, read_json, read_safetensors
from modsent.modular.parallel_adapter import _encoder, _identity_mismatch, base_model_identity, config_from_dict

WEIGHTS_NAME = "serial_adapters.safetensors"
CONFIG_NAME = "serial_adapters_config.json"
FORMAT = "modsent-serial-adapters/1"
SITES = ("attention", "ffn")
FUSION = "fusion"
FUSION_INIT_STD = 0.02  # W_q, W_k: BERT's initialiser range, as the adapters library's fusion


@dataclasses.dataclass(frozen=True)
class SerialAdapterConfig:
    """Shape of one set of serial adapters (defaults: InteMATs, Houlsby's two sites).

    reduction_factor  bottleneck r = hidden_size // reduction_factor (16: 64 for a 1024 model)
    bottleneck_size   an explicit r; overrides reduction_factor when given
    sites             where in each layer: "attention" (after the attention output projection)
                      and/or "ffn" (after the feed-forward output projection)
    layers            indices of the layers that get adapters; None = every layer
    dropout           on the bottleneck activations, training mode only
    """

    reduction_factor: float = 16.0
    bottleneck_size: int | None = None
    sites: tuple[str, ...] = SITES
    layers: tuple[int, ...] | None = None
    dropout: float = 0.0

    def __post_init__(self):
        def bad(key, value, expected):
            raise InputError(f"serial adapter config: {key}={value!r}: expected {expected}")

        if isinstance(self.reduction_factor, bool) or not isinstance(self.reduction_factor, (int, float)) \
                or not math.isfinite(self.reduction_factor) or self.reduction_factor <= 0:
            bad("reduction_factor", self.reduction_factor, "a number > 0")
        if self.bottleneck_size is not None and (isinstance(self.bottleneck_size, bool)
                                                 or not isinstance(self.bottleneck_size, int)
                                                 or self.bottleneck_size < 1):
            bad("bottleneck_size", self.bottleneck_size, "an integer >= 1 or null")
        sites = tuple(self.sites) if isinstance(self.sites, (list, tuple)) else None
        if not sites or any(site not in SITES for site in sites) or len(set(sites)) != len(sites):
            bad("sites", self.sites, f"a non-empty list of distinct sites of {list(SITES)}")
        object.__setattr__(self, "sites", tuple(site for site in SITES if site in sites))  # canonical order
        if self.layers is not None:
            layers = tuple(self.layers) if isinstance(self.layers, (list, tuple)) else None
            if (not layers or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in layers)
                    or len(set(layers)) != len(layers)):
                bad("layers", self.layers, "null (every layer) or a non-empty list of distinct layer indices >= 0")
            object.__setattr__(self, "layers", tuple(sorted(layers)))
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            bad("dropout", self.dropout, "a number in [0, 1)")
        object.__setattr__(self, "reduction_factor", float(self.reduction_factor))
        object.__setattr__(self, "dropout", float(self.dropout))

    def bottleneck(self, hidden_size: int) -> int:
        """r for a model of this hidden size."""
        if self.bottleneck_size is not None:
            return self.bottleneck_size
        return max(1, int(hidden_size // self.reduction_factor))

    def layer_indices(self, num_layers: int) -> tuple[int, ...]:
        """The layers that get adapters in a model of ``num_layers`` layers."""
        if self.layers is None:
            return tuple(range(num_layers))
        outside = [i for i in self.layers if i >= num_layers]
        if outside:
            raise InputError(f"serial adapter config: layers {outside} do not exist; the model has "
                             f"{num_layers} layers (0..{num_layers - 1})")
        return self.layers

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["sites"] = list(self.sites)
        out["layers"] = None if self.layers is None else list(self.layers)
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> "SerialAdapterConfig":
        """The inverse of :meth:`to_dict`; unknown keys are an error, missing ones take defaults."""
        return config_from_dict(cls, data, "serial adapter config")


class SerialAdapter(nn.Module):
    """``A(z) = z + up(dropout(relu(down(z))))``; :meth:`delta` is the part without the residual.
    ``up`` and every bias start at zero (a fresh adapter is the identity), ``down`` as
    ``nn.Linear`` (Kaiming-uniform, a=√5), from torch's global generator."""

    def __init__(self, hidden_size: int, config: SerialAdapterConfig):
        super().__init__()
        bottleneck = config.bottleneck(hidden_size)
        self.down = nn.Linear(hidden_size, bottleneck)
        self.up = nn.Linear(bottleneck, hidden_size)
        self.dropout = nn.Dropout(config.dropout)
        with torch.no_grad():
            nn.init.kaiming_uniform_(self.down.weight, a=math.sqrt(5))
            nn.init.zeros_(self.down.bias)
            nn.init.zeros_(self.up.weight)
            nn.init.zeros_(self.up.bias)

    def delta(self, z: torch.Tensor) -> torch.Tensor:
        return self.up(self.dropout(torch.relu(self.down(z))))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z + self.delta(z)


class AdapterFusion(nn.Module):
    """Attention over adapter outputs at one site, per token (see the module doc):
    ``forward(z, deltas) -> (z + sum_i w_i (delta_i W_v), w)`` with ``w = softmax_i((z W_q) ·
    (delta_i W_k) / sqrt(d))``. ``W_v`` starts as the identity, ``W_q`` and ``W_k`` N(0, 0.02)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.query = nn.Linear(hidden_size, hidden_size, bias=False)
        self.key = nn.Linear(hidden_size, hidden_size, bias=False)
        self.value = nn.Linear(hidden_size, hidden_size, bias=False)
        self.scale = 1.0 / math.sqrt(hidden_size)
        with torch.no_grad():
            nn.init.normal_(self.query.weight, std=FUSION_INIT_STD)
            nn.init.normal_(self.key.weight, std=FUSION_INIT_STD)
            self.value.weight.copy_(torch.eye(hidden_size))

    def forward(self, z: torch.Tensor, deltas: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        stacked = torch.stack(list(deltas), dim=-2)  # [..., n, d]
        query = self.query(z).unsqueeze(-1)  # [..., d, 1]
        scores = (self.key(stacked) @ query).squeeze(-1) * self.scale  # [..., n]
        weights = torch.softmax(scores, dim=-1)
        fused = (weights.unsqueeze(-1) * self.value(stacked)).sum(dim=-2)
        return z + fused, weights


def _site_module(layer: nn.Module, site: str, index: int) -> nn.Module:
    """The ``BertSelfOutput``/``BertOutput``-shaped module of ``site`` in ``layer``, checked."""
    import inspect

    module = layer.attention.output if site == "attention" and hasattr(layer, "attention") else \
        getattr(layer, "output", None) if site == "ffn" else None
    parameters = list(inspect.signature(type(module).forward).parameters) if module is not None else []
    if (module is None or not all(isinstance(getattr(module, name, None), cls) for name, cls in
                                  (("dense", nn.Linear), ("LayerNorm", nn.LayerNorm), ("dropout", nn.Dropout)))
            or parameters[1:3] != ["hidden_states", "input_tensor"]):
        raise TypeError(f"layer {index} ({type(layer).__name__}): its {site} output does not have the BERT "
                        "layout (dense, dropout, LayerNorm; forward(hidden_states, input_tensor))")
    return module


class SerialAdapterSet(nn.Module):
    """One set of serial adapters (MATs-ST or MATs-DT): ``layers.{i}.{site}``."""

    def __init__(self, hidden_size: int, num_layers: int, config: SerialAdapterConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleDict({
            str(i): nn.ModuleDict({site: SerialAdapter(hidden_size, config) for site in config.sites})
            for i in config.layer_indices(num_layers)})

    def get(self, layer: int, site: str) -> SerialAdapter | None:
        sites = self.layers[str(layer)] if str(layer) in self.layers else None
        return sites[site] if sites is not None and site in sites else None

    def places(self) -> list[tuple[int, str]]:
        return [(int(i), site) for i, sites in self.layers.items() for site in sites]


class FusionSet(nn.Module):
    """An :class:`AdapterFusion` at every site the fused adapter sets share: ``layers.{i}.{site}``."""

    def __init__(self, hidden_size: int, places: Sequence[tuple[int, str]]):
        super().__init__()
        self.layers = nn.ModuleDict()
        for layer, site in places:
            if str(layer) not in self.layers:
                self.layers[str(layer)] = nn.ModuleDict()
            self.layers[str(layer)][site] = AdapterFusion(hidden_size)

    def get(self, layer: int, site: str) -> AdapterFusion:
        return self.layers[str(layer)][site]


class SerialAdapterStack(nn.Module):
    """Named adapter sets and, with more than one, the fusion over them, inserted into a
    BERT-layout encoder by forward hooks (:meth:`attach`).

    At each site, one set: ``A(z)``; several: ``fusion(z, [delta_1(z), ...])``. Several sets
    without a fusion are an error (stacking is not what InteMATs does). ``record_weights``: the
    fusion weights of the last forward pass by (layer, site), ``[..., n]`` tensors (for analysis)."""

    def __init__(self, adapters: Mapping[str, SerialAdapterSet], fusion: FusionSet | None = None):
        super().__init__()
        if not adapters:
            raise ValueError("a serial adapter stack needs at least one adapter set")
        if len(adapters) > 1 and fusion is None:
            raise ValueError(f"adapter sets {sorted(adapters)} without a fusion: several sets are fused, not stacked")
        if fusion is not None and len(adapters) < 2:
            raise ValueError("a fusion needs at least two adapter sets")
        places = [set(a.places()) for a in adapters.values()]
        if fusion is not None and any(p != places[0] for p in places):
            raise InputError("the fused adapter sets must have adapters at the same layers and sites: "
                             + "; ".join(f"{name}: {len(a.places())} sites" for name, a in adapters.items()))
        self.names = list(adapters)
        self.adapters = nn.ModuleDict(dict(adapters))
        self.fusion = fusion
        self.record_weights = False
        self.weights: dict[tuple[int, str], torch.Tensor] = {}
        self._handles: list = []

    def places(self) -> list[tuple[int, str]]:
        return sorted(set().union(*(set(a.places()) for a in self.adapters.values())))

    def site_output(self, layer: int, site: str, z: torch.Tensor) -> torch.Tensor:
        """What replaces ``z`` at one site."""
        if self.fusion is None:
            adapter = self.adapters[self.names[0]].get(layer, site)
            return z if adapter is None else adapter(z)
        deltas = [self.adapters[name].get(layer, site).delta(z) for name in self.names]
        out, weights = self.fusion.get(layer, site)(z, deltas)
        if self.record_weights:
            self.weights[(layer, site)] = weights.detach()
        return out

    def attach(self, model: nn.Module) -> "SerialAdapterStack":
        """Register the hooks on ``model`` (a BertModel/XLMRobertaModel or anything holding one);
        the adapters are moved to the device and dtype of each site's LayerNorm."""
        if self._handles:
            raise ValueError("the serial adapters are attached already: detach() first")
        layers = _encoder(model).encoder.layer
        modules = {}
        for layer, site in self.places():
            if layer >= len(layers):
                raise InputError(f"serial adapters for layer {layer}: the model has {len(layers)} layers")
            modules[(layer, site)] = _site_module(layers[layer], site, layer)  # check all before changing any
        reference = next(iter(modules.values())).LayerNorm.weight
        self.to(device=reference.device, dtype=reference.dtype)
        for (layer, site), module in modules.items():
            def hook(_module, _args, output, layer=layer, site=site):
                return self.site_output(layer, site, output)

            self._handles.append(module.dropout.register_forward_hook(hook))
        return self

    def detach(self) -> None:
        """Remove the hooks: the model is the backbone again."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


# ---- saving and loading ----------------------------------------------------------------------


def new_adapter_set(model: nn.Module, config: SerialAdapterConfig) -> SerialAdapterSet:
    """A fresh adapter set (the identity) shaped for ``model``'s encoder."""
    encoder = _encoder(model)
    return SerialAdapterSet(encoder.config.hidden_size, len(encoder.encoder.layer), config)


def new_fusion(model: nn.Module, adapters: Mapping[str, SerialAdapterSet]) -> FusionSet:
    """A fresh fusion over ``adapters`` at the sites they share, shaped for ``model``."""
    places = sorted(set.intersection(*(set(a.places()) for a in adapters.values())))
    return FusionSet(_encoder(model).config.hidden_size, places)


def _tensors(stack: SerialAdapterStack, fusion_dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    state = {f"{name}.{key}": value for name, adapters in stack.adapters.items()
             for key, value in adapters.state_dict().items()}
    if stack.fusion is not None:
        state.update({f"{FUSION}.{key}": value.to(fusion_dtype) if value.is_floating_point() else value
                      for key, value in stack.fusion.state_dict().items()})
    return {key: value.detach().to("cpu").contiguous() for key, value in state.items()}


def write_serial_adapters(stack: SerialAdapterStack, model: nn.Module, directory: str | Path,
                          metadata: dict | None = None, fusion_dtype: str = "float32") -> None:
    """Write the stack's weights and config into the existing ``directory`` (not atomically:
    inside a directory being written atomically). ``model``: the encoder they sit on (its
    identity is recorded). ``fusion_dtype``: the fusion's saved weights (float32, float16 or
    bfloat16: 3 x hidden² per layer, as large as a third of the body's); the adapters stay
    float32 (a few MB). :func:`load_serial_adapters` loads either into the model's float32."""
    from safetensors.torch import save_file

    record = {"format": FORMAT, "adapters": {name: a.config.to_dict() for name, a in stack.adapters.items()},
              "fusion": None if stack.fusion is None else {"adapters": list(stack.names)},
              "base_model": base_model_identity(model), "metadata": metadata or {}}
    text = json.dumps(record, indent=2, ensure_ascii=False) + "\n"
    directory = Path(directory)
    save_file(_tensors(stack, getattr(torch, fusion_dtype)), str(directory / WEIGHTS_NAME), metadata={"format": "pt"})
    (directory / CONFIG_NAME).write_text(text, encoding="utf-8")


def save_serial_adapters(stack: SerialAdapterStack, model: nn.Module, out_dir: str | Path,
                         metadata: dict | None = None) -> Path:
    """:func:`write_serial_adapters` into a new directory ``out_dir``, atomically."""
    with atomic_path(out_dir, directory=True) as tmp:
        write_serial_adapters(stack, model, tmp, metadata)
    return Path(out_dir)


def read_config(directory: str | Path) -> dict:
    """``serial_adapters_config.json`` of ``directory``, each adapter config a SerialAdapterConfig."""
    path = Path(directory) / CONFIG_NAME
    record = read_json(path, "a serial adapter directory")
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("adapters"), dict):
        raise InputError(f"{path}: not a serial adapter config of format {FORMAT}")
    try:
        record["adapters"] = {name: SerialAdapterConfig.from_dict(cfg) for name, cfg in record["adapters"].items()}
    except (InputError, TypeError) as err:
        raise InputError(f"{path}: {err}") from None
    return record


def load_serial_adapters(model: nn.Module, directory: str | Path, *, names: Sequence[str] | None = None,
                         fusion: bool = True) -> tuple[dict[str, SerialAdapterSet], FusionSet | None]:
    """The adapter sets (``names``: only these; default all) and, with ``fusion``, the fusion
    saved in ``directory``, shaped for ``model`` and holding the saved weights (not attached).
    An adapter trained on another base model, or tensors that do not fit, is an InputError
    naming the directory."""
    directory = Path(directory)
    record = read_config(directory)
    identity = base_model_identity(model)
    mismatch = _identity_mismatch(record.get("base_model") or {}, identity, ("adapters", "model"))
    if mismatch:
        trained_on = (record.get("base_model") or {}).get("name_or_path") or "unnamed"
        raise InputError(f"{directory}: serial adapters trained on another base model ({trained_on}): "
                         f"{'; '.join(mismatch)}")
    wanted = list(record["adapters"]) if names is None else list(names)
    missing = [name for name in wanted if name not in record["adapters"]]
    if missing:
        raise InputError(f"{directory}: no adapter set {', '.join(missing)}; it has {', '.join(record['adapters'])}")
    tensors = read_safetensors(directory / WEIGHTS_NAME)
    adapters = {name: new_adapter_set(model, record["adapters"][name]) for name in wanted}
    parts: dict[str, nn.Module] = dict(adapters)
    fused = None
    if fusion and record.get("fusion") is not None:
        saved = {name: new_adapter_set(model, record["adapters"][name]) for name in record["fusion"]["adapters"]}
        fused = new_fusion(model, saved)
        parts[FUSION] = fused
    for prefix, module in parts.items():
        expected = {key: tuple(v.shape) for key, v in module.state_dict().items()}
        found = {key[len(prefix) + 1:]: tuple(v.shape) for key, v in tensors.items() if key.startswith(prefix + ".")}
        if expected != found:
            problems = [f"missing {prefix}.{k}" for k in sorted(expected.keys() - found.keys())]
            problems += [f"unexpected {prefix}.{k}" for k in sorted(found.keys() - expected.keys())]
            problems += [f"{prefix}.{k}: {list(found[k])} in the file, {list(expected[k])} in the model"
                         for k in sorted(expected.keys() & found.keys()) if expected[k] != found[k]]
            raise InputError(f"{directory}: the serial adapters do not fit this model (another base model, or "
                             f"a damaged file): {'; '.join(problems[:5])}")
        module.load_state_dict({key: tensors[f"{prefix}.{key}"] for key in expected})
    return adapters, fused

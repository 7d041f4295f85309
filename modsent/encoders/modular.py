"""Many languages' sentence encoders on one shared transformer body.

Every language's encoder (see :mod:`modsent.modular.sentence_adapter` and :mod:`modsent.modular.alignment`) is
the same frozen base body plus small per-language parts:

    tokenizer + word embeddings     the language's (LA directory), or the base's without an LA
    LA LoRA (q/k/v)                 frozen
    SE LoRA (every linear layer)    frozen
    CLA parallel adapters           frozen (one merged adapter set, or pp/pl)
    pooling [+ Dense] [+ Norm]      the base's sentence-transformers modules (shared)

:class:`ModularEncoder` loads the body and the head once and keeps only those small parts per
language. Routing is explicit: every ``nn.Linear`` of the body's encoder layers is wrapped in a
:class:`RoutedLoRALinear` that adds the LoRA deltas of the *active* language
(``W x + Σ s·B A x``, one term per LA and SE adapter, as PEFT computes them); the body's word
embedding module is swapped for the language's; the language's parallel adapters are attached
with the same forward pre-hook :mod:`modsent.modular.parallel_adapter` uses. The reference encoder merges
the LA into ``W`` before adding the SE LoRA; stacking the two unmerged computes the same function
up to float rounding.

Prompts are not added (as in :mod:`modsent.modular.sentence_adapter`).

:meth:`ModularEncoder.export` writes one language as a standalone sentence-transformers
directory (safetensors) that a plain ``SentenceTransformer(out_dir)`` loads: LoRA merged into the
weights, the language's tokenizer and embeddings, the base's pooling/Dense/Normalize modules.
A CLA adapter has a ReLU and so cannot be merged into the existing linear weights; it is folded
into the feed-forward block instead (:func:`fold_parallel_adapters`): its ``r`` bottleneck units
become ``r`` extra intermediate units of the FFN (``intermediate_size`` grows by ``r``), which
the FFN's own GELU computes as ``GELU(c·x)/c`` — equal to ``ReLU(x)`` to within ``0.17/c`` per
unit. The export is then an ordinary BERT/XLM-R checkpoint: no custom code, no
``trust_remote_code``; it encodes like the ModularEncoder to cosine ≥ 0.9999 (tested).
``export_info.json`` records the language and the fold.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from modsent.modular import alignment as al
from modsent.modular import language_adapter as la
from modsent.modular import parallel_adapter as pa
from modsent.modular import sentence_adapter as sa
from modsent.io import InputError, atomic_path, read_json, read_safetensors, record_added_tokens
from modsent.losses import mlm_parts
from modsent.training.precision import default_device
from modsent.training.seeding import private_cpu_stream

log = logging.getLogger(__name__)

EXPORT_INFO = "export_info.json"
# c in GELU(c·x)/c ≈ ReLU(x) (error ≤ 0.17/c per unit; larger c overflows sooner in float16)
RELU_AS_GELU_SCALE = 1000.0
GELU_ACTIVATIONS = {"gelu", "gelu_new", "gelu_python", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate"}


class RoutedLoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus the LoRA terms of the active language: ``[(A, B, scaling)]``.

    With ``merge=True`` the forward pass uses ``W + Σ s·B A``, computed once per activation (by
    the formula :meth:`merged` writes into an export), instead of adding each term to the output:
    one matrix product per layer instead of three per term, at the cost of a merged copy of the
    weight while a language is active. ``hold=True`` (what :meth:`ModularEncoder.encode` sets for
    one call) merges likewise from the first input large enough for the merge to cost fewer
    products than the terms (:meth:`merges_per_call`) and keeps the copy until :meth:`release`.
    With gradients enabled the terms are added as usual."""

    def __init__(self, base: nn.Linear, merge: bool = False):
        super().__init__()
        self.base = base
        self.merge = merge
        self.hold = False
        self._active: list[tuple[torch.Tensor, torch.Tensor, float]] = []
        self._merged: torch.Tensor | None = None

    @property
    def active(self) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
        return self._active

    @active.setter
    def active(self, terms: list[tuple[torch.Tensor, torch.Tensor, float]]) -> None:
        self._active, self._merged = terms, None

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._active and not torch.is_grad_enabled():  # inference only
            if self._merged is None and (self.merge or (self.hold and self.merges_per_call(x))):
                self._merged = self.merged_weight()
            if self._merged is not None:
                return nn.functional.linear(x, self._merged, self.base.bias)
        out = self.base(x)
        for a, b, scaling in self._active:
            out = out + (x.to(a.dtype) @ a.T @ b.T).to(out.dtype) * scaling
        return out

    def merges_per_call(self, x: torch.Tensor) -> bool:
        """Whether merging costs fewer multiply-adds (``out·r·in`` per term, once) than adding the
        terms to the output for ``x`` (``tokens·r·(in + out)`` per term): from ``in·out / (in +
        out)`` tokens on (192 for a 384-wide layer, 10-20 sentences)."""
        tokens = x.numel() // max(x.shape[-1], 1)
        n_in, n_out = self.base.in_features, self.base.out_features
        return tokens * (n_in + n_out) >= n_in * n_out

    def release(self) -> None:
        """Drop a merged copy held for one encode call (``hold``); a ``merge=True`` layer keeps its own."""
        self.hold = False
        if not self.merge:
            self._merged = None

    def merged_weight(self) -> torch.Tensor:
        """``W + Σ s·B A`` over the active terms (a new tensor), in the weight's dtype whatever
        autocast is active around the first forward pass (the export's merge runs without one).
        Each term is one fused ``addmm`` (no separate product, scaling and sum over the weight)."""
        base = self.base.weight.detach()
        with torch.no_grad(), torch.autocast(base.device.type, enabled=False):
            weight = None
            for a, b, scaling in self._active:
                a, b = a.to(base.dtype), b.to(base.dtype)
                weight = torch.addmm(base, b, a, alpha=scaling) if weight is None else weight.addmm_(b, a, alpha=scaling)
        return base.clone() if weight is None else weight

    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` with the active LoRA terms added to its weight (a new module)."""
        linear = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
        with torch.no_grad():
            linear.weight.copy_(self.merged_weight())
            if self.base.bias is not None:
                linear.bias.copy_(self.base.bias)
        return linear.to(self.base.weight.device)


def _attach(model: nn.Module, adapters: dict[int, pa.ParallelAdapter]) -> None:
    """Insert already-made parallel adapters into ``model`` the way :func:`pa.add_parallel_adapters`
    does (child ``parallel_adapter`` of each layer's FFN output, forward pre-hook); undone by
    :func:`pa.remove_parallel_adapters`."""
    layers = pa._encoder(model).encoder.layer
    for i, adapter in adapters.items():
        output = layers[i].output
        output.add_module(pa.ADAPTER_ATTRIBUTE, adapter)
        adapter._hook = output.register_forward_pre_hook(adapter.add_to_residual, with_kwargs=True)


def fold_parallel_adapters(body: nn.Module, adapters: dict[int, pa.ParallelAdapter],
                           scale: float = RELU_AS_GELU_SCALE) -> int:
    """Fold parallel adapters into the FFN of ``body`` (in place); return the new FFN width.

    A layer's FFN computes ``W2 · act(W1 h + b1) + b2`` and its adapter adds
    ``s · (Wu · ReLU(Wd h + bd) + bu)`` to it (see :mod:`modsent.modular.parallel_adapter`). Appending
    ``c·Wd`` to W1's rows (``c·bd`` to b1) and ``(s/c)·Wu`` to W2's columns (``s·bu`` to b2) gives
    the sum with ``act(c·x)/c`` in place of ``ReLU(x)``: exact for a ReLU FFN (c = 1), and for
    GELU within ``max_t t·Q(t)/c ≈ 0.17/c`` per unit. Layers without an adapter get zero units
    (act(0) = 0), since a config has one ``intermediate_size`` for all layers."""
    config = body.config
    act = str(getattr(config, "hidden_act", ""))
    if act == "relu":
        scale = 1.0
    elif act not in GELU_ACTIVATIONS:
        raise InputError(f"cannot fold a parallel adapter into an FFN with hidden_act={act!r} "
                         f"(supported: relu, {', '.join(sorted(GELU_ACTIVATIONS))})")
    layers = pa._encoder(body).encoder.layer
    widths = {adapter.down.out_features for adapter in adapters.values()}
    if len(widths) != 1:
        raise InputError(f"parallel adapters of different bottleneck sizes {sorted(widths)} cannot be folded")
    r = widths.pop()
    with torch.no_grad():
        for i, layer in enumerate(layers):
            inner, outer = layer.intermediate.dense, layer.output.dense
            adapter = adapters.get(i)
            down_w = inner.weight.new_zeros(r, inner.in_features)
            down_b = inner.weight.new_zeros(r)
            up_w = outer.weight.new_zeros(outer.out_features, r)
            up_b = outer.weight.new_zeros(outer.out_features)
            if adapter is not None:
                down_w = scale * adapter.down.weight
                down_b = scale * adapter.down.bias
                up_w = (adapter.scaling / scale) * adapter.up.weight
                up_b = adapter.scaling * adapter.up.bias
            wide_in = nn.Linear(inner.in_features, inner.out_features + r)
            wide_in.weight.copy_(torch.cat([inner.weight, down_w]))
            wide_in.bias.copy_(torch.cat([inner.bias, down_b]))
            wide_out = nn.Linear(outer.in_features + r, outer.out_features)
            wide_out.weight.copy_(torch.cat([outer.weight, up_w], dim=1))
            wide_out.bias.copy_(outer.bias + up_b)
            layer.intermediate.dense, layer.output.dense = wide_in, wide_out
    config.intermediate_size = int(config.intermediate_size) + r
    return config.intermediate_size


class _Language:
    """One language's small parts."""

    def __init__(self, lang: str, tokenizer, embeddings: nn.Embedding, lora: dict[str, list],
                 adapters: dict[int, pa.ParallelAdapter] | None, adapter_dir: Path | None,
                 max_seq_length: int):
        self.lang, self.tokenizer, self.embeddings = lang, tokenizer, embeddings
        self.lora, self.adapters, self.adapter_dir = lora, adapters, adapter_dir
        self.max_seq_length = max_seq_length

    def tensors(self) -> list[torch.Tensor]:
        out = [self.embeddings.weight]
        out += [t for terms in self.lora.values() for a, b, _ in terms for t in (a, b)]
        out += [p for adapter in (self.adapters or {}).values() for p in adapter.parameters()]
        return out


def _frozen_embedding(weights: torch.Tensor, padding_idx: int | None) -> nn.Embedding:
    """A frozen ``nn.Embedding`` holding ``weights`` as they are (no random initialisation
    drawn first and overwritten: 0.1 s per 10M entries on one core)."""
    return nn.Embedding.from_pretrained(weights, freeze=True, padding_idx=padding_idx)


def _file_stamps(folder: Path) -> tuple:
    """(relative path, modification time, size) of every file under ``folder``: what changes
    when the folder's contents are rewritten."""
    stamps = []
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            stat = path.stat()
            stamps.append((str(path.relative_to(folder)), stat.st_mtime_ns, stat.st_size))
    return tuple(stamps)


def _embedding_fingerprint(model_dir: Path) -> str | None:
    """A SHA-256 of the non-word embedding tensors in ``model_dir/model.safetensors`` (position and
    token-type embeddings, embedding LayerNorm: tensors no stage of the method changes, so every
    adapter of one base shares them); None when there is no such single file to read."""
    import hashlib

    from safetensors import safe_open

    path = model_dir / "model.safetensors"
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with safe_open(str(path), "pt") as handle:
        keys = {key.split("embeddings.", 1)[1]: key for key in handle.keys()
                if ".embeddings." in f".{key}" and "word_embeddings" not in key}
        for short in sorted(keys):
            tensor = handle.get_tensor(keys[short])
            digest.update(f"{short}:{list(tensor.shape)};".encode())
            digest.update(tensor.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
    return digest.hexdigest() if keys else None


def _check_recorded_base(adapter_dir: Path, config: dict, base_model_dir: Path, what: str) -> None:
    """Refuse a LoRA adapter whose recorded base (PEFT's ``base_model_name_or_path``) is another
    model: when that directory exists here and its embedding fingerprint differs from the base's.
    (A recorded base that is gone or elsewhere cannot be checked; the shapes still are.)"""
    recorded = config.get("base_model_name_or_path")
    if not recorded or not Path(recorded).is_dir():
        return
    recorded = Path(recorded)
    if recorded.resolve() == base_model_dir.resolve():
        return
    theirs, ours = _embedding_fingerprint(recorded), _embedding_fingerprint(base_model_dir)
    if theirs is not None and ours is not None and theirs != ours:
        raise InputError(f"{adapter_dir}: a {what} trained on another base model ({recorded}) than "
                         f"this encoder's ({base_model_dir}): their embedding tensors differ")


def _read_lora(adapter_dir: Path, body: nn.Module, prefix: str, what: str,
               base_model_dir: Path | None = None) -> dict[str, list]:
    """{module name in the body: [(A, B, scaling)]} of the PEFT LoRA adapter in ``adapter_dir``."""
    config_path = adapter_dir / "adapter_config.json"
    weights_path = adapter_dir / "adapter_model.safetensors"
    if not config_path.is_file() or not weights_path.is_file():
        raise InputError(f"{adapter_dir}: not a PEFT LoRA adapter directory ({what}: expected "
                         "adapter_config.json and adapter_model.safetensors)")
    config = read_json(config_path, f"a PEFT LoRA adapter directory ({what})")
    if config.get("peft_type", "LORA") != "LORA" or config.get("use_dora"):
        raise InputError(f"{adapter_dir}: only plain LoRA adapters are supported ({what})")
    if base_model_dir is not None:
        _check_recorded_base(adapter_dir, config, base_model_dir, what)
    r, alpha = int(config["r"]), float(config["lora_alpha"])
    rank_pattern, alpha_pattern = config.get("rank_pattern") or {}, config.get("alpha_pattern") or {}
    tensors = read_safetensors(weights_path)
    modules = dict(body.named_modules())
    out: dict[str, list] = {}
    for key in sorted(k for k in tensors if k.endswith(".lora_A.weight")):
        name = key[: -len(".lora_A.weight")]
        name = name.removeprefix("base_model.model.").removeprefix(prefix + ".")
        module = modules.get(name)
        if not isinstance(module, RoutedLoRALinear):
            raise InputError(f"{adapter_dir}: {what} LoRA for {name!r}, which is not a linear layer of "
                             "this base model's encoder: an adapter of another base model?")
        a, b = tensors[key], tensors.get(key.replace(".lora_A.", ".lora_B."))
        if b is None or a.shape[1] != module.base.in_features or b.shape[0] != module.base.out_features \
                or a.shape[0] != b.shape[1]:
            raise InputError(f"{adapter_dir}: {what} LoRA for {name!r} has shapes "
                             f"{list(a.shape)}/{list(getattr(b, 'shape', []))}, which do not fit this base "
                             f"model's layer ({module.base.in_features} -> {module.base.out_features}): "
                             "an adapter of another base model?")
        rank = next((v for k, v in rank_pattern.items() if name.endswith(k)), r)
        lora_alpha = next((v for k, v in alpha_pattern.items() if name.endswith(k)), alpha)
        scaling = lora_alpha / (rank ** 0.5 if config.get("use_rslora") else rank)
        dtype = module.base.weight.dtype
        out[name] = [(a.to(dtype), b.to(dtype), float(scaling))]
    if not out:
        raise InputError(f"{adapter_dir}: no LoRA weights ({what})")
    return out


class ModularEncoder:
    """One base body, many languages: ``add_language(...)`` then ``encode(sentences, lang=...)``.

    Each layer computes with the active language's LoRA terms merged into its weight, as the
    export computes it (:class:`RoutedLoRALinear`; one product per layer instead of three per term:
    1.2x per modular system on the CPU, 2.0x on an H100). By default the merged copy of the body's
    linear weights exists during an ``encode`` call only, from its first batch large enough for the
    merge to pay (a call of a sentence or two adds the terms instead), so that between calls the
    encoder holds only the small per-language parts. ``merge_lora=True`` (the evaluation's choice)
    keeps the copy while a language is active, sparing the merge at each call."""

    def __init__(self, base_model_dir: str | Path, device: str | None = None, *, merge_lora: bool = False):
        import transformers

        self.base_model_dir = Path(base_model_dir)
        self.device = torch.device(default_device(device))
        self.head, self.base_max_seq_length = sa._sentence_head(self.base_model_dir)
        self._base_tokenizer = None
        transformers.logging.set_verbosity_error()
        try:
            mlm = transformers.AutoModelForMaskedLM.from_pretrained(
                str(self.base_model_dir), attn_implementation="sdpa", dtype=torch.float32)
        finally:
            transformers.logging.set_verbosity_warning()
        self._prefix = mlm.base_model_prefix
        self.body = mlm_parts(mlm)[0]
        del mlm
        self.body.requires_grad_(False)
        self.body.eval()
        for name, module in list(self.body.named_modules()):
            for child_name, child in list(module.named_children()):
                if isinstance(child, nn.Linear) and ".layer." in f"{name}.{child_name}":
                    setattr(module, child_name, RoutedLoRALinear(child, merge=merge_lora))
        self._routed = {n: m for n, m in self.body.named_modules() if isinstance(m, RoutedLoRALinear)}
        words = self.body.embeddings.word_embeddings
        self._embedding_dim, self._padding_idx = words.embedding_dim, words.padding_idx
        self.body.to(self.device)
        self.head.to(self.device).eval()
        self._identity = pa.base_model_identity(self.body)
        # The base's word embeddings (250K rows: 384 MB for multilingual-e5-small, most of the
        # body) serve only languages without a language adapter; they are dropped here and read
        # back from the base's safetensors when such a language is added.
        self._base_embeddings: nn.Embedding | None = words
        self._base_embeddings_key = self._word_embeddings_key()
        self._empty = nn.Embedding(1, self._embedding_dim).to(self.device).requires_grad_(False)
        if self._base_embeddings_key is not None:
            self._base_embeddings = None
            self.body.embeddings.word_embeddings = self._empty
        self._languages: dict[str, _Language] = {}
        # one language adapter's tokenizer, embeddings and LoRA terms, read once however many
        # systems use it (an evaluation group registers Mod_en, Mod_m and each Mod_mc-* of a
        # language on its one LA): {(resolved LA directory, its files' times and sizes):
        # (tokenizer, embeddings, LoRA)}
        self._language_adapters: dict[tuple, tuple] = {}
        self._active: str | None = None
        self._identifier = None

    # ---- base word embeddings (loaded on demand) ---------------------------------------------------

    def _word_embeddings_key(self) -> str | None:
        """The key of the word embedding matrix in the base's ``model.safetensors``, or None."""
        from safetensors import safe_open

        path = self.base_model_dir / "model.safetensors"
        if not path.is_file():
            return None
        with safe_open(str(path), "pt") as handle:
            keys = [key for key in handle.keys() if key.endswith("embeddings.word_embeddings.weight")]
        return keys[0] if len(keys) == 1 else None

    @property
    def base_tokenizer(self):
        """The base model's tokenizer, loaded on first use: only languages without a language adapter
        need it (a 250K-piece tokenizer keeps ~240 MB resident even once freed)."""
        if self._base_tokenizer is None:
            import transformers

            self._base_tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.base_model_dir))
        return self._base_tokenizer

    @property
    def base_embeddings(self) -> nn.Embedding:
        """The base model's word embeddings, read from its safetensors on first use."""
        if self._base_embeddings is None:
            from safetensors import safe_open

            with safe_open(str(self.base_model_dir / "model.safetensors"), "pt") as handle:
                weights = handle.get_tensor(self._base_embeddings_key).to(torch.float32)
            self._base_embeddings = _frozen_embedding(weights, self._padding_idx).to(self.device)
        return self._base_embeddings

    # ---- languages -------------------------------------------------------------------------------

    @property
    def languages(self) -> list[str]:
        return sorted(self._languages)

    def add_language(self, lang: str, *, language_adapter: str | Path | None = None,
                     sentence_adapter: str | Path | None = None, alignment: str | Path | None = None,
                     max_seq_length: int | None = None) -> None:
        """Register ``lang``'s modules: an LA directory (tokenizer, ``embeddings.safetensors``,
        ``adapter/``), an SE training output (or its ``adapter/``), a CLA output or adapter
        directory; each optional. ``max_seq_length`` defaults as :func:`sa.load_sentence_encoder`'s
        (the SE's training ``seq_len``, else the base's). Adapters of another base are an InputError."""
        self._deactivate()
        if language_adapter is not None:
            tokenizer, embeddings, la_lora = self._language_adapter(Path(language_adapter))
            lora = {name: list(terms) for name, terms in la_lora.items()}  # the SE's terms go after
        else:
            tokenizer, embeddings, lora = self.base_tokenizer, self.base_embeddings, {}
        if sentence_adapter is not None:
            se_dir = Path(sentence_adapter)
            adapter = se_dir / sa.ADAPTER_DIR if (se_dir / sa.ADAPTER_DIR).is_dir() else se_dir
            for name, terms in _read_lora(adapter, self.body, self._prefix, "sentence adapter",
                                          self.base_model_dir).items():
                lora.setdefault(name, []).extend(terms)
            if max_seq_length is None and (se_dir / "metrics.json").is_file():
                trained = json.loads((se_dir / "metrics.json").read_text(encoding="utf-8"))
                max_seq_length = trained.get("config", {}).get("seq_len")
        lora = {name: [(a.to(self.device), b.to(self.device), s) for a, b, s in terms]
                for name, terms in lora.items()}
        adapters, adapter_dir = None, None
        if alignment is not None:
            adapter_dir = al.adapter_path(alignment)
            with private_cpu_stream():  # inserting draws a (discarded) random init
                pa.load_parallel_adapters(self.body, adapter_dir)  # checks the base identity
            adapters = pa.parallel_adapters(self.body)
            pa.remove_parallel_adapters(self.body)
            for adapter in adapters.values():
                adapter.requires_grad_(False)
                adapter.eval()
        max_len = min(max_seq_length or self.base_max_seq_length, self.base_max_seq_length)
        self._languages[lang] = _Language(lang, tokenizer, embeddings, lora, adapters, adapter_dir, max_len)
        self._identifier = None

    def _language_adapter(self, la_dir: Path) -> tuple:
        """An LA directory's tokenizer, word embeddings (on the device) and LoRA terms (on the
        CPU), read on its first use and shared by every key registered on it; read again when
        its files changed since (a language adapter retrained in place)."""
        key = (la_dir.resolve(), _file_stamps(la_dir))
        if key not in self._language_adapters:
            import transformers

            tokenizer = transformers.AutoTokenizer.from_pretrained(str(la_dir))
            embeddings_path = la_dir / la.EMBEDDINGS_NAME
            if not embeddings_path.is_file():
                raise InputError(f"{la_dir}: no {la.EMBEDDINGS_NAME}: not a language adapter directory")
            weights = read_safetensors(embeddings_path)["input_embeddings"]
            if weights.shape[0] != len(tokenizer) or weights.shape[1] != self._embedding_dim:
                raise InputError(f"{embeddings_path}: embeddings of shape {list(weights.shape)} do not fit "
                                 f"the tokenizer ({len(tokenizer)} tokens) and this base model "
                                 f"(dim {self._embedding_dim}): another base model?")
            embeddings = _frozen_embedding(weights.to(torch.float32), self._padding_idx).to(self.device)
            lora = _read_lora(la_dir / la.ADAPTER_DIR, self.body, self._prefix, "language adapter",
                              self.base_model_dir)
            self._language_adapters[key] = (tokenizer, embeddings, lora)
        return self._language_adapters[key]

    def _deactivate(self) -> None:
        if self._active is None:
            return
        pa.remove_parallel_adapters(self.body)
        for module in self._routed.values():
            module.active = []
        self.body.embeddings.word_embeddings = (self._base_embeddings if self._base_embeddings is not None
                                                else self._empty)
        self._active = None

    def _activate(self, lang: str) -> _Language:
        if lang not in self._languages:
            raise InputError(f"no modules for language {lang!r}; available: "
                             f"{', '.join(self.languages) or 'none (add_language first)'}")
        entry = self._languages[lang]
        if self._active == lang:
            return entry
        self._deactivate()
        for name, module in self._routed.items():
            module.active = entry.lora.get(name, [])
        self.body.embeddings.word_embeddings = entry.embeddings
        if entry.adapters:
            _attach(self.body, entry.adapters)
        self._active = lang
        return entry

    def _model(self, lang: str) -> sa.SentenceEncoderModel:
        entry = self._activate(lang)
        return sa.SentenceEncoderModel(self.body, entry.tokenizer, self.head, entry.max_seq_length)

    # ---- encoding ----------------------------------------------------------------------------------

    def detect(self, sentences: Sequence[str]) -> list[str]:
        """Each sentence's identified language (a registry code), among every language the
        identifier knows (:mod:`modsent.data.language_id`), whether or not this encoder has modules
        for it; a registered language is reported by the code it was added under."""
        from modsent.data import language_id

        if self._identifier is None:
            self._identifier = language_id.LanguageIdentifier()
        labels = {language_id.label_of(lang): lang for lang in self._languages}
        return [labels.get(language_id.label_of(code), code) for code in self._identifier.identify(sentences)]

    def route(self, sentences: Sequence[str], fallback: str | None = None) -> tuple[list[str], list[str]]:
        """(the language whose modules encode each sentence, its detected language). A sentence
        detected as a language without modules goes to ``fallback`` (logged), and without a
        fallback is an InputError naming the languages found: no sentence is routed silently to
        another language's modules."""
        if not self._languages:
            raise InputError("no languages registered (add_language first)")
        if fallback is not None and fallback not in self._languages:
            raise InputError(f"fallback language {fallback!r} has no modules; available: {', '.join(self.languages)}")
        detected = self.detect(sentences)
        unknown = [code for code in detected if code not in self._languages]
        if unknown and fallback is None:
            counts = ", ".join(f"{code} ({n})" for code, n in _counts(unknown))
            first = next(s for s, code in zip(sentences, detected) if code not in self._languages)
            raise InputError(f"{len(unknown)} of {len(detected)} sentences were identified as languages "
                             f"without modules: {counts} (e.g. {first[:60]!r}); modules: {', '.join(self.languages)}. "
                             "Name the language (lang=, --lang) or a fallback (fallback=, --fallback-lang)")
        if unknown:
            log.warning("%d of %d sentences identified as languages without modules (%s): encoded with "
                        "the fallback %s's modules", len(unknown), len(detected),
                        ", ".join(f"{code} {n}" for code, n in _counts(unknown)), fallback)
        return [code if code in self._languages else fallback for code in detected], detected

    def encode(self, sentences: Sequence[str], lang: str | None = None, batch_size: int = 32,
               normalize: bool = True, fallback: str | None = None) -> np.ndarray:
        """Embeddings [n, dim] (float32), each sentence by ``lang``'s encoder, or, with
        ``lang=None``, by the encoder of its detected language (see :meth:`route`)."""
        if isinstance(sentences, str):
            raise TypeError("encode() takes a sequence of sentences, not one string")
        sentences = list(sentences)
        if lang is not None:
            model = self._model(lang)  # an unknown language is an error, with sentences or without
            if not sentences:
                return np.zeros((0, self.embedding_dimension), dtype=np.float32)
            with self._merged_for_the_call():
                return model.encode(sentences, batch_size, normalize=normalize)
        if not sentences:
            return np.zeros((0, self.embedding_dimension), dtype=np.float32)
        return self.encode_by_language(sentences, self.route(sentences, fallback)[0], batch_size, normalize)

    def encode_by_language(self, sentences: Sequence[str], langs: Sequence[str], batch_size: int = 32,
                           normalize: bool = True) -> np.ndarray:
        """Embeddings [n, dim], sentence i by the modules of ``langs[i]``."""
        if len(langs) != len(sentences):
            raise ValueError(f"{len(sentences)} sentences but {len(langs)} languages")
        out = np.zeros((len(sentences), self.embedding_dimension), dtype=np.float32)
        for group in dict.fromkeys(langs):
            rows = [i for i, g in enumerate(langs) if g == group]
            model = self._model(group)
            with self._merged_for_the_call():
                out[rows] = model.encode([sentences[i] for i in rows], batch_size, normalize=normalize)
        return out

    @contextlib.contextmanager
    def _merged_for_the_call(self):
        """The active language's LoRA terms merged into each layer's weight from the call's first
        batch that makes it pay (:meth:`RoutedLoRALinear.merges_per_call`) to its end: the
        speed of ``merge_lora=True`` (one product per layer) for a call of many sentences,
        without keeping a merged copy of the body's weights between calls."""
        for module in self._routed.values():
            module.hold = True
        try:
            yield
        finally:
            for module in self._routed.values():
                module.release()

    @property
    def embedding_dimension(self) -> int:
        """The length of the sentence vectors: the last head module's that states one (Dense,
        Pooling), else the body's hidden size."""
        for module in reversed(list(self.head)):
            size = getattr(module, "get_embedding_dimension", lambda: None)()
            if size:
                return int(size)
        return int(self._embedding_dim)

    __call__ = encode

    # ---- export -------------------------------------------------------------------------------------

    def export(self, lang: str, out_dir: str | Path, card: str | None = None) -> Path:
        """``lang``'s encoder as a standalone sentence-transformers directory (atomically).

        Plain ``SentenceTransformer(out_dir).encode(texts)`` computes what ``encode(texts,
        lang=lang)`` does: the export has no prompts (the modules were trained and are evaluated
        without one; a base's default prompt such as E5's "query: " would shift every vector).
        ``export_info.json`` records the language and the base model's Hub id, where it has one;
        ``card`` (modsent.cards.export_card) is written as its README.md."""
        import copy

        from modsent.encoders.base_models import hub_id

        entry = self._activate(lang)
        base = self.base_model_dir
        self._deactivate()
        body = copy.deepcopy(self.body).to("cpu")  # a private copy to merge into
        self._activate(lang)
        for name, module in list(body.named_modules()):
            for child_name, child in list(module.named_children()):
                if isinstance(child, RoutedLoRALinear):
                    child.active = [(a.cpu(), b.cpu(), s) for a, b, s in entry.lora.get(f"{name}.{child_name}"
                                                                                          if name else child_name, [])]
                    setattr(module, child_name, child.merged())
        body.embeddings.word_embeddings = copy.deepcopy(entry.embeddings).to("cpu")
        body.config.vocab_size = entry.embeddings.num_embeddings
        body.config.pad_token_id = entry.tokenizer.pad_token_id
        info = {"language": lang, "base_model": hub_id(base), "max_seq_length": entry.max_seq_length,
                "parallel_adapter": None}
        if entry.adapters:
            ffn = body.config.intermediate_size
            adapters = {i: copy.deepcopy(adapter).to("cpu") for i, adapter in entry.adapters.items()}
            width = fold_parallel_adapters(body, adapters)
            info["parallel_adapter"] = {"source": str(entry.adapter_dir), "folded_into_ffn": True,
                                        "intermediate_size": [ffn, width],
                                        "relu_as_gelu_scale": RELU_AS_GELU_SCALE}
        modules = json.loads((base / "modules.json").read_text(encoding="utf-8"))
        transformer_path = modules[0].get("path", "")
        out_dir = Path(out_dir)
        with atomic_path(out_dir, directory=True) as tmp:
            for module in modules[1:]:  # pooling, Dense, Normalize: the base's own
                source = base / module["path"]
                if source.is_dir():
                    shutil.copytree(source, tmp / module["path"])
            st_settings = {}
            if (base / "config_sentence_transformers.json").is_file():
                st_settings = json.loads((base / "config_sentence_transformers.json").read_text(encoding="utf-8"))
            st_settings.update(prompts={}, default_prompt_name=None)  # encoded without prompts, as evaluated
            (tmp / "config_sentence_transformers.json").write_text(json.dumps(st_settings, indent=2) + "\n",
                                                                   encoding="utf-8")
            shutil.copy2(base / "modules.json", tmp / "modules.json")
            target = tmp / transformer_path
            target.mkdir(parents=True, exist_ok=True)
            body.save_pretrained(str(target), safe_serialization=True)
            _copy_unused_pooler(base / transformer_path / "model.safetensors", target / "model.safetensors")
            entry.tokenizer.save_pretrained(str(target))
            record_added_tokens(target)
            st_config = {}
            if (base / transformer_path / "sentence_bert_config.json").is_file():
                st_config = json.loads((base / transformer_path / "sentence_bert_config.json").read_text(encoding="utf-8"))
            st_config["max_seq_length"] = entry.max_seq_length
            (target / "sentence_bert_config.json").write_text(json.dumps(st_config, indent=2) + "\n", encoding="utf-8")
            (tmp / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
            if card is not None:
                (tmp / "README.md").write_text(card, encoding="utf-8")
        return out_dir


def _copy_unused_pooler(base_weights: Path, exported: Path) -> None:
    """Copy the base checkpoint's ``pooler.*`` tensors into the export. The encoder body has no
    pooler (sentence-transformers pools itself and never calls it), but ``AutoModel`` builds one and
    would report its weights as missing, newly initialised, on every load of the export."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    if not (base_weights.is_file() and exported.is_file()):
        return
    with safe_open(str(base_weights), "pt") as handle:
        pooler = {"pooler." + key.split("pooler.", 1)[1]: handle.get_tensor(key) for key in handle.keys()
                  if key.startswith("pooler.") or key.count(".pooler.") == 1 and "." not in key.split(".pooler.")[0]}
    if not pooler:
        return
    tensors = load_file(str(exported))
    if any(key.startswith("pooler.") for key in tensors):
        return
    tensors.update(pooler)
    save_file(tensors, str(exported), metadata={"format": "pt"})


def export_info(export_dir: str | Path) -> dict:
    """The ``export_info.json`` of a :meth:`ModularEncoder.export` directory (language, base model)."""
    path = Path(export_dir) / EXPORT_INFO
    if not path.is_file():
        raise InputError(f"{export_dir}: no {EXPORT_INFO}: not a ModularEncoder export")
    return json.loads(path.read_text(encoding="utf-8"))


def folded_adapter(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` is an export whose feed-forward layers carry a folded alignment
    adapter (:func:`export_info`); False for any other directory, or an unreadable record."""
    if not (Path(model_dir) / EXPORT_INFO).is_file():
        return False
    try:
        info = export_info(model_dir)
    except (OSError, ValueError):
        return False
    return bool(isinstance(info, dict) and (info.get("parallel_adapter") or {}).get("folded_into_ffn"))


def load_exported(export_dir: str | Path, device: str | None = None):
    """A :meth:`ModularEncoder.export` directory as a SentenceTransformer: what
    ``SentenceTransformer(export_dir)`` does, after checking it is an export (no custom code)."""
    from sentence_transformers import SentenceTransformer

    export_dir = Path(export_dir)
    if not (export_dir / EXPORT_INFO).is_file():
        raise InputError(f"{export_dir}: no {EXPORT_INFO}: not a ModularEncoder export")
    modules = json.loads((export_dir / "modules.json").read_text(encoding="utf-8"))
    custom = sorted({m["type"] for m in modules if not m["type"].startswith("sentence_transformers.")})
    if custom:
        raise InputError(f"{export_dir}: modules.json names module classes {custom} outside sentence-transformers")
    return SentenceTransformer(str(export_dir), device=device or "cpu")


def _counts(codes: Sequence[str]) -> list[tuple[str, int]]:
    from collections import Counter

    return Counter(codes).most_common()

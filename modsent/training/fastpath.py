"""Fewer kernels and less memory traffic for LoRA training under autocast, same parameters.

On a GPU the SE and CLA steps are bound by the CPU launching kernels and the LA step by
element-wise memory traffic, not by matrix products (benchmarks/results/README.md). Two sources
of both are in how a frozen body with PEFT's LoRA runs under bf16 autocast:

- **frozen weights cast every call.** Autocast caches its bf16 copy of a weight only for leaf
  tensors that require grad, so every frozen ``nn.Linear`` casts its fp32 weight (and bias) again
  on every forward: one extra kernel per layer and call. :func:`speed_up` gives such layers a
  forward that keeps the bf16 copy (refreshed when the weight changes, e.g. a merge) and calls
  ``F.linear`` with it. Autocast would compute exactly this: the outputs are bit-identical.
- **PEFT's LoRA branch** computes ``result + lora_B(lora_A(dropout(x))) * scaling`` with ``x``
  cast to the adapter's dtype (fp32) first: under bf16 autocast that is a cast of the
  activations to fp32, the dropout on fp32, a cast back to bf16 for ``lora_A``, then a multiply
  and an add — several full passes over the layer's input and output. The fast forward casts
  ``x`` to the autocast dtype once (shared with the base layer), applies the dropout there, and
  adds the scaled ``lora_B`` product with one ``addmm`` (``alpha`` = the scaling). Without
  autocast (fp32, the CPU) it is the same arithmetic as PEFT's up to the order of float
  additions, with the same dropout masks; under autocast the dropout draws its mask on the bf16
  activations (the same distribution; not the same draws) and the sum is rounded once instead of
  twice.

Only the vanilla case is sped up: one active adapter, not merged, adapters enabled, no DoRA or
other variant or LoRA bias, no extra forward arguments; anything else goes through PEFT's own
forward. The parameters, their names and the saved adapters are untouched; :func:`restore`
removes the fast forwards (before pickling a module: the forwards are bound methods of this
module's functions). Under ``torch.compile`` the frozen layers call ``F.linear`` as they are
and leave the casts to the compiler, so a sped-up model traces into one graph
(:func:`compile_in_place`, the LA's, SE's and CLA's ``compile`` setting). A frozen weight changed through
``.data`` (which keeps its version) needs :func:`forget_casts`; PEFT's merge and unmerge of a
sped-up layer call it. Used by the LA, SE, CLA and m-ST5 LoRA stages and InteMATs' frozen body, on every
device.

Two further fusions, :func:`fuse_projections` (one product for an attention's query, key and
value) and :func:`fuse_residual_norms` (dropout, residual add and LayerNorm compiled into one
kernel), compute the same and were measured slower on an H200 (benchmarks/results/README.md):
no stage uses them; ``benchmarks/mlm_throughput.py --fused`` times them. Triton kernels
(:mod:`modsent.training.kernels`) are the next try: :func:`fuse_lora_dropout` runs each LoRA
layer with dropout through two (an attention's query, key and value through the same two
together), and ``fuse_residual_norms(..., kernel="triton")`` each dropout,
residual add and LayerNorm through one each way, the dropout's mask drawn in registers, and
:func:`fuse_cross_entropy` the MLM loss's cross-entropy through one each way
(:func:`use_triton_kernels`: all three). They have not run on a GPU yet; the LA uses them where its
config says ``language_adapter.kernels: triton`` (off by default), and
``benchmarks/mlm_throughput.py --triton`` measures them.
"""

from __future__ import annotations

import contextlib
import threading
import types

import torch
import torch.nn.functional as F
from torch import nn

_FAST = "_modsent_fast"
_GROUP = "_modsent_group"  # on a frozen nn.Linear of fuse_projections: (its _ProjectionGroup, its index)
_KERNEL = "_modsent_lora_kernel"  # on a sped-up LoRA Linear of fuse_lora_dropout
_LORA_GROUP = "_modsent_lora_group"  # on such a layer reading one input with siblings: (its _LoRAGroup, its index)
_NORM_KERNEL = "_modsent_norm_kernel"  # on a module of fuse_residual_norms: "compiled" or "triton"
_CE_KERNEL = "_modsent_ce_kernel"  # on an MLM head of fuse_cross_entropy


def _autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    kind = x.device.type
    if kind in ("cuda", "cpu", "xpu") and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return None


def _cast_key(module: nn.Linear, dtype: torch.dtype) -> tuple:
    """What a cast of ``module``'s weight and bias to ``dtype`` stays valid for (changed through
    ``.data``, which keeps the version, it needs :func:`forget_casts`)."""
    weight, bias = module.weight, module.bias
    return (dtype, weight.device, weight.data_ptr(), weight._version,
            None if bias is None else (bias.data_ptr(), bias._version))


def _cached_weights(module: nn.Linear, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The module's weight and bias in ``dtype``, cast once and kept until either changes."""
    weight, bias = module.weight, module.bias
    key = _cast_key(module, dtype)
    cache = module.__dict__.get("_modsent_cast")
    if cache is None or cache[0] != key:
        with torch.no_grad():
            cast = (weight.to(dtype), None if bias is None else bias.to(dtype))
        module.__dict__["_modsent_cast"] = cache = (key, cast)
    return cache[1]


def forget_casts(model: nn.Module) -> None:
    """Drop the cached casts of ``model``'s frozen weights. Changes through ``.data`` do not bump a
    tensor's version, so code that changes frozen weights that way after :func:`speed_up` calls
    this (PEFT's merge and unmerge of sped-up LoRA layers do it themselves)."""
    for module in model.modules():
        module.__dict__.pop("_modsent_cast", None)
        group = module.__dict__.get(_GROUP)
        if group is not None:
            group[0].forget()


def _frozen_linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if torch.compiler.is_compiling():  # traced: the compiler fuses the casts itself, and the cache's
        return F.linear(x, self.weight, self.bias)  # Python bookkeeping would break the graph
    dtype = _autocast_dtype(x)
    group = self.__dict__.get(_GROUP)
    if group is not None and group[0].applies(x, dtype):
        return group[0].output(group[1], x, dtype)
    frozen = not self.weight.requires_grad and (self.bias is None or not self.bias.requires_grad)
    if dtype is None or not frozen or self.weight.dtype == dtype or not self.weight.is_floating_point() \
            or torch.is_inference_mode_enabled() or self.weight.is_inference():
        # (a cast kept from inference mode could not be saved for a later backward)
        return F.linear(x, self.weight, self.bias)
    weight, bias = _cached_weights(self, dtype)
    return F.linear(x, weight, bias)


def _vanilla_adapter(layer) -> str | None:
    """The one active adapter of a PEFT LoRA Linear when the fast forward applies, else None."""
    if layer.disable_adapters or layer.merged or len(layer.active_adapters) != 1:
        return None
    name = layer.active_adapters[0]
    if name not in layer.lora_A or name in getattr(layer, "lora_variant", {}) \
            or getattr(layer, "use_dora", {}).get(name, False) or getattr(layer, "lora_bias", {}).get(name, False):
        return None
    if not getattr(layer, "cast_input_dtype_enabled", True):
        return None
    return name


def _lora_linear_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    name = None if args or kwargs else _vanilla_adapter(self)
    if name is None:
        return type(self).forward(self, x, *args, **kwargs)
    lora_a, lora_b = self.lora_A[name].weight, self.lora_B[name].weight
    dtype = _autocast_dtype(x)
    if dtype is None:  # no autocast: only where PEFT would not mix dtypes either
        base_weight = getattr(self.base_layer, "weight", None)
        if not (x.dtype == lora_a.dtype == lora_b.dtype and getattr(base_weight, "dtype", x.dtype) == x.dtype):
            return type(self).forward(self, x, *args, **kwargs)
        dtype = x.dtype
    if self.__dict__.get(_KERNEL):
        out = _lora_kernel_forward(self, x, dtype)
        if out is not None:
            return out
    group = self.base_layer.__dict__.get(_GROUP)
    if group is not None and group[0].applies(x, dtype):
        result = group[0].output(group[1], x, dtype)  # its share of one product with its siblings'
        x = x.to(dtype)
    else:
        x = x.to(dtype)  # once, for the base layer and the branch (autocast would cast it for each)
        result = self.base_layer(x)
    branch = F.linear(self.lora_dropout[name](x), lora_a)
    out = torch.addmm(result.reshape(-1, result.shape[-1]), branch.reshape(-1, branch.shape[-1]),
                      lora_b.t(), alpha=self.scaling[name])
    return out.view(result.shape).to(result.dtype)


def _kernel_args(layer, x: torch.Tensor, dtype: torch.dtype) -> tuple | None:
    """(lora_a, lora_b, weight, bias, scaling, p) of a sped-up PEFT LoRA ``Linear``'s call on ``x``
    under ``dtype`` (the autocast dtype, else ``x``'s) where :mod:`modsent.training.kernels`
    apply to it (its fast forward's vanilla case, a dropout in training, not in inference mode, a
    frozen ``nn.Linear`` base not in a projection group, a device the kernels run on), else None.
    A training-mode call without gradients takes the kernels too: reentrant activation
    checkpointing runs the forward so first and again with gradients, and both must draw the same
    mask (the seeds come from PyTorch's CPU generator, whose state checkpointing restores)."""
    from modsent.training import kernels

    name = _vanilla_adapter(layer) if layer.__dict__.get(_FAST) else None
    if name is None:
        return None
    lora_a, lora_b = layer.lora_A[name].weight, layer.lora_B[name].weight
    dropout, base = layer.lora_dropout[name], layer.base_layer
    if not (isinstance(dropout, nn.Dropout) and dropout.training and dropout.p > 0) \
            or torch.is_inference_mode_enabled() or x.is_inference() \
            or type(base) is not nn.Linear or base.weight.requires_grad \
            or (base.bias is not None and base.bias.requires_grad) or _GROUP in base.__dict__ \
            or not base.weight.is_floating_point() or base.weight.is_inference() or not kernels.supported(x):
        return None
    if _autocast_dtype(x) is None and not (x.dtype == dtype == lora_a.dtype == lora_b.dtype == base.weight.dtype):
        return None  # no autocast: only where PEFT would not mix dtypes either
    if base.weight.dtype == dtype:
        weight, bias = base.weight, base.bias
    else:
        weight, bias = _cached_weights(base, dtype)
    return lora_a, lora_b, weight, bias, layer.scaling[name], dropout.p


def _lora_kernel_forward(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """The layer through :func:`modsent.training.kernels.lora_linear` where it applies
    (:func:`_kernel_args`), or its share of :func:`modsent.training.kernels.lora_linears` with its
    siblings reading the same input (:class:`_LoRAGroup`), else None."""
    from modsent.training import kernels

    if torch.compiler.is_compiling():  # a compiled trace: the fast forward (first: no guard on what follows)
        return None
    group = self.__dict__.get(_LORA_GROUP)
    if group is not None:
        out = group[0].output(group[1], x, dtype)
        if out is not None:
            return out
    args = _kernel_args(self, x, dtype)
    return None if args is None else kernels.lora_linear(x.to(dtype), *args)


class _SharedInput:
    """Outputs of layers that read one input, computed together by the first of them called: each
    sibling takes its own when it is called with the same input (the same tensor, unchanged, in
    the same grad mode and dtype), once; any other call finds nothing waiting."""

    pending = None  # (the input, (its version, dtype, grad mode), [outputs not yet taken])

    def _take(self, index: int, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        pending, self.pending = self.pending, None
        if pending is None or pending[0] is not x or pending[2][index] is None \
                or pending[1] != (x._version, dtype, torch.is_grad_enabled()):
            return None
        out, pending[2][index] = pending[2][index], None
        if any(o is not None for o in pending[2]):
            self.pending = pending
        return out

    def _keep(self, index: int, x: torch.Tensor, dtype: torch.dtype, outs: list) -> torch.Tensor:
        """``outs[index]``, the others left waiting for their layers."""
        out, outs[index] = outs[index], None
        self.pending = (x, (x._version, dtype, torch.is_grad_enabled()), outs)
        return out


class _LoRAGroup(_SharedInput):
    """Sped-up PEFT LoRA ``Linear`` layers with kernels that read one input (an attention's
    query, key and value): inside the attention's forward, the first of them called computes all
    their outputs through :func:`modsent.training.kernels.lora_linears` (one kernel reads the input
    for every branch, and one writes the input's gradient once), and each sibling takes its output
    when it is called with the same input (the same tensor, unchanged, in the same grad mode and
    dtype). Outputs wait only between the hooks on the attention's forward (before it and after
    it, even when it raises): nothing outlives the call, so no optimizer step, copy or other
    module can meet a waiting output. A call on another input computes the group afresh on it; a
    call outside that forward, a sibling the kernels do not apply to, or other dropout
    probabilities or ranks run each layer alone (turning a layer's kernels off ends its group)."""

    def __init__(self, layers: list, attention: nn.Module):
        self.layers = layers
        self.open = False  # inside the attention's forward
        self.hooks = (attention.register_forward_pre_hook(self.begin),
                      attention.register_forward_hook(self.end, always_call=True))

    def begin(self, *_) -> None:
        self.open, self.pending = True, None

    def end(self, *_) -> None:
        self.open, self.pending = False, None

    def detach(self) -> None:
        self.end()
        for hook in self.hooks:
            hook.remove()

    def output(self, index: int, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        from modsent.training import kernels

        if not self.open or x.is_inference():  # (an inference tensor has no version counter)
            return None
        out = self._take(index, x, dtype)
        if out is not None:
            return out
        args = [_kernel_args(layer, x, dtype) for layer in self.layers]
        if any(a is None for a in args) or len({a[5] for a in args}) != 1 \
                or len({tuple(a[0].shape) for a in args}) != 1:
            return None
        return self._keep(index, x, dtype, list(kernels.lora_linears(x.to(dtype), [a[:5] for a in args], args[0][5])))


def fuse_lora_dropout(model: nn.Module, on: bool = True, shared_input: bool = True) -> int:
    """Run each sped-up PEFT LoRA ``Linear`` of ``model`` whose dropout is on through
    :func:`modsent.training.kernels.lora_linear` (``on=False`` undoes it); returns how many
    layers changed. After :func:`speed_up`. On a GPU with Triton: the dropout's mask is drawn
    inside the branch's products (two Triton kernels), so no dropped copy of the input, no mask
    and no input-sized gradient of the branch is written or kept, and the branch's gradient is
    added to the input's in the same pass. With ``shared_input`` the LoRA layers among an
    attention's query, key and value (which read one input) run together through
    :func:`modsent.training.kernels.lora_linears` (:class:`_LoRAGroup`): one read of the input
    forward for the three branches, and one pass over the input's gradient backward, into which
    cuBLAS sums the three base products' gradients (where each layer alone reads the input and
    writes its own gradient, and autograd adds those). The same function of the same parameters;
    the dropout draws from its own Philox stream seeded from PyTorch's CPU generator (the same
    distribution, ``p`` rounded to 1/65,536; not PEFT's draws). Where it does not apply
    (evaluation, inference mode, a compiled trace, the CPU without Triton's interpreter, a
    projection group of :func:`fuse_projections`) the layer runs the fast forward as before.
    Grouped layers run together only inside their attention's forward; called outside it, each
    runs alone.
    Parameters, their names and the saved adapters are untouched. Returns how many layers'
    kernels were turned on or off (a change of ``shared_input`` alone regroups them and counts 0).
    Grouped are the BERT family's attentions (``query``, ``key``, ``value``: the LA's bases).

    ``language_adapter.kernels: triton`` uses it (:func:`use_triton_kernels`; off by default: it has
    not run on a GPU yet). ``benchmarks/mlm_throughput.py --triton`` measures it beside the eager step."""
    from peft.tuners.lora import Linear as LoraLinear

    changed = 0
    for module in model.modules():
        if not isinstance(module, LoraLinear) or not module.__dict__.get(_FAST):
            continue
        if on and not module.__dict__.get(_KERNEL):
            module.__dict__[_KERNEL] = True
            changed += 1
        elif not on and module.__dict__.pop(_KERNEL, False):
            changed += 1
    for module in model.modules():
        _ungroup(module)
    if on and shared_input:
        for module in model.modules():
            # its own children only (a PeftModel forwards attribute lookups to the model it wraps)
            layers = [module._modules.get(name) for name in ("query", "key", "value")]
            layers = [layer for layer in layers if isinstance(layer, LoraLinear) and layer.__dict__.get(_KERNEL)]
            if len(layers) > 1:
                group = _LoRAGroup(layers, module)
                for index, layer in enumerate(layers):
                    layer.__dict__[_LORA_GROUP] = (group, index)
    return changed


def _ungroup(module: nn.Module) -> None:
    group = module.__dict__.pop(_LORA_GROUP, None)
    if group is not None:
        group[0].detach()


def _merge(self, *args, **kwargs):
    """PEFT's merge, then the base weight's cached cast is dropped (it changed through .data)."""
    try:
        return type(self).merge(self, *args, **kwargs)
    finally:
        forget_casts(self)


def _unmerge(self, *args, **kwargs):
    try:
        return type(self).unmerge(self, *args, **kwargs)
    finally:
        forget_casts(self)


def speed_up(model: nn.Module) -> int:
    """Give every PEFT LoRA ``Linear`` in ``model`` the fast forward and every frozen
    ``nn.Linear`` the cached-cast forward (module docstring); return how many modules changed.
    Idempotent. Call it once the model has every adapter it will have: a LoRA layer that PEFT
    puts around a sped-up ``Linear`` later merges through PEFT's own ``merge``, which changes
    the weight through ``.data`` without dropping its cached cast (call it again after adding
    adapters: each LoRA layer then gets the merge that does)."""
    from peft.tuners.lora import Linear as LoraLinear

    changed = 0
    branches = {id(sub) for module in model.modules() if isinstance(module, LoraLinear)
                for part in (module.lora_A, module.lora_B) for sub in part.values()}
    for module in model.modules():
        if module.__dict__.get(_FAST) or id(module) in branches:
            continue
        if isinstance(module, LoraLinear):
            module.forward = types.MethodType(_lora_linear_forward, module)
            module.merge = types.MethodType(_merge, module)
            module.unmerge = types.MethodType(_unmerge, module)
        elif type(module) is nn.Linear:
            module.forward = types.MethodType(_frozen_linear_forward, module)
        else:
            continue
        module.__dict__[_FAST] = True
        changed += 1
    return changed


def restore(model: nn.Module) -> None:
    """Undo :func:`speed_up`: every module it changed runs its class's forward again (what
    :func:`bf16_residual_stream` changed stays: ``bf16_residual_stream(model, False)`` undoes it)."""
    for module in model.modules():
        _ungroup(module)
        if module.__dict__.pop(_FAST, False):
            for name in ("forward", "merge", "unmerge", "_modsent_cast", _GROUP, _KERNEL):
                module.__dict__.pop(name, None)


def check_compilable(device: str | torch.device, key: str) -> None:
    """Raise :class:`modsent.io.InputError` naming the config ``key`` unless ``torch.compile``
    can generate code for ``device`` here: Triton for CUDA (in PyTorch's CUDA wheels), a C++
    compiler for the CPU. Called before any training work, not at the first forward."""
    from modsent.io import InputError

    kind = torch.device(device).type
    problem = None
    if not torch._dynamo.is_dynamo_supported():
        problem = f"torch.compile does not support this Python ({torch.__version__})"
    elif kind == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            problem = "torch.compile on CUDA needs Triton, which this PyTorch install lacks"
    elif kind == "cpu":
        from torch._inductor import cpp_builder

        try:
            cpp_builder.get_cpp_compiler()
        except Exception as error:  # noqa: BLE001 - its message says what it looked for
            problem = f"torch.compile on the CPU needs a C++ compiler ({error})"
    else:
        problem = f"modsent does not compile for {kind} devices"
    if problem:
        raise InputError(f"{key}: true, but {problem}; set {key}: false")


def check_kernels(device: str | torch.device, key: str) -> bool:
    """Whether modsent's Triton kernels (:mod:`modsent.training.kernels`) run on ``device``: a
    CUDA device with Triton, or the CPU under Triton's interpreter (the tests); False elsewhere
    (the CPU: the eager layers run, nothing is missing). Raises :class:`modsent.io.InputError`
    naming the config ``key`` for a CUDA device without Triton. Called before any training work."""
    from modsent.io import InputError
    from modsent.training import kernels

    runs = kernels.runs_on(device)
    if not runs and torch.device(device).type == "cuda":
        problem = ("this PyTorch install has no Triton" if not kernels.triton_available()
                   else "TRITON_INTERPRET=1 runs Triton's kernels on the CPU")
        raise InputError(f"{key}: triton, but {problem}; install PyTorch's CUDA wheels (which bring "
                         f"Triton) or set {key}: eager")
    return runs


def use_triton_kernels(model: nn.Module, on: bool = True, mlm_head: nn.Module | None = None) -> tuple[int, int, int]:
    """All of :mod:`modsent.training.kernels`' kernels in ``model`` (after :func:`speed_up`;
    ``on=False`` undoes it): each LoRA layer's dropout (:func:`fuse_lora_dropout`), each
    dropout + residual add + LayerNorm (:func:`fuse_residual_norms` with ``kernel="triton"``) and,
    given the model's MLM head (``mlm_head``: :func:`modsent.losses.mlm_parts`), its loss's
    cross-entropy (:func:`fuse_cross_entropy`). Returns how many of each changed. Where a kernel
    does not apply (for the LoRA layers and norms: evaluation, inference mode, a trained norm or
    base layer; for all three: a compiled trace, a device without the kernels) the layer runs as
    before (the loss's kernel runs in evaluation too: it draws nothing); parameters and saved
    adapters are untouched."""
    return (fuse_lora_dropout(model, on), fuse_residual_norms(model, on=on, kernel="triton"),
            0 if mlm_head is None else fuse_cross_entropy(mlm_head, on))


def fuse_cross_entropy(head: nn.Module, on: bool = True) -> int:
    """Compute the loss of the MLM head ``head`` (:class:`modsent.losses.MaskedLanguageModelingLoss`
    of a model whose head it is, :func:`modsent.losses.mlm_parts`; MEXMA's
    :class:`modsent.losses.CrossUnmaskingLoss` given it) with
    :func:`modsent.training.kernels.cross_entropy` (``on=False`` undoes it); returns 1 if that
    changed, else 0. The same loss and gradient in
    fp32 from the head's bf16 logits, without eager's fp32 copy of them, its log-softmax output and
    the loss's dense fp32 gradient: one read of the logits forward, one read and one write
    backward. Where the kernel does not apply (a compiled trace, a device without the kernels) the
    loss is computed as before (:func:`mlm_cross_entropy`). Not measured on a GPU yet;
    ``language_adapter.kernels: triton`` and ``methods.MEXMA*.kernels: triton`` use it."""
    if bool(head.__dict__.get(_CE_KERNEL)) == on:
        return 0
    if on:
        head.__dict__[_CE_KERNEL] = True
    else:
        del head.__dict__[_CE_KERNEL]
    return 1


def mlm_cross_entropy(head: nn.Module | None, logits: torch.Tensor, targets: torch.Tensor,
                      reduction: str) -> torch.Tensor:
    """The cross-entropy of ``head``'s ``logits`` (rows) against ``targets``, averaged or summed over
    the rows (``reduction``), in fp32: through :func:`modsent.training.kernels.cross_entropy` where
    :func:`fuse_cross_entropy` turned it on for ``head`` and the kernel runs on the logits' device
    (not in a compiled trace), else (also for no ``head``) eager's ``F.cross_entropy`` of the
    logits in fp32."""
    _check_reduction("mlm_cross_entropy", reduction)
    if cross_entropy_kernel(head, logits):
        from modsent.training import kernels

        return _reduce(kernels.cross_entropy(logits, targets), targets, reduction)
    return F.cross_entropy(logits.float(), targets, reduction=reduction)


def cross_entropy_kernel(head: nn.Module | None, x: torch.Tensor) -> bool:
    """Whether ``head``'s loss runs Triton's cross-entropy on ``x``'s device now:
    :func:`fuse_cross_entropy` marked it, the kernels run there and no compiled trace is being
    made."""
    if head is None or not head.__dict__.get(_CE_KERNEL) or torch.compiler.is_compiling():
        return False
    from modsent.training import kernels

    return kernels.supported(x)


def _check_reduction(caller: str, reduction: str) -> None:
    if reduction not in ("mean", "sum"):
        raise ValueError(f"{caller}: reduction {reduction!r}, expected 'mean' or 'sum'")


def _reduce(losses: torch.Tensor, targets: torch.Tensor, reduction: str) -> torch.Tensor:
    # a mean over the rows that count (all of them in an MLM loss), as eager's ignores -100
    return losses.sum() if reduction == "sum" else losses.sum() / (targets != -100).sum()


def projection_cross_entropy(head: nn.Module | None, states: torch.Tensor, weight: torch.Tensor,
                             bias: torch.Tensor | None, targets: torch.Tensor, reduction: str,
                             chunk_rows: int) -> torch.Tensor:
    """:func:`mlm_cross_entropy` of the logits ``F.linear(states, weight, bias)``, computed
    ``chunk_rows`` rows at a time and never kept (:func:`modsent.training.vocab_loss.linear_cross_entropy`:
    the backward computes each chunk's logits again), each chunk's cross-entropy through Triton's
    kernel where :func:`cross_entropy_kernel` says so for ``head``."""
    _check_reduction("projection_cross_entropy", reduction)
    from modsent.training.vocab_loss import linear_cross_entropy

    losses = linear_cross_entropy(states, weight, bias, targets, chunk_rows,
                                  kernel=cross_entropy_kernel(head, states))
    return _reduce(losses, targets, reduction)


# the attention implementation attention_outside_graph names (modsent.tokenizing treats it as "sdpa")
OUTSIDE_GRAPH_ATTENTION = "modsent_sdpa_outside_graph"


def attention_outside_graph(model: nn.Module, on: bool = True) -> bool:
    """Keep ``model``'s attention out of ``torch.compile``'s graphs (``on=False`` undoes it);
    returns whether the model's attention changed (only transformers' ``"sdpa"`` does).

    The model's config then names an attention function registered with transformers'
    ``AttentionInterface`` that is its SDPA function under ``torch.compiler.disable``: a compiled
    encoder breaks its graph around each attention call, which runs as in eager mode (PyTorch's
    choice of kernel, as the eager step's), while Inductor still fuses the element-wise work
    between the matrix products (dropout, residual adds, LayerNorm, GELU, the LoRA branches).
    The masks are built as for ``"sdpa"``. Eager runs do exactly what ``"sdpa"`` does."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if OUTSIDE_GRAPH_ATTENTION not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(OUTSIDE_GRAPH_ATTENTION, torch.compiler.disable(ALL_ATTENTION_FUNCTIONS["sdpa"]))
        AttentionMaskInterface.register(OUTSIDE_GRAPH_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    wanted, other = (OUTSIDE_GRAPH_ATTENTION, "sdpa") if on else ("sdpa", OUTSIDE_GRAPH_ATTENTION)
    if current != other:
        return False
    config._attn_implementation = wanted
    return True


def compile_in_place(module: nn.Module, device: str | torch.device, key: str, *,
                     dynamic: bool | None = False, eager_random: bool = False) -> None:
    """``torch.compile`` ``module`` in place (``nn.Module.compile``: its parameters, their names,
    its state dict and so the checkpoints and saved adapters are unchanged). ``dynamic=False``
    (static shapes: one graph per batch shape and mode; the LA's packed sequences have one
    shape) or None (torch.compile's default: a second shape recompiles the graph with symbolic
    sizes, so the pair stages' batches, padded to their longest sentence, share it). After
    :func:`speed_up`: the fast path traces into one graph. Inductor
    fuses the element-wise work around the matrix products (the LA's autocast residual stream,
    LayerNorm, GELU, dropout) into fewer kernels; its dropout draws from its own generator, so
    a compiled run equals an eager one up to float rounding and dropout draws (with
    ``torch._inductor.config.fallback_random`` it draws as eager: the tests compare so).

    ``eager_random``: this module's graphs draw their random numbers with eager PyTorch's kernels
    (Inductor's ``fallback_random`` as a compile option, for these graphs only), for a module whose
    layers are checkpointed: AOTAutograd runs them again in the backward from the random state their
    forward saved, which gives the same dropout with eager's kernels (tested), where Inductor's own
    CUDA draws can differ between a forward kernel and the backward's recomputing one in torch 2.13
    (pytorch/pytorch#198333). The dropout then runs as kernels of its own, not fused."""
    check_compilable(device, key)
    module.compile(dynamic=dynamic, **({"options": {"fallback_random": True}} if eager_random else {}))


_CUDNN_LOCK = threading.Lock()
_cudnn_holders = 0  # blocks inside attention_for_varying_shapes, on every thread
_cudnn_before = True  # the setting the first of them found


@contextlib.contextmanager
def attention_for_varying_shapes():
    """Scaled dot-product attention without cuDNN's kernel while the block runs (also a decorator,
    of functions, not generators, whose body would run after the setting came back), for work
    whose batch shapes vary: the pair stages, the full baselines, the methods, every encoding
    pass (:func:`modsent.training.loop.encode_in_batches`), DuEAM's word mover's distance pass
    and the transformers translation engine (each decoding step attends over one more position).

    PyTorch prefers cuDNN's fused attention on Hopper GPUs (H100, H200), and cuDNN builds an
    execution plan for each new shape, forward and backward. On an H200 the first step of each
    new batch shape took 1.0 s (SE) and 2.8 s (CLA) more than a steady step of 60-70 ms
    (benchmarks/results/pair_throughput_graphs_h200.txt), and these steps meet hundreds of
    shapes in a run: their batches are padded to their longest sentence and carry a varying
    number of hard negatives. Without cuDNN, SDPA takes flash attention (no padding) or the
    memory-efficient kernel (a padding mask), which build no plans: the same attention up to
    float rounding. The LA's packed sequences have one shape and keep PyTorch's choice. The
    setting is process-wide (``torch.backends.cuda.enable_cudnn_sdp``): it is off while any
    thread is inside such a block, and the last block to end, nested or on another thread,
    gives back what the first found, also when the work fails. It changes nothing off CUDA."""
    global _cudnn_holders, _cudnn_before
    with _CUDNN_LOCK:
        if _cudnn_holders == 0:
            _cudnn_before = torch.backends.cuda.cudnn_sdp_enabled()
            torch.backends.cuda.enable_cudnn_sdp(False)
        _cudnn_holders += 1
    try:
        yield
    finally:
        with _CUDNN_LOCK:
            _cudnn_holders -= 1
            if _cudnn_holders == 0:
                torch.backends.cuda.enable_cudnn_sdp(_cudnn_before)


def _layer_norm_in_bf16(self, x: torch.Tensor) -> torch.Tensor:
    """LayerNorm that returns bf16 under bf16 autocast (autocast runs it in fp32 and returns fp32);
    the kernel still accumulates its statistics in fp32. Anything else: the module's own forward."""
    if _autocast_dtype(x) != torch.bfloat16:
        return nn.LayerNorm.forward(self, x)
    with torch.autocast(x.device.type, enabled=False):
        return F.layer_norm(x.to(torch.bfloat16), self.normalized_shape,
                            None if self.weight is None else self.weight.to(torch.bfloat16),
                            None if self.bias is None else self.bias.to(torch.bfloat16), self.eps)


def bf16_residual_stream(model: nn.Module, on: bool = True) -> int:
    """Run ``model``'s residual stream in bf16 under bf16 autocast (``on=False`` undoes it); returns
    the number of LayerNorms changed (0 when they already were as asked).

    Under autocast every LayerNorm computes and returns fp32, so the residual stream between the
    matrix products (its adds, dropouts and the casts to and from bf16 around every product) moves
    fp32 tensors: the element-wise traffic that bounds the LA step on a GPU
    (benchmarks/results/README.md). Each LayerNorm returning bf16 halves those bytes: the LA step
    ran 1.19x faster on an H200 (626K against 524K tokens/s, mlm_throughput_compiled_h200.txt).
    The body then runs as one held in bf16 does: other numerics than the method's autocast (the
    stream's values rounded to bf16 at every layer), which is why it is a setting of its own
    (``language_adapter.residual_stream``). Without bf16 autocast (fp32, fp16, the CPU) nothing
    changes. Parameters, state dict and saved adapters are untouched."""
    changed = 0
    for module in model.modules():
        if not isinstance(module, nn.LayerNorm):
            continue
        forward = module.__dict__.get("forward")
        ours = getattr(forward, "__func__", None) is _layer_norm_in_bf16
        if on and not ours:
            module.forward = types.MethodType(_layer_norm_in_bf16, module)
            changed += 1
        elif not on and ours:
            del module.__dict__["forward"]  # only the forward set here; another one stays
            changed += 1
    return changed


# the transformers classes whose forward is ``LayerNorm(dropout(dense(hidden_states)) + input_tensor)``
_RESIDUAL_OUTPUTS = frozenset({"BertSelfOutput", "BertOutput", "RobertaSelfOutput", "RobertaOutput",
                               "XLMRobertaSelfOutput", "XLMRobertaOutput"})
_fused_norm_function = None


def _dropout_add_norm(hidden: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                      bias: torch.Tensor | None, eps: float, p: float, out_dtype: torch.dtype) -> torch.Tensor:
    """``LayerNorm(dropout(hidden) + residual)`` computed in fp32 and returned as ``out_dtype``:
    what the module computes under autocast (the sum in the inputs' promoted dtype, the norm in
    fp32), for Inductor to make one kernel of forward and one of backward."""
    x = F.dropout(hidden, p, training=p > 0) + residual
    shape = (x.shape[-1],)
    return F.layer_norm(x.float(), shape, None if weight is None else weight.float(),
                        None if bias is None else bias.float(), eps).to(out_dtype)


def _fused_norm():
    global _fused_norm_function
    if _fused_norm_function is None:  # default dynamic: a second shape recompiles once, with symbolic sizes
        _fused_norm_function = torch.compile(_dropout_add_norm)
    return _fused_norm_function


def _fused_output_forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
    hidden = self.dense(hidden_states)
    norm = self.LayerNorm
    if torch.compiler.is_compiling() or torch.is_inference_mode_enabled() \
            or not (torch.is_grad_enabled() or self.dropout.training and self.dropout.p > 0):
        # inside a compiled encoder: the module's own ops, fused there; evaluation and encoding
        # (inference mode, or no gradients and no dropout): the module's own ops too, no graph
        # compiled for each such shape. A dropout in training without gradients (reentrant
        # activation checkpointing's first forward, recomputed with them) draws as with them:
        # the same masks both times.
        return norm(self.dropout(hidden) + input_tensor)
    dtype = _autocast_dtype(hidden)
    if dtype == torch.bfloat16 and getattr(norm.forward, "__func__", None) is _layer_norm_in_bf16:
        out_dtype = torch.bfloat16  # bf16_residual_stream: the norm returns bf16
    elif dtype is not None:
        out_dtype = torch.float32  # autocast runs LayerNorm in fp32 and returns fp32
    else:
        out_dtype = torch.promote_types(hidden.dtype, input_tensor.dtype)
    p = self.dropout.p if self.dropout.training else 0.0
    if self.__dict__.get(_NORM_KERNEL) == "triton":
        from modsent.training import kernels

        frozen = all(param is None or not param.requires_grad for param in (norm.weight, norm.bias))
        if not (frozen and hidden.shape == input_tensor.shape and kernels.supported(hidden)):
            return norm(self.dropout(hidden) + input_tensor)
        # the weights the module's norm computes with: cast to bf16 by the bf16 stream's LayerNorm
        weight, bias = ((None if t is None else t.to(out_dtype)) if out_dtype == torch.bfloat16 else t
                        for t in (norm.weight, norm.bias))
        return kernels.dropout_add_norm(hidden, input_tensor, weight, bias, norm.eps, float(p), out_dtype)
    with torch.autocast(hidden.device.type, enabled=False):
        return _fused_norm()(hidden, input_tensor, norm.weight, norm.bias, norm.eps, float(p), out_dtype)


def fuse_residual_norms(model: nn.Module, device: str | torch.device | None = None, key: str | None = None,
                        on: bool = True, kernel: str = "compiled") -> int:
    """Make each ``dropout → add the residual → LayerNorm`` after an attention output and a
    feed-forward output one compiled function (``on=False`` undoes it); returns how many modules
    changed. Only these element-wise steps are compiled (``torch.compile`` of a small function:
    no matrix product or attention kernel changes, unlike compiling the encoder whole), so
    Inductor writes one kernel for the three steps' forward and one for their backward: the
    residual stream's tensors are read and written once instead of three times, with one launch
    instead of three to six. The sum and the norm are computed as under autocast (fp32 norm; with
    :func:`bf16_residual_stream` a bf16 output, from the unrounded sum); the dropout draws from
    Inductor's generator (the same distribution, seeded from PyTorch's: a run stays reproducible).
    ``device`` and ``key`` as for :func:`compile_in_place` (refused, naming ``key``, where nothing
    compiles). Modules of other classes are left as they are. Parameters, state dict and saved
    adapters are untouched; inside a compiled encoder, in inference mode and without gradients
    and dropout (evaluation), the module's own forward runs (a dropout in training without
    gradients, as reentrant checkpointing's first forward, takes the fused one as with them).

    No stage uses it: on an H200 the LA step ran 0.84x as fast with it (mlm_fused_h200.txt; the
    in-kernel dropout draws are slower than eager's, and each compiled call costs the host more
    than the launches it saves). ``benchmarks/mlm_throughput.py --fused`` measures it beside the
    eager step, for GPUs whose memory bandwidth weighs differently.

    ``kernel="triton"``: the three steps are instead one Triton kernel each way
    (:func:`modsent.training.kernels.dropout_add_norm`: the dropout's mask drawn in registers, eight
    draws a Philox call, and drawn again in the backward; only the sum and each row's mean and 1/std
    kept; rounded as the eager steps round), on a GPU (or the CPU in Triton's interpreter), for a
    norm whose weight and bias are frozen, as in the LA; elsewhere the module's own ops run. No
    compiler needed, ``device`` and ``key`` not needed. Not measured on a GPU yet; ``language_adapter.kernels:
    triton`` uses it (:func:`use_triton_kernels`), ``benchmarks/mlm_throughput.py --triton`` measures it."""
    if kernel not in ("compiled", "triton"):
        raise ValueError(f"fuse_residual_norms: kernel {kernel!r}, expected 'compiled' or 'triton'")
    if on and kernel == "compiled":
        if device is None or key is None:
            raise ValueError("fuse_residual_norms: the compiled kind needs the device and the config key")
        check_compilable(device, key)
    changed = 0
    for module in model.modules():
        if type(module).__name__ not in _RESIDUAL_OUTPUTS or not isinstance(getattr(module, "LayerNorm", None), nn.LayerNorm) \
                or not isinstance(getattr(module, "dropout", None), nn.Dropout):
            continue
        ours = getattr(module.__dict__.get("forward"), "__func__", None) is _fused_output_forward
        if on and (not ours or module.__dict__.get(_NORM_KERNEL, "compiled") != kernel):
            module.forward = types.MethodType(_fused_output_forward, module)
            module.__dict__[_NORM_KERNEL] = kernel
            changed += 1
        elif not on and ours:
            del module.__dict__["forward"]
            module.__dict__.pop(_NORM_KERNEL, None)
            changed += 1
    return changed


class _ProjectionGroup(_SharedInput):
    """Frozen ``nn.Linear`` layers that read one input (an attention's query, key and value): the
    first of them called computes all their outputs with one matrix product of their weights
    side by side (cast once to the autocast dtype, kept until a weight changes, as
    :func:`_cached_weights`), and each gets its columns; the others take theirs when they are
    called with the same input (the same tensor, unchanged, in the same grad mode and dtype),
    anything else computes afresh."""

    def __init__(self, linears: list[nn.Linear]):
        self.linears = linears
        self.sizes = [linear.out_features for linear in linears]
        self.cache = None  # (key, weight, bias)

    def forget(self) -> None:
        self.cache = self.pending = None

    def applies(self, x: torch.Tensor, dtype: torch.dtype | None) -> bool:
        if torch.compiler.is_compiling() or torch.is_inference_mode_enabled():
            return False
        for linear in self.linears:
            weight, bias = linear.weight, linear.bias
            if weight.requires_grad or (bias is not None and bias.requires_grad) or weight.is_inference() \
                    or not weight.is_floating_point() or weight.device != x.device \
                    or (dtype is None and weight.dtype != x.dtype):
                return False
        return True

    def _weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
        key = tuple(_cast_key(linear, dtype) for linear in self.linears)
        if self.cache is None or self.cache[0] != key:
            with torch.no_grad():
                weight = torch.cat([linear.weight.to(dtype) for linear in self.linears])
                bias = None if all(linear.bias is None for linear in self.linears) else torch.cat(
                    [linear.bias.to(dtype) if linear.bias is not None else
                     torch.zeros(linear.out_features, dtype=dtype, device=linear.weight.device)
                     for linear in self.linears])
            self.cache = (key, weight, bias)
        return self.cache[1], self.cache[2]

    def output(self, index: int, x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
        dtype = dtype or x.dtype
        out = self._take(index, x, dtype)
        if out is not None:
            return out
        weight, bias = self._weights(dtype)
        return self._keep(index, x, dtype, list(F.linear(x.to(dtype), weight, bias).split(self.sizes, dim=-1)))


def fuse_projections(model: nn.Module, on: bool = True) -> int:
    """Give each attention's frozen query, key and value projections (``nn.Linear`` layers, or the
    base layers of PEFT LoRA layers) one matrix product instead of three (``on=False`` undoes
    it); returns how many attentions changed. After :func:`speed_up`, which routes the frozen
    layers (and the LoRA layers' base layers) through :class:`_ProjectionGroup`.

    Three products of a 768-wide input by 768x768 weights seemed to run at 46% of an H200's bf16
    peak where the feed-forward's 768x3072 ran at 71% (profile_la_compiled_h200.txt); one
    768x2304 product was meant to run near the latter, its backward one product instead of three
    and the sums of their input gradients. The same weights, the same arithmetic per output column
    (up to the matrix kernel's order of additions); LoRA branches, dropouts and trainable
    projections stay as they are, and a projection that is trained, merged into (its cached
    weights are dropped: :func:`forget_casts`) or called on another input computes alone.

    No stage uses it: on an H200 the products took no less time this way and the LA step ran
    0.98x as fast (mlm_fused_h200.txt); ``benchmarks/mlm_throughput.py --fused`` measures it."""
    from peft.tuners.lora import Linear as LoraLinear

    changed = 0
    for module in model.modules():
        parts = [getattr(module, name, None) for name in ("query", "key", "value")]
        if any(part is None for part in parts):
            continue
        linears = [part.base_layer if isinstance(part, LoraLinear) else part for part in parts]
        if any(type(linear) is not nn.Linear for linear in linears) \
                or len({linear.in_features for linear in linears}) != 1:
            continue
        grouped = all(_GROUP in linear.__dict__ for linear in linears)
        if on and not grouped:
            group = _ProjectionGroup(linears)
            for index, linear in enumerate(linears):
                linear.__dict__[_GROUP] = (group, index)
            changed += 1
        elif not on and any(_GROUP in linear.__dict__ for linear in linears):
            for linear in linears:
                linear.__dict__.pop(_GROUP, None)
            changed += 1
    return changed

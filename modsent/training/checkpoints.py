"""Resumable training checkpoints, one format for every stage.

A checkpoint is a directory ``{output}.checkpoint`` beside the output it leads to (not inside:
Snakemake removes an incomplete output before a rerun): ``state.safetensors`` with the
trainable tensors, the AdamW moments and the torch RNG states (the CPU's, and the current GPU's
where CUDA runs), and ``meta.json`` with the step,
the fingerprint of what was being trained, the stage's progress (losses, history, ...) and,
when fp16 runs, the loss scaler's state (modsent.training.precision).
It is written atomically and resumed only when its fingerprint matches, so a checkpoint of
other settings or other inputs is never continued.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from pathlib import Path

import pandas as pd
import torch

from modsent.io import atomic_path

log = logging.getLogger(__name__)

STATE = "state.safetensors"
META = "meta.json"
# The trainers' settings that say how a run goes, not what it trains (modsent.config's
# `x-role: runtime` among them): left out of fingerprints, so a checkpoint resumes whatever they are.
# Matched by name in every trainer's settings: a method's key of one of these names is one of them
RUNTIME_SETTINGS = ("checkpoint_every", "log_every", "compile", "kernels", "loss_chunk_rows", "gradient_checkpointing")
# The settings that say how the result is saved, not how it trains: left out of fingerprints too
OUTPUT_SETTINGS = ("storage_dtype",)


@functools.cache
def later_defaults() -> dict:
    """Settings added after checkpoints existed, each with the default the earlier code trained
    with: left out of fingerprints at it, so that an interrupted run's checkpoint still resumes
    after an upgrade. They are the keys the workflow schema marks ``x-omit-default`` (left out
    of the rules' params at their default for the same reason; the recipes' settings take theirs
    from its ``$defs``), so one mark in the schema says both. A key is matched by its name, in
    every section: a later key must have one default wherever it is marked (checked here)."""
    from modsent.schema import OMIT_DEFAULT_KEY, load_schema

    found: dict = {}

    def walk(node):
        if isinstance(node, dict):
            for group in ("properties", "$defs"):
                for name, prop in (node.get(group) or {}).items():
                    if isinstance(prop, dict) and prop.get(OMIT_DEFAULT_KEY) and "default" in prop:
                        if name in found and found[name] != prop["default"]:
                            raise ValueError(f"schema: x-omit-default key {name!r} has two defaults, "
                                             f"{found[name]!r} and {prop['default']!r}")
                        found[name] = prop["default"]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(load_schema())
    return found


def at_later_default(key: str, value) -> bool:
    """Whether ``key`` is a setting added later (:func:`later_defaults`) at its earlier default."""
    defaults = later_defaults()
    return key in defaults and value == defaults[key]


def checkpoint_path(out_dir: str | Path) -> Path:
    """Where the checkpoints of the training that writes ``out_dir`` live: ``{out}.checkpoint``."""
    out_dir = Path(out_dir)
    return out_dir.with_name(out_dir.name + ".checkpoint")


def trainable_state(model) -> dict[str, torch.Tensor]:
    """Every trainable tensor by name, shared (tied) tensors once."""
    state, seen = {}, set()
    for name, param in model.named_parameters():
        if param.requires_grad and id(param) not in seen:
            seen.add(id(param))
            state[name] = param.detach()
    return state


def save_checkpoint(path: Path, model, optimizer, step: int, fingerprint: str, progress, scaler=None) -> None:
    """Trainable weights, AdamW moments, the torch RNG states (safetensors) and ``step``,
    ``fingerprint``, ``progress`` and an enabled ``scaler``'s state (JSON), written atomically
    to directory ``path``."""
    from safetensors.torch import save_file

    params = trainable_state(model)
    tensors = {f"param/{k}": v.contiguous() for k, v in params.items()}
    by_id = {id(p): n for n, p in model.named_parameters()}
    for param, state in optimizer.state.items():
        name = by_id[id(param)]
        tensors[f"exp_avg/{name}"] = state["exp_avg"].contiguous()
        tensors[f"exp_avg_sq/{name}"] = state["exp_avg_sq"].contiguous()
        tensors[f"step/{name}"] = torch.as_tensor(state["step"]).reshape(1).float()
    tensors["rng/torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # a GPU's dropout draws from the device's generator, not the CPU's: a resumed
        # one-process run goes on with the unbroken run's masks (the data-parallel LA, and every
        # other stage, seed each step anyway)
        tensors["rng/cuda"] = torch.cuda.get_rng_state()
    with atomic_path(path, directory=True) as tmp:
        save_file(tensors, str(tmp / STATE))
        meta = {"step": step, "fingerprint": fingerprint, "history": progress}
        if scaler is not None and scaler.is_enabled():
            meta["scaler"] = scaler.state_dict()
        (tmp / META).write_text(json.dumps(meta) + "\n", encoding="utf-8")


def load_checkpoint(path: Path, model, optimizer, fingerprint: str, scaler=None):
    """Restore a checkpoint into model and optimizer (the AdamW moments on their parameters'
    device; the step counts where AdamW keeps them: on the CPU, or for fused and capturable
    AdamW on the parameter's device) and an enabled ``scaler``
    (the loss scale of the run that saved it, when it ran fp16 too): (step, progress), or None
    when there is none or it was made with another fingerprint."""
    from safetensors.torch import load_file

    meta_path = path / META
    if not meta_path.is_file():
        return None
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("fingerprint") != fingerprint:
        log.warning("checkpoint %s was made with other settings: starting over", path)
        return None
    tensors = load_file(str(path / STATE))
    named = dict(model.named_parameters())
    with torch.no_grad():
        for key, value in tensors.items():
            if key.startswith("param/"):
                named[key[len("param/"):]].copy_(value)
    # AdamW keeps its step counts on the CPU, but fused and capturable AdamW (modsent's on GPUs)
    # on the parameter's device, in float32, as torch's own Optimizer.load_state_dict puts them
    on_device = {id(p) for group in optimizer.param_groups if group.get("fused") or group.get("capturable")
                 for p in group["params"]}
    # moments only for what this optimizer trains (a weight trained when the checkpoint was
    # made and frozen since, as DuEAM's unused pooler, gets none: AdamW would keep saving them)
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for name, param in named.items():
        if f"exp_avg/{name}" in tensors and id(param) in trained:
            step = tensors[f"step/{name}"].reshape(()).clone()
            optimizer.state[param] = {
                "step": step.to(param.device, torch.float32) if id(param) in on_device else step,
                "exp_avg": tensors[f"exp_avg/{name}"].to(param.device, copy=True),
                "exp_avg_sq": tensors[f"exp_avg_sq/{name}"].to(param.device, copy=True),
            }
    torch.set_rng_state(tensors["rng/torch"])
    if "rng/cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng/cuda"])
    # (MEXMA's checkpoints kept the scale in their progress before every stage had a scaler)
    progress = meta["history"]
    saved = meta.get("scaler") or (progress.get("scaler") if isinstance(progress, dict) else None)
    if scaler is not None and scaler.is_enabled() and saved:
        scaler.load_state_dict(saved)
    return meta["step"], progress


def resume(checkpoint_dir: Path, model, optimizer, fingerprint: str, scaler=None) -> dict | None:
    """A checkpoint's progress dict with its ``step`` added, after restoring it into ``model``,
    ``optimizer`` and ``scaler``; None when there is none or it is stale."""
    resumed = load_checkpoint(checkpoint_dir, model, optimizer, fingerprint, scaler)
    if resumed is None:
        return None
    step, progress = resumed
    log.info("resuming from checkpoint %s at step %d", checkpoint_dir, step)
    return {**progress, "step": step}


def fingerprint(settings: dict, *inputs) -> str:
    """What a checkpoint must match to be resumed: the settings (but the runtime ones,
    :data:`RUNTIME_SETTINGS`: how often to log and checkpoint, compile, kernels, ...; the saved
    weights' dtype, :data:`OUTPUT_SETTINGS`; and a later setting at its default:
    :func:`later_defaults`) and the content of
    the inputs: a file's bytes, a directory's files (names and bytes, hidden files aside), a
    data frame's values, or None (an absent input)."""
    relevant = {k: v for k, v in settings.items() if k not in RUNTIME_SETTINGS + OUTPUT_SETTINGS
                and not at_later_default(k, v)}
    digest = hashlib.sha256(json.dumps(relevant, sort_keys=True, default=str).encode())
    for item in inputs:
        if item is None:
            digest.update(b"\0none")
        elif isinstance(item, pd.DataFrame):
            digest.update(b"\0frame" + json.dumps([str(c) for c in item.columns]).encode())
            digest.update(pd.util.hash_pandas_object(item, index=False).to_numpy().tobytes())
        else:
            root = Path(item)
            files = sorted(p for p in root.rglob("*") if p.is_file()
                           and not any(part.startswith(".") for part in p.relative_to(root).parts)) \
                if root.is_dir() else [root]
            for path in files:
                name = path.relative_to(root).as_posix() if root.is_dir() else ""
                digest.update(f"\0file {name} {path.stat().st_size}\0".encode())
                with open(path, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(block)
    return digest.hexdigest()[:16]

"""The sentence-encoding (SE) adapter: LoRA on every linear layer of the encoder, stacked on the
language's frozen language adapter (LA), trained with Multiple Negatives Ranking Loss (MNRL) on
the language's monolingual paraphrase pairs.

The model of one language L, from the bottom up:

    tokenizer + embeddings      L's (from the LA directory), frozen
    encoder weights             the base's, with the LA's LoRA (q/k/v) merged in, frozen
    SE LoRA                     on every nn.Linear of the encoder layers (attention q/k/v and
                                output, FFN in and out; not the embeddings), trained
    pooling [+ Dense] [+ Norm]  the base's sentence-transformers modules (modules.json), frozen

Merging the LA's LoRA into a private copy of the weights (``merge_and_unload``) and adding a new
LoRA on top computes exactly the stacked adapters: ``W x + B_la A_la x + B_se A_se x`` with
``W + B_la A_la`` precomputed. (The only difference from keeping the LA as a separate frozen
LoRA: its dropout, active in training mode, no longer applies to the LA's branch.) The saved SE
adapter is a plain PEFT directory whose base is "base + merged LA" — :func:`load_sentence_encoder`
rebuilds that base the same way before loading it. ``la_dir=None`` (the Mod_m-LA ablation) puts
the SE adapter directly on the base model with its own tokenizer and embeddings.

Pooling, the optional Dense layer (LaBSE: CLS -> Dense(tanh)) and Normalize are the base
directory's own sentence-transformers modules, run by sentence-transformers' code on our
encoder's token embeddings, so the sentence embedding is defined exactly as the base model's.
Prompts (E5's "query: ") are not added: the pairs are symmetric paraphrases.

The output directory:

    adapter/          the SE LoRA (PEFT: adapter_config.json, adapter_model.safetensors)
    metrics.json      MNRL first/last, steps, pairs/s, held-out retrieval accuracy before/after
    loss.tsv, loss.png

The loop is written out top to bottom (no Trainer). Batches hold no text twice (anchor, positive
or negative of any pair), so no in-batch negative is secretly a positive: sentence-transformers'
NoDuplicatesBatchSampler rule, seeded and a pure function of (seed, epoch).

A job killed midway and rerun continues from its last checkpoint (``{out}.checkpoint/``, the
language adapter's format: safetensors + JSON, written atomically; removed once the output is
complete). Batches, the learning rate and dropout (reseeded every step) are pure functions of
the step, so the resumed run ends where an unbroken one ends, bit for bit on the CPU. The CLA
adapters (modsent.modular.alignment) train with the same loop and checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from modsent.modular import language_adapter as la
from modsent.io import InputError, atomic_path, canonical_adapter_config, check_model_files
from modsent.losses import MultipleNegativesRankingLoss, mlm_parts
from modsent.tokenizing import BatchTokenizer, encoder_attention_mask
from modsent.training import checkpoints, efficiency, fastpath, schedules
from modsent.training.pairs import (check_length_groups, epochs_of, fingerprinted,  # noqa: F401
                                    no_duplicate_batches, read_pairs, split_heldout, steps_of_epochs)
from modsent.training.optim import adamw
from modsent.training.loop import (LengthChunks, TrainingLog, ahead, checkpoint_due, encode_in_batches,
                                   optimizer_step, pinned, set_learning_rate, split_by_length, to_device,
                                   token_counts)
from modsent.training.precision import autocast, default_device, grad_scaler
from modsent.training.seeding import dropout_seed
from modsent.evaluation.plots import write_before_after_bars, write_loss_curve

log = logging.getLogger(__name__)

ADAPTER_DIR = "adapter"
# settings that may change between a killed run and its rerun without making its checkpoint stale


@dataclasses.dataclass(frozen=True)
class SentenceAdapterConfig:
    """Hyperparameters of SE training (defaults: the paper's). ``max_steps`` (if set) replaces
    ``epochs``: training runs that many steps, starting a new epoch whenever one ends."""

    batch_size: int = 128
    seq_len: int = 128
    learning_rate: float = 2e-5
    epochs: int = 1
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.1
    target_modules: str | tuple[str, ...] = "all-linear"
    scale: float = 20.0
    eval_pairs: int = 500
    seed: int = 0
    max_steps: int | None = None
    log_every: int = 10
    checkpoint_every: int = 500  # optimizer steps between resumable checkpoints
    precision: str = "auto"  # modsent.training.precision: auto, fp16 or fp32
    compile: bool = False  # torch.compile the encoder (fastpath.compile_in_place)
    length_groups: int = 1  # > 1: batches grouped by length (training.pairs.no_duplicate_batches)

    @classmethod
    def from_config(cls, section: dict) -> "SentenceAdapterConfig":
        """From a config section: these field names, LoRA settings under ``lora: {r, alpha,
        dropout, target_modules}``; missing keys take the defaults, unknown keys are an error."""
        section = dict(section)
        lora = section.pop("lora", None) or {}
        for key, value in lora.items():
            section[f"lora_{key}" if key != "target_modules" else key] = value
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise InputError(f"sentence_adapter: unknown key(s) {', '.join(unknown)}; allowed: "
                             f"{', '.join(sorted(known))}")
        if isinstance(section.get("target_modules"), list):
            section["target_modules"] = tuple(section["target_modules"])
        return cls(**section)

    def __post_init__(self):
        check_contrastive_settings("sentence_adapter", self)
        if self.seq_len < 3:
            raise InputError(f"sentence_adapter.seq_len must be at least 3, got {self.seq_len}")
        if self.checkpoint_every < 1:
            raise InputError(f"sentence_adapter.checkpoint_every must be at least 1, got {self.checkpoint_every}")

    def fingerprint(self, *inputs) -> str:
        """What a checkpoint must match to be resumed (:func:`modsent.training.checkpoints.fingerprint`)."""
        return checkpoints.fingerprint(dataclasses.asdict(self), *inputs)


def check_contrastive_settings(section: str, cfg) -> None:
    """Settings every contrastive training stage shares (direct library use; the workflow's
    config is already checked by the schema)."""
    if cfg.batch_size < 2:
        raise InputError(f"{section}.batch_size must be at least 2 (in-batch negatives), got {cfg.batch_size}")
    if not 0 <= cfg.warmup_ratio < 1:
        raise InputError(f"{section}.warmup_ratio must be in [0, 1), got {cfg.warmup_ratio}")
    if cfg.max_steps is not None and cfg.max_steps < 1:
        raise InputError(f"{section}.max_steps must be at least 1 or null, got {cfg.max_steps}")
    if cfg.epochs < 1:
        raise InputError(f"{section}.epochs must be at least 1, got {cfg.epochs}")
    check_length_groups(getattr(cfg, "length_groups", 1), f"{section}.length_groups")


# ---- data: modsent.training.pairs (read_pairs, split_heldout, no_duplicate_batches) ---------


# ---- the model ---------------------------------------------------------------------------------


def _sentence_head(base_model_dir: str | Path) -> tuple[nn.Sequential, int]:
    """(the base's modules after the transformer — Pooling, [Dense], [Normalize] — frozen,
    the base's max_seq_length), as ``SentenceTransformer(base_model_dir)`` would load them.

    Only the head modules are loaded (each module class's own ``load``), never the transformer or
    its tokenizer: a 250K-piece tokenizer alone leaves ~240 MB resident after it is freed."""
    from sentence_transformers.util import import_module_class

    from modsent.encoders.base_models import check_no_pickled_weights

    base_model_dir = Path(base_model_dir)
    modules_json = base_model_dir / "modules.json"
    if not modules_json.is_file():
        raise InputError(f"{base_model_dir}: no modules.json: the base must be a sentence-transformers "
                         "model directory (it says how to pool)")
    check_no_pickled_weights(base_model_dir)  # a Dense module's pytorch_model.bin: never unpickled
    entries = sorted(json.loads(modules_json.read_text(encoding="utf-8")), key=lambda e: e.get("idx", 0))
    head = []
    for entry in entries[1:]:
        module_class = import_module_class(entry["type"], model_name_or_path=str(base_model_dir),
                                           trust_remote_code=False, local_files_only=True)
        if hasattr(module_class, "load"):
            try:
                module = module_class.load(str(base_model_dir), subfolder=entry.get("path", ""),
                                           local_files_only=True)
            except TypeError:  # modules of the old style take the directory only
                module = module_class.load(str(base_model_dir / entry.get("path", "")))
        else:
            module = module_class()
        head.append(module)
    head = nn.Sequential(*head)
    head.requires_grad_(False)
    return head, _base_max_seq_length(base_model_dir, entries[0].get("path", "") if entries else "")


def _base_max_seq_length(base_model_dir: Path, subfolder: str) -> int:
    """sentence-transformers' rule: the Transformer module's configured ``max_seq_length``, else the
    tokenizer's ``model_max_length`` capped at the model's ``max_position_embeddings``."""
    def read(name: str) -> dict:
        path = base_model_dir / subfolder / name
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    for name in ("sentence_bert_config.json", "sentence_xlnet_config.json"):
        value = read(name).get("max_seq_length")
        if value:
            return int(value)
    config_max = read("config.json").get("max_position_embeddings")
    tokenizer_max = read("tokenizer_config.json").get("model_max_length")
    candidates = [int(v) for v in (config_max, tokenizer_max) if isinstance(v, (int, float)) and 0 < v < 10**9]
    return min(candidates) if candidates else 512


def _base_encoder(base_model_dir: str | Path, la_dir: str | Path | None):
    """(encoder, tokenizer): the base's encoder (no head), with L's LA merged in when given."""
    import transformers

    if la_dir is not None:
        model, tokenizer = la.load_language_model(base_model_dir, la_dir, mlm=True)
        model = model.merge_and_unload()  # a private copy: base weights + LA LoRA, no LoRA layers
    else:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(base_model_dir))
        transformers.logging.set_verbosity_error()  # sentence encoders ship without an MLM head
        model = transformers.AutoModelForMaskedLM.from_pretrained(
            str(base_model_dir), attn_implementation="sdpa", dtype=torch.float32)
        transformers.logging.set_verbosity_warning()
    encoder = mlm_parts(model)[0]  # the same module names with and without an LA
    encoder.requires_grad_(False)
    return encoder, tokenizer


class SentenceEncoderModel(nn.Module):
    """encoder (+ SE LoRA) -> the base's pooling modules; ``forward(texts) -> embeddings``."""

    def __init__(self, encoder: nn.Module, tokenizer, head: nn.Sequential, max_seq_length: int):
        super().__init__()
        self.encoder, self.head = encoder, head
        self.tokenizer, self.max_seq_length = tokenizer, max_seq_length

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """``texts`` padded to the longest and cut at ``max_seq_length`` tokens, as the tokenizer's
        call gives them, with less work on the host (modsent.tokenizing; whether the lean path
        is taken is decided once per tokenizer, there)."""
        return BatchTokenizer(self.tokenizer, self.max_seq_length)(texts)

    def features(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """``texts`` tokenised for :meth:`forward`, in pinned memory when the model is on a GPU
        (what a training loop prepares ahead on a thread: modsent.training.loop.ahead)."""
        device = next(self.encoder.parameters()).device
        return {k: pinned(v, device) for k, v in self.tokenize(texts).items()}

    def step_features(self, texts: Sequence[str]) -> dict[str, torch.Tensor] | LengthChunks:
        """``texts`` tokenised for one training step's forward pass: :meth:`features`, which on
        the CPU are cut into sub-passes of similar length (:func:`modsent.training.loop.split_by_length`:
        less padding, the same loss but for float rounding and dropout's draws); a GPU keeps one pass.
        For steps that train adapters: where every weight trains (Full_*, DuEAM) each sub-pass's
        backward writes the whole gradient again, and one pass (:meth:`features`) is as fast."""
        features = self.features(texts)
        if next(self.encoder.parameters()).device.type != "cpu":
            return features
        return split_by_length(features)

    def forward(self, texts: Sequence[str] | Mapping[str, torch.Tensor] | LengthChunks) -> torch.Tensor:
        """Embeddings of ``texts``, or of texts already tokenised (:meth:`features`,
        :meth:`step_features`)."""
        if isinstance(texts, LengthChunks):
            return texts.restore([self(chunk) for chunk in texts])
        device = next(self.encoder.parameters()).device
        features = texts if isinstance(texts, Mapping) else self.tokenize(texts)
        host_mask = features.get("attention_mask")
        features = {k: to_device(v, device) for k, v in features.items()}  # pinned, no GPU wait
        inputs = dict(features)
        if host_mask is not None:  # decided from the host's copy: no GPU wait (modsent.tokenizing)
            inputs["attention_mask"] = encoder_attention_mask(getattr(self.encoder, "config", None), host_mask,
                                                              features["attention_mask"])
        out = self.encoder(**inputs)
        features["token_embeddings"] = out.last_hidden_state
        return self.head(features)["sentence_embedding"]

    @torch.no_grad()
    def encode(self, sentences: Sequence[str], batch_size: int = 64, *, normalize: bool = True,
               precision: str = "auto") -> np.ndarray:
        """Embeddings [n, dim] (float32 numpy), L2-normalised unless ``normalize=False`` (then
        exactly what the base's modules give). Sentences are batched by length (less padding);
        the next batch is tokenised on a thread while this one is encoded (``loop.ahead``), and
        each batch's vectors come back to the host without the loop waiting for them
        (``loop.HostCopies``): on a GPU nothing in the loop waits for the device."""
        was_training = self.training
        self.eval()
        device = next(self.encoder.parameters()).device

        def forward(features):
            with autocast(device, precision):
                return self(features)

        try:
            out = encode_in_batches(list(sentences), batch_size, self.features, forward, normalize=normalize,
                                    count=lambda texts: token_counts(self.tokenize(texts)))
        finally:
            self.train(was_training)
        return np.zeros((0, 0), dtype=np.float32) if out is None else out


def lora_config(cfg: SentenceAdapterConfig):
    from peft import LoraConfig

    targets = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets, bias="none")


def build_model(base_model_dir: str | Path, la_dir: str | Path | None,
                cfg: SentenceAdapterConfig) -> SentenceEncoderModel:
    """L's frozen model (base + merged LA, or the base alone) with a fresh SE LoRA (its B is zero:
    the model starts as exactly the frozen one); only the SE LoRA is trainable."""
    from peft import get_peft_model

    encoder, tokenizer = _base_encoder(base_model_dir, la_dir)
    head, max_len = _sentence_head(base_model_dir)
    encoder = get_peft_model(encoder, lora_config(cfg))  # freezes all but LoRA
    for name, param in encoder.named_parameters():
        param.requires_grad_("lora_" in name)
    return SentenceEncoderModel(encoder, tokenizer, head, min(cfg.seq_len, max_len))


class SentenceEncoder:
    """A loaded encoder of one language: ``.encode(sentences, batch_size) -> np.ndarray``."""

    def __init__(self, model: SentenceEncoderModel):
        self.model = model
        self.tokenizer = model.tokenizer

    def encode(self, sentences: Sequence[str], batch_size: int = 64, *, normalize: bool = True) -> np.ndarray:
        return self.model.encode(sentences, batch_size, normalize=normalize)

    __call__ = encode


def load_sentence_encoder(base_model_dir: str | Path, la_dir: str | Path | None,
                          se_dir: str | Path | None, *, device: str | None = None,
                          max_seq_length: int | None = None) -> SentenceEncoder:
    """L's sentence encoder: base + LA (merged; none when ``la_dir`` is None) + the SE adapter of
    ``se_dir`` (the training output directory, or its ``adapter/``; none when None), pooled as
    the base's sentence-transformers config says. Inference mode."""
    from peft import PeftModel

    encoder, tokenizer = _base_encoder(base_model_dir, la_dir)
    head, max_len = _sentence_head(base_model_dir)
    if se_dir is not None:
        se_dir = Path(se_dir)
        adapter = se_dir / ADAPTER_DIR if (se_dir / ADAPTER_DIR).is_dir() else se_dir
        check_model_files(adapter)  # a damaged file named, not peft's bare error
        encoder = PeftModel.from_pretrained(encoder, str(adapter), is_trainable=False)
    if max_seq_length is None and se_dir is not None and (se_dir / "metrics.json").is_file():
        trained = json.loads((se_dir / "metrics.json").read_text(encoding="utf-8"))
        max_seq_length = trained.get("config", {}).get("seq_len")
    model = SentenceEncoderModel(encoder, tokenizer, head, min(max_seq_length or max_len, max_len))
    model.to(default_device(device)).eval()
    return SentenceEncoder(model)


# ---- evaluation ----------------------------------------------------------------------------------


def retrieval_accuracy(model: SentenceEncoderModel, anchors: Sequence[str], positives: Sequence[str],
                       *, batch_size: int = 64, precision: str = "auto") -> float | None:
    """Share of anchors whose most similar positive (cosine, over all the given positives) is
    their own: in-batch retrieval over the held-out slice as one batch."""
    if len(anchors) < 2:
        return None
    a = model.encode(anchors, batch_size, precision=precision)
    p = model.encode(positives, batch_size, precision=precision)
    return float(((a @ p.T).argmax(axis=1) == np.arange(len(a))).mean())


# ---- training ------------------------------------------------------------------------------------


def batch_texts(rows: pd.DataFrame) -> list[str]:
    """A batch's texts in the order of one forward pass: anchors, positives, hard negatives."""
    return (rows["anchor"].tolist() + rows["positive"].tolist()
            + [t for t in rows["negative"] if isinstance(t, str)])


def batch_loss(model: SentenceEncoderModel, loss_fn: MultipleNegativesRankingLoss,
               rows: pd.DataFrame, features: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """MNRL of one batch; all its texts are encoded in one forward pass (on the CPU in
    sub-passes by length). ``features``: the batch's texts (:func:`batch_texts`) already
    tokenised (``model.step_features``)."""
    return pass_loss(loss_fn, model(features if features is not None else batch_texts(rows)), len(rows))


def pass_loss(loss_fn: MultipleNegativesRankingLoss, emb: torch.Tensor, n: int) -> torch.Tensor:
    """MNRL of one forward pass over a batch of ``n`` pairs, its rows in :func:`batch_texts`'
    order: anchors, positives, then the hard negatives present."""
    return loss_fn(emb[:n], emb[n:2 * n], emb[2 * n:] if len(emb) > 2 * n else None)


# ---- checkpoints -----------------------------------------------------------------------------------


@fastpath.attention_for_varying_shapes()
def train_sentence_adapter(base_model_dir: str | Path, la_dir: str | Path | None,
                           pairs_path: str | Path, out_dir: str | Path,
                           cfg: SentenceAdapterConfig = SentenceAdapterConfig(), *,
                           checkpoint_dir: str | Path | None = None, device: str | None = None,
                           progress: bool = True, on_step=None) -> dict:
    """Train L's SE adapter on its pair file and write ``out_dir`` (atomically); return metrics.

    Every ``cfg.checkpoint_every`` steps a checkpoint goes to ``checkpoint_dir`` (default
    :func:`modsent.training.checkpoints.checkpoint_path`); a rerun with the same settings and inputs continues from it, and
    it is removed once ``out_dir`` is complete. ``on_step(step)`` is called after every
    optimizer step and checkpoint (tests use it to kill the process midway)."""

    out_dir = Path(out_dir)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else checkpoints.checkpoint_path(out_dir)
    device = default_device(device)
    torch.manual_seed(cfg.seed)  # LoRA A initialisation
    if cfg.compile:  # before any work: a missing compiler is an input error
        fastpath.check_compilable(device, "sentence_adapter.compile")

    pairs = read_pairs(pairs_path)
    train, heldout = split_heldout(pairs, cfg.eval_pairs)
    epochs = epochs_of(train, cfg.batch_size, cfg.seed, length_groups=cfg.length_groups)
    epoch_batches = len(epochs(0))
    total_steps = cfg.max_steps or cfg.epochs * epoch_batches
    log.info("pairs %s: %d training, %d held out; %d batches per epoch; %d steps",
             pairs_path, len(train), len(heldout), epoch_batches, total_steps)

    model = build_model(base_model_dir, la_dir, cfg).to(device)
    fastpath.speed_up(model)  # same parameters and results, fewer kernels under autocast
    if cfg.compile:  # batches padded to their longest sentence: shapes vary, so dynamic sizes
        fastpath.compile_in_place(model.encoder, device, "sentence_adapter.compile", dynamic=None)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    n_total = sum(p.numel() for p in model.parameters())
    log.info("trainable parameters: %d of %d (%.2f%%)", n_trainable, n_total, 100 * n_trainable / n_total)
    body = efficiency.start(model.encoder, device)  # for the model FLOPs of metrics.json
    optimizer = adamw(trainable, cfg.learning_rate, cfg.weight_decay)
    loss_fn = MultipleNegativesRankingLoss(cfg.scale)
    eval_batch = max(1, min(cfg.batch_size, 64))

    def evaluate():
        return retrieval_accuracy(model, heldout["anchor"].tolist(), heldout["positive"].tolist(),
                                  batch_size=eval_batch, precision=cfg.precision)

    scaler = grad_scaler(device, cfg.precision)  # fp16: the loss scaler; else a pass-through
    fingerprint = cfg.fingerprint(base_model_dir, la_dir, fingerprinted(pairs, cfg.length_groups))
    resumed = checkpoints.resume(checkpoint_dir, model, optimizer, fingerprint, scaler)
    start = resumed["step"] if resumed else 0
    accuracy_before = resumed["accuracy_before"] if resumed else evaluate()
    log_ = TrainingLog(total_steps, start, f"SE {out_dir.name}", progress, cfg.log_every, resumed, scaler)
    model.train()
    batches = steps_of_epochs(epochs, total_steps, start)

    def prepare(batch):  # on a thread, one step ahead: the next batch's texts tokenised
        return model.step_features(batch_texts(train.iloc[batch]))

    for step, (batch, features) in enumerate(ahead(batches, prepare), start=start):
        lr = set_learning_rate(optimizer, schedules.warmup_ratio_linear(step, total_steps, cfg.warmup_ratio,
                                                                        cfg.learning_rate))
        torch.manual_seed(dropout_seed(step, cfg.seed))
        with autocast(device, cfg.precision):
            loss = batch_loss(model, loss_fn, train.iloc[batch], features)
        scaler.scale(loss).backward()
        optimizer_step(optimizer, trainable, cfg.max_grad_norm, scaler)
        log_.record(step, loss, lr, len(batch), features)  # read back at the logged steps: no GPU wait here
        if checkpoint_due(step + 1, cfg.checkpoint_every, total_steps, checkpoint_dir):
            checkpoints.save_checkpoint(checkpoint_dir, model, optimizer, step + 1, fingerprint,
                                        log_.state(accuracy_before=accuracy_before), scaler)
        if on_step is not None:
            on_step(step + 1)
    losses, history, pairs_seen, elapsed = log_.close()
    figures = log_.efficiency(body, elapsed, device)  # before the evaluation's own passes
    model.eval()
    accuracy_after = evaluate()

    metrics = {
        "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
        "heldout_retrieval_accuracy_before": accuracy_before,
        "heldout_retrieval_accuracy_after": accuracy_after,
        "heldout_pairs": len(heldout), "train_pairs": len(train), "steps": len(losses),
        "resumed_from_step": start,
        "batches_per_epoch": epoch_batches, "pairs_per_second": pairs_seen / elapsed if elapsed > 0 else None,
        "padding_fraction": log_.padding_fraction,  # of the encoded positions: this run's steps
        **figures,  # model FLOPs, their rate, MFU, peak memory (modsent.training.efficiency)
        "trainable_parameters": n_trainable, "total_parameters": n_total,
        "language_adapter": None if la_dir is None else str(la_dir),
        "device": str(device), "config": dataclasses.asdict(cfg),
    }
    with atomic_path(out_dir, directory=True) as tmp:
        model.encoder.save_pretrained(str(tmp / ADAPTER_DIR), save_embedding_layers=False)
        canonical_adapter_config(tmp / ADAPTER_DIR)
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        write_loss_curve(history, tmp, title=f"sentence adapter {out_dir.name}", ylabel="MNRL loss")
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    log.info("SE %s: MNRL %.3f → %.3f; held-out retrieval accuracy %s → %s; %.1f pairs/s, %s",
             out_dir.name, metrics["loss_first"] or 0, metrics["loss_last"] or 0,
             accuracy_before, accuracy_after, metrics["pairs_per_second"] or 0, efficiency.describe(figures))
    return metrics


def write_summary(se_dirs: list[str], table_path: str | Path, plot_path: str | Path) -> None:
    """Held-out retrieval accuracy (each anchor's nearest positive among the held-out slice)
    before and after SE training, per language: a Markdown table and a bar plot."""
    from modsent.io import atomic_open

    rows = [(Path(d).name, json.loads((Path(d) / "metrics.json").read_text(encoding="utf-8"))) for d in se_dirs]

    def pct(value):
        return "n/a" if value is None else f"{100 * value:.1f}"

    lines = ["# Sentence-encoding adapters: held-out retrieval accuracy (%)", "",
             "Each held-out anchor's nearest neighbour among the held-out positives (cosine); "
             "before = the language's model without the SE adapter.", la.MFU_NOTE, "",
             "| language | LA | held-out pairs | before | after | steps | loss first → last | pairs/s | padding % | MFU % |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for lang, m in rows:
        lines.append(
            f"| {lang} | {'yes' if m['language_adapter'] else 'no'} | {m['heldout_pairs']} | "
            f"{pct(m['heldout_retrieval_accuracy_before'])} | {pct(m['heldout_retrieval_accuracy_after'])} | "
            f"{m['steps']} | {m['loss_first'] or 0:.3f} → {m['loss_last'] or 0:.3f} | {m['pairs_per_second'] or 0:.1f} | "
            f"{pct(m.get('padding_fraction'))} | {pct(m.get('mfu'))} |")  # (no padding_fraction, mfu in earlier adapters)
    with atomic_open(table_path) as handle:
        handle.write("\n".join(lines) + "\n")
    def percent(value):
        return None if value is None else 100 * value

    write_before_after_bars([lang for lang, _ in rows],
                            [percent(m["heldout_retrieval_accuracy_before"]) for _, m in rows],
                            [percent(m["heldout_retrieval_accuracy_after"]) for _, m in rows], plot_path, stage="SE",
                            ylabel="held-out retrieval accuracy (%)", ylim=(0, 105))  # the table's unit

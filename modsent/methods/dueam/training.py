"""DuEAM's training: every weight of one shared (Siamese) encoder, mean pooling, L = L_A - lambda L_B
over the pairs of :mod:`modsent.methods.dueam.pairs` and their WMD (:mod:`modsent.methods.dueam.wmd`).

Model. :func:`modsent.encoders.transformer.load_encoder_body` loads the encoder the learner
starts from (``model``; null: the workflow's base model), every parameter trainable but a
pooler's, which mean pooling never uses (frozen, it is saved as drawn with any process count;
trainable, averaged gradients of zero would let AdamW decay it on several GPUs only); the
sentence vector is the mean of the last layer's token states over the real tokens, not
normalised (the paper's; a base's own Dense or Normalize module is not used). Both texts of a
pair go through the same encoder, in one forward pass per batch.

Loss. :class:`modsent.losses.DuEAMLoss`: ``joint`` L_A - lambda L_B (lambda 0.003), or the
ablations ``LA`` and ``LB`` (-L_B). d_wmd comes from the WMD stage's shard files
(``inputs["wmd"]``), checked to hold exactly these pairs; without them (library use) it is
computed here, uncached.

Training: one plain loop (:func:`run_training`, with :mod:`modsent.training.loop`'s parts of a
step): the step's learning rate (``warmup_steps`` of linear warm-up, then linear decay to
zero), dropout seeded from (seed, step), the loss under autocast on GPUs (bf16, or fp16 with a
loss scaler: :mod:`modsent.training.precision`), backward, gradient clipping, AdamW (weight
decay on matrices only). Batches are a seeded permutation of the pairs per epoch (no
negatives: a batch's composition does not change a pair's terms), a pure function of (seed,
epoch). Every ``checkpoint_every`` steps every trained weight, the AdamW moments,
the RNG state and the progress go to ``{out}.checkpoint/`` (:mod:`modsent.training.checkpoints`);
a rerun with the same settings and inputs resumes there and ends, on the CPU, with exactly the
weights of an unbroken run.

Several GPUs (the method's ``gpus``; :mod:`modsent.methods.launch` starts one process per GPU
under torchrun): every process holds the step's whole batch (a pure function of the step) and
encodes its contiguous share of the pairs; each term of the loss is a function of one pair, so
the processes' shares, weighted by their size, sum to the batch's mean exactly, and the
averaged gradients are the one-process gradients up to float rounding (and dropout draws,
seeded per process). Only the main process evaluates, writes checkpoints and the output.

Metrics: held-out retrieval accuracy (each language, and English->L), the mean cosine of
related and of unrelated held-out pairs (a collapsed space has both near 1), and the Spearman
correlation of d_euc with d_wmd on a sample of training pairs, before and after; L_A and L_B
of the logged steps; the pairs by kind and languages; texts truncated by the learner and by
the anchor; the WMD stage's counts.

Output (:func:`train_dueam`, atomically): a plain sentence-transformers directory (the trained
transformer + mean pooling), ``metrics.json``, ``loss.tsv`` and ``loss.png``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from modsent import distributed
from modsent.encoders import transformer as tf
from modsent.evaluation.plots import write_loss_curve
from modsent.io import atomic_path
from modsent.losses import DuEAMLoss
from modsent.methods import baselines as bl
from modsent.methods.dueam.pairs import PairSet, build_pairs
from modsent.methods.dueam.settings import DuEAMConfig, uses_translations
from modsent.methods.dueam.wmd import anchor_for, compute_wmd, pair_idf, read_wmd
from modsent.modular import sentence_adapter as sa
from modsent.training import checkpoints, efficiency, fastpath, schedules
from modsent.training.optim import adamw
from modsent.training.loop import (TrainingLog, ahead, checkpoint_due, optimizer_step, pinned, set_learning_rate,
                                   to_device)
from modsent.training.precision import autocast, default_device, for_model as precision_for, grad_scaler
from modsent.training.seeding import dropout_seed, private_cpu_stream

log = logging.getLogger(__name__)

# training pairs whose d_euc is compared with d_wmd before and after: eval_pairs, at most this
CORRELATION_SAMPLE = 500
RUNTIME_FIELDS = ("wmd_batch_size",)  # how a job runs: not in the checkpoint fingerprint


# ---- the model -----------------------------------------------------------------------------------


def build_learner(source: str | Path, cfg: DuEAMConfig) -> sa.SentenceEncoderModel:
    """The encoder of ``source`` with mean pooling (no normalisation), every weight trainable but
    the body's pooler (unused). Weights the checkpoint lacks (a pooler) are drawn from
    ``cfg.seed``: the same in every run."""
    from sentence_transformers.sentence_transformer.modules import Pooling

    with private_cpu_stream(cfg.seed):
        body, tokenizer = tf.load_encoder_body(source, revision=cfg.revision)
    _, source_limit = tf.sentence_head(source, body)
    limit = tf.max_sequence_length(tokenizer, body, source_limit)
    head = nn.Sequential(Pooling(body.config.hidden_size, "mean"))
    model = sa.SentenceEncoderModel(body, tokenizer, head, min(cfg.seq_len, limit or cfg.seq_len))
    model.requires_grad_(True)
    if getattr(body, "pooler", None) is not None:
        body.pooler.requires_grad_(False)
    return model


def truncated_texts(model: sa.SentenceEncoderModel, texts) -> int:
    """How many of ``texts`` are longer than the learner's ``max_seq_length`` tokens."""
    import transformers

    texts = sorted(set(texts))
    transformers.logging.set_verbosity_error()
    try:
        lengths = [len(ids) for ids in model.tokenizer(texts, truncation=False)["input_ids"]]
    finally:
        transformers.logging.set_verbosity_warning()
    return int(sum(length > model.max_seq_length for length in lengths))


def pair_texts(rows: pd.DataFrame) -> list[str]:
    """A batch's texts in the order of :func:`pair_embeddings`' one forward pass: first texts,
    then second texts."""
    return rows["text_a"].tolist() + rows["text_b"].tolist()


def pair_embeddings(model: sa.SentenceEncoderModel, rows: pd.DataFrame,
                    features: Mapping[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The learner's (unnormalised) vectors of a batch's first and second texts: one shared
    encoder, one forward pass. ``features``: :func:`pair_texts` of the batch already tokenised
    (``model.features``)."""
    n = len(rows)
    embeddings = model(features if features is not None else pair_texts(rows))
    return embeddings[:n], embeddings[n:]


# ---- evaluation ----------------------------------------------------------------------------------


def _retrieval(a: np.ndarray, p: np.ndarray) -> float | None:
    """Share of rows of ``a`` whose most similar row of ``p`` (cosine) is their own."""
    if len(a) < 2:
        return None
    return float(((a @ p.T).argmax(axis=1) == np.arange(len(a))).mean())


def evaluate_heldout(model: sa.SentenceEncoderModel, heldout: Mapping[str, pd.DataFrame], pivot: str,
                     batch_size: int, precision: str) -> dict:
    """On the held-out pairs, each language's texts encoded once: retrieval accuracy in each
    language and English->L (the baselines' measure), and per language L (English included) the
    mean cosine of each English anchor with its own positive in L (related) and with the other
    pairs' positives in L (unrelated; near 1 in a collapsed space)."""
    vectors = {lang: (model.encode(frame["anchor"].tolist(), batch_size, precision=precision),
                      model.encode(frame["positive"].tolist(), batch_size, precision=precision))
               for lang, frame in sorted(heldout.items())}
    mono = {lang: _retrieval(*vectors[lang]) for lang in sorted(heldout)}
    cross, related, unrelated = {}, {}, {}
    pivot_rows = heldout[pivot][["pair_id"]].reset_index().rename(columns={"index": "a"})
    for lang, frame in sorted(heldout.items()):
        joined = pivot_rows.merge(frame[["pair_id"]].reset_index().rename(columns={"index": "p"}), on="pair_id")
        a, p = vectors[pivot][0][joined["a"].to_numpy()], vectors[lang][1][joined["p"].to_numpy()]
        if lang != pivot:
            cross[f"{pivot}-{lang}"] = _retrieval(a, p)
        if len(joined) >= 2:
            sims, n = a @ p.T, len(joined)
            related[f"{pivot}-{lang}"] = float(np.trace(sims) / n)
            unrelated[f"{pivot}-{lang}"] = float((sims.sum() - np.trace(sims)) / (n * n - n))
    return {"mono": mono, "cross": cross,
            "spread": {"related": related, "unrelated": unrelated, "related_mean": bl._mean(related.values()),
                       "unrelated_mean": bl._mean(unrelated.values())}}


@torch.no_grad()
def _distance_correlation(model: sa.SentenceEncoderModel, rows: pd.DataFrame, d_wmd: np.ndarray,
                          batch_size: int, precision: str) -> float | None:
    """Spearman correlation of d_euc (the learner's unnormalised vectors) with d_wmd."""
    from scipy.stats import spearmanr

    if len(rows) < 3:
        return None
    a = model.encode(rows["text_a"].tolist(), batch_size, normalize=False, precision=precision)
    b = model.encode(rows["text_b"].tolist(), batch_size, normalize=False, precision=precision)
    d_euc = np.linalg.norm(a - b, axis=1)
    value = spearmanr(d_euc, d_wmd).statistic
    return None if np.isnan(value) else float(value)


# ---- training ------------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainingResult:
    model: sa.SentenceEncoderModel
    source: str
    metrics: dict
    history: list[list[float]]


# a pair's stratum where batches are grouped by length: its kind (mono, cross, parallel, random)
# and the languages of its two sides
STRATA = ("kind", "lang_a", "lang_b")


def epoch_batches(rows: pd.DataFrame, batch_size: int, seed: int,
                  length_groups: int = 1) -> Callable[[int], list[list[int]]]:
    """The batches of an epoch: a permutation of the pairs seeded by (seed, epoch), cut into
    ``batch_size`` runs (the last one may be shorter). ``length_groups`` k > 1: grouped by the
    longer text of each pair within pools of k batches, each batch keeping every stratum's
    share (:data:`STRATA`; :func:`modsent.training.pairs.grouped_runs`). DuEAM's terms are each
    pair's own, so a batch's make-up changes no pair's loss, only the padding and the order."""
    from modsent.training.pairs import grouped_runs, row_strata, text_lengths

    lengths = text_lengths(rows, ("text_a", "text_b")) if length_groups > 1 else np.zeros(len(rows))
    strata = row_strata(rows, STRATA) if length_groups > 1 else None

    def batches(epoch: int) -> list[list[int]]:
        return grouped_runs(lengths, batch_size, seed, epoch, length_groups, strata)

    return batches


def training_fingerprint(name: str, cfg: DuEAMConfig, source: str, inputs: Mapping) -> str:
    """What a checkpoint must match to be resumed: the method, its settings (the log and
    checkpoint cadence, the WMD batch size and the storage dtype may change) and the inputs' content (a local
    model directory's files, each pair file, the translation files it reads, the WMD files)."""
    settings = {"method": name, **{k: v for k, v in dataclasses.asdict(cfg).items() if k not in RUNTIME_FIELDS}}
    files = [inputs["pairs"][lang] for lang in sorted(inputs["pairs"])]
    if uses_translations({"data": cfg.data}):
        files += [inputs["translations"][lang] for lang in sorted(inputs.get("translations") or {})]
    wmd = inputs.get("wmd")
    files += [wmd] if isinstance(wmd, (str, Path)) else list(wmd or [])
    return checkpoints.fingerprint(settings, source if Path(source).is_dir() else None, *files)


def training_pairs(name: str, inputs: Mapping, cfg: DuEAMConfig, device: str | None = None
                   ) -> tuple[PairSet, np.ndarray, dict]:
    """(the pairs, their d_wmd, the WMD counts): the pairs built from the inputs' files, the
    distances read from ``inputs["wmd"]`` (the WMD stage's shards) or, without them, computed."""
    key = f"methods.{name}"
    translations = dict(inputs.get("translations") or {}) if uses_translations({"data": cfg.data}) else None
    pairs = build_pairs(dict(inputs["pairs"]), translations, cfg, key)
    if inputs.get("wmd") is not None:
        d_wmd, stats = read_wmd(inputs["wmd"], pairs, key)
    else:
        anchor = anchor_for(cfg, inputs.get("base"), device, key)
        d_wmd, _, stats = compute_wmd(pairs.rows, anchor, cfg.wmd_settings(),
                                      idf=pair_idf(anchor, pairs.rows, cfg.token_weights),
                                      batch_size=cfg.wmd_batch_size)
        del anchor
    return pairs, d_wmd, stats


@fastpath.attention_for_varying_shapes()
def run_training(name: str, inputs: Mapping, cfg: DuEAMConfig, *, device: str | None = None, progress: bool = True,
                 checkpoint_dir: str | Path | None = None,
                 on_step: Callable[[int], None] | None = None) -> TrainingResult | None:
    """Train method ``name`` on ``inputs`` (``base``: the workflow's base model, used when
    ``cfg.model`` is None; ``pairs``: {language: paraphrase file}; ``translations``: {language:
    translation file} for parallel data; ``wmd``: the WMD stage's shard files, optional) and
    return the model, its metrics and logged losses; nothing is written but checkpoints
    (``checkpoint_dir``; None: none). ``on_step(step)`` runs after every step and checkpoint.
    In a process group (torchrun) the processes share every batch (see the module's text); the
    main process returns the result, the others None."""
    key = f"methods.{name}"
    source = tf.model_source(cfg.model, inputs.get("base"), key)
    device = default_device(device)
    if cfg.compile:  # before any work: a missing compiler is an input error
        fastpath.check_compilable(device, f"{key}.compile")
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
    rank, world = distributed.rank(), distributed.world_size()
    main = rank == 0

    pairs, d_wmd, wmd_stats = training_pairs(name, inputs, cfg, device)
    rows = pairs.rows
    data = bl.TrainingData(rows, epoch_batches(rows, cfg.batch_size, cfg.seed, cfg.length_groups))
    steps_per_epoch = len(data.epoch_batches(0))
    total_steps = cfg.max_steps or cfg.epochs * steps_per_epoch

    model = build_learner(source, cfg).to(device)
    if cfg.compile:  # batches padded to their longest sentence: shapes vary, so dynamic sizes
        fastpath.compile_in_place(model.encoder, device, f"{key}.compile", dynamic=None)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    body = efficiency.start(model.encoder, device)  # for the model FLOPs of metrics.json
    learner_truncated = truncated_texts(model, pd.concat([rows["text_a"], rows["text_b"]]))
    if learner_truncated:
        log.warning("%s: %d training texts are longer than the learner's %d tokens and are truncated", name,
                    learner_truncated, model.max_seq_length)
    log.info("%s: %d %s pairs (%s) of %d groups, %d held-out pair ids; %d steps (%d per epoch); %s, every "
             "weight that makes the vector trained (%d); loss %s, lambda %g", name, len(rows), cfg.data,
             ", ".join(f"{k} {v}" for k, v in pairs.stats["pairs_by_kind"].items()), pairs.stats["groups"],
             pairs.stats["heldout_pair_ids"], total_steps, steps_per_epoch, source, n_trainable, cfg.objective,
             cfg.lambda_)
    optimizer = adamw(trainable, cfg.learning_rate, cfg.weight_decay)
    loss_fn = DuEAMLoss(cfg.lambda_, cfg.objective)
    eval_batch = max(1, min(cfg.batch_size, 64))
    sample = np.sort(np.random.default_rng([cfg.seed, 4]).permutation(len(rows))[:min(cfg.eval_pairs,
                                                                                           CORRELATION_SAMPLE)])

    precision = precision_for(model, device, cfg.precision)  # a T5-family learner stays out of fp16

    def evaluate() -> dict:
        return {**evaluate_heldout(model, pairs.heldout, pairs.pivot, eval_batch, precision),
                "correlation": _distance_correlation(model, rows.iloc[sample], d_wmd[sample], eval_batch,
                                                     precision)}

    scaler = grad_scaler(device, precision)  # fp16: the loss scaler; else a pass-through
    fingerprint = training_fingerprint(name, cfg, source, inputs) if checkpoint_dir is not None else None
    resumed = checkpoints.resume(checkpoint_dir, model, optimizer, fingerprint, scaler) if checkpoint_dir else None
    start = resumed["step"] if resumed else 0
    before = resumed["before"] if resumed else (evaluate() if main else None)
    components = [list(row) for row in resumed["components"]] if resumed else []
    if world > 1:
        log.info("data-parallel over %d processes: each encodes its share of a step's pairs", world)
    distributed.broadcast_from_main(trainable)  # as DistributedDataParallel does

    def prepare(batch):  # on a thread, one step ahead: this process's texts tokenised, its WMD targets (pinned)
        local = batch[distributed.local_slice(len(batch), rank, world)]
        if not local:
            return local, None, None
        wmd = pinned(torch.as_tensor(d_wmd[local], dtype=torch.float32), device)
        # one pass, also on the CPU: DuEAM trains every weight, and each sub-pass's backward would
        # write the whole gradient again (SentenceEncoderModel.step_features: no faster)
        return local, model.features(pair_texts(rows.iloc[local])), wmd

    log_ = TrainingLog(total_steps, start, name, progress and main, cfg.log_every, resumed, scaler)
    model.train()
    steps = enumerate(ahead(bl.iter_steps(data, total_steps, start), prepare), start=start)
    for step, (batch, (local, features, wmd)) in steps:
        lr = set_learning_rate(optimizer, schedules.warmup_linear(step, total_steps, cfg.warmup_steps,
                                                                  cfg.learning_rate))
        torch.manual_seed(dropout_seed(step, cfg.seed, rank))  # the same masks in a resumed run
        share = len(local) / len(batch)  # this process's terms' weight in the batch's mean
        logged = (step + 1) % cfg.log_every == 0 or step == 0 or step + 1 == total_steps
        parts = torch.zeros(3, device=device)  # the batch's loss, L_A and L_B: this process's shares
        if local:
            wmd = to_device(wmd, device)
            with autocast(device, precision):
                sources, targets = pair_embeddings(model, rows.iloc[local], features)
                loss = loss_fn(sources, targets, wmd) * share
            scaler.scale(loss * world).backward()  # the average over the processes is then the batch's gradient
            parts[0] = loss.detach().float()
            if logged:
                with torch.no_grad():
                    parts[1] = loss_fn.anchor_loss(sources, targets, wmd).float() * share
                    parts[2] = loss_fn.cosine(sources, targets).float() * share
        distributed.average_gradients(trainable)
        optimizer_step(optimizer, trainable, cfg.max_grad_norm, scaler)
        reduced = distributed.all_reduce_mean(parts) * world  # the shares' sums: loss, L_A, L_B
        log_.record(step, reduced[0], lr, len(batch), features)  # read back at the logged steps only
        if logged:
            value, la, lb = reduced.tolist()
            components.append([step + 1, la, lb])
            log.info("%s: step %d/%d, loss %.4f (L_A %.4f, L_B %.4f), lr %.2e", name, step + 1, total_steps,
                     value, la, lb, lr)
        if checkpoint_due(step + 1, cfg.checkpoint_every, total_steps, checkpoint_dir):
            checkpoints.save_checkpoint(checkpoint_dir, model, optimizer, step + 1, fingerprint,
                                        log_.state(before=before, components=components), scaler)
        if on_step is not None:
            on_step(step + 1)
    losses, history, pairs_seen, elapsed = log_.close()
    figures = log_.efficiency(body, elapsed, device, world)  # every process's share of the texts
    if not main:
        return None
    model.eval()
    after = evaluate()

    def error(accuracies: dict) -> float | None:
        mean = bl._mean(accuracies.values())
        return None if mean is None else 1.0 - mean

    metrics = {
        "method": name, "source_model": source, "languages": sorted(inputs["pairs"]), "data": cfg.data,
        "objective": cfg.objective, "lambda": cfg.lambda_, "loss": "DuEAM",
        "loss_first": history[0][1] if history else None, "loss_last": history[-1][1] if history else None,
        "loss_components": {"columns": ["step", "L_A", "L_B"], "rows": components},
        "L_A_first": components[0][1] if components else None, "L_A_last": components[-1][1] if components else None,
        "L_B_first": components[0][2] if components else None, "L_B_last": components[-1][2] if components else None,
        "heldout_retrieval_accuracy_before": before["mono"], "heldout_retrieval_accuracy_after": after["mono"],
        "heldout_retrieval_accuracy_mean_before": bl._mean(before["mono"].values()),
        "heldout_retrieval_accuracy_mean_after": bl._mean(after["mono"].values()),
        "heldout_crosslingual_retrieval_accuracy_before": before["cross"],
        "heldout_crosslingual_retrieval_accuracy_after": after["cross"],
        "heldout_crosslingual_mining_error_before": error(before["cross"]),
        "heldout_crosslingual_mining_error_after": error(after["cross"]),
        "heldout_cosine_related_before": before["spread"]["related_mean"],
        "heldout_cosine_related_after": after["spread"]["related_mean"],
        "heldout_cosine_unrelated_before": before["spread"]["unrelated_mean"],
        "heldout_cosine_unrelated_after": after["spread"]["unrelated_mean"],
        "heldout_cosine_by_languages_before": before["spread"], "heldout_cosine_by_languages_after": after["spread"],
        "euclidean_wmd_spearman_before": before["correlation"], "euclidean_wmd_spearman_after": after["correlation"],
        "heldout_pairs": {lang: len(frame) for lang, frame in sorted(pairs.heldout.items())},
        "train_pairs": len(rows), "pair_stats": pairs.stats,
        "d_wmd_mean": float(np.mean(d_wmd)) if len(d_wmd) else None,
        "d_wmd_min": float(np.min(d_wmd)) if len(d_wmd) else None,
        "d_wmd_max": float(np.max(d_wmd)) if len(d_wmd) else None,
        "wmd": wmd_stats, "anchor_truncated_texts": wmd_stats.get("truncated_texts"),
        "learner_truncated_texts": learner_truncated,
        "steps": len(losses), "batches_per_epoch": steps_per_epoch, "resumed_from_step": start,
        "processes": world,
        "pairs_per_second": pairs_seen / elapsed if elapsed > 0 and pairs_seen else None,
        "padding_fraction": log_.padding_fraction,  # of the encoded positions: this run's steps
        **figures,  # model FLOPs (all processes'), their rate, MFU, peak memory (modsent.training.efficiency)
        "trainable_parameters": n_trainable, "total_parameters": sum(p.numel() for p in model.parameters()),
        "max_seq_length": model.max_seq_length, "device": str(device),
        "config": {("lambda" if k == "lambda_" else k): v for k, v in dataclasses.asdict(cfg).items()},
    }
    return TrainingResult(model, source, metrics, history)


def write_output(result: TrainingResult, out_dir: str | Path, dtype: str = "float32") -> None:
    """``out_dir`` (atomically): a sentence-transformers directory (the trained transformer and
    mean pooling), ``metrics.json``, ``loss.tsv`` and ``loss.png``."""
    model = result.model
    with atomic_path(out_dir, directory=True) as tmp:
        tf.save_sentence_transformer(model.encoder, model.tokenizer, model.head, model.max_seq_length, tmp,
                                     source=result.source, dtype=dtype)
        (tmp / "metrics.json").write_text(json.dumps(result.metrics, indent=2) + "\n", encoding="utf-8")
        m = result.metrics
        write_loss_curve(result.history, tmp, title=f"{m['method']} (all weights)",
                         ylabel={"joint": "L_A - lambda L_B", "LA": "L_A", "LB": "-L_B"}[m["objective"]])


def train_dueam(name: str, inputs: Mapping, out_dir: str | Path, settings: Mapping, *, device: str | None = None,
                progress: bool = True, checkpoint_dir: str | Path | None = None,
                on_step: Callable[[int], None] | None = None) -> dict | None:
    """A DuEAM method's ``train``: :func:`run_training` with checkpoints in ``checkpoint_dir``
    (default ``{out_dir}.checkpoint``), then :func:`write_output`; the checkpoint is removed
    once the output is complete. Returns the metrics (None in processes other than the main)."""
    cfg = DuEAMConfig.from_settings(name, settings)
    out_dir = Path(out_dir)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else checkpoints.checkpoint_path(out_dir)
    result = run_training(name, inputs, cfg, device=device, progress=progress, checkpoint_dir=checkpoint_dir,
                          on_step=on_step)
    if result is None:
        distributed.barrier()  # while the main process evaluates and writes the output
        return None
    write_output(result, out_dir, cfg.storage_dtype)
    distributed.barrier()  # every process got here: only now is the checkpoint not needed by a rerun
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    m = result.metrics
    log.info("%s: loss %.4f → %.4f; held-out retrieval accuracy (mean over %d languages) %s → %s; mean cosine "
             "of unrelated pairs %s → %s; %.1f pairs/s, %s", name, m["loss_first"] or 0, m["loss_last"] or 0,
             len(m["languages"]), m["heldout_retrieval_accuracy_mean_before"],
             m["heldout_retrieval_accuracy_mean_after"], m["heldout_cosine_unrelated_before"],
             m["heldout_cosine_unrelated_after"], m["pairs_per_second"] or 0, efficiency.describe(m))
    return m

"""MEXMA's training: bitext, four passes per pair, L = w_align L_align + w_mlm L_mlm + w_koleo L_K.

Data. English sentence + its translation into X, for every non-English language: the
translations ``results/translation/{lang}.parquet`` (``unit_id, text, translation``) and, with
``provided_translations``, the human translations ``resources/translations/{lang}.parquet``
(``english, translation``); identical pairs once. ``eval_pairs`` English sentences are held out
in every language (a seeded sample of the English texts; none of them is trained in any
language) for the retrieval and spread measures before and after. Batches are a seeded
permutation of all languages' pairs per epoch; a step takes ``grad_accum`` micro-batches of
``batch_size`` pairs.

Masking (:func:`modsent.modular.language_adapter.mask_tokens`, BERT's 80/10/10 on
``mask_probability`` of the non-special tokens, 40% by default), drawn for the whole micro-batch
from a generator seeded by (seed, step), independently for A and B, so a resumed run and any
number of processes mask exactly alike.

Loss (:mod:`modsent.losses`), per micro-batch:

    L_mlm   = CE(head_A, A) + CE(head_B, B)       CrossUnmaskingLoss, masked positions only
    L_align = MSE(S_A, S_B)                        alignment "mse" (mean over pairs and dimensions)
            | SymmetricInfoNCE(S_A, S_B)           alignment "contrastive" (temperature)
    L_K     = KoLeo(S_A) + KoLeo(S_B)              within each process's share of the batch

weights 1 / 0.5 / 0.005 (the public script's 1 x mean of the two CEs and 0.01 x mean of the two
KoLeo terms are the same objective). The contrastive variant of the paper has no KoLeo: set
``koleo_weight: 0`` with it (MEXMA-contrastive does).

Several processes (torchrun; :mod:`modsent.methods.launch`): every process tokenises and masks
the whole micro-batch and encodes its contiguous share of the pairs. The CE terms are summed
over the share's masked positions and divided by the micro-batch's count, the MSE likewise, so
the shares sum to the one-process loss; InfoNCE ranks each pair against the whole micro-batch
(the vectors gathered, :func:`modsent.distributed.all_gather_rows`); KoLeo is computed within
each process's share, as the paper does per GPU, and averaged over the processes. Gradients are
averaged after the step's micro-batches; every process takes the same clipped AdamW step.

Schedule (the public repo's): AdamW without weight decay, ``warmup_ratio`` (30%) of the steps
of linear warm-up from ``warmup_start_factor`` (0.1) x lr, then cosine to zero; clipping at 1.2;
bf16 autocast on GPUs (``precision: auto``) or fp16 with a loss scaler. Every
``checkpoint_every`` steps the encoder, the head, the AdamW moments and the progress go to
``{out}.checkpoint/``; a rerun resumes there (bit for bit on the CPU).

Output: a sentence-transformers directory (the encoder without pooler + CLS pooling, not
normalised: ``SentenceTransformer(path)`` encodes as MEXMA does), ``metrics.json``, ``loss.tsv``,
``loss.png``. The unmasking head is a training device and is not saved; the source's pooler is
saved as it was (untrained and unused by CLS pooling) so that a plain load finds every weight.
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
from modsent.io import InputError, atomic_path
from modsent.losses import CrossUnmaskingLoss, KoLeoLoss, SymmetricInfoNCELoss
from modsent.methods import baselines as bl
from modsent.methods.mexma import model as mm
from modsent.methods.mexma.model import MEXMAModel, build_model
from modsent.modular import sentence_adapter as sa
from modsent.training import checkpoints, efficiency, fastpath, schedules
from modsent.training.optim import step_options
from modsent.tokenizing import encoder_attention_mask
from modsent.training.loop import (TrainingLog, ahead, checkpoint_due, optimizer_step, pinned, set_learning_rate,
                                   to_device)
from modsent.training.precision import PRECISIONS, autocast, default_device, grad_scaler
from modsent.schema import STORAGE_DTYPES
from modsent.training.seeding import dropout_seed, step_generator
from modsent.training.vocab_loss import is_chunk_rows

log = logging.getLogger(__name__)

ALIGNMENTS = ("mse", "contrastive")


@dataclasses.dataclass(frozen=True)
class MEXMAConfig:
    model: str | None = None
    revision: str | None = None
    head_layers: int = 6
    head_heads: int = 8
    head_intermediate_size: int | None = None
    mask_probability: float = 0.4
    alignment: str = "mse"
    temperature: float = 0.05
    align_weight: float = 1.0
    mlm_weight: float = 0.5
    koleo_weight: float = 0.005
    detach_tokens: bool = False
    provided_translations: bool = False
    max_pairs: int | None = None
    eval_pairs: int = 200
    learning_rate: float = 1e-4
    batch_size: int = 1200
    grad_accum: int = 2
    epochs: int = 1
    max_steps: int | None = None
    warmup_ratio: float = 0.3
    warmup_start_factor: float = 0.1
    weight_decay: float = 0.0
    max_grad_norm: float = 1.2
    seq_len: int = 200
    seed: int = 0
    precision: str = "auto"
    storage_dtype: str = "float32"  # the saved weights (how the result is saved: not in the fingerprint)
    length_groups: int = 1  # > 1: steps grouped by length within each language (epoch_batches)
    compile: bool = False  # torch.compile the encoder (fastpath.compile_in_place); a runtime setting
    kernels: str = "eager"  # triton: the cross-unmasking loss through kernels.cross_entropy on a GPU; runtime
    loss_chunk_rows: int | None = None  # the cross-unmasking loss's logits this many rows at a time, none kept; runtime
    gradient_checkpointing: bool = False  # each layer run again in the backward (mm.checkpoint_activations); runtime
    log_every: int = 10
    checkpoint_every: int = 2000

    @classmethod
    def from_settings(cls, name: str, settings: Mapping) -> "MEXMAConfig":
        """From ``methods.{name}``: missing keys take the defaults, unknown keys are an error."""
        from modsent.methods import settings_config

        return settings_config(cls, name, settings)

    def check(self, name: str) -> None:
        """The schema's rules, for direct library use (the workflow's config is already checked)."""
        problems = {
            "alignment": self.alignment not in ALIGNMENTS,
            "mask_probability": not 0 < self.mask_probability < 1,
            "batch_size": self.batch_size < 2,
            "grad_accum": self.grad_accum < 1,
            "temperature": not self.temperature > 0,
            "warmup_ratio": not 0 <= self.warmup_ratio < 1,
            "precision": self.precision not in PRECISIONS,
            "kernels": self.kernels not in ("eager", "triton"),
            "loss_chunk_rows": self.loss_chunk_rows is not None and not is_chunk_rows(self.loss_chunk_rows),
            "storage_dtype": self.storage_dtype not in STORAGE_DTYPES,
        }
        from modsent.training.pairs import check_length_groups

        check_length_groups(self.length_groups, f"methods.{name}.length_groups")
        for key, bad in problems.items():
            if bad:
                raise InputError(f"methods.{name}.{key}: invalid value {getattr(self, key)!r}")
        for key in ("align_weight", "mlm_weight", "koleo_weight"):
            if getattr(self, key) < 0:
                raise InputError(f"methods.{name}.{key}: must be at least 0, got {getattr(self, key)}")


# ---- data ------------------------------------------------------------------------------------------


def _read_bitext(path, lang: str, english: str, translation: str) -> pd.DataFrame:
    frame = pd.read_parquet(path)
    missing = {english, translation} - set(frame.columns)
    if missing:
        raise InputError(f"{path}: missing column(s) {sorted(missing)} (expected {english}, {translation})")
    for column in (english, translation):
        empty = frame[column].isna() | (frame[column].astype(str).str.strip() == "")
        if empty.any():
            row = int(np.flatnonzero(empty.to_numpy())[0])
            raise InputError(f"{path}: row {row} has an empty {column!r}; every pair needs both sides")
    return pd.DataFrame({"lang": lang, "english": frame[english].astype(str).str.strip(),
                         "translation": frame[translation].astype(str).str.strip()})


def read_bitext(translations: Mapping[str, str | Path], provided: Mapping[str, str | Path] | None = None
                ) -> pd.DataFrame:
    """``lang, english, translation`` of every non-English language, machine (or the demo's
    provided) translations first, then the human translations; each distinct pair once."""
    frames = [_read_bitext(path, lang, "text", "translation") for lang, path in sorted(translations.items())]
    frames += [_read_bitext(path, lang, "english", "translation") for lang, path in sorted((provided or {}).items())]
    if not frames:
        raise InputError("MEXMA: no translation files (it trains on English and its translations)")
    rows = pd.concat(frames, ignore_index=True)
    return rows.drop_duplicates(["lang", "english", "translation"]).reset_index(drop=True)


def split_heldout(rows: pd.DataFrame, count: int, seed: int) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """(training rows, {lang: held-out rows}): ``count`` English sentences drawn (seeded) from
    those translated into every language, held out everywhere; each held-out language keeps one
    translation per English sentence."""
    if count == 0:
        return rows, {}
    langs = sorted(rows["lang"].unique())
    common = sorted(set.intersection(*(set(rows.loc[rows["lang"] == lang, "english"]) for lang in langs)))
    chosen = set(np.random.default_rng([seed, 7]).permutation(np.array(common, dtype=object))[:count].tolist())
    held = rows["english"].isin(chosen)
    heldout = {lang: frame.drop_duplicates("english").sort_values("english").reset_index(drop=True)
               for lang, frame in rows[held].groupby("lang")}
    return rows[~held].reset_index(drop=True), heldout


def epoch_batches(rows: pd.DataFrame, size: int, seed: int, length_groups: int = 1) -> Callable[[int], list[list[int]]]:
    """The steps' rows of an epoch: a seeded shuffle of (seed, epoch), each step taking the next
    ``size`` rows (batch_size x grad_accum) none of which repeats a text or an English sentence
    already in the step (:func:`modsent.training.pairs.no_duplicate_batches` grouped by the
    English text): one sentence's translations into several languages would otherwise be each
    other's nearest neighbours for KoLeo (two copies of one vector: -log of a near-zero
    distance) and false negatives for InfoNCE. Steps with fewer rows are left out of the epoch,
    so every micro-batch has ``batch_size`` pairs; those rows come in other epochs.

    ``length_groups`` k > 1: steps grouped by length (the longer of the English sentence and its
    translation), each keeping every language's share of a pool of k steps' pairs, so a step's
    negatives are not all one language's short sentences (``no_duplicate_batches``); its
    micro-batches are then consecutive runs of its pairs in that order (shorter ones first)."""
    from modsent.training.pairs import no_duplicate_batches

    frame = pd.DataFrame({"anchor": rows["english"].to_numpy(), "positive": rows["translation"].to_numpy(),
                          "negative": None, "english": rows["english"].to_numpy(), "lang": rows["lang"].to_numpy()})

    def batches(epoch: int) -> list[list[int]]:
        return no_duplicate_batches(frame, size, seed, epoch, min_size=size, group_column="english",
                                    length_groups=length_groups, strata_column="lang")

    return batches


# ---- the measures before and after -------------------------------------------------------------------


def encoder_of(model: MEXMAModel, tokenizer, max_len: int) -> sa.SentenceEncoderModel:
    """The trained system as a sentence encoder (body + CLS pooling), sharing the model's body."""
    from sentence_transformers.sentence_transformer.modules import Pooling

    head = nn.Sequential(Pooling(model.body.config.hidden_size, "cls"))
    head.requires_grad_(False)
    return sa.SentenceEncoderModel(model.body, tokenizer, head, max_len)


def evaluate(encoder: sa.SentenceEncoderModel, heldout: Mapping[str, pd.DataFrame], precision: str) -> dict:
    """Per held-out language: en->X and X->en retrieval accuracy (nearest neighbour by cosine
    among the held-out sentences), their mean's complement (the mining error), and over every
    held-out vector of every language the mean cosine of distinct vectors (the spread KoLeo
    widens) and of aligned pairs."""
    if not heldout:
        return {}
    english = next(iter(heldout.values()))["english"].tolist()
    en = encoder.encode(english, 64, precision=precision)
    out: dict = {"retrieval_en_x": {}, "retrieval_x_en": {}, "related_cosine": {}}
    vectors = [en]
    for lang, frame in sorted(heldout.items()):
        x = encoder.encode(frame["translation"].tolist(), 64, precision=precision)
        vectors.append(x)
        sims = en @ x.T
        target = np.arange(len(en))
        out["retrieval_en_x"][lang] = float((sims.argmax(1) == target).mean())
        out["retrieval_x_en"][lang] = float((sims.argmax(0) == target).mean())
        out["related_cosine"][lang] = float(np.trace(sims) / len(en))
    both = [(out["retrieval_en_x"][lang] + out["retrieval_x_en"][lang]) / 2 for lang in sorted(heldout)]
    out["mining_error"] = float(1 - np.mean(both))
    allv = np.concatenate(vectors)
    sims = allv @ allv.T
    n = len(allv)
    out["mean_pairwise_cosine"] = float((sims.sum() - np.trace(sims)) / (n * n - n))
    return out


# ---- one micro-batch -------------------------------------------------------------------------------


def masked_batch(tokenizer, texts: list[str], max_len: int, probability: float, generator: torch.Generator):
    """(input ids, masked ids, labels, attention mask) of ``texts`` (one micro-batch, padded)."""
    from modsent.modular.language_adapter import mask_tokens

    encoded = tokenizer(texts, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
    masked, labels = mask_tokens(encoded["input_ids"], tokenizer, probability, generator)
    return encoded["input_ids"], masked, labels, encoded["attention_mask"]


def _share(tensors, rows: slice, device="cpu"):
    """This process's rows of each tensor, trimmed to their longest real sequence (on the host;
    pinned when bound for a GPU ``device``, for a copy that does not block)."""
    ids, masked, labels, mask = (t[rows] for t in tensors)
    width = int(mask.sum(1).max()) if len(mask) else 1
    return [pinned(t[:, :width].contiguous(), device) for t in (ids, masked, labels, mask)]


def _on_device(share, device, config):
    """A side's share (:func:`_share`) as the model takes it: ids on ``device`` (copies that do
    not block, from pinned memory), the labels left on the host (the loss finds the masked
    positions there) and the attention mask decided from the host's copy
    (modsent.tokenizing.encoder_attention_mask): nothing here makes the host wait for the GPU."""
    ids, masked, labels, mask = share
    attention = encoder_attention_mask(config, mask, to_device(mask, device))
    return to_device(ids, device), to_device(masked, device), labels, attention


def step_batches(tokenizer, rows: pd.DataFrame, micro_batches: list[list[int]], step: int, cfg: "MEXMAConfig",
                 max_len: int, rank: int, world: int, device="cpu") -> list[tuple]:
    """Step ``step``'s micro-batches as this process trains on them: for each, its share of A
    (English) and B (translations), masked, and (masked positions in A, in B) of the whole
    micro-batch. The masks are drawn from the step's own generator, micro-batch by micro-batch, A
    before B, so they depend on (seed, step) only; a pure function of its arguments, which the
    loop runs one step ahead on a thread (modsent.training.loop.ahead)."""
    generator = step_generator(step, cfg.seed)
    out = []
    for micro in micro_batches:
        rows_ = rows.iloc[micro]
        a_all = masked_batch(tokenizer, rows_["english"].tolist(), max_len, cfg.mask_probability, generator)
        b_all = masked_batch(tokenizer, rows_["translation"].tolist(), max_len, cfg.mask_probability, generator)
        counts = (int((a_all[2] != -100).sum()), int((b_all[2] != -100).sum()))
        share = distributed.local_slice(len(micro), rank, world)
        out.append((_share(a_all, share, device), _share(b_all, share, device), counts, len(micro)))
    return out


@dataclasses.dataclass
class Objective:
    """The loss terms of :mod:`modsent.losses` with the settings' weights."""

    cfg: MEXMAConfig

    def __post_init__(self):
        self.unmasking = CrossUnmaskingLoss(reduction="sum", chunk_rows=self.cfg.loss_chunk_rows)
        self.koleo = KoLeoLoss()
        self.infonce = SymmetricInfoNCELoss(self.cfg.temperature)

    def __call__(self, model: MEXMAModel, a, b, counts: tuple[int, int], rows: int, world: int):
        """(what this process back-propagates, its shares of [total, mlm, align, koleo] whose sums
        over the processes are the micro-batch's values). ``a``, ``b``: (ids, masked ids, labels,
        attention mask) of this process's share of each side (:func:`_on_device`); ``counts``:
        the micro-batch's masked positions in A and B; ``rows``: its pairs."""
        cfg = self.cfg
        out = model(a[0], a[1], a[3], b[0], b[1], b[3])
        zero = out["s_a"].new_zeros(()).float()
        mlm = zero
        if counts[0]:
            mlm = mlm + self.unmasking(model.head.logits, out["head_a"], a[2], head=model.head,
                                       projection=model.head.projection()) / counts[0]
        if counts[1]:
            mlm = mlm + self.unmasking(model.head.logits, out["head_b"], b[2], head=model.head,
                                       projection=model.head.projection()) / counts[1]
        s_a, s_b = out["s_a"].float(), out["s_b"].float()
        koleo = zero
        if cfg.koleo_weight and len(s_a) >= 2:  # within this process's share, as per GPU in the paper
            koleo = self.koleo(s_a) + self.koleo(s_b)
        if cfg.alignment == "mse":
            align = ((s_a - s_b) ** 2).sum() / (rows * s_a.shape[1])  # the share of the mean
            backward = cfg.align_weight * align + cfg.mlm_weight * mlm + cfg.koleo_weight * koleo / world
            shares = [align, mlm, koleo / world]
        else:  # every pair ranked against the whole micro-batch: the same value in every process
            sizes = distributed.share_sizes(rows, world)  # known: no exchange of shapes, no wait
            full = self.infonce(distributed.all_gather_rows(s_a, sizes), distributed.all_gather_rows(s_b, sizes))
            backward = cfg.align_weight * full + cfg.mlm_weight * mlm + cfg.koleo_weight * koleo / world
            shares = [full / world, mlm, koleo / world]
        total = cfg.align_weight * shares[0] + cfg.mlm_weight * shares[1] + cfg.koleo_weight * shares[2]
        return backward, torch.stack([total.detach(), *(s.detach() for s in (shares[1], shares[0], shares[2]))])


def model_flops(model: MEXMAModel, body: tuple[int, int, int], head: tuple[int, int, int], tokens: int,
                squares: int, masked: int) -> float:
    """MEXMA's training FLOPs (:mod:`modsent.training.efficiency`'s count) of sequences whose real
    lengths sum to ``tokens`` and their squares to ``squares`` (A's and B's, each encoded as it
    is and masked), ``masked`` of their positions masked: the encoder's clean and masked passes,
    the unmasking head's layers over the masked sequence (position 0 the other side's vector:
    the same lengths) and its vocabulary projection, tied to the word embeddings, on the masked
    positions only. ``body``, ``head``: :func:`~modsent.training.efficiency.body_shape` of
    ``model.body`` and ``model.head.encoder``. With ``detach_tokens`` too the masked pass counts
    its backward: it runs in one call with the clean pass, whose backward covers both."""
    projection = model.body.get_input_embeddings().weight.numel() + model.head.bias.numel()  # d x V (tied), the bias
    return (2 * efficiency.encoder_flops(body, tokens, squares) + efficiency.encoder_flops(head, tokens, squares)
            + 6.0 * projection * masked)


# ---- training ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainingResult:
    encoder: sa.SentenceEncoderModel
    source: str
    metrics: dict
    history: list[list[float]]


def training_fingerprint(name: str, cfg: MEXMAConfig, source: str, files: list) -> str:
    # checkpoints.fingerprint drops the runtime keys (gradient_checkpointing, loss_chunk_rows, ...)
    return checkpoints.fingerprint({"method": name, **dataclasses.asdict(cfg)},
                                   source if Path(source).is_dir() else None, *files)


@fastpath.attention_for_varying_shapes()
def run_training(name: str, inputs: Mapping, cfg: MEXMAConfig, *, device: str | None = None, progress: bool = True,
                 checkpoint_dir: str | Path | None = None,
                 on_step: Callable[[int], None] | None = None) -> TrainingResult | None:
    """Train method ``name`` on ``inputs`` (``base``; ``translations``: {lang: file};
    ``provided``: {lang: file} with ``provided_translations``) and return the encoder, its
    metrics and logged losses (the main process; the others None). Writes only checkpoints."""
    key = f"methods.{name}"
    source = tf.model_source(cfg.model, inputs.get("base"), key)
    device = default_device(device)
    if cfg.compile:  # before any work: a missing compiler is an input error
        fastpath.check_compilable(device, f"{key}.compile")
    # Triton's kernels: on a GPU without Triton, refused here (before the pairs are read)
    kernels_run = cfg.kernels == "triton" and fastpath.check_kernels(device, f"{key}.kernels")
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
    rank, world = distributed.rank(), distributed.world_size()
    main = rank == 0
    if cfg.batch_size < (2 if cfg.koleo_weight else 1) * world:
        raise InputError(f"{key}.batch_size: {cfg.batch_size} pairs over {world} processes leave a process "
                         "no pair (or, with KoLeo, no nearest neighbour)")

    provided = dict(inputs.get("provided") or {}) if cfg.provided_translations else {}
    if cfg.provided_translations and not provided:
        raise InputError(f"{key}.provided_translations: no provided translation files were given "
                         "(the workflow's translation.provided)")
    rows = read_bitext(dict(inputs.get("translations") or {}), provided)
    train, heldout = split_heldout(rows, cfg.eval_pairs, cfg.seed)
    if cfg.max_pairs is not None and len(train) > cfg.max_pairs:
        keep = np.sort(np.random.default_rng([cfg.seed, 5]).permutation(len(train))[:cfg.max_pairs])
        train = train.iloc[keep].reset_index(drop=True)
    step_size = cfg.batch_size * cfg.grad_accum
    if len(train) < step_size:
        raise InputError(f"{key}: {len(train)} training pairs after holding out {cfg.eval_pairs} English "
                         f"sentences, fewer than one step's batch_size x grad_accum = {step_size}")
    data = bl.TrainingData(train, epoch_batches(train, step_size, cfg.seed, cfg.length_groups))
    steps_per_epoch = len(data.epoch_batches(0))
    if steps_per_epoch == 0:
        raise InputError(f"{key}: no step of batch_size x grad_accum = {step_size} pairs with distinct English "
                         f"sentences can be formed from {train['english'].nunique()} English sentences")
    total_steps = cfg.max_steps or cfg.epochs * steps_per_epoch

    model, tokenizer = build_model(source, revision=cfg.revision, head_layers=cfg.head_layers,
                                   head_heads=cfg.head_heads, head_intermediate_size=cfg.head_intermediate_size,
                                   detach_tokens=cfg.detach_tokens, seed=cfg.seed, key=key)
    model.to(device)
    if kernels_run:  # outside the compiled encoder: it applies with compile too
        fastpath.fuse_cross_entropy(model.head)
        log.info("%s.kernels: triton: the cross-unmasking loss's cross-entropy runs as a Triton kernel each way",
                 key)
    elif cfg.kernels == "triton":
        log.info("%s.kernels: triton changes nothing here: the kernels run on CUDA GPUs, this job on %s", key, device)
    if cfg.gradient_checkpointing:
        layers = mm.checkpoint_activations(model, key=key)
        log.info("%s.gradient_checkpointing: %d transformer layers (the encoder's and the head's) keep only their "
                 "input and run again in the backward", key, layers)
    if cfg.loss_chunk_rows:
        log.info("%s.loss_chunk_rows: the cross-unmasking loss projects %d masked positions at a time and keeps no "
                 "logits (the backward projects them again)", key, cfg.loss_chunk_rows)
    if cfg.compile:  # sequences padded to each share's longest: shapes vary, so dynamic sizes
        fastpath.compile_in_place(model.body, device, f"{key}.compile", dynamic=None,
                                  eager_random=cfg.gradient_checkpointing)
    _, source_limit = tf.sentence_head(source, model.body)
    limit = tf.max_sequence_length(tokenizer, model.body, source_limit)
    max_len = min(cfg.seq_len, limit or cfg.seq_len)
    encoder = encoder_of(model, tokenizer, max_len)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_encoder = sum(p.numel() for p in model.body.parameters())
    # for the model FLOPs of metrics.json (model_flops): the encoder's and the head's layers
    body, head = efficiency.start(model.body, device), efficiency.body_shape(model.head.encoder)
    optimizer = torch.optim.AdamW(trainable, lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                                  **step_options(trainable))
    scaler = grad_scaler(device, cfg.precision)
    objective = Objective(cfg)
    log.info("%s: %d bitext pairs (%s), %d held-out English sentences; %d steps of %d x %d pairs (%d per epoch); "
             "%s, every weight trained (%d) + a %d-layer unmasking head; alignment %s, weights %g/%g/%g%s",
             name, len(train), ", ".join(f"{k} {v}" for k, v in train["lang"].value_counts().sort_index().items()),
             len(next(iter(heldout.values()))) if heldout else 0, total_steps, cfg.grad_accum, cfg.batch_size,
             steps_per_epoch, source, n_encoder, cfg.head_layers, cfg.alignment, cfg.align_weight, cfg.mlm_weight,
             cfg.koleo_weight, ", head input detached (no-tok)" if cfg.detach_tokens else "")

    files = [inputs["translations"][lang] for lang in sorted(inputs.get("translations") or {})]
    files += [provided[lang] for lang in sorted(provided)]
    fingerprint = training_fingerprint(name, cfg, source, files) if checkpoint_dir is not None else None
    resumed = checkpoints.resume(checkpoint_dir, model, optimizer, fingerprint, scaler) if checkpoint_dir else None
    start = resumed["step"] if resumed else 0
    before = resumed["before"] if resumed else (evaluate(encoder, heldout, cfg.precision) if main else None)
    components = [list(r) for r in resumed["components"]] if resumed else []
    if world > 1:
        log.info("data-parallel over %d processes: each encodes its share of every micro-batch", world)
    distributed.broadcast_from_main(trainable)

    def prepare(item):  # on a thread, one step ahead: the next step's micro-batches masked (and pinned)
        step, batch = item
        micro_batches = [batch[i:i + cfg.batch_size] for i in range(0, len(batch), cfg.batch_size)]
        return step_batches(tokenizer, train, micro_batches, step, cfg, max_len, rank, world, device)

    log_ = TrainingLog(total_steps, start, name, progress and main, cfg.log_every, resumed, scaler)
    masked_seen = 0  # every micro-batch's masked positions (all processes'): the vocabulary projection's
    model.train()
    steps = enumerate(bl.iter_steps(data, total_steps, start), start=start)
    for (step, batch), prepared in ahead(steps, prepare):
        lr = set_learning_rate(optimizer, schedules.warmup_cosine(
            step, total_steps, schedules.warmup_steps_of(cfg.warmup_ratio, total_steps), cfg.learning_rate,
            cfg.warmup_start_factor))
        torch.manual_seed(dropout_seed(step, cfg.seed, rank))
        values = torch.zeros(4, device=device)
        for a, b, counts, rows in prepared:
            a, b = _on_device(a, device, model.body.config), _on_device(b, device, model.body.config)
            with autocast(device, cfg.precision):
                backward, shares = objective(model, a, b, counts, rows, world)
            scaler.scale(backward * world / len(prepared)).backward()
            values += shares / len(prepared)
        distributed.average_gradients(trainable)
        optimizer_step(optimizer, trainable, cfg.max_grad_norm, scaler)
        reduced = distributed.all_reduce_mean(values) * world  # [total, mlm, align, koleo]
        log_.count_padding(*(side[3] for a, b, *_ in prepared for side in (a, b)))  # the shares' host masks
        masked_seen += sum(sum(counts) for _, _, counts, _ in prepared)  # step_batches' counts, for the loss too
        log_.record(step, reduced[0], lr, len(batch))  # read back at the logged steps only
        if (step + 1) % cfg.log_every == 0 or step == 0 or step + 1 == total_steps:
            total, mlm, align, koleo = reduced.tolist()
            components.append([step + 1, align, mlm, koleo])
            log.info("%s: step %d/%d, loss %.4f (align %.4f, unmasking %.4f, KoLeo %.4f), lr %.2e", name, step + 1,
                     total_steps, total, align, mlm, koleo, lr)
        if checkpoint_due(step + 1, cfg.checkpoint_every, total_steps, checkpoint_dir):
            checkpoints.save_checkpoint(checkpoint_dir, model, optimizer, step + 1, fingerprint,
                                        log_.state(before=before, components=components), scaler)
        if on_step is not None:
            on_step(step + 1)
    losses, history, pairs_seen, elapsed = log_.close()
    tokens, squares = log_.totals(device, world)  # all processes' shares
    figures = efficiency.run_figures(model_flops(model, body, head, tokens, squares, masked_seen), elapsed, device,
                                     world)
    if not main:
        return None
    model.eval()
    after = evaluate(encoder, heldout, cfg.precision)
    mm.restore_pooler(model)  # saved untrained, so that a plain load finds every weight

    def get(result, key_):
        return result.get(key_) if result else None

    metrics = {
        "method": name, "source_model": source, "languages": sorted(train["lang"].unique()),
        "alignment": cfg.alignment, "weights": {"align": cfg.align_weight, "unmasking": cfg.mlm_weight,
                                                "koleo": cfg.koleo_weight},
        "detach_tokens": cfg.detach_tokens,
        "loss_first": history[0][1] if history else None, "loss_last": history[-1][1] if history else None,
        "loss_components": {"columns": ["step", "align", "unmasking", "koleo"], "rows": components},
        "heldout_retrieval_en_x_before": get(before, "retrieval_en_x"),
        "heldout_retrieval_en_x_after": get(after, "retrieval_en_x"),
        "heldout_retrieval_x_en_before": get(before, "retrieval_x_en"),
        "heldout_retrieval_x_en_after": get(after, "retrieval_x_en"),
        "heldout_mining_error_before": get(before, "mining_error"),
        "heldout_mining_error_after": get(after, "mining_error"),
        "heldout_mean_pairwise_cosine_before": get(before, "mean_pairwise_cosine"),
        "heldout_mean_pairwise_cosine_after": get(after, "mean_pairwise_cosine"),
        "heldout_related_cosine_before": get(before, "related_cosine"),
        "heldout_related_cosine_after": get(after, "related_cosine"),
        "heldout_sentences": len(next(iter(heldout.values()))) if heldout else 0,
        "train_pairs": len(train), "train_pairs_by_language": {k: int(v) for k, v in
                                                                train["lang"].value_counts().sort_index().items()},
        "steps": len(losses), "batches_per_epoch": steps_per_epoch, "resumed_from_step": start, "processes": world,
        "pairs_per_second": pairs_seen / elapsed if elapsed > 0 and pairs_seen else None,
        "padding_fraction": log_.padding_fraction,  # of the encoded positions: this run's steps
        **figures,  # model FLOPs (all processes': model_flops), their rate, MFU, peak memory (efficiency)
        "encoder_parameters": n_encoder, "head_parameters": sum(p.numel() for p in model.head.parameters()),
        "max_seq_length": max_len, "device": str(device), "config": dataclasses.asdict(cfg),
    }
    return TrainingResult(encoder, source, metrics, history)


def write_output(result: TrainingResult, out_dir: str | Path, dtype: str = "float32") -> None:
    """``out_dir`` (atomically): the sentence-transformers directory (encoder + CLS pooling),
    ``metrics.json``, ``loss.tsv`` and ``loss.png``."""
    encoder = result.encoder
    with atomic_path(out_dir, directory=True) as tmp:
        tf.save_sentence_transformer(encoder.encoder, encoder.tokenizer, encoder.head, encoder.max_seq_length, tmp,
                                     source=result.source, dtype=dtype)
        (tmp / "metrics.json").write_text(json.dumps(result.metrics, indent=2) + "\n", encoding="utf-8")
        write_loss_curve(result.history, tmp, title=f"{result.metrics['method']} (all weights)",
                         ylabel="align + unmasking + KoLeo (weighted)")


def train_mexma(name: str, inputs: Mapping, out_dir: str | Path, settings: Mapping, *, device: str | None = None,
                progress: bool = True, checkpoint_dir: str | Path | None = None,
                on_step: Callable[[int], None] | None = None) -> dict | None:
    """A MEXMA method's ``train``: :func:`run_training` with checkpoints in ``checkpoint_dir``
    (default ``{out_dir}.checkpoint``), then :func:`write_output`; the checkpoint is removed once
    the output is complete. Returns the metrics (None in processes other than the main)."""
    cfg = MEXMAConfig.from_settings(name, settings)
    out_dir = Path(out_dir)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else checkpoints.checkpoint_path(out_dir)
    result = run_training(name, inputs, cfg, device=device, progress=progress, checkpoint_dir=checkpoint_dir,
                          on_step=on_step)
    if result is None:
        distributed.barrier()
        return None
    write_output(result, out_dir, cfg.storage_dtype)
    distributed.barrier()  # every process got here: only now is the checkpoint not needed by a rerun
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    m = result.metrics
    log.info("%s: loss %.4f → %.4f; held-out mining error %s → %s; mean pairwise cosine %s → %s; %.1f pairs/s, "
             "%s", name, m["loss_first"] or 0, m["loss_last"] or 0, m["heldout_mining_error_before"],
             m["heldout_mining_error_after"], m["heldout_mean_pairwise_cosine_before"],
             m["heldout_mean_pairwise_cosine_after"], m["pairs_per_second"] or 0, efficiency.describe(m))
    return m

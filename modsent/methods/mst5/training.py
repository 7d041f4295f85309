"""m-ST5's training: NLI triplets from the paraphrase files, a frozen encoder with LoRA, triplet
InfoNCE, and the merged encoder saved as a sentence-transformers directory.

Data. The paraphrase files ``results/paraphrase/{lang}.parquet`` are multi-parallel (every
language has the English pairs' ids); the rows of the configured ``datasets`` (default
``mnli``: premise, entailment, contradiction) with a negative form the triplets:

- cross-lingual (mSimCSE's XNLI recipe, :func:`crosslingual_triplets`): for every pair id the
  languages share and every language L, (the premise in L, the entailment in a random language,
  the contradiction in a random language), the two languages drawn independently from all
  languages (L included), once per run from the seed. A pair id gives one triplet per
  language, as XNLI's 15 translations of MNLI give the paper's 1.96M triplets.
- English-only (:func:`english_triplets`): the English rows.

A triplet whose negative equals its anchor or positive text (a name the same in two languages)
is dropped. Batches are ``no_duplicate_batches`` with ``group_column="pair_id"``: no text twice
and no two triplets of one pair id in a batch (a premise's copy in another language would be a
false in-batch negative), a pure function of (seed, epoch).

Held out: ``split_heldout`` on the English (pivot) pairs of those datasets picks the held-out pair
ids (the baselines' rule, :func:`modsent.methods.baselines.split_heldout_by_pivot`); they leave
the training triplets of every language. Held-out retrieval accuracy (each anchor's nearest
positive) is measured before and after training per language, and English→L.

Model. :func:`modsent.encoders.transformer.load_encoder_body` loads the encoder (mT5's encoder
alone; any other model's ``AutoModel``), frozen; peft's LoRA goes on the query and value
projections (``targets: qv``) or on every linear layer but a pooler (``all-linear``); the
sentence vector is the source's sentence-transformers pooling, or the mean over the real tokens.
The loss is :class:`modsent.losses.TripletInfoNCELoss` (cosine / temperature; every positive
and every negative of the batch is a candidate). The anchors, positives and negatives are
encoded in three forward passes (each padded to its own longest text).

Training: one plain loop (:func:`run_training`, with :mod:`modsent.training.loop`'s parts of a
step): the step's learning rate (linear warm-up, then linear decay), dropout seeded from (seed,
step), the loss under bf16 autocast on GPUs (fp32 for an mT5 body on GPUs without bf16, where
``auto`` would run fp16: :func:`modsent.training.precision.for_model`), backward, gradient
clipping, AdamW over the LoRA matrices. Every ``checkpoint_every`` steps the LoRA
weights, AdamW moments, RNG state and progress go to ``{out}.checkpoint/``
(:mod:`modsent.training.checkpoints`); a rerun with the same settings and inputs resumes from it
and ends, on the CPU, with exactly the weights of an unbroken run.

Output (:func:`train_mst5`, written atomically): the LoRA merged into the encoder
(``merge_and_unload``), a plain sentence-transformers directory
(:func:`modsent.encoders.transformer.save_sentence_transformer`), ``metrics.json``,
``loss.tsv`` and ``loss.png``.
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

from modsent.encoders import transformer as tf
from modsent.evaluation.plots import write_loss_curve
from modsent.io import InputError, atomic_path
from modsent.languages import PIVOT_LANGUAGE
from modsent.losses import TripletInfoNCELoss
from modsent.methods import baselines as bl
from modsent.modular import sentence_adapter as sa
from modsent.training import checkpoints, efficiency, fastpath, schedules
from modsent.training.optim import step_options
from modsent.training.loop import TrainingLog, ahead, checkpoint_due, optimizer_step, set_learning_rate
from modsent.training.pairs import no_duplicate_batches
from modsent.training.precision import autocast, default_device, for_model as precision_for, grad_scaler
from modsent.training.precision import resolve as resolve_precision
from modsent.schema import STORAGE_DTYPES
from modsent.training.seeding import dropout_seed, private_cpu_stream

log = logging.getLogger(__name__)

TRIPLET_COLUMNS = ["pair_id", "anchor_lang", "anchor", "positive_lang", "positive", "negative_lang", "negative"]
# each triplet's stratum where batches are grouped by length (length_groups): its pair's paraphrase
# dataset (a column the triplets carry where the pair files have it) in its anchor's language
STRATA = ("dataset", "anchor_lang")
# LoRA targets "qv": the query and value projections, by the names the architectures use
QUERY_VALUE_NAMES = (("q", "v"), ("query", "value"), ("q_proj", "v_proj"), ("q_lin", "v_lin"))
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class MST5Config:
    """An m-ST5 method's settings (the schema and its defaults: :mod:`modsent.methods.mst5`)."""

    model: str | None = None
    revision: str | None = None
    dtype: str = "float32"
    targets: str = "qv"
    lora_r: int = 8
    lora_alpha: float = 32
    lora_dropout: float = 0.1
    temperature: float = 0.05
    learning_rate: float = 5e-5
    batch_size: int = 128
    epochs: int = 1
    max_steps: int | None = None
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seq_len: int = 128
    datasets: tuple[str, ...] | None = ("mnli",)
    eval_pairs: int = 500
    gradient_checkpointing: bool = False  # each mT5 block run again in the backward; runtime
    seed: int = 0
    precision: str = "auto"
    storage_dtype: str = "float32"  # the saved weights (how the result is saved: not in the fingerprint)
    length_groups: int = 1  # > 1: batches grouped by length within each stratum (STRATA; triplet_data)
    compile: bool = False  # torch.compile the encoder (fastpath.compile_in_place); a runtime setting
    log_every: int = 10
    checkpoint_every: int = 500

    @classmethod
    def from_settings(cls, name: str, settings: Mapping) -> "MST5Config":
        """From ``methods.{name}`` (defaults filled in or not); unknown keys are an error."""
        from modsent.methods import settings_config

        return settings_config(cls, name, settings, tuples=("datasets",))

    def check(self, name: str) -> None:
        """The schema's rules, for direct library use (the workflow's config is already checked)."""
        sa.check_contrastive_settings(f"methods.{name}", self)
        problems = {
            "targets": self.targets not in ("qv", "all-linear"),
            "dtype": self.dtype not in DTYPES,
            "storage_dtype": self.storage_dtype not in STORAGE_DTYPES,
            "temperature": not self.temperature > 0,
            "seq_len": self.seq_len < 3,
            "lora_r": self.lora_r < 1,
            "checkpoint_every": self.checkpoint_every < 1,
            "log_every": self.log_every < 1,
            "seed": self.seed < 0,
            "datasets": self.datasets is not None and not self.datasets,
        }
        for key, bad in problems.items():
            if bad:
                raise InputError(f"methods.{name}.{key}: invalid value {getattr(self, key)!r} "
                                 "(see the method's settings: modsent.methods.mst5)")


# ---- data ----------------------------------------------------------------------------------------


def read_frames(pairs_paths: Mapping[str, str | Path], datasets, key: str) -> dict[str, pd.DataFrame]:
    """{language: its pairs} (``baselines.read_language_pairs``: unique pair ids) restricted to
    the rows whose ``dataset`` is one of ``datasets`` (None: every row). ``key`` names the
    setting in errors."""
    import pyarrow.parquet as pq

    frames = bl.read_language_pairs(pairs_paths)
    if datasets is None:
        return frames
    wanted = set(datasets)
    for lang, path in pairs_paths.items():
        if "dataset" not in pq.read_schema(path).names:
            raise InputError(f"{path}: no dataset column to choose {key} {sorted(wanted)} by "
                             f"({key}: null uses every row)")
        labels = pd.read_parquet(path, columns=["pair_id", "dataset"])
        ids = set(labels.loc[labels["dataset"].isin(wanted), "pair_id"].astype(str))
        if not ids:
            present = ", ".join(sorted(labels["dataset"].dropna().astype(str).unique()))
            raise InputError(f"{path}: no pair of {key} {sorted(wanted)}; the file's datasets: {present} "
                             f"({key}: null uses every row)")
        frames[lang] = frames[lang][frames[lang]["pair_id"].isin(ids)].reset_index(drop=True)
    return frames


def _drop_contradictory(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows whose negative equals their anchor or positive removed (no such triplet)."""
    bad = (rows["negative"] == rows["anchor"]) | (rows["negative"] == rows["positive"])
    if bad.any():
        log.info("%d triplets dropped: the negative's text equals the anchor's or the positive's", int(bad.sum()))
    return rows[~bad].reset_index(drop=True)


def crosslingual_triplets(frames: Mapping[str, pd.DataFrame], seed: int) -> pd.DataFrame:
    """mSimCSE's cross-lingual triplets (columns :data:`TRIPLET_COLUMNS`): for every pair id that
    has a negative in every language, and every language L (sorted order), the anchor in L, the
    positive in a random language and the negative in a random language (both drawn from every
    language, independently; a pure function of ``seed`` and the pairs)."""
    langs = sorted(frames)
    usable = {lang: frame.dropna(subset=["negative"]).set_index("pair_id") for lang, frame in frames.items()}
    ids = sorted(set.intersection(*(set(frame.index) for frame in usable.values())))
    if not ids:
        return pd.DataFrame(columns=TRIPLET_COLUMNS)
    # [language, pair id] tables of each text
    texts = {column: np.array([usable[lang].loc[ids, column].to_numpy(dtype=object) for lang in langs], dtype=object)
             for column in ("anchor", "positive", "negative")}
    rng = np.random.default_rng(seed)
    positive_lang = rng.integers(len(langs), size=(len(langs), len(ids)))
    negative_lang = rng.integers(len(langs), size=(len(langs), len(ids)))
    names, columns = np.array(langs), np.arange(len(ids))
    labels = _dataset_columns(usable[langs[0]], ids)
    rows = pd.concat([pd.DataFrame({
        "pair_id": ids, "anchor_lang": lang, "anchor": texts["anchor"][a],
        "positive_lang": names[positive_lang[a]], "positive": texts["positive"][positive_lang[a], columns],
        "negative_lang": names[negative_lang[a]], "negative": texts["negative"][negative_lang[a], columns],
        **labels}) for a, lang in enumerate(langs)], ignore_index=True)
    return _drop_contradictory(rows[TRIPLET_COLUMNS + list(labels)])


def _dataset_columns(frame: pd.DataFrame, ids) -> dict:
    """{"dataset": the labels of pair ``ids``} where ``frame`` (indexed by pair id) has them, else {}."""
    return {"dataset": frame.loc[ids, "dataset"].to_numpy(dtype=object)} if "dataset" in frame.columns else {}


def english_triplets(frame: pd.DataFrame) -> pd.DataFrame:
    """The English rows with a negative, as triplets (columns :data:`TRIPLET_COLUMNS`)."""
    rows = frame.dropna(subset=["negative"])
    rows = pd.DataFrame({"pair_id": rows["pair_id"], "anchor_lang": PIVOT_LANGUAGE, "anchor": rows["anchor"],
                         "positive_lang": PIVOT_LANGUAGE, "positive": rows["positive"],
                         "negative_lang": PIVOT_LANGUAGE, "negative": rows["negative"],
                         **({"dataset": rows["dataset"]} if "dataset" in rows.columns else {})})
    return _drop_contradictory(rows.reset_index(drop=True))


def triplet_data(rows: pd.DataFrame, batch_size: int, seed: int, length_groups: int = 1) -> bl.TrainingData:
    """The triplets and each epoch's batches: no text twice, no pair id twice in a batch;
    ``length_groups`` > 1: grouped by length, each batch keeping every stratum's share
    (:data:`STRATA`: a dataset in an anchor language)."""
    return bl.TrainingData(rows, lambda epoch: no_duplicate_batches(rows, batch_size, seed, epoch,
                                                                    group_column="pair_id",
                                                                    length_groups=length_groups,
                                                                    strata_column=STRATA))


# ---- the model -----------------------------------------------------------------------------------


def lora_targets(body: torch.nn.Module, targets: str, key: str = "targets") -> list[str]:
    """peft ``target_modules`` for ``targets``: "qv", the query and value projections' names
    (T5: q, v; BERT/XLM-R: query, value); "all-linear", the full name of every ``nn.Linear`` of
    the encoder but a pooler's (T5: q, k, v, o, wi_0, wi_1, wo of every block; a pooler does
    not take part in mean-pooled embeddings). ``key`` names the setting in errors."""
    linear = [name for name, module in body.named_modules()
              if isinstance(module, torch.nn.Linear) and "pooler" not in name.split(".")]
    if targets == "all-linear":
        return linear
    leaves = {name.rsplit(".", 1)[-1] for name in linear}
    for query, value in QUERY_VALUE_NAMES:
        if query in leaves and value in leaves:
            return [query, value]
    raise InputError(f"{key}: qv: no query/value projections found in {type(body).__name__} (its linear "
                     f"layers: {', '.join(sorted(leaves))}); use targets: all-linear")


@dataclasses.dataclass
class BuiltModel:
    model: sa.SentenceEncoderModel
    source: str
    targets: list[str]


def build_model(source: str | Path, cfg: MST5Config, key: str = "methods.mST5") -> BuiltModel:
    """The frozen encoder of ``source`` with a fresh LoRA (B = 0: it starts as the frozen model;
    A drawn from ``cfg.seed``), its sentence head and tokenizer; only the LoRA trains. ``key``:
    the method's settings in errors."""
    from peft import LoraConfig, get_peft_model

    body, tokenizer = tf.load_encoder_body(source, dtype=DTYPES[cfg.dtype], revision=cfg.revision)
    head, source_limit = tf.sentence_head(source, body)
    limit = tf.max_sequence_length(tokenizer, body, source_limit)
    body.requires_grad_(False)
    if cfg.gradient_checkpointing:
        body.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    targets = lora_targets(body, cfg.targets, f"{key}.targets")
    with private_cpu_stream(cfg.seed):
        encoder = get_peft_model(body, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                                                  lora_dropout=cfg.lora_dropout, target_modules=targets,
                                                  bias="none"))
    for name, param in encoder.named_parameters():
        param.requires_grad_("lora_" in name)
    model = sa.SentenceEncoderModel(encoder, tokenizer, head, min(cfg.seq_len, limit or cfg.seq_len))
    return BuiltModel(model, str(source), targets)


TRIPLET = ("anchor", "positive", "negative")


def batch_features(model: sa.SentenceEncoderModel, rows: pd.DataFrame) -> tuple[dict, dict, dict]:
    """The batch's anchors, positives and negatives tokenised for :func:`batch_loss`
    (``model.step_features``: pinned on a GPU, in sub-passes by length on the CPU), what the loop
    prepares one step ahead on a thread."""
    return tuple(model.step_features(rows[column].tolist()) for column in TRIPLET)


def batch_loss(model: sa.SentenceEncoderModel, loss_fn: TripletInfoNCELoss, rows: pd.DataFrame,
               features: tuple[dict, dict, dict] | None = None) -> torch.Tensor:
    """The triplet loss of one batch: anchors, positives and negatives encoded in three passes.
    ``features``: :func:`batch_features` of the batch, when prepared already."""
    if features is None:
        features = batch_features(model, rows)
    return loss_fn(*(model(part) for part in features))


# ---- training ------------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainingResult:
    model: sa.SentenceEncoderModel  # the LoRA not merged
    source: str
    metrics: dict
    history: list[list[float]]


def training_fingerprint(name: str, cfg: MST5Config, source: str, langs: list[str],
                         pairs_paths: Mapping[str, str | Path]) -> str:
    """What a checkpoint must match to be resumed: the method, its languages, its settings (the
    runtime ones, checkpoints.RUNTIME_SETTINGS, and the storage dtype may change) and the inputs'
    content (a local model directory's files; a Hub model by its id and revision, which are
    settings; each pair file)."""
    settings = {"method": name, "languages": langs, **dataclasses.asdict(cfg)}
    model_dir = source if Path(source).is_dir() else None
    return checkpoints.fingerprint(settings, model_dir, *(pairs_paths[lang] for lang in langs))


@fastpath.attention_for_varying_shapes()
def run_training(name: str, inputs: Mapping, cfg: MST5Config, *, english_only: bool, device: str | None = None,
                 progress: bool = True, checkpoint_dir: str | Path | None = None,
                 on_step: Callable[[int], None] | None = None) -> TrainingResult:
    """Train method ``name`` on ``inputs`` (``base``: the workflow's base model, used when
    ``cfg.model`` is None; ``pairs``: {language: paraphrase file}) and return the model (LoRA
    not merged), its metrics and logged losses; nothing is written but checkpoints
    (``checkpoint_dir``; None: none). ``on_step(step)`` runs after every step and checkpoint
    (the tests stop a run there)."""
    key = f"methods.{name}"
    pairs_paths = dict(inputs["pairs"])
    langs = [PIVOT_LANGUAGE] if english_only else sorted(pairs_paths)
    missing = [lang for lang in langs if lang not in pairs_paths]
    if missing:
        raise InputError(f"{name}: no paraphrase pairs for {', '.join(missing)}")
    source = tf.model_source(cfg.model, inputs.get("base"), key)
    device = default_device(device)
    if cfg.compile:  # before any work: a missing compiler is an input error
        fastpath.check_compilable(device, f"{key}.compile")
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None

    frames = read_frames({lang: pairs_paths[lang] for lang in langs}, cfg.datasets, f"{key}.datasets")
    train, heldout = bl.split_heldout_by_pivot(frames, cfg.eval_pairs)
    pivot = bl.pivot_language(frames)
    rows = english_triplets(train[PIVOT_LANGUAGE]) if english_only else crosslingual_triplets(train, cfg.seed)
    if len(rows) < 2:
        raise InputError(f"{key}: {len(rows)} training triplets (pairs with a negative"
                         + ("" if english_only else " in every language") + f" in {key}.datasets "
                         f"{list(cfg.datasets) if cfg.datasets is not None else 'all'}); at least 2 are needed")
    data = triplet_data(rows, cfg.batch_size, cfg.seed, cfg.length_groups)
    epoch_batches = len(data.epoch_batches(0))
    total_steps = cfg.max_steps or cfg.epochs * epoch_batches
    warmup_steps = schedules.warmup_steps_of(cfg.warmup_ratio, total_steps)

    built = build_model(source, cfg, key)
    model = built.model.to(device)
    fastpath.speed_up(model)  # same parameters and results, fewer kernels under autocast
    if cfg.compile:  # batches padded to their longest sentence: shapes vary, so dynamic sizes
        fastpath.compile_in_place(model.encoder, device, f"{key}.compile", dynamic=None,
                                  eager_random=cfg.gradient_checkpointing)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    n_total = sum(p.numel() for p in model.parameters())
    body = efficiency.start(model.encoder, device)  # for the model FLOPs of metrics.json: three passes a step
    log.info("%s: %d %s triplets of %d pair ids (%s), %d held-out pair ids; %d batches per epoch, %d steps; "
             "%s, LoRA on %s: %d of %d parameters trained", name, len(rows),
             "English" if english_only else "cross-lingual", rows["pair_id"].nunique(), ", ".join(langs),
             len(heldout[pivot]), epoch_batches, total_steps, source, cfg.targets, n_trainable, n_total)
    optimizer = torch.optim.AdamW(trainable, lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                                  **step_options(trainable))
    loss_fn = TripletInfoNCELoss(cfg.temperature)
    eval_batch = max(1, min(cfg.batch_size, 64))

    precision = precision_for(model, device, cfg.precision)  # mT5 stays out of fp16
    if cfg.dtype == "bfloat16" and resolve_precision(device, "auto") == "fp16":
        log.warning("%s: dtype bfloat16 on a GPU without bf16 units (%s): it still halves the frozen weights' "
                    "memory, but their products are emulated, at about fp32's speed; a GPU with bf16 (A100, "
                    "H100) runs them several times faster", name, device)

    def evaluate():
        return bl._heldout_accuracies(model, heldout, pivot, eval_batch, precision)

    scaler = grad_scaler(device, precision)  # fp16: the loss scaler; else a pass-through
    fingerprint = training_fingerprint(name, cfg, source, langs, pairs_paths)
    resumed = checkpoints.resume(checkpoint_dir, model, optimizer, fingerprint, scaler) if checkpoint_dir else None
    start = resumed["step"] if resumed else 0
    mono_before, cross_before = resumed["accuracy_before"] if resumed else evaluate()

    def prepare(batch):  # on a thread, one step ahead: the next batch tokenised (and pinned)
        return batch_features(model, data.rows.iloc[batch])

    log_ = TrainingLog(total_steps, start, name, progress, cfg.log_every, resumed, scaler)
    model.train()

    for step, (batch, features) in enumerate(ahead(bl.iter_steps(data, total_steps, start), prepare), start=start):
        lr = set_learning_rate(optimizer, schedules.warmup_linear(step, total_steps, warmup_steps, cfg.learning_rate))
        torch.manual_seed(dropout_seed(step, cfg.seed))  # the same masks in a resumed run
        with autocast(device, precision):
            loss = batch_loss(model, loss_fn, data.rows.iloc[batch], features)
        scaler.scale(loss).backward()
        optimizer_step(optimizer, trainable, cfg.max_grad_norm, scaler)
        log_.record(step, loss, lr, len(batch), features)  # read back and logged at the logged steps
        if checkpoint_due(step + 1, cfg.checkpoint_every, total_steps, checkpoint_dir):
            checkpoints.save_checkpoint(checkpoint_dir, model, optimizer, step + 1, fingerprint,
                                        log_.state(accuracy_before=[mono_before, cross_before]), scaler)
        if on_step is not None:
            on_step(step + 1)
    losses, history, triplets_seen, elapsed = log_.close()
    figures = log_.efficiency(body, elapsed, device)  # the anchors', positives' and negatives' tokens
    model.eval()
    mono_after, cross_after = evaluate()

    metrics = {
        "method": name, "source_model": source, "english_only": english_only, "languages": langs,
        "loss": "TripletInfoNCE", "lora_targets": built.targets,
        "loss_first": history[0][1] if history else None, "loss_last": history[-1][1] if history else None,
        "heldout_retrieval_accuracy_before": mono_before, "heldout_retrieval_accuracy_after": mono_after,
        "heldout_retrieval_accuracy_mean_before": bl._mean(mono_before.values()),
        "heldout_retrieval_accuracy_mean_after": bl._mean(mono_after.values()),
        "heldout_crosslingual_retrieval_accuracy_before": cross_before,
        "heldout_crosslingual_retrieval_accuracy_after": cross_after,
        "heldout_pairs": {lang: len(frame) for lang, frame in sorted(heldout.items())},
        "train_triplets": len(rows), "train_pair_ids": int(rows["pair_id"].nunique()),
        "triplets_by_anchor_language": {k: int(v) for k, v in sorted(rows["anchor_lang"].value_counts().items())},
        "crosslingual_positive_share": float((rows["positive_lang"] != rows["anchor_lang"]).mean()),
        "crosslingual_negative_share": float((rows["negative_lang"] != rows["anchor_lang"]).mean()),
        "steps": len(losses), "batches_per_epoch": epoch_batches, "resumed_from_step": start,
        "pairs_per_second": triplets_seen / elapsed if elapsed > 0 and triplets_seen else None,
        "padding_fraction": log_.padding_fraction,  # of the encoded positions: this run's steps
        **figures,  # model FLOPs, their rate, MFU, peak memory (modsent.training.efficiency)
        "trainable_parameters": n_trainable, "total_parameters": n_total, "max_seq_length": model.max_seq_length,
        "device": str(device), "config": dataclasses.asdict(cfg),
    }
    return TrainingResult(model, source, metrics, history)


def write_output(result: TrainingResult, out_dir: str | Path, dtype: str = "float32") -> None:
    """``out_dir`` (atomically): the LoRA merged into the encoder, saved as a
    sentence-transformers directory in ``dtype`` (the setting ``storage_dtype``), with
    ``metrics.json``, ``loss.tsv`` and ``loss.png``. The merge is float32 whatever the frozen
    weights trained in (the setting ``dtype``), and so are the saved weights unless
    ``storage_dtype`` asks for half: a LoRA update is often finer than a bfloat16 weight's
    resolution (8 bits of mantissa), so merging into bfloat16 weights would round much of what
    was learnt away. The saved model
    computes what the trained one did: its frozen weights' values and the LoRA's product. The
    merge runs on the host (the job's memory, not what the GPU's allocator keeps after training:
    mt5-xxl's encoder is 22.6 GB in float32)."""
    model = result.model
    model.encoder = model.encoder.to("cpu").float().merge_and_unload()  # a plain Hugging Face model again
    with atomic_path(out_dir, directory=True) as tmp:
        tf.save_sentence_transformer(model.encoder, model.tokenizer, model.head, model.max_seq_length, tmp,
                                     source=result.source, dtype=dtype)
        (tmp / "metrics.json").write_text(json.dumps(result.metrics, indent=2) + "\n", encoding="utf-8")
        write_loss_curve(result.history, tmp, title=f"{result.metrics['method']} (LoRA)", ylabel="triplet InfoNCE")


def train_mst5(name: str, inputs: Mapping, out_dir: str | Path, settings: Mapping, *, english_only: bool,
               device: str | None = None, progress: bool = True, checkpoint_dir: str | Path | None = None,
               on_step: Callable[[int], None] | None = None) -> dict:
    """An m-ST5 method's ``train``: :func:`run_training` with checkpoints in ``checkpoint_dir``
    (default ``{out_dir}.checkpoint``), then :func:`write_output`; the checkpoint is removed once
    the output is complete. Returns the metrics."""
    cfg = MST5Config.from_settings(name, settings)
    out_dir = Path(out_dir)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else checkpoints.checkpoint_path(out_dir)
    result = run_training(name, inputs, cfg, english_only=english_only, device=device, progress=progress,
                          checkpoint_dir=checkpoint_dir, on_step=on_step)
    write_output(result, out_dir, cfg.storage_dtype)
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    m = result.metrics
    log.info("%s: loss %.3f → %.3f; held-out retrieval accuracy (mean over %d languages) %s → %s; %.1f triplets/s, "
             "%s", name, m["loss_first"] or 0, m["loss_last"] or 0, len(m["languages"]),
             m["heldout_retrieval_accuracy_mean_before"], m["heldout_retrieval_accuracy_mean_after"],
             m["pairs_per_second"] or 0, efficiency.describe(m))
    return m

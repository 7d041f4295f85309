"""Cross-lingual alignment (CLA) training: a parallel adapter on L's frozen LA + SE model that
pulls L's sentence embeddings towards the frozen English encoder's (method steps 6-7).

The model of a non-English language L during CLA training:

    L's tokenizer + embeddings, base + merged LA, SE LoRA, pooling      frozen
    parallel adapters beside every FFN (modsent.modular.parallel_adapter)       trained

The English side is frozen: :func:`embed_english` encodes every English training sentence once
per base model with the English LA + SE encoder and writes

    {out}.safetensors        embeddings [N, d] float32 (what ``SentenceEncoder.encode`` returns:
                             L2-normalised), metadata: the base identity, N, d, a hash of the ids
    {out stem}.units.parquet unit_id, text — row i of ``embeddings`` is ``unit_id[i]``

(:func:`units_path` names the second file). Each language's CLA training looks English vectors
up by content-hash id (``modsent.data.translation.unit_id``) instead of re-encoding them.

Objectives (``kind``):

    pp   MNRL: ``scale * cos(en_anchor_i, [pos_L_j ..., neg_L_j ...])``, cross-entropy with
         target j = i; the English anchor is looked up, L's positive and hard negative (where
         present) are encoded by the trainable model; batches hold no text twice
         (``training.pairs.no_duplicate_batches``). Data: ``crosslingual_paraphrase_pairs``.
    pl   sentence-transformers' CosineSimilarityLoss with label 1: ``mean((cos(en_i, l_i) - 1)^2)``
         between the English sentence's frozen embedding and its translation encoded by the
         trainable model. Data: ``parallel_pairs`` (unit_id, english, translation).

The output directory of :func:`train_alignment_adapter` (written atomically):

    adapter/          the parallel adapter (parallel_adapter.safetensors + config; metadata
                      {language, kind, ...}); :func:`merge_alignment_adapters` writes the same layout
    metrics.json      loss first/last, steps, pairs/s, held-out English→L retrieval accuracy
                      before and after
    loss.tsv, loss.png

Training resumes like the SE adapter's (the loop of :mod:`modsent.training.loop` and its checkpoints): a job
killed midway and rerun continues from ``{out}.checkpoint/`` (safetensors + JSON), seeing the
batches and dropout an unbroken run sees; a checkpoint of other settings or inputs (pairs, LA,
SE, English embeddings, base) is ignored, and it is removed once the output is complete.

Held-out slice: the pairs with the smallest content hash (``training.pairs.split_heldout``);
training pairs sharing an English or L text with a held-out pair are dropped, so the held-out
texts are never trained on. Retrieval: for each held-out English sentence (its stored frozen
embedding), is its own L text the most similar (cosine) among the held-out L texts?
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from modsent.modular import parallel_adapter as pa
from modsent import losses
from modsent.modular import sentence_adapter as sa
from modsent.evaluation.plots import write_loss_curve
from modsent.io import InputError, atomic_path, write_parquet, write_safetensors
from modsent.data.translation import make_units, unit_id
from modsent.training import checkpoints, efficiency, fastpath
from modsent.training.optim import adamw
from modsent.training.loop import TrainingLog, ahead, checkpoint_due, optimizer_step, pinned, set_learning_rate, to_device
from modsent.training import schedules
from modsent.training.pairs import (PAIR_TEXT_COLUMNS, dataset_labels, epochs_of, fingerprinted, split_heldout,
                                    steps_of_epochs)
from modsent.training.precision import autocast, default_device, describe_device, grad_scaler
from modsent.training.seeding import dropout_seed, private_cpu_stream

log = logging.getLogger(__name__)

KINDS = ("pp", "pl")
#: Keys of the config's alignment section that choose pl's training data (the workflow reads
#: the provided translations), not how the adapter trains
DATA_KEYS = ("provided_translations", "max_provided")
# the settings of pl's data alone, left out of pp's params (rules/common.smk: ALIGNMENT_DATA_KEYS)
PL_ONLY_KEYS = DATA_KEYS + ("max_parallel",)
ADAPTER_DIR = "adapter"
EMBEDDINGS_KEY = "embeddings"
EMBEDDINGS_FORMAT = "modsent-english-embeddings/1"
ENGLISH_TEXT_COLUMNS = ("text", "english", "anchor", "positive", "negative")
#: The texts of a row that L's encoder encodes (the English anchor is looked up): what
#: length-grouped batches group by
L_TEXT_COLUMNS = ("positive", "negative")


# ---- configuration ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AlignmentConfig:
    """Hyperparameters of CLA training (defaults: the paper's). ``max_steps`` (if set) replaces
    ``epochs``. ``seq_len`` None: the SE adapter's training length (its metrics.json), else the
    base's maximum. ``adapter``: the parallel adapter's shape (``ParallelAdapterConfig``)."""

    batch_size: int = 256
    learning_rate: float = 2e-5
    epochs: int = 1
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    scale: float = 20.0
    seq_len: int | None = None
    eval_pairs: int = 500
    seed: int = 0
    max_steps: int | None = None
    max_parallel: int | None = None  # pl: at most this many pairs, by content hash (alignment_pairs)
    log_every: int = 10
    checkpoint_every: int = 500  # optimizer steps between resumable checkpoints
    precision: str = "auto"  # modsent.training.precision: auto, fp16 or fp32
    compile: bool = False  # torch.compile the encoder (fastpath.compile_in_place)
    length_groups: int = 1  # > 1: batches grouped by L's lengths (training.pairs.no_duplicate_batches)
    adapter: pa.ParallelAdapterConfig = dataclasses.field(default_factory=pa.ParallelAdapterConfig)

    @classmethod
    def from_config(cls, section: dict) -> "AlignmentConfig":
        """From a config section: these field names (``lr`` is accepted for ``learning_rate``;
        :data:`DATA_KEYS` choose pl's data, which the caller reads, and are passed over),
        the adapter's under ``adapter: {reduction_factor, bottleneck_size, scaling, dropout,
        layers}``; missing keys take the defaults, unknown keys are an error."""
        section = {key: value for key, value in (section or {}).items() if key not in DATA_KEYS}
        if "lr" in section:
            if "learning_rate" in section:
                raise InputError("alignment: give learning_rate or lr, not both")
            section["learning_rate"] = section.pop("lr")
        adapter = section.pop("adapter", None)
        known = {f.name for f in dataclasses.fields(cls)} - {"adapter"}
        unknown = sorted(set(section) - known)
        if unknown:
            raise InputError(f"alignment: unknown key(s) {', '.join(unknown)}; allowed: "
                             f"{', '.join(sorted(known | {'adapter'}))}")
        if adapter is not None:
            if isinstance(adapter, dict) and isinstance(adapter.get("layers"), list):
                adapter = {**adapter, "layers": tuple(adapter["layers"])}
            section["adapter"] = pa.ParallelAdapterConfig.from_dict(adapter)
        return cls(**section)

    def __post_init__(self):
        sa.check_contrastive_settings("alignment", self)
        if self.seq_len is not None and self.seq_len < 3:
            raise InputError(f"alignment.seq_len must be at least 3 or null, got {self.seq_len}")
        if self.log_every < 1:
            raise InputError(f"alignment.log_every must be at least 1, got {self.log_every}")
        if self.checkpoint_every < 1:
            raise InputError(f"alignment.checkpoint_every must be at least 1, got {self.checkpoint_every}")
        if self.max_parallel is not None and self.max_parallel < 1:
            raise InputError(f"alignment.max_parallel must be at least 1 or null, got {self.max_parallel}")
        if not isinstance(self.adapter, pa.ParallelAdapterConfig):
            raise InputError("alignment.adapter must be a ParallelAdapterConfig")

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["adapter"] = self.adapter.to_dict()
        return out

    def fingerprint(self, kind: str, *inputs) -> str:
        """What a checkpoint of a ``kind`` adapter must match to be resumed
        (:func:`modsent.training.checkpoints.fingerprint`)."""
        return checkpoints.fingerprint({**self.to_dict(), "kind": kind}, *inputs)


# ---- English embeddings ------------------------------------------------------------------------


def units_path(embeddings_path: str | Path) -> Path:
    """The parquet (unit_id, text) beside an English embeddings file, rows in the same order."""
    path = Path(embeddings_path)
    return path.with_name(f"{path.stem}.units.parquet")


def _english_sentences(source) -> list[str]:
    """Texts from a list, or from parquet file(s): every column of ENGLISH_TEXT_COLUMNS present
    (a units file's ``text``, a parallel file's ``english``, a pair file's anchor/positive/negative)."""
    if isinstance(source, (str, Path)):
        source = [source]
    source = list(source)
    if source and all(isinstance(s, Path) or (isinstance(s, str) and s.endswith(".parquet")) for s in source):
        texts: list[str] = []
        for path in source:
            frame = pd.read_parquet(path)
            columns = [c for c in ENGLISH_TEXT_COLUMNS if c in frame.columns]
            if not columns:
                raise InputError(f"{path}: no sentence column (expected one of {', '.join(ENGLISH_TEXT_COLUMNS)})")
            for column in columns:
                texts.extend(t for t in frame[column] if isinstance(t, str))
        return texts
    return source


def embed_english(base_model_dir: str | Path, en_la_dir: str | Path | None, en_se_dir: str | Path | None,
                  sentences, out_path: str | Path, batch_size: int = 64, *,
                  device: str | None = None) -> Path:
    """Encode the distinct English sentences once with the frozen English encoder (LA + SE) and
    write ``out_path`` (safetensors: ``embeddings`` [N, d] float32, rows sorted by unit id) and
    :func:`units_path` (unit_id, text), both atomically. ``sentences``: a list of texts or parquet
    path(s) (see :func:`_english_sentences`). Returns ``out_path``."""
    units = make_units(_english_sentences(sentences))
    if units.empty:
        raise InputError("embed_english: no English sentences")
    encoder = sa.load_sentence_encoder(base_model_dir, en_la_dir, en_se_dir, device=device)
    log.info("encoding on %s", describe_device(next(encoder.model.parameters()).device))
    start = time.perf_counter()
    embeddings = encoder.encode(units["text"].tolist(), batch_size).astype(np.float32)
    elapsed = time.perf_counter() - start
    identity = pa.base_model_identity(encoder.model.encoder)
    metadata = {
        "format": EMBEDDINGS_FORMAT, "rows": str(len(units)), "dim": str(embeddings.shape[1]),
        "units_sha256": _ids_digest(units["unit_id"]), "normalized": "true",
        "base_model": json.dumps(identity, sort_keys=True),
        "language_adapter": str(en_la_dir or ""), "sentence_adapter": str(en_se_dir or ""),
    }
    out_path = Path(out_path)
    write_parquet(units, units_path(out_path))
    with atomic_path(out_path) as tmp:
        write_safetensors({EMBEDDINGS_KEY: torch.from_numpy(np.ascontiguousarray(embeddings))}, tmp, metadata)
    log.info("English embeddings: %d sentences, dim %d, %.1f sentences/s -> %s", len(units),
             embeddings.shape[1], len(units) / elapsed if elapsed > 0 else 0.0, out_path)
    return out_path


def _ids_digest(ids) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


@dataclasses.dataclass
class EnglishEmbeddings:
    """The frozen English vectors: ``vectors`` [N, d] float32 tensor, ``index`` unit_id -> row,
    ``base_model`` the identity of the base they were made on."""

    vectors: torch.Tensor
    index: dict[str, int]
    base_model: dict

    def rows(self, texts: Sequence[str]) -> list[int]:
        """Row of each text; an InputError lists texts that have no embedding."""
        rows, missing = [], []
        for text in texts:
            row = self.index.get(unit_id(text))
            if row is None:
                missing.append(text)
            rows.append(row)
        if missing:
            raise InputError(f"{len(missing)} English sentence(s) have no stored embedding (not among the "
                             f"sentences given to embed_english), e.g. {missing[:3]!r}")
        return rows

    def lookup(self, texts: Sequence[str]) -> torch.Tensor:
        return self.vectors[self.rows(texts)]


def read_english_embeddings(path: str | Path) -> EnglishEmbeddings:
    """Read what :func:`embed_english` wrote, checking that the two files belong together."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    ids_path = units_path(path)
    if not path.is_file() or not ids_path.is_file():
        raise InputError(f"{path}: English embeddings need {path.name} and {ids_path.name} (embed_english)")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            vectors = handle.get_tensor(EMBEDDINGS_KEY)
    except (SafetensorError, OSError) as err:
        raise InputError(f"{path}: unreadable English embeddings: {err}") from None
    if metadata.get("format") != EMBEDDINGS_FORMAT:
        raise InputError(f"{path}: not an English embeddings file of format {EMBEDDINGS_FORMAT}")
    ids = pd.read_parquet(ids_path)["unit_id"].astype(str).tolist()
    if len(ids) != vectors.shape[0] or _ids_digest(ids) != metadata.get("units_sha256"):
        raise InputError(f"{ids_path}: does not match {path.name} (rows or ids differ): rerun embed_english")
    return EnglishEmbeddings(vectors.float(), {u: i for i, u in enumerate(ids)},
                             json.loads(metadata.get("base_model", "{}")))


def read_english_embeddings_files(paths) -> EnglishEmbeddings:
    """One path (:func:`read_english_embeddings`) or several files of the same base model and
    dimension read as one (a sentence in two files: the first file's row)."""
    if isinstance(paths, (str, Path)):
        return read_english_embeddings(paths)
    paths = list(paths)
    if not paths:
        raise InputError("no English embeddings file given")
    parts = [read_english_embeddings(path) for path in paths]
    first = parts[0]
    vectors, index = [first.vectors], dict(first.index)
    offset = len(first.vectors)
    for path, part in zip(paths[1:], parts[1:]):
        if part.base_model != first.base_model or part.vectors.shape[1] != first.vectors.shape[1]:
            raise InputError(f"{path}: made on another base model or dimension than {paths[0]}")
        for uid, row in part.index.items():
            index.setdefault(uid, offset + row)
        vectors.append(part.vectors)
        offset += len(part.vectors)
    return EnglishEmbeddings(torch.cat(vectors), index, first.base_model)


# ---- data --------------------------------------------------------------------------------------


def alignment_pairs(kind: str, pairs, max_parallel: int | None = None) -> pd.DataFrame:
    """The training rows of ``kind`` as ``anchor`` (English), ``positive`` (L), ``negative`` (L or
    None): from ``crosslingual_paraphrase_pairs`` (pp) or ``parallel_pairs`` (pl), a frame or a
    parquet path. Empty or missing texts are dropped. ``max_parallel`` (pl,
    ``alignment.max_parallel``): at most that many pairs, those of smallest content hash
    (``data.paraphrase.smallest_hashes``: the same pairs whatever their order)."""
    from modsent.data.paraphrase import smallest_hashes

    _check_kind(kind)
    frame = pd.read_parquet(pairs) if isinstance(pairs, (str, Path)) else pd.DataFrame(pairs)
    need = ("anchor", "positive") if kind == "pp" else ("english", "translation")
    missing = set(need) - set(frame.columns)
    if missing:
        raise InputError(f"{kind} pairs: missing columns {sorted(missing)} (expected {', '.join(need)})")
    if kind == "pl":
        frame = smallest_hashes(frame, max_parallel)
    if kind == "pp":
        out = pd.DataFrame({"anchor": frame["anchor"], "positive": frame["positive"],
                            "negative": frame["negative"] if "negative" in frame.columns else None})
    else:
        out = pd.DataFrame({"anchor": frame["english"], "positive": frame["translation"], "negative": None})
    if "dataset" in frame.columns:  # length-grouped batches keep each dataset's share
        out["dataset"] = dataset_labels(frame["dataset"])
    # texts exactly as given (the English side is looked up by the hash of its exact text)
    for column in PAIR_TEXT_COLUMNS:
        out[column] = out[column].map(lambda t: t if isinstance(t, str) and t.strip() else None)
    out = out.dropna(subset=["anchor", "positive"]).reset_index(drop=True)
    contradictory = out["negative"] == out["positive"]
    out.loc[contradictory, "negative"] = None
    if len(out) < 2:
        raise InputError(f"{kind} pairs: {len(out)} usable pairs; at least 2 are needed")
    return out


def split_pairs(pairs: pd.DataFrame, count: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, heldout): ``training.pairs.split_heldout``, then training rows that share any
    text with a held-out row are dropped."""
    train, heldout = split_heldout(pairs, count)
    held_texts = set(heldout["anchor"]) | set(heldout["positive"])
    clash = train["anchor"].isin(held_texts) | train["positive"].isin(held_texts) \
        | train["negative"].isin(held_texts)
    return train[~clash].reset_index(drop=True), heldout


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise InputError(f"alignment kind must be one of {', '.join(KINDS)}, not {kind!r}")


# ---- the model -----------------------------------------------------------------------------------


def build_alignment_model(base_model_dir, la_dir, se_dir, cfg: AlignmentConfig, *,
                          device: str | None = None) -> sa.SentenceEncoderModel:
    """L's frozen encoder (base + LA + SE) with fresh parallel adapters, the only trainable part.
    A fresh adapter adds zero: the model starts as exactly L's SE encoder."""
    encoder = sa.load_sentence_encoder(base_model_dir, la_dir, se_dir, device=device,
                                       max_seq_length=cfg.seq_len)
    model = encoder.model
    with private_cpu_stream(cfg.seed):  # the down-projections' initialisation
        pa.add_parallel_adapters(model.encoder, cfg.adapter)
    pa.freeze_all_but_adapters(model)
    return model


def batch_inputs(kind: str, model: sa.SentenceEncoderModel, english: EnglishEmbeddings,
                 rows: pd.DataFrame) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """What a batch needs from the host: the English vectors looked up and L's texts (positives,
    then pp's hard negatives) tokenised for one step (``model.step_features``: in pinned memory
    when the model is on a GPU, in sub-passes by length on the CPU; a training loop prepares
    them ahead on a thread: modsent.training.loop.ahead)."""
    anchors = english.lookup(rows["anchor"].tolist())
    texts = rows["positive"].tolist()
    if kind != "pl":
        texts += [t for t in rows["negative"] if isinstance(t, str)]
    return pinned(anchors, next(model.encoder.parameters()).device), model.step_features(texts)


def batch_loss(kind: str, model: sa.SentenceEncoderModel, english: EnglishEmbeddings, rows: pd.DataFrame,
               scale: float = 20.0, inputs: tuple[torch.Tensor, dict] | None = None) -> torch.Tensor:
    """The loss of one batch: the English side looked up, L's texts encoded in one forward pass
    (on the CPU in sub-passes by length). ``inputs``: :func:`batch_inputs` of the batch, when
    prepared already."""
    device = next(model.encoder.parameters()).device
    anchors, features = inputs if inputs is not None else batch_inputs(kind, model, english, rows)
    anchors = to_device(anchors, device)
    if kind == "pl":
        return losses.CosineSimilarityLoss()(anchors, model(features))
    return pp_pass_loss(losses.MultipleNegativesRankingLoss(scale), anchors, model(features).float())


def pp_pass_loss(loss_fn: losses.MultipleNegativesRankingLoss, anchors: torch.Tensor,
                 emb: torch.Tensor) -> torch.Tensor:
    """pp's MNRL of one forward pass over L's side, its rows in :func:`batch_inputs`' order:
    the positives of the ``len(anchors)`` pairs, then the hard negatives present."""
    n = len(anchors)
    return loss_fn(anchors, emb[:n], emb[n:] if len(emb) > n else None)


def retrieval_accuracy(model: sa.SentenceEncoderModel, english: EnglishEmbeddings, anchors: Sequence[str],
                       targets: Sequence[str], *, batch_size: int = 64, precision: str = "auto") -> float | None:
    """English→L: share of English sentences (their stored embeddings) whose most similar L text
    among ``targets`` (encoded by ``model``) is their own."""
    return heldout_diagnostics(model, english, anchors, targets, batch_size=batch_size,
                               precision=precision)["retrieval_accuracy"]


def mean_pairwise_cosine(vectors: np.ndarray) -> float | None:
    """The mean cosine between distinct rows (1.0: every vector points the same way)."""
    x = np.asarray(vectors, dtype=np.float64)
    n = len(x)
    if n < 2:
        return None
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    total = x.sum(axis=0)
    return float((total @ total - n) / (n * (n - 1)))


def heldout_diagnostics(model: sa.SentenceEncoderModel, english: EnglishEmbeddings, anchors: Sequence[str],
                        targets: Sequence[str], *, batch_size: int = 64, precision: str = "auto") -> dict:
    """On the held-out pairs: ``retrieval_accuracy`` (English→L, see :func:`retrieval_accuracy`),
    ``pair_cosine`` (mean cosine of each English vector with its own L text) and ``l_spread``
    (:func:`mean_pairwise_cosine` of the L vectors). A rising ``l_spread`` with a flat
    ``pair_cosine`` shows every L vector drifting towards the same point (the English centroid)
    instead of towards its own translation: what a few steps on a few hundred pairs do."""
    if len(anchors) < 2:
        return {"retrieval_accuracy": None, "pair_cosine": None, "l_spread": None}
    a = nn.functional.normalize(english.lookup(anchors), dim=-1).numpy()
    t = model.encode(targets, batch_size, precision=precision)
    return {"retrieval_accuracy": float(((a @ t.T).argmax(axis=1) == np.arange(len(a))).mean()),
            "pair_cosine": float((a * t).sum(axis=1).mean()), "l_spread": mean_pairwise_cosine(t)}


# ---- training ------------------------------------------------------------------------------------


@fastpath.attention_for_varying_shapes()
def train_alignment_adapter(kind: str, base_model_dir: str | Path, la_dir: str | Path | None,
                            se_dir: str | Path | None, pairs, english_embeddings_path,
                            out_dir: str | Path, cfg: AlignmentConfig = AlignmentConfig(), *,
                            language: str | None = None, checkpoint_dir: str | Path | None = None,
                            device: str | None = None, progress: bool = True, on_step=None) -> dict:
    """Train L's ``kind`` (pp or pl) CLA adapter on ``pairs`` (frame or parquet, see
    :func:`alignment_pairs`) against the English embeddings (a file of :func:`embed_english`, or
    a list of them read as one); write ``out_dir`` atomically and
    return the metrics.

    Every ``cfg.checkpoint_every`` steps a checkpoint goes to ``checkpoint_dir`` (default
    ``{out_dir}.checkpoint``); a rerun with the same settings and inputs continues from it, and
    it is removed once ``out_dir`` is complete. ``on_step(step)`` is called after every
    optimizer step and checkpoint (tests use it to kill the process midway)."""

    _check_kind(kind)
    out_dir = Path(out_dir)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else checkpoints.checkpoint_path(out_dir)
    language = language or out_dir.name
    device = default_device(device)
    if cfg.compile:  # before any work: a missing compiler is an input error
        fastpath.check_compilable(device, "alignment.compile")

    english_files = [str(english_embeddings_path)] if isinstance(english_embeddings_path, (str, Path)) \
        else [str(path) for path in english_embeddings_path]
    english_embeddings_path = english_files[0] if len(english_files) == 1 else english_files  # as named
    english = read_english_embeddings_files(english_files)
    data = alignment_pairs(kind, pairs, cfg.max_parallel)
    english.rows(data["anchor"].tolist())  # every English text must have a vector: fail early
    train, heldout = split_pairs(data, cfg.eval_pairs)
    if len(train) < 2:
        raise InputError(f"{kind} pairs: {len(train)} training pairs after holding out {len(heldout)}")
    epochs = epochs_of(train, cfg.batch_size, cfg.seed, length_groups=cfg.length_groups, length_columns=L_TEXT_COLUMNS)
    epoch_batches = len(epochs(0))
    total_steps = cfg.max_steps or cfg.epochs * epoch_batches
    log.info("CLA %s %s: %d training pairs, %d held out; %d batches per epoch; %d steps",
             kind, language, len(train), len(heldout), epoch_batches, total_steps)

    model = build_alignment_model(base_model_dir, la_dir, se_dir, cfg, device=device)
    fastpath.speed_up(model)  # same parameters and results, fewer kernels under autocast
    identity = pa.base_model_identity(model.encoder)
    mismatch = pa._identity_mismatch(english.base_model, identity, ("English embeddings", "model"))
    if mismatch:
        raise InputError(f"{english_embeddings_path}: made on another base model than "
                         f"{base_model_dir}: {'; '.join(mismatch)}")
    if english.vectors.shape[1] != model.encode(data["positive"].tolist()[:1]).shape[1]:
        raise InputError(f"{english_embeddings_path}: dimension {english.vectors.shape[1]} differs from the model's")
    if cfg.compile:  # batches padded to their longest sentence: shapes vary, so dynamic sizes
        fastpath.compile_in_place(model.encoder, device, "alignment.compile", dynamic=None)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    n_total = sum(p.numel() for p in model.parameters())
    body = efficiency.start(model.encoder, device)  # for the model FLOPs of metrics.json
    optimizer = adamw(trainable, cfg.learning_rate, cfg.weight_decay)
    eval_batch = max(1, min(cfg.batch_size, 64))

    def evaluate():
        return heldout_diagnostics(model, english, heldout["anchor"].tolist(), heldout["positive"].tolist(),
                                   batch_size=eval_batch, precision=cfg.precision)

    scaler = grad_scaler(device, cfg.precision)  # fp16: the loss scaler; else a pass-through
    fingerprint = cfg.fingerprint(kind, base_model_dir, la_dir, se_dir, fingerprinted(data, cfg.length_groups),
                                  *english_files)
    resumed = checkpoints.resume(checkpoint_dir, model, optimizer, fingerprint, scaler)
    start = resumed["step"] if resumed else 0
    before = resumed["heldout_before"] if resumed and "heldout_before" in resumed else evaluate()
    log_ = TrainingLog(total_steps, start, f"CLA {kind} {language}", progress, cfg.log_every, resumed, scaler)
    model.train()
    batches = steps_of_epochs(epochs, total_steps, start)

    def prepare(batch):  # on a thread, one step ahead: the next batch's vectors and tokens
        return batch_inputs(kind, model, english, train.iloc[batch])

    for step, (batch, inputs) in enumerate(ahead(batches, prepare), start=start):
        lr = set_learning_rate(optimizer, schedules.warmup_ratio_linear(step, total_steps, cfg.warmup_ratio,
                                                                        cfg.learning_rate))
        torch.manual_seed(dropout_seed(step, cfg.seed))
        with autocast(device, cfg.precision):
            loss = batch_loss(kind, model, english, train.iloc[batch], cfg.scale, inputs)
        scaler.scale(loss).backward()
        optimizer_step(optimizer, trainable, cfg.max_grad_norm, scaler)
        log_.record(step, loss, lr, len(batch), inputs)  # read back at the logged steps: no GPU wait here
        if checkpoint_due(step + 1, cfg.checkpoint_every, total_steps, checkpoint_dir):
            checkpoints.save_checkpoint(checkpoint_dir, model, optimizer, step + 1, fingerprint,
                                        log_.state(heldout_before=before), scaler)
        if on_step is not None:
            on_step(step + 1)
    losses, history, pairs_seen, elapsed = log_.close()
    figures = log_.efficiency(body, elapsed, device)  # L's texts: the English side is looked up
    model.eval()
    after = evaluate()
    accuracy_before, accuracy_after = before["retrieval_accuracy"], after["retrieval_accuracy"]

    metrics = {
        "kind": kind, "language": language, "loss": "MNRL" if kind == "pp" else "cosine MSE",
        "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
        "heldout_retrieval_accuracy_before": accuracy_before,
        "heldout_retrieval_accuracy_after": accuracy_after,
        "heldout_pair_cosine_before": before["pair_cosine"], "heldout_pair_cosine_after": after["pair_cosine"],
        "heldout_l_spread_before": before["l_spread"], "heldout_l_spread_after": after["l_spread"],
        "heldout_pairs": len(heldout), "train_pairs": len(train), "steps": len(losses),
        "resumed_from_step": start,
        "batches_per_epoch": epoch_batches, "pairs_per_second": pairs_seen / elapsed if elapsed > 0 else None,
        "padding_fraction": log_.padding_fraction,  # of the encoded positions: this run's steps
        **figures,  # model FLOPs, their rate, MFU, peak memory (modsent.training.efficiency)
        "trainable_parameters": n_trainable, "total_parameters": n_total,
        "language_adapter": None if la_dir is None else str(la_dir),
        "sentence_adapter": None if se_dir is None else str(se_dir),
        "english_embeddings": english_embeddings_path,
        "device": str(device), "config": cfg.to_dict(),
    }
    with atomic_path(out_dir, directory=True) as tmp:
        pa.save_parallel_adapters(model.encoder, tmp / ADAPTER_DIR, metadata={
            "language": language, "kind": kind, "steps": len(losses),
            "heldout_retrieval_accuracy_after": accuracy_after})
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        write_loss_curve(history, tmp, title=f"CLA {kind} {language}", ylabel=metrics["loss"])
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    log.info("CLA %s %s: loss %.3f → %.3f; held-out en→%s retrieval accuracy %s → %s; %.1f pairs/s, %s",
             kind, language, metrics["loss_first"] or 0, metrics["loss_last"] or 0, language,
             accuracy_before, accuracy_after, metrics["pairs_per_second"] or 0, efficiency.describe(figures))
    return metrics


# ---- merging and loading -------------------------------------------------------------------------


def adapter_path(cla_dir: str | Path) -> Path:
    """The parallel adapter inside a CLA output directory (``adapter/``), or the directory itself
    when it is a bare adapter directory."""
    cla_dir = Path(cla_dir)
    inner = cla_dir / ADAPTER_DIR
    return inner if (inner / pa.CONFIG_NAME).is_file() else cla_dir


def merge_alignment_adapters(pp_dir: str | Path, pl_dir: str | Path, weights: Sequence[float] = (0.5, 0.5),
                             out_dir: str | Path = None, *, metadata: dict | None = None) -> Path:
    """``w_pp · pp + w_pl · pl`` (``parallel_adapter.merge_parallel_adapters``) written as
    ``out_dir/adapter/`` (atomically), the layout of a training output. Returns ``out_dir``."""
    if out_dir is None:
        raise InputError("merge_alignment_adapters: out_dir is required")
    weights = tuple(weights)
    if len(weights) != 2:
        raise InputError(f"merge_alignment_adapters: two weights (pp, pl) expected, got {list(weights)}")
    records = [pa.read_adapter_config(adapter_path(d)) for d in (pp_dir, pl_dir)]
    languages = {r.get("metadata", {}).get("language") for r in records} - {None}
    if len(languages) > 1:
        raise InputError(f"merge_alignment_adapters: adapters of different languages {sorted(languages)}")
    meta = {"kind": "merged", "weights": {"pp": weights[0], "pl": weights[1]}, **(metadata or {})}
    if languages:
        meta.setdefault("language", languages.pop())
    out_dir = Path(out_dir)
    with atomic_path(out_dir, directory=True) as tmp:
        pa.merge_parallel_adapters([adapter_path(pp_dir), adapter_path(pl_dir)], weights,
                                   tmp / ADAPTER_DIR, metadata=meta)
    return out_dir


def load_aligned_encoder(base_model_dir: str | Path, la_dir: str | Path | None, se_dir: str | Path | None,
                         cla_dir: str | Path | None, *, device: str | None = None,
                         max_seq_length: int | None = None) -> sa.SentenceEncoder:
    """L's encoder: base + LA + SE + the CLA adapter of ``cla_dir`` (a training or merge output,
    or a bare adapter directory; none when None). An adapter made on another base model is an
    InputError. Inference mode; ``.encode(sentences)``."""
    encoder = sa.load_sentence_encoder(base_model_dir, la_dir, se_dir, device=device,
                                       max_seq_length=max_seq_length)
    if cla_dir is not None:
        pa.load_parallel_adapters(encoder.model.encoder, adapter_path(cla_dir))
        encoder.model.eval()
    return encoder


def write_summary(cla_dirs: list[str], out_path: str | Path) -> None:
    """A Markdown table: held-out English→L retrieval accuracy before/after per kind and language."""
    from modsent.io import atomic_open

    lines = ["# Cross-lingual alignment: held-out English→L retrieval accuracy (%)", "",
             "Spread: the mean cosine between the held-out L sentences' embeddings (1: all the same). "
             "A spread that rises while the pair cosine (each English sentence with its own "
             "translation) barely moves means L's embeddings drift together towards the English "
             "centroid rather than towards their translations: too few steps or pairs "
             "(docs/alignment-study.md).", "",
             "| language | kind | training pairs | held-out pairs | before | after | pair cosine | spread "
             "| steps | loss first → last |",
             "|---|---|---:|---:|---:|---:|---|---|---:|---|"]

    def pct(value):
        return "n/a" if value is None else f"{100 * value:.1f}"

    def change(m, key):
        before, after = m.get(f"heldout_{key}_before"), m.get(f"heldout_{key}_after")
        return "n/a" if before is None or after is None else f"{before:.3f} → {after:.3f}"

    for directory in cla_dirs:
        m = json.loads((Path(directory) / "metrics.json").read_text(encoding="utf-8"))
        lines.append(f"| {m['language']} | {m['kind']} | {m['train_pairs']} | {m['heldout_pairs']} | "
                     f"{pct(m['heldout_retrieval_accuracy_before'])} | "
                     f"{pct(m['heldout_retrieval_accuracy_after'])} | {change(m, 'pair_cosine')} | "
                     f"{change(m, 'l_spread')} | {m['steps']} | "
                     f"{m['loss_first'] or 0:.3f} → {m['loss_last'] or 0:.3f} |")
    with atomic_open(out_path) as handle:
        handle.write("\n".join(lines) + "\n")

"""Full-parameter (monolithic) baselines: every weight of the base model trained with Multiple
Negatives Ranking Loss on the base's own tokenizer, on the same paraphrase pairs as the modular
encoders (the recipes are :data:`modsent.encoders.systems.FULL_BASELINES`):

    Full_en   English pairs only                                   monolingual batches
    Full_m    every language's pairs, each batch in one language   monolingual batches
    Full_c    each pair's anchor and positive in random languages  cross-lingual pairs
    Full_mc   Full_c's data, starting from Full_m's weights        cross-lingual pairs

Everything but the trainable set is the SE adapter's (:mod:`modsent.modular.sentence_adapter`): the
encoder loaded the same way (the base without an LA), the base's own Pooling/Dense/Normalize
modules, the loss (MNRL, scale 20, in-batch negatives plus each pair's hard negative), batches
without a repeated text (``no_duplicate_batches``), the warm-up/linear-decay schedule, AdamW
with weight decay on matrices only, gradient clipping. Here every parameter is
trained: the embeddings, every layer, and the Dense layer of a base that has one (LaBSE).

Data:

- Held-out pairs: ``split_heldout`` on the English (pivot) pairs picks the held-out pair ids,
  exactly the English SE adapter's held-out slice. Those pair ids are removed from every
  language's training pairs (no translation of a held-out pair is trained on) and each
  language's held-out slice is its rows with those ids. Held-out retrieval accuracy is reported
  before and after per language, and English→L for the other languages.
- Monolingual batches (Full_en, Full_m): each language's pairs are cut into batches by
  ``no_duplicate_batches`` with a seed derived from (seed, language); the batches of all
  languages are then shuffled together, a pure function of (seed, epoch). So each step's
  language is drawn at random (in proportion to the batches it has left) and every language's
  pairs are all used once per epoch.
- Cross-lingual pairs (Full_c, Full_mc): ``paraphrase_data.crosslingual_mix`` draws, once per
  run from the seed, the anchor's and the positive's language of every pair id (the negative is
  in the positive's language); then ``no_duplicate_batches`` epoch after epoch.

Training (:func:`run_full_training`): the SE adapter's step (learning rate, loss, clipping,
AdamW) in a loop of its own, which also runs data-parallel. Checkpoints: ``{out}.checkpoint/``
every ``checkpoint_every`` steps, holding every weight, the AdamW moments, the step, the loss
history and the accuracies before training (safetensors + JSON, written atomically: the
language and SE adapters' checkpoint format); a rerun of a killed job continues from it, and
a checkpoint made from other settings or inputs (:func:`training_fingerprint`) is ignored. The
batch of a step is a pure function of (seed, epoch, step) and dropout is seeded per step, so a
resumed run trains exactly as an unbroken one (bit for bit on the CPU). Several GPUs of one
node: ``python -m modsent.methods.baselines`` (:func:`main`) under torchrun, one process per GPU; see
:func:`gathered_batch_loss` for how the in-batch negatives span the processes.

Output: a sentence-transformers directory (``SentenceTransformer(dir)`` loads it and encodes as
the trained model does) with ``metrics.json``, ``loss.tsv`` and ``loss.png`` beside its files.
It is written by loading the starting directory with sentence-transformers, putting the trained
weights into its modules and saving it, so the module layout, tokenizer and pooling
configuration are the base's. The base's default prompt name (E5's "query: ") is cleared: the
baselines, like every modular encoder, are trained and used without prompts.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from modsent import distributed
from modsent.modular import sentence_adapter as sa
from modsent.encoders import systems as variants
from modsent.languages import PIVOT_LANGUAGE
from modsent.io import InputError, atomic_open, atomic_path, record_added_tokens_under
from modsent.losses import MultipleNegativesRankingLoss
from modsent.data.paraphrase import crosslingual_mix
from modsent.evaluation.plots import write_loss_curve
from modsent.training import checkpoints, efficiency, fastpath, schedules
from modsent.training.optim import adamw
from modsent.training.loop import TrainingLog, ahead, checkpoint_due, optimizer_step, set_learning_rate
from modsent.training.pairs import (last_epoch_kept, no_duplicate_batches, read_pairs, row_texts, split_heldout,
                                   steps_of_epochs)
from modsent.training.precision import autocast, default_device, grad_scaler
from modsent.schema import STORAGE_DTYPES
from modsent.training.seeding import dropout_seed

log = logging.getLogger(__name__)

SELECTION_KEYS = ("full", "ablations")  # the config section's choice of systems, not hyperparameters
# where and how a job runs, not what it trains: not FullTrainingConfig fields, not rule params
EXECUTION_KEYS = ("gpus",)


@dataclasses.dataclass(frozen=True)
class FullTrainingConfig:
    """Hyperparameters of the full-parameter baselines (defaults: the paper's). ``max_steps``
    (if set) replaces ``epochs``; warm-up, weight decay and clipping as the SE adapter's."""

    batch_size: int = 128
    seq_len: int = 128
    learning_rate: float = 2e-5
    epochs: int = 3
    monolingual_epoch: str = "pair_ids"  # Full_m's epoch: each pair id once (the paper's) or "languages"
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    scale: float = 20.0
    eval_pairs: int = 500
    seed: int = 0
    max_steps: int | None = None
    log_every: int = 10
    checkpoint_every: int = 2000
    precision: str = "auto"  # modsent.training.precision: auto, fp16 or fp32
    compile: bool = False  # torch.compile the encoder (fastpath.compile_in_place); a runtime setting
    storage_dtype: str = "float32"  # the saved weights: float32, or float16/bfloat16 (half the disk)
    length_groups: int = 1  # > 1: batches grouped by length (training.pairs.no_duplicate_batches)

    @classmethod
    def from_config(cls, section: dict) -> "FullTrainingConfig":
        """From the ``baselines`` config section: these field names (``full``, ``ablations``
        and ``gpus`` are ignored); missing keys take the defaults, unknown keys are an error."""
        ignored = SELECTION_KEYS + EXECUTION_KEYS
        section = {k: v for k, v in dict(section or {}).items() if k not in ignored}
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise InputError(f"baselines: unknown key(s) {', '.join(unknown)}; allowed: "
                             f"{', '.join(sorted(known | set(ignored)))}")
        return cls(**section)

    def __post_init__(self):
        sa.check_contrastive_settings("baselines", self)
        if self.seq_len < 3:
            raise InputError(f"baselines.seq_len must be at least 3, got {self.seq_len}")
        if self.seed < 0:
            raise InputError(f"baselines.seed must be at least 0, got {self.seed}")
        if self.checkpoint_every < 1:
            raise InputError(f"baselines.checkpoint_every must be at least 1, got {self.checkpoint_every}")
        if self.storage_dtype not in STORAGE_DTYPES:
            raise InputError(f"baselines.storage_dtype must be one of {', '.join(STORAGE_DTYPES)}, got {self.storage_dtype!r}")
        if self.monolingual_epoch not in MONOLINGUAL_EPOCHS:
            raise InputError(f"baselines.monolingual_epoch must be one of {', '.join(MONOLINGUAL_EPOCHS)}, "
                             f"got {self.monolingual_epoch!r}")


# ---- data --------------------------------------------------------------------------------------


def read_language_pairs(pairs_paths: Mapping[str, str | Path]) -> dict[str, pd.DataFrame]:
    """{language: its pairs} (``training.pairs.read_pairs``); every file needs unique pair ids
    (they tie the languages' pairs together)."""
    frames = {}
    for lang, path in pairs_paths.items():
        frame = read_pairs(path)
        if "pair_id" not in frame.columns:
            raise InputError(f"{path}: no pair_id column (the baselines match pairs across languages by it)")
        if frame["pair_id"].duplicated().any():
            raise InputError(f"{path}: pair_id {frame['pair_id'][frame['pair_id'].duplicated()].iloc[0]!r} "
                             "occurs twice")
        frames[lang] = frame
    if not frames:
        raise InputError("no paraphrase pairs given")
    return frames


def pivot_language(languages) -> str:
    """English when present, else the first language in sorted order: its held-out pair ids
    are held out in every language."""
    return PIVOT_LANGUAGE if PIVOT_LANGUAGE in languages else sorted(languages)[0]


def split_heldout_by_pivot(frames: Mapping[str, pd.DataFrame], count: int,
                           ) -> tuple[dict[str, pd.DataFrame], dict[str, pd.DataFrame]]:
    """({lang: training pairs}, {lang: held-out pairs}): ``split_heldout`` on the pivot's pairs
    chooses the held-out pair ids; they leave every language's training pairs. A language's
    held-out slice is its rows with those ids, minus rows repeating an anchor or positive of
    another held-out row (retrieval would be ambiguous)."""
    pivot = pivot_language(frames)
    train_pivot, _ = split_heldout(frames[pivot], count)
    held_ids = set(frames[pivot]["pair_id"]) - set(train_pivot["pair_id"])
    train, heldout = {}, {}
    for lang, frame in frames.items():
        is_held = frame["pair_id"].isin(held_ids)
        train[lang] = frame[~is_held].reset_index(drop=True)
        held = frame[is_held]
        held = held[~held["anchor"].duplicated(keep=False) & ~held["positive"].duplicated(keep=False)]
        heldout[lang] = held.reset_index(drop=True)
    return train, heldout


def language_seed(seed: int, lang: str) -> int:
    """A language's own batching seed: independent of which other languages are configured."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{lang}".encode()).digest()[:8], "big")


@dataclasses.dataclass
class TrainingData:
    """The training rows (anchor, positive, negative, their languages) and the batches of each
    epoch as row indices into them (``epoch_batches(epoch)``, a pure function of the seed)."""

    rows: pd.DataFrame
    epoch_batches: Callable[[int], list[list[int]]]

    def __post_init__(self):  # the first epoch's batches count the steps, then train: made once
        self.epoch_batches = last_epoch_kept(self.epoch_batches)


MONOLINGUAL_EPOCHS = ("pair_ids", "languages")


def monolingual_data(frames: Mapping[str, pd.DataFrame], batch_size: int, seed: int,
                     length_groups: int = 1, epoch_of: str = "languages") -> TrainingData:
    """Full_en / Full_m: every language's pairs stacked (column ``language``); each batch holds
    one language. What an epoch is (``epoch_of``):

    - ``pair_ids`` (Full_m's default, the paper's: "each batch is monolingual, language randomly
      sampled for each batch", 3 epochs "on the 600K monolingual paraphrase data", as many
      steps as Full_c): the pivot's ``no_duplicate_batches`` (seed: :func:`language_seed`;
      ``length_groups``: grouped by length), each batch then taken in a language drawn
      uniformly at random (seeded by seed and epoch): its rows of those pair ids, less the ids
      the language lacks and a row repeating a text already in the batch. Each pivot pair id is
      used once per epoch, in one language.
    - ``languages``: every language's ``no_duplicate_batches`` shuffled together, so the
      language of each step is random and every pair of every language is used once per
      epoch (as many times more steps as there are languages).

    With one language (Full_en) both are the same batches."""
    if epoch_of not in MONOLINGUAL_EPOCHS:
        raise InputError(f"monolingual_epoch {epoch_of!r}: expected one of {', '.join(MONOLINGUAL_EPOCHS)}")
    langs = sorted(frames)
    rows = pd.concat([frames[lang].assign(language=lang) for lang in langs], ignore_index=True)
    offsets = np.cumsum([0] + [len(frames[lang]) for lang in langs])
    if epoch_of == "pair_ids" and len(langs) > 1:
        return TrainingData(rows, _per_batch_language(frames, langs, rows, batch_size, seed, length_groups))

    def epoch_batches(epoch: int) -> list[list[int]]:
        batches = []
        for lang, offset in zip(langs, offsets):
            for batch in no_duplicate_batches(frames[lang], batch_size, language_seed(seed, lang), epoch,
                                              length_groups=length_groups):
                batches.append([int(offset) + i for i in batch])
        order = np.random.default_rng([seed, epoch]).permutation(len(batches))
        return [batches[i] for i in order]

    return TrainingData(rows, epoch_batches)


def _per_batch_language(frames: Mapping[str, pd.DataFrame], langs: list[str], rows: pd.DataFrame,
                        batch_size: int, seed: int, length_groups: int) -> Callable[[int], list[list[int]]]:
    """``monolingual_data``'s ``pair_ids`` epochs: the pivot's batches of pair ids, each taken in
    a language drawn at random (row indices into ``rows``, the stacked languages)."""
    pivot = pivot_language(langs)
    where = {(lang, pair_id): index for index, (lang, pair_id)
             in enumerate(zip(rows["language"], rows["pair_id"].astype(str)))}
    texts = row_texts(rows)
    pivot_ids = frames[pivot]["pair_id"].astype(str).tolist()

    def epoch_batches(epoch: int) -> list[list[int]]:
        id_batches = no_duplicate_batches(frames[pivot], batch_size, language_seed(seed, pivot), epoch,
                                          length_groups=length_groups)
        drawn = np.random.default_rng([seed, epoch, 2]).integers(len(langs), size=len(id_batches))
        batches = []
        for batch, pick in zip(id_batches, drawn):
            chosen, seen = [], set()
            for index in batch:
                row = where.get((langs[pick], pivot_ids[index]))
                if row is None or any(t in seen for t in texts[row]):
                    continue
                chosen.append(row)
                seen.update(texts[row])
            if len(chosen) >= 2:
                batches.append(chosen)
        return batches

    return epoch_batches


def crosslingual_pairs(frames: Mapping[str, pd.DataFrame], seed: int) -> pd.DataFrame:
    """Full_c's pairs: ``paraphrase_data.crosslingual_mix`` (per pair id the anchor's and the
    positive's language drawn at random from all languages; negative in the positive's), with a
    negative equal to its own anchor or positive removed (as ``read_pairs`` does)."""
    mixed = crosslingual_mix(dict(frames), seed)
    contradictory = (mixed["negative"] == mixed["anchor"]) | (mixed["negative"] == mixed["positive"])
    mixed.loc[contradictory, "negative"] = None
    if len(mixed) < 2:
        raise InputError(f"{len(mixed)} pair ids shared by the languages {', '.join(sorted(frames))}; "
                         "cross-lingual training needs at least 2")
    return mixed


def crosslingual_data(frames: Mapping[str, pd.DataFrame], batch_size: int, seed: int,
                      length_groups: int = 1) -> TrainingData:
    """Full_c / Full_mc: :func:`crosslingual_pairs`, batched by ``no_duplicate_batches``."""
    rows = crosslingual_pairs(frames, seed)
    return TrainingData(rows, lambda epoch: no_duplicate_batches(rows, batch_size, seed, epoch,
                                                                 length_groups=length_groups))


def iter_steps(data: TrainingData, total_steps: int, start: int = 0) -> Iterator[list[int]]:
    """The batches of steps ``start`` .. ``total_steps - 1``: epoch after epoch of
    ``data.epoch_batches`` (:func:`modsent.training.pairs.steps_of_epochs`)."""
    return steps_of_epochs(data.epoch_batches, total_steps, start)


# ---- the model ---------------------------------------------------------------------------------


def build_full_model(model_dir: str | Path, cfg: FullTrainingConfig) -> sa.SentenceEncoderModel:
    """The sentence encoder of ``model_dir`` (a sentence-transformers directory: the base, or a
    baseline to continue from) as the SE adapter builds it without LA or LoRA, every parameter
    trainable: the encoder (embeddings included) and the head's Dense layer, if any."""
    encoder, tokenizer = sa._base_encoder(model_dir, None)
    head, max_len = sa._sentence_head(model_dir)
    model = sa.SentenceEncoderModel(encoder, tokenizer, head, min(cfg.seq_len, max_len))
    model.requires_grad_(True)
    return model


def save_sentence_transformer(model: sa.SentenceEncoderModel, source_dir: str | Path,
                              out_dir: str | Path, dtype: str = "float32") -> None:
    """Write ``model`` into ``out_dir`` as a sentence-transformers directory: ``source_dir`` (the
    directory the model was built from) loaded by sentence-transformers, the trained weights put
    into its modules, saved in ``dtype`` (``float16``/``bfloat16``: half the disk; modsent's
    loader computes in float32 from them). Its default prompt name is cleared (trained without
    prompts)."""
    import transformers
    from sentence_transformers import SentenceTransformer

    transformers.logging.set_verbosity_error()
    try:  # float32 whatever the source was stored in: the trained weights are not rounded twice
        st = SentenceTransformer(str(source_dir), device="cpu", model_kwargs={"dtype": torch.float32})
    finally:
        transformers.logging.set_verbosity_warning()
    state = {k: v.detach().to("cpu") for k, v in model.encoder.state_dict().items()}
    loaded = st[0].auto_model.load_state_dict(state, strict=False)
    missing = [k for k in loaded.missing_keys if not k.startswith("pooler.")]  # unused by sentence embeddings
    if missing or loaded.unexpected_keys:
        raise RuntimeError(f"the trained encoder does not fit {source_dir}'s transformer: missing "
                           f"{missing[:5]}, unexpected {loaded.unexpected_keys[:5]}")
    if len(st) != len(model.head) + 1:
        raise RuntimeError(f"{source_dir}: {len(st)} modules, the model has {len(model.head) + 1}")
    for i, module in enumerate(model.head, start=1):
        st[i].load_state_dict({k: v.detach().to("cpu") for k, v in module.state_dict().items()})
    st.max_seq_length = model.max_seq_length
    st.default_prompt_name = None
    st.to(getattr(torch, dtype))
    st.save(str(out_dir), create_model_card=False)
    record_added_tokens_under(out_dir)


# ---- training ------------------------------------------------------------------------------------


@dataclasses.dataclass
class FullTrainingResult:
    model: sa.SentenceEncoderModel
    metrics: dict
    history: list[list[float]]


def _heldout_accuracies(model, heldout: Mapping[str, pd.DataFrame], pivot: str, batch_size: int,
                        precision: str) -> tuple[dict, dict]:
    """({lang: monolingual held-out retrieval accuracy}, {"en-L": English→L accuracy})."""
    mono = {lang: sa.retrieval_accuracy(model, frame["anchor"].tolist(), frame["positive"].tolist(),
                                        batch_size=batch_size, precision=precision)
            for lang, frame in sorted(heldout.items())}
    cross = {}
    for lang, frame in sorted(heldout.items()):
        if lang == pivot:
            continue
        joined = heldout[pivot][["pair_id", "anchor"]].merge(frame[["pair_id", "positive"]], on="pair_id")
        cross[f"{pivot}-{lang}"] = sa.retrieval_accuracy(model, joined["anchor"].tolist(),
                                                         joined["positive"].tolist(), batch_size=batch_size,
                                                         precision=precision)
    return mono, cross


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def _check_start(name: str, start_dir: Path, init: str | None) -> None:
    """A baseline that continues another (Full_mc from Full_m) must start from that one's output."""
    if init is None:
        return
    metrics_path = start_dir / "metrics.json"
    trained = json.loads(metrics_path.read_text(encoding="utf-8")) if metrics_path.is_file() else {}
    if trained.get("baseline") != init:
        raise InputError(f"{name} starts from {init}'s weights: {start_dir} is not a {init} output "
                         f"(its metrics.json names {trained.get('baseline')!r})")


def training_fingerprint(name: str, cfg: FullTrainingConfig, start_dir: str | Path,
                         pairs_paths: Mapping[str, str | Path]) -> str:
    """What a checkpoint must match to be resumed (:func:`modsent.training.checkpoints.fingerprint`):
    the baseline, its languages, the hyperparameters (the log and checkpoint cadence and the
    storage dtype may change) and the content of the inputs: every file of the starting directory (a retrained
    Full_m must not resume a stale Full_mc) and each language's pair file."""
    settings = {"baseline": name, "languages": sorted(pairs_paths), **dataclasses.asdict(cfg)}
    return checkpoints.fingerprint(settings, start_dir, *(pairs_paths[lang] for lang in sorted(pairs_paths)))


def share_texts(rows: pd.DataFrame, rank: int, world: int) -> list[str]:
    """This process's contiguous share of a batch's texts (``sentence_adapter.batch_texts``)."""
    texts = sa.batch_texts(rows)
    return texts[distributed.local_slice(len(texts), rank, world)]


def gathered_batch_loss(model: sa.SentenceEncoderModel, loss_fn: MultipleNegativesRankingLoss,
                        rows: pd.DataFrame, rank: int, world: int,
                        features: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """MNRL of one batch (``sentence_adapter.batch_loss``), its texts encoded by ``world``
    processes with the in-batch negatives spanning all of them.

    Every process holds the step's whole batch (a pure function of the step) and encodes its
    contiguous share of the batch's texts (anchors, positives, hard negatives, in that order);
    the embeddings are gathered (:func:`distributed.all_gather_rows`), so every process computes
    the loss of the whole batch, exactly the single-process loss: every anchor is ranked against
    every positive and hard negative of the global batch, not only its own process's. The
    gradient flows back into each process's own texts only; the processes' weight gradients sum
    to the gradient of the loss (the trainer back-propagates ``world`` × the loss and averages).
    One process: ``sentence_adapter.batch_loss`` itself. ``features``: this process's share
    (:func:`share_texts`) already tokenised (``model.features``), when prepared ahead."""
    if world == 1:
        return sa.batch_loss(model, loss_fn, rows, features)
    share = share_texts(rows, rank, world)
    device = next(model.parameters()).device
    # float32 for the exchange: one dtype in every process, and the loss is computed in float32
    local = (model(features if features is not None else share).float() if share
             else torch.zeros(0, 0, device=device))
    n = len(rows)
    emb = distributed.all_gather_rows(local, distributed.share_sizes(len(sa.batch_texts(rows)), world))
    return loss_fn(emb[:n], emb[n:2 * n], emb[2 * n:] if len(emb) > 2 * n else None)


def run_full_training(name: str, start_dir: str | Path, pairs_paths: Mapping[str, str | Path],
                      cfg: FullTrainingConfig = FullTrainingConfig(), *, device: str | None = None,
                      progress: bool = True, checkpoint_dir: str | Path | None = None,
                      on_step: Callable[[int], None] | None = None, recipe: variants.FullBaseline | None = None,
                      objective: torch.nn.Module | None = None) -> FullTrainingResult | None:
    """Train baseline ``name`` from ``start_dir`` (the base model; Full_mc: Full_m's output) on
    ``pairs_paths`` ({language: pair file}; Full_en uses English only) and return the trained
    model, its metrics and loss history (nothing is written but checkpoints).

    ``checkpoint_dir``: resume from the checkpoint there if it matches
    (:func:`training_fingerprint`), and write one every ``cfg.checkpoint_every`` steps; None:
    no checkpoints. ``on_step(step)`` is called after every optimizer step and checkpoint (the
    tests kill the process there).

    In a process group of several processes (torchrun, :func:`distributed.setup`; ``device`` is
    then this process's GPU) the training is data-parallel: each process encodes its share of
    every batch (:func:`gathered_batch_loss`), the gradients are averaged after backward, and
    every process takes the same clipped AdamW step, so weights and moments stay replicated and
    a checkpoint does not depend on the number of processes. Only the main process evaluates,
    writes checkpoints and shows progress; the others return None.

    ``recipe`` (default: the paper's baseline ``name``) says which pairs and batches; ``objective``
    (default: MNRL with ``cfg.scale``) is any loss over the batch's (anchors, positives,
    negatives or None) embeddings, as :mod:`modsent.losses`' are: a training method of
    :mod:`modsent.methods` trains every weight with its own objective this way."""
    if recipe is None:
        recipe = variants.FULL_BASELINES.get(name)
    if recipe is None:
        raise InputError(f"unknown full baseline {name!r}; baselines: {', '.join(variants.FULL_BASELINES)}")
    device = default_device(device)
    compile_key = f"{'baselines' if name in variants.FULL_BASELINES else f'methods.{name}'}.compile"
    if cfg.compile:  # before any work: a missing compiler is an input error
        fastpath.check_compilable(device, compile_key)
    start_dir = Path(start_dir)
    _check_start(name, start_dir, recipe.init)
    langs = recipe.training_languages(list(pairs_paths))
    missing = [lang for lang in langs if lang not in pairs_paths]
    if missing:
        raise InputError(f"{name}: no pairs for {', '.join(missing)}")
    rank, world = distributed.rank(), distributed.world_size()
    main = rank == 0
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None

    frames = read_language_pairs({lang: pairs_paths[lang] for lang in langs})
    train, heldout = split_heldout_by_pivot(frames, cfg.eval_pairs)
    pivot = pivot_language(frames)
    if recipe.objective == "monolingual":
        data = monolingual_data(train, cfg.batch_size, cfg.seed, cfg.length_groups, cfg.monolingual_epoch)
    else:
        data = crosslingual_data(train, cfg.batch_size, cfg.seed, cfg.length_groups)
    epoch_batches = len(data.epoch_batches(0))
    total_steps = cfg.max_steps or cfg.epochs * epoch_batches
    log.info("%s: %s pairs of %s, %d training rows, %d held-out pair ids; %d batches per epoch; %d steps",
             name, recipe.objective, ", ".join(langs), len(data.rows), len(heldout[pivot]), epoch_batches,
             total_steps)
    if world > 1:
        log.info("data-parallel over %d processes: each encodes its share of a step's texts; the "
                 "loss ranks every anchor against the whole batch", world)

    model = build_full_model(start_dir, cfg).to(device)
    if cfg.compile:  # batches padded to their longest sentence: shapes vary, so dynamic sizes
        fastpath.compile_in_place(model.encoder, device, compile_key, dynamic=None)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    body = efficiency.start(model.encoder, device)  # for the model FLOPs of metrics.json
    optimizer = adamw(trainable, cfg.learning_rate, cfg.weight_decay)
    loss_fn = objective if objective is not None else MultipleNegativesRankingLoss(cfg.scale)
    eval_batch = max(1, min(cfg.batch_size, 64))

    def evaluate():
        return _heldout_accuracies(model, heldout, pivot, eval_batch, cfg.precision)

    scaler = grad_scaler(device, cfg.precision)  # fp16: the loss scaler; else a pass-through
    fingerprint, resumed = None, None
    if checkpoint_dir is not None:
        fingerprint = training_fingerprint(name, cfg, start_dir, {lang: pairs_paths[lang] for lang in langs})
        resumed = checkpoints.resume(checkpoint_dir, model, optimizer, fingerprint, scaler)
    start = resumed["step"] if resumed else 0
    if resumed is not None:
        mono_before, cross_before = resumed["accuracy_before"]
    else:
        mono_before, cross_before = evaluate() if main else ({}, {})
    # every process starts from the main process's weights, as DistributedDataParallel does
    distributed.broadcast_from_main(trainable)

    # the loss is the whole batch's, the same in every process
    log_ = TrainingLog(total_steps, start, name, progress and main, cfg.log_every, resumed, scaler)
    model.train()

    def prepare(batch):  # on a thread, one step ahead: this process's texts of the next batch tokenised
        share = share_texts(data.rows.iloc[batch], rank, world)
        # one pass, also on the CPU: a full baseline trains every weight, and each sub-pass's
        # backward would write the whole gradient again (SentenceEncoderModel.step_features: no faster)
        return model.features(share) if share else None

    for step, (batch, features) in enumerate(ahead(iter_steps(data, total_steps, start=start), prepare),
                                             start=start):
        lr = set_learning_rate(optimizer, schedules.warmup_ratio_linear(step, total_steps, cfg.warmup_ratio,
                                                                        cfg.learning_rate))
        torch.manual_seed(dropout_seed(step, cfg.seed, rank))
        with autocast(device, cfg.precision):
            loss = gathered_batch_loss(model, loss_fn, data.rows.iloc[batch], rank, world, features)
        if loss.requires_grad:  # a process with no text in a tiny batch has no share of the gradient
            scaler.scale(loss * world).backward()
        distributed.average_gradients(trainable)
        optimizer_step(optimizer, trainable, cfg.max_grad_norm, scaler)
        log_.record(step, loss, lr, len(batch), features)  # read back at the logged steps: no GPU wait here
        if checkpoint_due(step + 1, cfg.checkpoint_every, total_steps, checkpoint_dir):
            checkpoints.save_checkpoint(checkpoint_dir, model, optimizer, step + 1, fingerprint,
                                        log_.state(accuracy_before=[mono_before, cross_before]), scaler)
        if on_step is not None:
            on_step(step + 1)
    losses, history, pairs_seen, elapsed = log_.close()
    figures = log_.efficiency(body, elapsed, device, world)  # every process's share of the texts
    step = len(losses)
    if not main:
        return None
    model.eval()
    mono_after, cross_after = evaluate()

    metrics = {
        "baseline": name, "description": recipe.description, "objective": recipe.objective,
        "languages": langs, "initialised_from": str(start_dir),
        "loss_first": history[0][1] if history else None, "loss_last": history[-1][1] if history else None,
        "heldout_retrieval_accuracy_before": mono_before, "heldout_retrieval_accuracy_after": mono_after,
        "heldout_retrieval_accuracy_mean_before": _mean(mono_before.values()),
        "heldout_retrieval_accuracy_mean_after": _mean(mono_after.values()),
        "heldout_crosslingual_retrieval_accuracy_before": cross_before,
        "heldout_crosslingual_retrieval_accuracy_after": cross_after,
        "heldout_pairs": {lang: len(frame) for lang, frame in sorted(heldout.items())},
        "train_pairs": {lang: len(frame) for lang, frame in sorted(train.items())},
        "train_rows": len(data.rows), "steps": step, "batches_per_epoch": epoch_batches,
        "resumed_from_step": start, "processes": world,
        "pairs_per_second": pairs_seen / elapsed if elapsed > 0 and pairs_seen else None,
        "padding_fraction": log_.padding_fraction,  # of the encoded positions: this run's steps
        **figures,  # model FLOPs (all processes'), their rate, MFU, peak memory (modsent.training.efficiency)
        "trainable_parameters": n_trainable, "total_parameters": sum(p.numel() for p in model.parameters()),
        "device": str(device), "config": dataclasses.asdict(cfg),
    }
    if recipe.objective == "crosslingual":
        counts = (data.rows["anchor_lang"] + "-" + data.rows["positive_lang"]).value_counts()
        metrics["pair_languages"] = {key: int(counts[key]) for key in sorted(counts.index)}
    return FullTrainingResult(model, metrics, history)


@fastpath.attention_for_varying_shapes()
def train_full_baseline(name: str, start_dir: str | Path, pairs_paths: Mapping[str, str | Path],
                        out_dir: str | Path, cfg: FullTrainingConfig = FullTrainingConfig(), *,
                        device: str | None = None, progress: bool = True,
                        checkpoint_dir: str | Path | None = None,
                        on_step: Callable[[int], None] | None = None, recipe: variants.FullBaseline | None = None,
                        objective: torch.nn.Module | None = None) -> dict | None:
    """:func:`run_full_training` with checkpoints in ``checkpoint_dir`` (default:
    ``{out_dir}.checkpoint``, :func:`modsent.training.checkpoints.checkpoint_path`), then ``out_dir`` (atomically): the sentence-transformers
    directory, ``metrics.json`` and the loss curve; the checkpoint is removed once the output
    is complete. Returns the metrics (None in the processes other than the main one)."""
    out_dir = Path(out_dir)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else checkpoints.checkpoint_path(out_dir)
    result = run_full_training(name, start_dir, pairs_paths, cfg, device=device, progress=progress,
                               checkpoint_dir=checkpoint_dir, on_step=on_step, recipe=recipe, objective=objective)
    if result is None:
        distributed.barrier()  # while the main process evaluates and writes the output
        return None
    metrics = result.metrics
    with atomic_path(out_dir, directory=True) as tmp:
        save_sentence_transformer(result.model, start_dir, tmp, dtype=cfg.storage_dtype)
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        write_loss_curve(result.history, tmp, title=f"{name} (all weights)",
                         ylabel=f"{type(objective).__name__ if objective is not None else 'MNRL'} loss")
    log.info("%s: MNRL %.3f → %.3f; held-out retrieval accuracy (mean over %d languages) %s → %s; %.1f pairs/s, %s",
             name, metrics["loss_first"] or 0, metrics["loss_last"] or 0, len(metrics["languages"]),
             metrics["heldout_retrieval_accuracy_mean_before"], metrics["heldout_retrieval_accuracy_mean_after"],
             metrics["pairs_per_second"] or 0, efficiency.describe(metrics))
    distributed.barrier()  # every process got here: only now is the checkpoint not needed by a rerun
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    return metrics


def write_summary(baseline_dirs: list[str | Path], out_path: str | Path) -> None:
    """A Markdown table: per baseline, held-out retrieval accuracy before → after in each
    language (monolingual) and English→L (mean), steps and loss."""
    rows = [json.loads((Path(d) / "metrics.json").read_text(encoding="utf-8")) for d in baseline_dirs]
    langs = sorted({lang for m in rows for lang in m["heldout_retrieval_accuracy_after"]},
                   key=lambda lang: (lang != PIVOT_LANGUAGE, lang))

    def pct(value):
        return "n/a" if value is None else f"{100 * value:.1f}"

    lines = ["# Full-parameter baselines: held-out retrieval accuracy (%), before → after", "",
             "Each held-out anchor's nearest neighbour among the held-out positives (cosine), per "
             "language; en→L: English anchors, positives in L (mean over L). Before = the starting "
             "weights (the base model; Full_m's for Full_mc).", "",
             "| baseline | steps | loss first → last | " + " | ".join(langs) + " | en→L |",
             "|---|---:|---|" + "---|" * len(langs) + "---|"]
    for m in rows:
        before, after = m["heldout_retrieval_accuracy_before"], m["heldout_retrieval_accuracy_after"]
        cells = [f"{pct(before[lang])} → {pct(after[lang])}" if lang in after else "" for lang in langs]
        cross_before = _mean(m["heldout_crosslingual_retrieval_accuracy_before"].values())
        cross_after = _mean(m["heldout_crosslingual_retrieval_accuracy_after"].values())
        cross = f"{pct(cross_before)} → {pct(cross_after)}" if m["heldout_crosslingual_retrieval_accuracy_after"] else ""
        lines.append(f"| {m['baseline']} | {m['steps']} | {m['loss_first'] or 0:.3f} → {m['loss_last'] or 0:.3f} | "
                     + " | ".join(cells) + f" | {cross} |")
    with atomic_open(out_path) as handle:
        handle.write("\n".join(lines) + "\n")


# ---- command line: one baseline per process group (the workflow's form for several GPUs) -----


def cli_arguments(name: str, start_dir, pairs_paths: Mapping[str, str | Path], out_dir,
                  cfg: FullTrainingConfig, *, log_path=None, threads: int | None = None,
                  progress: bool = True) -> list[str]:
    """The arguments of ``python -m modsent.methods.baselines`` that train like ``train_full_baseline``
    with these inputs (:func:`main` reads them back). No option is a prefix of torchrun's own
    (``--start`` would be: see ``distributed.launch_command``)."""
    args = ["--name", name, "--init", start_dir, "--out", out_dir,
            "--config", json.dumps(dataclasses.asdict(cfg), sort_keys=True)]
    for lang, path in pairs_paths.items():
        args += ["--pairs", lang, path]
    if log_path is not None:
        args += ["--log-file", log_path]
    if threads is not None:
        args += ["--threads", threads]
    if not progress:
        args.append("--no-progress")
    return [str(a) for a in args]


def main(argv: list[str] | None = None) -> int:
    """``python -m modsent.methods.baselines --name Full_m --init DIR --pairs LANG FILE ... --out DIR
    --config JSON``: train one full baseline.

    Run directly, one process; under torchrun (``modsent.distributed.launch_command``), one
    process per GPU of the node, data-parallel (see :func:`run_full_training`)."""
    parser = argparse.ArgumentParser(prog="python -m modsent.methods.baselines",
                                     description="Train one full-parameter baseline.")
    parser.add_argument("--name", required=True, choices=list(variants.FULL_BASELINES))
    parser.add_argument("--init", required=True, help="the starting directory: the base model, or Full_m for Full_mc")
    parser.add_argument("--pairs", nargs=2, action="append", required=True, metavar=("LANG", "FILE"),
                        help="a language's paraphrase pairs (repeat for every language)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", required=True,
                        help="FullTrainingConfig as JSON (its field names, e.g. from cli_arguments)")
    distributed.add_process_arguments(parser)
    args = parser.parse_args(argv)

    cfg = FullTrainingConfig(**json.loads(args.config))
    with distributed.trainer_process(args) as device:
        train_full_baseline(args.name, args.init, dict(args.pairs), args.out, cfg, device=str(device),
                            progress=not args.no_progress)
    return 0


if __name__ == "__main__":
    # run the imported module's main, so that log records and classes carry its real name
    from modsent.methods.baselines import main as _main

    sys.exit(_main())

"""InteMATs' training: the data of each stage, the frozen backbone with serial adapters or their
fusion, one plain loop for the three stages, and the output directories.

Data (every stage reads the multi-parallel paraphrase files ``results/paraphrase/{lang}.parquet``:
the same pair ids in every language; the rows of ``datasets``, default all). ``split_heldout``
on the English (pivot) pairs picks ``eval_pairs`` pair ids (the baselines' and other recipes'
rule, :func:`modsent.methods.baselines.split_heldout_by_pivot`); they leave every stage's data.

- MATs-ST (:func:`sentence_pairs`): for every training pair id and every language X but English,
  (English anchor, X anchor) and (English positive, X positive): a sentence and its aligned
  text in X (the translation the pair file holds). A pair whose two sides are the same text (a
  name spelt alike) is dropped and counted. The paper also aligns entity names (Eq. 4): no data
  has them; dropped.
- MATs-DT (:func:`pseudo_documents`): pseudo-documents of up to ``document_sentences`` (k)
  consecutive pair ids (the English file's row order; ids every language has), each
  language's anchors joined by spaces, in the same order on both sides. A document ends before
  the sentence that would take it past ``max_length`` tokens in *any* language (the sentence
  lengths are counted one by one, plus the special tokens), so every language's document
  covers the same pair ids; a sentence longer than that alone is a document of its own and is
  truncated. Document pairs: (English document, X document) for every X.
- Fusion (:func:`fusion_data`): Full_c's pairs (each pair id's anchor and positive in randomly
  drawn languages, the negative in the positive's) or Full_m's (monolingual batches), MNRL.

Batches: ``no_duplicate_batches`` grouped by pair id (ST), document (DT) or the baselines' rules
(fusion): no text twice and no two copies of one pair or document in a batch (they would be
each other's false negatives), a pure function of (seed, epoch).

Model: the backbone (``model`` setting, else the base model; the fusion: InteMATs-ST's
directory) loaded with :func:`modsent.encoders.transformer.load_encoder_body`, frozen; fresh
serial adapters (``W_up`` = 0: the model starts as exactly the backbone) or the two trained sets
plus a fresh fusion (:mod:`modsent.modular.serial_adapter`); the sentence vector is the mean over
the real tokens of the average of the hidden states ``pooling_layers``
(:class:`modsent.encoders.intemats.InteMATsBody`), whatever the base's own head. ST and DT train
with :class:`modsent.losses.InfoNCELoss` (English side as anchors), the fusion with
:class:`modsent.losses.MultipleNegativesRankingLoss`.

Loop (:func:`run_training`, with :mod:`modsent.training.loop`'s parts): an optimizer step takes
``gradient_accumulation`` consecutive batches (each loss over its own in-batch negatives, divided
by the count), the learning rate (linear warm-up, linear decay), dropout seeded from (seed,
batch index), clipping, AdamW (:func:`modsent.training.optim.adamw`) over the adapters or the
fusion. Every ``checkpoint_every`` steps ``{out}.checkpoint/`` (:mod:`modsent.training.checkpoints`)
keeps the trained weights, AdamW moments and progress; a rerun with the same settings and inputs
resumes and ends, on the CPU, with the weights of an unbroken run, bit for bit.

Metrics, before and after, on the held-out pair ids: English→X translation retrieval (English
anchor among the X anchors), the baselines' monolingual and English→X paraphrase retrieval,
and for DT English→X document retrieval; the fusion also scores the backbone, MATs-ST and
MATs-DT alone on its held-out ids, and records the mean fusion weight of each adapter per site.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from modsent.encoders import intemats as ie
from modsent.encoders import transformer as tf
from modsent.evaluation.plots import write_loss_curve
from modsent.io import InputError, atomic_path
from modsent.losses import InfoNCELoss, MultipleNegativesRankingLoss
from modsent.methods import baselines as bl
from modsent.methods.intemats.settings import DT, FUSED, FUSION_PAIRS, SITES, ST
from modsent.modular import sentence_adapter as sa
from modsent.modular import serial_adapter as sad
from modsent.training import checkpoints, efficiency, fastpath, schedules
from modsent.training.loop import TrainingLog, ahead, checkpoint_due, optimizer_step, set_learning_rate
from modsent.training.optim import adamw
from modsent.training.pairs import no_duplicate_batches, steps_of_epochs
from modsent.training.precision import PRECISIONS, autocast, default_device, grad_scaler
from modsent.schema import STORAGE_DTYPES
from modsent.training.seeding import dropout_seed, private_cpu_stream

log = logging.getLogger(__name__)

ROW_COLUMNS = ["group", "lang", "anchor", "positive", "negative"]
# a pair's stratum where batches are grouped by length (length_groups): its X language, and for
# MATs-ST the paraphrase dataset of its pair id (where the pair files have it)
STRATA = ("dataset", "lang")
ADAPTER_NAMES = {ST: "st", DT: "dt"}  # the adapter set's name inside the saved files


@dataclasses.dataclass(frozen=True)
class InteMATsConfig:
    """An InteMATs stage's settings (schemas and defaults: :mod:`modsent.methods.intemats`;
    each stage uses its own keys, the others keep these defaults)."""

    model: str | None = None
    revision: str | None = None
    reduction_factor: float = 16.0
    sites: tuple[str, ...] = tuple(SITES)
    adapter_layers: tuple[int, ...] | None = None
    temperature: float = 0.1
    document_sentences: int = 16
    pairs: str = "crosslingual"
    scale: float = 20.0
    pooling_layers: tuple[int, ...] = (-2,)
    datasets: tuple[str, ...] | None = None
    learning_rate: float = 5e-5
    batch_size: int = 8
    gradient_accumulation: int = 2
    epochs: int = 5
    max_steps: int | None = None
    warmup_steps: int = 10000
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_length: int = 384
    eval_pairs: int = 500
    seed: int = 0
    precision: str = "auto"
    storage_dtype: str = "float32"  # the saved weights (how the result is saved: not in the fingerprint)
    length_groups: int = 1  # > 1: batches grouped by length within each stratum (STRATA; grouped_data)
    compile: bool = False  # torch.compile the encoder (fastpath.compile_in_place); a runtime setting
    log_every: int = 10
    checkpoint_every: int = 500

    @classmethod
    def from_settings(cls, name: str, settings: Mapping) -> "InteMATsConfig":
        """From ``methods.{name}`` (defaults filled in or not); keys of another stage or unknown
        keys are an error naming them."""
        from modsent import methods

        return methods.settings_config(cls, name, settings, allowed=list(methods.get(name).settings_schema),
                                       tuples=("sites", "adapter_layers", "pooling_layers", "datasets"))

    def check(self, name: str) -> None:
        """The schema's rules, for direct library use (the workflow's config is checked already)."""
        problems = {
            "reduction_factor": not self.reduction_factor > 0,
            "sites": not self.sites or any(site not in SITES for site in self.sites),
            "temperature": not self.temperature > 0,
            "document_sentences": self.document_sentences < 1,
            "pairs": self.pairs not in FUSION_PAIRS,
            "scale": not self.scale > 0,
            "pooling_layers": not self.pooling_layers,
            "learning_rate": not self.learning_rate > 0,
            "batch_size": self.batch_size < 2,
            "gradient_accumulation": self.gradient_accumulation < 1,
            "epochs": self.epochs < 1,
            "max_steps": self.max_steps is not None and self.max_steps < 1,
            "warmup_steps": self.warmup_steps < 0,
            "max_length": self.max_length < 3,
            "eval_pairs": self.eval_pairs < 0,
            "seed": self.seed < 0,
            "precision": self.precision not in PRECISIONS,
            "storage_dtype": self.storage_dtype not in STORAGE_DTYPES,
            "log_every": self.log_every < 1,
            "checkpoint_every": self.checkpoint_every < 1,
        }
        from modsent.training.pairs import check_length_groups

        check_length_groups(self.length_groups, f"methods.{name}.length_groups")
        bad = [key for key, wrong in problems.items() if wrong]
        if bad:
            raise InputError(f"methods.{name}: invalid value(s) for {', '.join(bad)} "
                             "(see the method's settings: modsent.methods.intemats)")

    def adapter_config(self) -> sad.SerialAdapterConfig:
        return sad.SerialAdapterConfig(reduction_factor=self.reduction_factor, sites=self.sites,
                                       layers=self.adapter_layers)


# ---- data ----------------------------------------------------------------------------------------


def read_frames(pairs_paths: Mapping[str, str | Path], datasets, key: str) -> dict[str, pd.DataFrame]:
    """{language: its pairs} (unique pair ids) restricted to the rows of ``datasets`` (None: all)."""
    from modsent.methods.mst5.training import read_frames as read_dataset_frames

    return read_dataset_frames(pairs_paths, datasets, key)


def _rows(group, lang, anchors, positives, datasets=None) -> pd.DataFrame:
    rows = pd.DataFrame({"group": group, "lang": lang, "anchor": anchors, "positive": positives, "negative": None})
    if datasets is not None:
        rows["dataset"] = datasets
    return rows


def sentence_pairs(frames: Mapping[str, pd.DataFrame], pivot: str) -> tuple[pd.DataFrame, int]:
    """MATs-ST's pairs (columns :data:`ROW_COLUMNS`, group = pair id): for every pair id the
    pivot shares with X, (pivot anchor, X anchor) and (pivot positive, X positive), every
    language X but the pivot; and how many pairs of identical texts were dropped."""
    parts = []
    labelled = "dataset" in frames[pivot].columns
    english = frames[pivot][["pair_id", "anchor", "positive"] + (["dataset"] if labelled else [])]
    for lang in sorted(frames):
        if lang == pivot:
            continue
        joined = english.merge(frames[lang][["pair_id", "anchor", "positive"]], on="pair_id", suffixes=("_en", "_x"))
        for column in ("anchor", "positive"):
            parts.append(_rows(joined["pair_id"].to_numpy(), lang, joined[f"{column}_en"].to_numpy(),
                               joined[f"{column}_x"].to_numpy(),
                               joined["dataset"].to_numpy(dtype=object) if labelled else None))
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=ROW_COLUMNS)
    identical = rows["anchor"] == rows["positive"]
    return rows[~identical].reset_index(drop=True), int(identical.sum())


def _token_counts(tokenizer, texts: Sequence[str]) -> np.ndarray:
    """Tokens of each text without special tokens."""
    if not len(texts):
        return np.zeros(0, dtype=np.int64)
    encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return np.array([len(ids) for ids in encoded], dtype=np.int64)


def document_groups(frames: Mapping[str, pd.DataFrame], pivot: str, tokenizer, k: int,
                    max_length: int) -> list[list[str]]:
    """The pair ids of each pseudo-document: consecutive ids of the pivot file (those every
    language has), at most ``k``, ending before the sentence that would pass ``max_length``
    tokens (special tokens included) in any language."""
    shared = set.intersection(*(set(frame["pair_id"]) for frame in frames.values()))
    ids = [pair_id for pair_id in frames[pivot]["pair_id"] if pair_id in shared]
    if not ids:
        return []
    special = tokenizer.num_special_tokens_to_add(pair=False)
    lengths = np.max([_token_counts(tokenizer, frame.set_index("pair_id").loc[ids, "anchor"].tolist())
                      for frame in frames.values()], axis=0)
    groups, current, used = [], [], special
    for pair_id, length in zip(ids, lengths):
        if current and (len(current) == k or used + length > max_length):
            groups.append(current)
            current, used = [], special
        current.append(pair_id)
        used += int(length)
    groups.append(current)
    return groups


def pseudo_documents(frames: Mapping[str, pd.DataFrame], pivot: str, groups: Sequence[Sequence[str]]) -> pd.DataFrame:
    """MATs-DT's pairs (columns :data:`ROW_COLUMNS`, group = the document's first pair id):
    (pivot document, X document) of every document and language X but the pivot; a document is
    its pair ids' anchors joined by spaces, in the same order on both sides."""
    indexed = {lang: frame.set_index("pair_id")["anchor"] for lang, frame in frames.items()}
    keys = [group[0] for group in groups]
    texts = {lang: [" ".join(series.loc[list(group)]) for group in groups] for lang, series in indexed.items()}
    parts = [_rows(keys, lang, texts[pivot], texts[lang]) for lang in sorted(frames) if lang != pivot]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=ROW_COLUMNS)


def fusion_data(train: Mapping[str, pd.DataFrame], cfg: InteMATsConfig) -> bl.TrainingData:
    """The fusion's MNRL pairs and batches: Full_c's (crosslingual) or Full_m's (monolingual)."""
    if cfg.pairs == "crosslingual":
        return bl.crosslingual_data(train, cfg.batch_size, cfg.seed, cfg.length_groups)
    return bl.monolingual_data(train, cfg.batch_size, cfg.seed, cfg.length_groups)


def grouped_data(rows: pd.DataFrame, batch_size: int, seed: int, length_groups: int = 1) -> bl.TrainingData:
    """Batches with no text twice and no group (pair id, document) twice; ``length_groups`` > 1:
    grouped by length, each batch keeping every stratum's share (:data:`STRATA`)."""
    return bl.TrainingData(rows, lambda epoch: no_duplicate_batches(rows, batch_size, seed, epoch,
                                                                    group_column="group",
                                                                    length_groups=length_groups,
                                                                    strata_column=STRATA))


# ---- the model -----------------------------------------------------------------------------------


def _mean_head(body: nn.Module) -> nn.Sequential:
    from sentence_transformers.sentence_transformer.modules import Pooling

    head = nn.Sequential(Pooling(body.config.hidden_size, "mean"))
    head.requires_grad_(False)
    return head


def _check_layout(body: nn.Module, source: str, key: str) -> None:
    from modsent.modular.parallel_adapter import _encoder

    try:
        layer = _encoder(body).encoder.layer[0]
        for site in SITES:
            sad._site_module(layer, site, 0)
    except TypeError as err:
        raise InputError(f"{key}: {source}: InteMATs needs a BERT-layout encoder (BERT, XLM-R, ...): {err}") from None


def build_adapter_model(name: str, source: str, cfg: InteMATsConfig, key: str) -> sa.SentenceEncoderModel:
    """The frozen backbone of ``source`` with a fresh adapter set (the identity; W_down drawn
    from ``cfg.seed``), mean pooling over ``cfg.pooling_layers``; only the adapters train."""
    body, tokenizer = tf.load_encoder_body(source, revision=cfg.revision)
    _check_layout(body, source, key)
    _, source_limit = tf.sentence_head(source, body)
    limit = tf.max_sequence_length(tokenizer, body, source_limit)
    body.requires_grad_(False)
    with private_cpu_stream(cfg.seed):
        adapters = sad.new_adapter_set(body, cfg.adapter_config())
    stack = sad.SerialAdapterStack({ADAPTER_NAMES[name]: adapters})
    inner = ie.InteMATsBody(body, stack, ie.check_pooling_layers(cfg.pooling_layers, body.config.num_hidden_layers,
                                                                 f"{key}.pooling_layers"))
    inner.stack.requires_grad_(True)
    return sa.SentenceEncoderModel(inner, tokenizer, _mean_head(body), min(cfg.max_length, limit or cfg.max_length))


def build_fusion_model(st_dir: str | Path, dt_dir: str | Path, cfg: InteMATsConfig,
                       key: str) -> sa.SentenceEncoderModel:
    """The backbone of InteMATs-ST's directory with its adapters and InteMATs-DT's, frozen, and a
    fresh fusion (W_v = I; W_q, W_k drawn from ``cfg.seed``); only the fusion trains."""
    for label, directory in ((ST, st_dir), (DT, dt_dir)):
        if not (Path(directory) / sad.CONFIG_NAME).is_file():
            raise InputError(f"{key}: {directory} is not an {label} system (no {sad.CONFIG_NAME}): train {label} first")
    body, tokenizer = tf.load_encoder_body(st_dir)
    _, source_limit = tf.sentence_head(st_dir, body)
    body.requires_grad_(False)
    st, _ = sad.load_serial_adapters(body, st_dir, names=["st"], fusion=False)
    dt, _ = sad.load_serial_adapters(body, dt_dir, names=["dt"], fusion=False)
    adapters = {**st, **dt}
    with private_cpu_stream(cfg.seed):
        fusion = sad.new_fusion(body, adapters)
    stack = sad.SerialAdapterStack(adapters, fusion)
    stack.requires_grad_(False)
    fusion.requires_grad_(True)
    inner = ie.InteMATsBody(body, stack, ie.check_pooling_layers(cfg.pooling_layers, body.config.num_hidden_layers,
                                                                 f"{key}.pooling_layers"))
    limit = min(cfg.max_length, source_limit or cfg.max_length)
    return sa.SentenceEncoderModel(inner, tokenizer, _mean_head(body), limit)


@contextlib.contextmanager
def other_stack(model: sa.SentenceEncoderModel, adapters: Mapping[str, sad.SerialAdapterSet] | None):
    """Within the block the model runs with only ``adapters`` (one set; None: the bare backbone)."""
    inner: ie.InteMATsBody = model.encoder
    inner.stack.detach()
    replacement = sad.SerialAdapterStack(adapters).attach(inner.body) if adapters else None
    try:
        yield
    finally:
        if replacement is not None:
            replacement.detach()
        inner.stack.attach(inner.body)


def flop_shape(encoder: ie.InteMATsBody, device) -> tuple[int, int, int]:
    """:func:`modsent.training.efficiency.start`'s (N, L, d) of ``encoder``: the frozen backbone
    with every adapter it runs (and the fusion), up to the pooled layer (the default pools the
    second-to-last: the last layer runs, but its output is not used). A fusion's key and value
    projections run on each of its n adapter sets' outputs at every token: they count n times."""
    shape = efficiency.start(encoder, device, encoder.layers_used)
    fusion = encoder.stack.fusion
    if fusion is None:
        return shape
    repeated = sum(module.key.weight.numel() + module.value.weight.numel()
                   for layer, sites in fusion.layers.items() if int(layer) < encoder.layers_used
                   for module in sites.values())
    return shape[0] + (len(encoder.stack.names) - 1) * repeated, shape[1], shape[2]


# ---- evaluation ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Heldout:
    frames: dict[str, pd.DataFrame]  # each language's held-out pairs
    pivot: str
    documents: pd.DataFrame | None  # DT: held-out document pairs


def translation_accuracies(model, heldout: Heldout, batch_size: int, precision: str) -> dict[str, float | None]:
    """{"en-X": share of held-out English anchors whose nearest X anchor is their translation}."""
    out = {}
    english = heldout.frames[heldout.pivot][["pair_id", "anchor"]]
    for lang, frame in sorted(heldout.frames.items()):
        if lang == heldout.pivot:
            continue
        joined = english.merge(frame[["pair_id", "anchor"]], on="pair_id", suffixes=("_en", "_x"))
        out[f"{heldout.pivot}-{lang}"] = sa.retrieval_accuracy(model, joined["anchor_en"].tolist(),
                                                               joined["anchor_x"].tolist(), batch_size=batch_size,
                                                               precision=precision)
    return out


def document_accuracies(model, heldout: Heldout, batch_size: int, precision: str) -> dict[str, float | None]:
    """{"en-X": English→X retrieval among the held-out pseudo-documents}."""
    if heldout.documents is None:
        return {}
    return {f"{heldout.pivot}-{lang}": sa.retrieval_accuracy(model, rows["anchor"].tolist(), rows["positive"].tolist(),
                                                             batch_size=batch_size, precision=precision)
            for lang, rows in sorted(heldout.documents.groupby("lang"))}


def evaluate(model, heldout: Heldout, cfg: InteMATsConfig) -> dict:
    """The held-out accuracies of the model as it is now."""
    batch = max(1, min(cfg.batch_size * 4, 64))
    mono, cross = bl._heldout_accuracies(model, heldout.frames, heldout.pivot, batch, cfg.precision)
    translation = translation_accuracies(model, heldout, batch, cfg.precision)
    out = {"translation": translation, "translation_mean": bl._mean(translation.values()),
           "monolingual": mono, "crosslingual": cross}
    if heldout.documents is not None:
        documents = document_accuracies(model, heldout, max(1, min(cfg.batch_size, 16)), cfg.precision)
        out.update(documents=documents, documents_mean=bl._mean(documents.values()))
    return out


@torch.no_grad()
def fusion_weights(model: sa.SentenceEncoderModel, texts: Sequence[str], batch_size: int = 16) -> dict[str, dict]:
    """{"{layer}.{site}": {adapter: its mean fusion weight over the real tokens of ``texts``}}."""
    inner: ie.InteMATsBody = model.encoder
    stack = inner.stack
    was_training = model.training
    model.eval()
    sums: dict[tuple[int, str], torch.Tensor] = {}
    tokens = 0.0
    stack.record_weights = True
    try:
        for start in range(0, len(texts), batch_size):
            features = model.tokenize(texts[start:start + batch_size])
            device = next(inner.body.parameters()).device
            features = {k: v.to(device) for k, v in features.items()}
            inner(**features)
            mask = features["attention_mask"].unsqueeze(-1).float()
            tokens += float(mask.sum())
            for place, weights in stack.weights.items():
                sums[place] = sums.get(place, 0) + (weights.float() * mask).sum(dim=(0, 1)).cpu()
    finally:
        stack.record_weights = False
        stack.weights = {}
        model.train(was_training)
    return {f"{layer}.{site}": {name: round(float(total[i] / max(tokens, 1.0)), 4)
                                for i, name in enumerate(stack.names)}
            for (layer, site), total in sorted(sums.items())}


# ---- training ------------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainingResult:
    model: sa.SentenceEncoderModel
    source: str
    metrics: dict
    history: list[list[float]]


def training_fingerprint(name: str, cfg: InteMATsConfig, langs: list[str], inputs: Sequence) -> str:
    """What a checkpoint must match to be resumed: the method, its languages, its settings (not
    the log or checkpoint cadence, nor the storage dtype) and the inputs' content (model directories, pair files)."""
    return checkpoints.fingerprint({"method": name, "languages": langs, **dataclasses.asdict(cfg)}, *inputs)


def _prepare(name: str, inputs: Mapping, cfg: InteMATsConfig, key: str):
    """(model, training data, held-out data, its stats, source, fingerprint inputs) of a stage."""
    pairs_paths = dict(inputs["pairs"])
    frames = read_frames(pairs_paths, cfg.datasets, f"{key}.datasets")
    if len(frames) < 2 and name != FUSED:
        raise InputError(f"{key}: {name} aligns English with other languages: pair files of English and at "
                         f"least one other language are needed, got {', '.join(sorted(frames))}")
    train, held = bl.split_heldout_by_pivot(frames, cfg.eval_pairs)
    pivot = bl.pivot_language(frames)
    stats: dict = {}
    if name == FUSED:
        st_dir, dt_dir = inputs.get("st"), inputs.get("dt")
        if st_dir is None or dt_dir is None:
            raise InputError(f"{key}: the fusion needs the InteMATs-ST and InteMATs-DT systems (inputs st, dt)")
        ours = set(held[pivot]["pair_id"].astype(str)) if pivot in held else set()
        for label, directory in (("InteMATs-ST", st_dir), ("InteMATs-DT", dt_dir)):
            recorded = Path(directory) / "metrics.json"
            if ours and recorded.is_file():
                theirs = set(json.loads(recorded.read_text(encoding="utf-8")).get("heldout_pair_ids", []))
                if ours - theirs:  # a warning: ids the adapter dropped from its held-out slice were not trained either
                    log.warning("%s: %d of its held-out pair ids are not among %s's held-out ids and may have been its "
                                "training data (metrics: heldout_ids_trained_on_by_adapters); use %s's datasets and "
                                "at most its eval_pairs", key, len(ours - theirs), label, label)
        model = build_fusion_model(st_dir, dt_dir, cfg, key)
        source, fingerprint_inputs = str(st_dir), [st_dir, dt_dir]
        data = fusion_data(train, cfg)
        heldout = Heldout(held, pivot, None)
    else:
        source = tf.model_source(cfg.model, inputs.get("base"), key)
        model = build_adapter_model(name, source, cfg, key)
        fingerprint_inputs = [source if Path(source).is_dir() else None]
        documents = None
        if name == ST:
            rows, identical = sentence_pairs(train, pivot)
            stats.update(train_pairs=len(rows), identical_pairs_dropped=identical)
        else:
            groups = document_groups(train, pivot, model.tokenizer, cfg.document_sentences, model.max_seq_length)
            rows = pseudo_documents(train, pivot, groups)
            held_groups = document_groups(held, pivot, model.tokenizer, cfg.document_sentences, model.max_seq_length)
            documents = pseudo_documents(held, pivot, held_groups) if len(held_groups) >= 2 else None
            sizes = [len(group) for group in groups]
            stats.update(train_documents=len(groups), train_document_pairs=len(rows),
                         sentences_per_document_mean=float(np.mean(sizes)) if sizes else None,
                         heldout_documents=len(held_groups))
        if len(rows) < 2:
            raise InputError(f"{key}: {len(rows)} training pairs; at least 2 are needed")
        data = grouped_data(rows, cfg.batch_size, cfg.seed, cfg.length_groups)
        heldout = Heldout(held, pivot, documents)
    fingerprint_inputs += [pairs_paths[lang] for lang in sorted(pairs_paths)]
    return model, data, heldout, stats, source, fingerprint_inputs


@fastpath.attention_for_varying_shapes()
def run_training(name: str, inputs: Mapping, cfg: InteMATsConfig, *, device: str | None = None,
                 progress: bool = True, checkpoint_dir: str | Path | None = None,
                 on_step: Callable[[int], None] | None = None) -> TrainingResult:
    """Train stage ``name`` (InteMATs-ST, -DT or the fusion InteMATs) on ``inputs`` (``base``,
    ``pairs``: {language: paraphrase file}; the fusion: ``st`` and ``dt``, the two systems'
    directories) and return the model, metrics and logged losses; nothing is written but
    checkpoints (``checkpoint_dir``; None: none). ``on_step(step)`` runs after every optimizer
    step and checkpoint (the tests stop a run there)."""
    key = f"methods.{name}"
    device = default_device(device)
    if cfg.compile:  # before any work: a missing compiler is an input error
        fastpath.check_compilable(device, f"{key}.compile")
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
    model, data, heldout, stats, source, fingerprint_inputs = _prepare(name, inputs, cfg, key)
    langs = sorted(inputs["pairs"])
    model = model.to(device)
    fastpath.speed_up(model)  # the frozen body's casts kept under autocast: the same results, fewer kernels
    if cfg.compile:  # batches padded to their longest text: shapes vary, so dynamic sizes
        fastpath.compile_in_place(model.encoder, device, f"{key}.compile", dynamic=None)
    accumulation = cfg.gradient_accumulation
    epoch_batches = len(data.epoch_batches(0))
    total_steps = cfg.max_steps or max(1, cfg.epochs * epoch_batches // accumulation)

    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in trainable)
    n_total = sum(p.numel() for p in model.parameters())
    body = flop_shape(model.encoder, device)  # for the model FLOPs of metrics.json
    log.info("%s: %d training rows (%s), %d held-out pair ids; %d batches per epoch, %d steps of %d batches; "
             "%s: %d of %d parameters trained", name, len(data.rows), ", ".join(langs),
             len(heldout.frames[heldout.pivot]), epoch_batches, total_steps, accumulation, source, n_trainable, n_total)
    optimizer = adamw(trainable, cfg.learning_rate, cfg.weight_decay)
    if name == FUSED:
        loss_fn = MultipleNegativesRankingLoss(cfg.scale)
        batch_texts = sa.batch_texts

        def batch_loss(rows, features):
            return sa.batch_loss(model, loss_fn, rows, features)
    else:
        info_nce = InfoNCELoss(cfg.temperature)

        def batch_texts(rows):
            return rows["anchor"].tolist() + rows["positive"].tolist()

        def batch_loss(rows, features):
            emb = model(features)
            return info_nce(emb[:len(rows)], emb[len(rows):])

    def prepare(batch):  # on a thread, one micro-batch ahead: its texts tokenised (and pinned)
        return model.step_features(batch_texts(data.rows.iloc[batch]))

    scaler = grad_scaler(device, cfg.precision)  # fp16: the loss scaler; else a pass-through
    fingerprint = training_fingerprint(name, cfg, langs, fingerprint_inputs)
    resumed = checkpoints.resume(checkpoint_dir, model, optimizer, fingerprint, scaler) if checkpoint_dir else None
    start = resumed["step"] if resumed else 0
    before = resumed["before"] if resumed else _before(name, model, heldout, cfg)

    log_ = TrainingLog(total_steps, start, name, progress, cfg.log_every, resumed, scaler)
    model.train()
    micro_batches = ahead(steps_of_epochs(data.epoch_batches, total_steps * accumulation, start * accumulation),
                          prepare)
    with contextlib.closing(micro_batches):
        for step in range(start, total_steps):
            lr = set_learning_rate(optimizer, schedules.warmup_linear(step, total_steps, cfg.warmup_steps,
                                                                      cfg.learning_rate))
            value, seen = 0.0, 0
            for micro in range(accumulation):
                batch, features = next(micro_batches)
                torch.manual_seed(dropout_seed(step * accumulation + micro, cfg.seed))  # the same masks when resumed
                with autocast(device, cfg.precision):
                    loss = batch_loss(data.rows.iloc[batch], features) / accumulation
                scaler.scale(loss).backward()
                log_.count_padding(features)
                value = value + loss.detach().double()  # a tensor: no GPU wait per micro-batch
                seen += len(batch)
            optimizer_step(optimizer, trainable, cfg.max_grad_norm, scaler)
            log_.record(step, value, lr, seen)  # read back and logged at the logged steps
            if checkpoint_due(step + 1, cfg.checkpoint_every, total_steps, checkpoint_dir):
                checkpoints.save_checkpoint(checkpoint_dir, model, optimizer, step + 1, fingerprint,
                                            log_.state(before=before), scaler)
            if on_step is not None:
                on_step(step + 1)
    losses, history, rows_seen, elapsed = log_.close()
    figures = log_.efficiency(body, elapsed, device)  # every micro-batch's texts
    model.eval()
    after = evaluate(model, heldout, cfg)

    metrics = {
        "method": name, "source_model": source, "languages": langs, "pivot": heldout.pivot,
        "loss": "MNRL" if name == FUSED else "InfoNCE",
        "loss_first": history[0][1] if history else None, "loss_last": history[-1][1] if history else None,
        **_accuracy_metrics(before, after),
        "heldout_pairs": {lang: len(frame) for lang, frame in sorted(heldout.frames.items())},
        "heldout_pair_ids": sorted(heldout.frames[heldout.pivot]["pair_id"].astype(str)),
        "train_rows": len(data.rows), **stats,
        "steps": len(losses), "batches_per_epoch": epoch_batches, "resumed_from_step": start,
        "rows_per_second": rows_seen / elapsed if elapsed > 0 and rows_seen else None,
        "padding_fraction": log_.padding_fraction,  # of the encoded positions: this run's steps
        **figures,  # model FLOPs, their rate, MFU, peak memory (modsent.training.efficiency)
        "trainable_parameters": n_trainable, "total_parameters": n_total,
        "max_seq_length": model.max_seq_length, "pooling_layers": list(model.encoder.pooling_layers),
        "device": str(device), "config": dataclasses.asdict(cfg),
    }
    if name == FUSED:
        metrics.update(_fusion_metrics(model, heldout, before, inputs))
    return TrainingResult(model, source, metrics, history)


def _before(name: str, model, heldout: Heldout, cfg: InteMATsConfig) -> dict:
    """The held-out accuracies before training; the fusion's also of the backbone and of each
    adapter set alone (they do not change while the fusion trains)."""
    out = {"model": evaluate(model, heldout, cfg)}
    if name == FUSED:
        stack = model.encoder.stack
        with other_stack(model, None):
            out["backbone"] = evaluate(model, heldout, cfg)
        for adapter in stack.names:
            with other_stack(model, {adapter: stack.adapters[adapter]}):
                out[adapter] = evaluate(model, heldout, cfg)
    return out


def _accuracy_metrics(before: dict, after: dict) -> dict:
    out = {
        "heldout_translation_retrieval_accuracy_before": before["model"]["translation"],
        "heldout_translation_retrieval_accuracy_after": after["translation"],
        "heldout_translation_retrieval_accuracy_mean_before": before["model"]["translation_mean"],
        "heldout_translation_retrieval_accuracy_mean_after": after["translation_mean"],
        "heldout_retrieval_accuracy_before": before["model"]["monolingual"],
        "heldout_retrieval_accuracy_after": after["monolingual"],
        "heldout_retrieval_accuracy_mean_before": bl._mean(before["model"]["monolingual"].values()),
        "heldout_retrieval_accuracy_mean_after": bl._mean(after["monolingual"].values()),
        "heldout_crosslingual_retrieval_accuracy_before": before["model"]["crosslingual"],
        "heldout_crosslingual_retrieval_accuracy_after": after["crosslingual"],
    }
    if "documents" in after:
        out.update({"heldout_document_retrieval_accuracy_before": before["model"]["documents"],
                    "heldout_document_retrieval_accuracy_after": after["documents"],
                    "heldout_document_retrieval_accuracy_mean_before": before["model"]["documents_mean"],
                    "heldout_document_retrieval_accuracy_mean_after": after["documents_mean"]})
    return out


def _fusion_metrics(model, heldout: Heldout, before: dict, inputs: Mapping) -> dict:
    """The fusion's comparison on its held-out ids (backbone, ST, DT, fusion before/after), the
    mean fusion weights per site, and held-out ids the adapters were trained on (if any)."""
    texts = []
    for frame in heldout.frames.values():
        texts += frame["anchor"].head(16).tolist()
    adapters_heldout = {}
    for label in ("st", "dt"):
        metrics_path = Path(inputs[label]) / "metrics.json"
        if metrics_path.is_file():
            recorded = json.loads(metrics_path.read_text(encoding="utf-8"))
            adapters_heldout[label] = set(recorded.get("heldout_pair_ids", []))
    ours = set(heldout.frames[heldout.pivot]["pair_id"].astype(str))
    return {
        "heldout_translation_retrieval_accuracy_by_system": {
            "backbone": before["backbone"]["translation"], ST: before["st"]["translation"],
            DT: before["dt"]["translation"], "fusion_before": before["model"]["translation"]},
        "heldout_translation_retrieval_accuracy_mean_by_system": {
            "backbone": before["backbone"]["translation_mean"], ST: before["st"]["translation_mean"],
            DT: before["dt"]["translation_mean"], "fusion_before": before["model"]["translation_mean"]},
        "heldout_retrieval_accuracy_mean_by_system": {
            "backbone": bl._mean(before["backbone"]["monolingual"].values()),
            ST: bl._mean(before["st"]["monolingual"].values()), DT: bl._mean(before["dt"]["monolingual"].values())},
        "fusion_weights": fusion_weights(model, texts),
        "heldout_ids_trained_on_by_adapters": {label: len(ours - ids) for label, ids in adapters_heldout.items()},
    }


def write_output(result: TrainingResult, out_dir: str | Path, dtype: str = "float32") -> None:
    """``out_dir`` (atomically): a sentence-transformers directory with the InteMATs module
    (:func:`modsent.encoders.intemats.save_system`), ``metrics.json``, ``loss.tsv``, ``loss.png``."""
    name = result.metrics["method"]
    with atomic_path(out_dir, directory=True) as tmp:
        ie.save_system(result.model, tmp, source=result.source, metadata={"method": name}, dtype=dtype)
        (tmp / "metrics.json").write_text(json.dumps(result.metrics, indent=2) + "\n", encoding="utf-8")
        write_loss_curve(result.history, tmp, title=f"{name} ({'fusion' if name == FUSED else 'serial adapters'})",
                         ylabel=result.metrics["loss"])


def train_intemats(name: str, inputs: Mapping, out_dir: str | Path, settings: Mapping, *, device: str | None = None,
                   progress: bool = True, checkpoint_dir: str | Path | None = None,
                   on_step: Callable[[int], None] | None = None) -> dict:
    """An InteMATs method's ``train``: :func:`run_training` with checkpoints in ``checkpoint_dir``
    (default ``{out_dir}.checkpoint``), then :func:`write_output`; the checkpoint is removed once
    the output is complete. Returns the metrics."""
    cfg = InteMATsConfig.from_settings(name, settings)
    out_dir = Path(out_dir)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else checkpoints.checkpoint_path(out_dir)
    result = run_training(name, inputs, cfg, device=device, progress=progress, checkpoint_dir=checkpoint_dir,
                          on_step=on_step)
    write_output(result, out_dir, cfg.storage_dtype)
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    m = result.metrics
    log.info("%s: loss %.3f → %.3f; held-out English→X translation retrieval %s → %s; %.1f rows/s, %s", name,
             m["loss_first"] or 0, m["loss_last"] or 0, m["heldout_translation_retrieval_accuracy_mean_before"],
             m["heldout_translation_retrieval_accuracy_mean_after"], m["rows_per_second"] or 0,
             efficiency.describe(m))
    return m

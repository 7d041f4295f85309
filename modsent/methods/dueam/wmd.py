"""DuEAM's anchor term: the word mover's distance between the frozen anchor model's token states
of a pair's two texts, exact, computed once per pair and cached by content.

Token vectors (:class:`Anchor`). The anchor (a Hugging Face encoder,
:func:`modsent.encoders.transformer.load_encoder_body`, frozen, eval mode: no dropout) encodes
each text alone (padding does not change a text's states); the token vectors of a text are its
hidden states of layer ``anchor_layer`` (``hidden_states[anchor_layer]``: -1 the last layer, 0
the embeddings), its special tokens (<s>, </s>, [CLS], [SEP], ...) dropped unless
``special_tokens: keep``, each vector L2-normalised unless ``normalize_tokens: false``. A text
longer than the anchor's limit (``anchor_max_length``, else the model's own) is truncated to it
and counted (logged; ``truncated_texts`` in the shard's metadata and the training metrics).

Distance (:func:`word_movers_distance`). The earth mover's distance between the two texts'
token distributions: token masses uniform (1/n each) or, with ``token_weights: idf``,
MoverScore's idf, log((M + 1) / (df + 1)) over the M distinct texts of the method's pairs,
normalised to sum to 1 (a text whose tokens all have idf 0 gets uniform masses); ground cost
the Euclidean distance between token vectors (MoverScore's; or squared Euclidean, or 1 - cosine);
solved exactly by POT's network simplex, ``ot.emd2`` (tests compare it with a linear program).

Cache (:class:`WMDCache`). A pair's WMD is a function of (the anchor's weights, these
settings, the two texts [, their token masses with idf]), so its key is a hash of exactly that
(:func:`pair_key`); the anchor is identified by the content of its directory (or its Hub id
and commit). The cache directory holds parquet parts (``key, d_wmd``), each written atomically
by one job (jobs running side by side never write the same file; a killed job keeps the parts
it flushed); a job reads every part and adds one part with what it computed. So a rerun, a
job whose training settings changed, or another method over the same pairs computes nothing
again, and a changed anchor setting or model misses the cache.

Shards (:func:`run_shard`). The pairs of a method (:func:`modsent.methods.dueam.pairs.build_pairs`)
are split by a hash of their group (pair id); shard i of n scores its pairs and writes
``pair_index, digest, d_wmd, cached`` with the run's counts in the parquet metadata
(:func:`read_wmd` joins the shards back onto the training pairs and checks that they match).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from modsent.encoders import transformer as tf
from modsent.io import InputError, atomic_path
from modsent.methods.dueam.pairs import PairSet, build_pairs, pair_digest, shard_of
from modsent.training import checkpoints
from modsent.training.fastpath import attention_for_varying_shapes
from modsent.training.loop import encoding_order
from modsent.training.precision import default_device, describe_device

log = logging.getLogger(__name__)

CACHE_VERSION = 1  # bump when the computation changes meaning: every old entry then misses
COMPACT_PARTS = 64  # a job that finds more parts than this merges them into one
METADATA_KEY = b"modsent.dueam.wmd"
SHARD_COLUMNS = ["pair_index", "digest", "d_wmd", "cached"]


# ---- the anchor ----------------------------------------------------------------------------------


def model_identity(source: str, revision: str | None, body=None) -> str:
    """What identifies the anchor's weights: a local directory's content (every file), or a Hub
    id with the commit transformers loaded (else the revision asked for)."""
    if Path(source).is_dir():
        return "dir:" + checkpoints.fingerprint({}, source)
    commit = getattr(getattr(body, "config", None), "_commit_hash", None) if body is not None else None
    return f"hub:{source}@{commit or revision or 'unpinned'}"


class Anchor:
    """The frozen anchor: tokenisation, truncation counting and token vectors of texts."""

    def __init__(self, source: str | Path, *, revision: str | None = None, layer: int = -1,
                 special_tokens: str = "drop", normalize_tokens: bool = True, max_length: int | None = None,
                 device: str | None = None, key: str = "methods.DuEAM"):
        source = str(source)
        self.device = default_device(device)
        body, tokenizer = tf.load_encoder_body(source, revision=revision)
        body.requires_grad_(False)
        self.body, self.tokenizer = body.eval().to(self.device), tokenizer
        log.info("encoding on %s", describe_device(self.device))
        _, source_limit = tf.sentence_head(source, body)
        limit = tf.max_sequence_length(tokenizer, body, source_limit)
        limits = [v for v in (max_length, limit) if v]
        if not limits:
            raise InputError(f"{key}.anchor_max_length: {source} sets no length limit; give one")
        self.max_length = min(limits)
        layers = int(getattr(body.config, "num_hidden_layers", getattr(body.config, "num_layers", 0)))
        if not -(layers + 1) <= layer <= layers:
            raise InputError(f"{key}.anchor_layer {layer}: {source} has {layers} layers (hidden states "
                             f"{-(layers + 1)}..{layers}; -1: the last)")
        self.layer, self.special_tokens, self.normalize_tokens = layer, special_tokens, normalize_tokens
        self.source = source
        self.identity = model_identity(source, revision, body)

    def token_ids(self, texts: Sequence[str]) -> tuple[list[list[int]], list[bool]]:
        """(each text's kept token ids after truncation, whether it was truncated)."""
        import transformers

        transformers.logging.set_verbosity_error()  # "sequence longer than the maximum": counted here
        try:
            full = self.tokenizer(list(texts), truncation=False)
        finally:
            transformers.logging.set_verbosity_warning()
        truncated = [len(input_ids) > self.max_length for input_ids in full["input_ids"]]
        # the ids as the model sees them: truncated to the limit
        encoded = self.tokenizer(list(texts), truncation=True, max_length=self.max_length,
                                 return_special_tokens_mask=True)
        kept = []
        for input_ids, special in zip(encoded["input_ids"], encoded["special_tokens_mask"]):
            keep = [i for i, s in zip(input_ids, special) if not (s and self.special_tokens == "drop")]
            kept.append(keep)
        return kept, truncated

    @torch.no_grad()
    @attention_for_varying_shapes()  # batches padded to their longest: shapes vary
    def token_vectors(self, texts: Sequence[str], batch_size: int = 64) -> list[np.ndarray]:
        """Each text's token vectors [tokens, dim] (float64): the layer's hidden states of its
        kept tokens, L2-normalised if so set. Texts are batched by their token count
        (modsent.training.loop.encoding_order: the least padding)."""
        texts = list(texts)
        order = encoding_order(texts, lambda chunk: [len(ids) for ids in self.tokenizer(
            list(chunk), truncation=True, max_length=self.max_length)["input_ids"]])
        out: list[np.ndarray | None] = [None] * len(texts)
        for start in range(0, len(texts), batch_size):
            chosen = [texts[i] for i in order[start:start + batch_size]]
            batch = self.tokenizer(chosen, padding=True, truncation=True, max_length=self.max_length,
                                   return_special_tokens_mask=True, return_tensors="pt")
            special = batch.pop("special_tokens_mask").bool()
            mask = batch["attention_mask"].bool()
            keep = mask & ~special if self.special_tokens == "drop" else mask
            batch = {k: v.to(self.device) for k, v in batch.items() if k in ("input_ids", "attention_mask")}
            states = self.body(**batch, output_hidden_states=True).hidden_states[self.layer].float()
            if self.normalize_tokens:
                states = torch.nn.functional.normalize(states, dim=-1)
            states = states.cpu().double().numpy()
            for row, index in enumerate(order[start:start + batch_size]):
                vectors = states[row][keep[row].numpy()]
                if not len(vectors):
                    raise InputError(f"text {chosen[row]!r}: no token left for the WMD after dropping the "
                                     "anchor's special tokens")
                out[index] = vectors
        return out  # type: ignore[return-value]


# ---- the distance --------------------------------------------------------------------------------


def cost_matrix(x: np.ndarray, y: np.ndarray, ground_cost: str = "euclidean") -> np.ndarray:
    """[len(x), len(y)] cost of moving each token of x onto each token of y (float64)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if ground_cost == "cosine":
        xn = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        yn = y / np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)
        return np.maximum(1.0 - xn @ yn.T, 0.0)
    squared = np.maximum((x * x).sum(1)[:, None] + (y * y).sum(1)[None, :] - 2.0 * x @ y.T, 0.0)
    if ground_cost == "sqeuclidean":
        return squared
    if ground_cost == "euclidean":
        return np.sqrt(squared)
    raise ValueError(f"ground_cost must be euclidean, sqeuclidean or cosine, got {ground_cost!r}")


def word_movers_distance(x: np.ndarray, y: np.ndarray, wx: np.ndarray | None = None, wy: np.ndarray | None = None,
                         ground_cost: str = "euclidean") -> float:
    """The exact earth mover's distance between token vectors ``x`` and ``y`` with masses
    ``wx``, ``wy`` (each normalised to sum 1; None: uniform), POT's ``ot.emd2``."""
    import ot

    wx = np.full(len(x), 1.0 / len(x)) if wx is None else np.asarray(wx, dtype=np.float64) / np.sum(wx)
    wy = np.full(len(y), 1.0 / len(y)) if wy is None else np.asarray(wy, dtype=np.float64) / np.sum(wy)
    cost, info = ot.emd2(wx, wy, cost_matrix(x, y, ground_cost), numItermax=10_000_000, log=True)
    if info.get("warning"):
        raise RuntimeError(f"earth mover's distance not solved exactly: {info['warning']}")
    return float(cost)


def idf_table(token_ids: Sequence[Sequence[int]]) -> dict[int, float]:
    """MoverScore's idf over documents (each a text's token ids): log((M + 1) / (df + 1))."""
    df: dict[int, int] = {}
    for ids in token_ids:
        for token in set(ids):
            df[token] = df.get(token, 0) + 1
    m = len(token_ids)
    return {token: float(np.log((m + 1) / (count + 1))) for token, count in df.items()}


def token_masses(ids: Sequence[int], idf: Mapping[int, float] | None) -> np.ndarray | None:
    """A text's token masses: None (uniform) or its tokens' idf (uniform where all are 0)."""
    if idf is None:
        return None
    weights = np.array([idf.get(i, 0.0) for i in ids], dtype=np.float64)
    return weights if weights.sum() > 0 else None


def pair_key(anchor_identity: str, settings: Mapping, text_a: str, text_b: str,
             masses: tuple[np.ndarray | None, np.ndarray | None] = (None, None)) -> str:
    """The cache key of one pair's WMD: a hash of everything it depends on."""
    digest = hashlib.sha256(json.dumps([CACHE_VERSION, anchor_identity, dict(sorted(settings.items())),
                                        text_a, text_b], ensure_ascii=False).encode())
    for weights in masses:
        digest.update(b"\0" if weights is None else np.asarray(weights, dtype=np.float64).tobytes() + b"\1")
    return digest.hexdigest()[:32]


# ---- the cache -----------------------------------------------------------------------------------


class WMDCache:
    """A directory of parquet parts (``key, d_wmd``), read whole at the start; :meth:`add`
    collects new values and :meth:`flush` writes them as one new part, atomically."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.values: dict[str, float] = {}
        self.pending: dict[str, float] = {}
        parts = sorted(self.directory.glob("part-*.parquet"))
        read = []
        for part in parts:
            try:
                frame = pd.read_parquet(part)
            except FileNotFoundError:  # merged away by a job compacting the cache just now
                continue
            self.values.update(zip(frame["key"].tolist(), frame["d_wmd"].tolist()))
            read.append(part)
        if len(read) > COMPACT_PARTS:
            self._compact(read)

    def __len__(self) -> int:
        return len(self.values)

    def get(self, key: str) -> float | None:
        return self.values.get(key)

    def add(self, key: str, value: float) -> None:
        self.values[key] = value
        self.pending[key] = value

    def _write(self, values: Mapping[str, float]) -> Path:
        path = self.directory / f"part-{time.time_ns()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.parquet"
        with atomic_path(path) as tmp:
            pd.DataFrame({"key": list(values), "d_wmd": np.array(list(values.values()), dtype=np.float64)}
                         ).to_parquet(tmp, index=False)
        return path

    def flush(self) -> None:
        if self.pending:
            self._write(self.pending)
            self.pending = {}

    def _compact(self, parts: list[Path]) -> None:
        """Merge ``parts`` into one (written first, so no value is ever missing from disk)."""
        self._write(dict(self.values))
        for part in parts:
            part.unlink(missing_ok=True)


# ---- scoring pairs -------------------------------------------------------------------------------


def _chunks(rows: pd.DataFrame, max_texts: int) -> list[np.ndarray]:
    """Row positions in runs of whole groups, each with at most ~``max_texts`` distinct texts."""
    chunks, current, texts = [], [], set()
    for group, positions in rows.groupby("group", sort=False).indices.items():
        new = set(rows["text_a"].iloc[positions]) | set(rows["text_b"].iloc[positions])
        if current and len(texts | new) > max_texts:
            chunks.append(np.concatenate(current))
            current, texts = [], set()
        current.append(positions)
        texts |= new
    if current:
        chunks.append(np.concatenate(current))
    return chunks


def compute_wmd(rows: pd.DataFrame, anchor: Anchor, settings: Mapping, *, cache: WMDCache | None = None,
                idf: Mapping[int, float] | None = None, batch_size: int = 64, chunk_texts: int = 4096,
                flush_every: int = 50_000, progress: bool = False) -> tuple[np.ndarray, np.ndarray, dict]:
    """(d_wmd of every row of ``rows`` (``text_a``, ``text_b``, ``group``), whether it came
    from the cache, counts): cached values are looked up, the rest computed (each distinct
    text encoded once per chunk of groups) and added to ``cache``. ``settings``: the anchor
    settings of :meth:`DuEAMConfig.wmd_settings` (the cache key's part)."""
    from tqdm.auto import tqdm

    start = time.perf_counter()
    texts = sorted(set(rows["text_a"]) | set(rows["text_b"]))
    ids, truncated = anchor.token_ids(texts)
    by_text = dict(zip(texts, range(len(texts))))
    if any(truncated):
        examples = [t[:60] for t, cut in zip(texts, truncated) if cut][:3]
        log.warning("%d of %d texts are longer than the anchor's limit of %d tokens and were truncated "
                    "for the WMD (e.g. %s)", sum(truncated), len(texts), anchor.max_length, examples)
    masses = [token_masses(i, idf) for i in ids]
    keys = [pair_key(anchor.identity, settings, a, b, (masses[by_text[a]], masses[by_text[b]]))
            for a, b in zip(rows["text_a"], rows["text_b"])]
    values = np.full(len(rows), np.nan)
    cached = np.zeros(len(rows), dtype=bool)
    for i, key in enumerate(keys):
        value = cache.get(key) if cache is not None else None
        if value is not None:
            values[i], cached[i] = value, True
    todo = rows.iloc[np.flatnonzero(~cached)]
    positions = np.flatnonzero(~cached)
    computed, since_flush, encoded = 0, 0, 0
    known: dict[str, float] = {}
    bar = tqdm(total=len(todo), desc="WMD", unit="pair", disable=not progress)
    for chunk in _chunks(todo.reset_index(drop=True), chunk_texts):
        part = todo.iloc[chunk]
        chunk_texts_ = sorted(set(part["text_a"]) | set(part["text_b"]))
        vectors = dict(zip(chunk_texts_, anchor.token_vectors(chunk_texts_, batch_size)))
        encoded += len(chunk_texts_)
        for local, (a, b) in zip(chunk, zip(part["text_a"], part["text_b"])):
            row = positions[local]
            key = keys[row]
            if key not in known:  # the same pair twice in the shard: once
                known[key] = word_movers_distance(vectors[a], vectors[b], masses[by_text[a]], masses[by_text[b]],
                                                  settings["ground_cost"])
                computed += 1
                since_flush += 1
                if cache is not None:
                    cache.add(key, known[key])
            values[row] = known[key]
        bar.update(len(chunk))
        if cache is not None and since_flush >= flush_every:
            cache.flush()
            since_flush = 0
    bar.close()
    if cache is not None:
        cache.flush()
    stats = {"pairs": len(rows), "computed": computed, "cached": int(cached.sum()), "texts": len(texts),
             "texts_encoded": encoded, "truncated_texts": int(sum(truncated)), "anchor_max_length": anchor.max_length,
             "anchor": anchor.identity, "seconds": round(time.perf_counter() - start, 3)}
    return values, cached, stats


def anchor_for(cfg, base: str | Path | None, device: str | None = None, key: str = "methods.DuEAM") -> Anchor:
    """The anchor of settings ``cfg`` (its ``anchor_model``, else the learner's start model)."""
    source, revision = cfg.anchor_source(base)
    if source is None:
        raise InputError(f"{key}.anchor_model: null uses the base model, and no base model was given")
    return Anchor(source, revision=revision, layer=cfg.anchor_layer, special_tokens=cfg.special_tokens,
                  normalize_tokens=cfg.normalize_tokens, max_length=cfg.anchor_max_length, device=device, key=key)


def pair_idf(anchor: Anchor, rows: pd.DataFrame, token_weights: str) -> dict[int, float] | None:
    """The idf table over the distinct texts of all the method's pairs (``token_weights: idf``)."""
    if token_weights != "idf":
        return None
    texts = sorted(set(rows["text_a"]) | set(rows["text_b"]))
    ids, _ = anchor.token_ids(texts)
    return idf_table(ids)


def run_shard(pairs_paths: Mapping[str, str | Path], translation_paths: Mapping[str, str | Path] | None, cfg,
              base: str | Path | None, shard: int, shards: int, out_path: str | Path, *,
              cache_dir: str | Path | None, device: str | None = None, progress: bool = False,
              key: str = "methods.DuEAM") -> dict:
    """Score shard ``shard`` of ``shards`` of the pairs of ``cfg`` and write it to ``out_path``
    (atomically): ``pair_index, digest, d_wmd, cached``, the counts in the metadata. Returns them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not 0 <= shard < shards:
        raise InputError(f"shard {shard} of {shards}: shards are numbered 0..{shards - 1}")
    pairs = build_pairs(pairs_paths, translation_paths, cfg, key)
    anchor = anchor_for(cfg, base, device, key)
    idf = pair_idf(anchor, pairs.rows, cfg.token_weights)
    mine = np.flatnonzero([shard_of(g, shards) == shard for g in pairs.rows["group"]])
    rows = pairs.rows.iloc[mine]
    cache = WMDCache(cache_dir) if cache_dir is not None else None
    log.info("WMD shard %d of %d: %d of %d pairs, anchor %s (layer %d, %s tokens, %s weights, %s cost); "
             "cache: %s", shard, shards, len(rows), len(pairs.rows), anchor.source, cfg.anchor_layer,
             cfg.special_tokens + " special", cfg.token_weights, cfg.ground_cost,
             f"{len(cache)} entries in {cache_dir}" if cache is not None else "none")
    values, cached, stats = compute_wmd(rows, anchor, cfg.wmd_settings(), cache=cache, idf=idf,
                                        batch_size=cfg.wmd_batch_size, progress=progress)
    stats.update(shard=shard, shards=shards, total_pairs=len(pairs.rows))
    table = pa.Table.from_pandas(pd.DataFrame({
        "pair_index": mine.astype(np.int64),
        "digest": [pair_digest(a, b) for a, b in zip(rows["text_a"], rows["text_b"])],
        "d_wmd": values.astype(np.float64), "cached": cached}), preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), METADATA_KEY: json.dumps(stats).encode()})
    with atomic_path(out_path) as tmp:
        pq.write_table(table, tmp)
    log.info("WMD shard %d of %d: %d pairs, %d computed, %d from the cache, %d texts truncated; %.1f s",
             shard, shards, stats["pairs"], stats["computed"], stats["cached"], stats["truncated_texts"],
             stats["seconds"])
    return stats


def shard_stats(path: str | Path) -> dict:
    """The counts a shard file carries in its metadata."""
    import pyarrow.parquet as pq

    metadata = pq.read_schema(path).metadata or {}
    return json.loads(metadata.get(METADATA_KEY, b"{}"))


def read_wmd(paths: Sequence[str | Path], pairs: PairSet, key: str = "methods.DuEAM") -> tuple[np.ndarray, dict]:
    """(d_wmd of every training pair, the shards' counts summed) from the shard files; an
    error when they do not hold exactly these pairs (the WMD stage ran for other settings)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    frames = [pd.read_parquet(p) for p in paths]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=SHARD_COLUMNS)
    n = len(pairs.rows)
    index = frame["pair_index"].to_numpy()
    if len(frame) != n or not np.array_equal(np.sort(index), np.arange(n)):
        raise InputError(f"{key}: the WMD files ({len(paths)} shard(s), {len(frame)} pairs) do not cover the "
                         f"{n} training pairs; rerun the WMD stage for these settings")
    frame = frame.sort_values("pair_index").reset_index(drop=True)
    digests = [pair_digest(a, b) for a, b in zip(pairs.rows["text_a"], pairs.rows["text_b"])]
    wrong = np.flatnonzero(frame["digest"].to_numpy() != np.array(digests))
    if len(wrong):
        row = pairs.rows.iloc[wrong[0]]
        raise InputError(f"{key}: the WMD files were made for other pairs ({len(wrong)} differ, e.g. pair "
                         f"{row['group']!r} {row['text_a'][:40]!r} / {row['text_b'][:40]!r}); rerun the WMD stage")
    values = frame["d_wmd"].to_numpy(dtype=np.float64)
    if not np.isfinite(values).all():
        raise InputError(f"{key}: the WMD files hold non-finite distances")
    totals: dict = {"shards": len(paths)}
    for path in paths:
        for name, value in shard_stats(path).items():
            if name in ("pairs", "computed", "cached", "texts", "texts_encoded", "truncated_texts", "seconds"):
                totals[name] = totals.get(name, 0) + value
            elif name in ("anchor", "anchor_max_length"):
                totals[name] = value
    return values, totals

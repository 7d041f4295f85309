"""The language adapter (LA): continued masked-language-model training of one language.

What is trained: the language's new embedding matrix (FOCUS-initialised, tied to the MLM
decoder), the MLM head's own layers (base sentence encoders ship without an MLM head, so it
starts untrained and must learn), and a LoRA adapter on attention query/key/value. Everything
else stays frozen. The result is a directory:

    tokenizer files          the language's tokenizer (AutoTokenizer loads the directory)
    embeddings.safetensors   input_embeddings [V, H] (+ output_embeddings if untied) and the
                             MLM head (mlm_head.*): everything trained besides the LoRA weights
    adapter/                 the LoRA adapter (PEFT: adapter_config.json, adapter_model.safetensors)
    metrics.json             held-out MLM loss before/after, steps, tokens, tokens/s
    loss.tsv, loss.png       the training curve

:func:`load_language_model` rebuilds the model from the base model and this directory.

The loop is written out (no Trainer) so a reader can follow it top to bottom, and so that
checkpoints hold safetensors only: trainable weights, AdamW moments and RNG state, no pickles.
A job killed midway and rerun continues from its last checkpoint, bit for bit on the CPU.

Several GPUs of one node: ``python -m modsent.modular.language_adapter ...`` (:func:`main`) started by
torchrun trains data-parallel, one process per GPU (see :func:`train_language_adapter`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import heapq
import json
import logging
import math
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch

from modsent import distributed
from modsent.io import (
    InputError,
    atomic_path,
    canonical_adapter_config,
    check_model_files,
    iter_utf8_lines,
    read_safetensors,
    record_added_tokens,
)
from modsent.losses import MaskedLanguageModelingLoss, mlm_parts
from modsent.training import efficiency, fastpath, schedules, tracking
from modsent.training.checkpoints import (
    RUNTIME_SETTINGS,
    at_later_default,
    checkpoint_path,
    load_checkpoint,
    save_checkpoint,
)
from modsent.training.loop import LossScaleWatch, optimizer_step, report_step, to_device
from modsent.training.optim import adamw, step_options
from modsent.training.precision import autocast, default_device, grad_scaler, resolve as resolve_precision
from modsent.training.seeding import dropout_seed, step_generator
from modsent.training.tracking import Tracker
from modsent.evaluation.plots import write_before_after_bars, write_loss_curve

log = logging.getLogger(__name__)

EMBEDDINGS_NAME = "embeddings.safetensors"
ADAPTER_DIR = "adapter"


@dataclasses.dataclass(frozen=True)
class LanguageAdapterConfig:
    """Hyperparameters of LA training: the config's `language_adapter` section. The defaults are
    the schema's (modsent/schemas/config.schema.yaml, the one source; tests/test_config.py compares)."""

    steps: int
    batch_size: int
    seq_len: int
    learning_rate: float
    warmup_steps: int = 1000
    weight_decay: float = 0.01
    mlm_probability: float = 0.15
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.1
    target_modules: tuple[str, ...] = ("query", "key", "value")
    eval_sentences: int = 1000
    checkpoint_every: int = 1000
    log_every: int = 50
    head_warmup_steps: int = 500
    seed: int = 0
    precision: str = "auto"  # modsent.training.precision: auto, fp16 or fp32
    residual_stream: str = "fp32"  # bf16: fastpath.bf16_residual_stream under bf16 autocast
    tracking: str = "none"  # none | tensorboard | wandb
    compile: bool = False  # torch.compile the encoder (fastpath.compile_in_place)
    kernels: str = "eager"  # triton: fastpath.use_triton_kernels on a CUDA GPU

    @classmethod
    def from_config(cls, section: dict) -> "LanguageAdapterConfig":
        """From the validated config section (the schema filled in every default; a job's params
        leave out ``residual_stream`` at its default, ``x-omit-default``)."""
        lora = section["lora"]
        return cls(
            steps=section["steps"], batch_size=section["batch_size"], seq_len=section["seq_len"],
            learning_rate=section["learning_rate"], warmup_steps=section["warmup_steps"],
            weight_decay=section["weight_decay"], mlm_probability=section["mlm_probability"],
            lora_r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
            target_modules=tuple(lora["target_modules"]),
            eval_sentences=section["eval_sentences"], checkpoint_every=section["checkpoint_every"],
            log_every=section["log_every"], head_warmup_steps=section["head_warmup_steps"],
            seed=section["seed"], precision=section["precision"],
            residual_stream=section.get("residual_stream", cls.residual_stream),
            tracking=section["tracking"], compile=section["compile"],
            kernels=section["kernels"],
        )

    def fingerprint(self, *inputs: str | Path) -> str:
        """What a checkpoint must match to be resumed: the hyperparameters (log/checkpoint
        cadence, tracking and compiling may change) and the content of the input files (a retrained tokenizer or new
        embeddings of the same shape must not resume a stale checkpoint)."""
        relevant = {k: v for k, v in dataclasses.asdict(self).items()  # a later key at its default: as before it
                    if k not in (*RUNTIME_SETTINGS, "tracking") and not at_later_default(k, v)}
        digest = hashlib.sha256(json.dumps(relevant, sort_keys=True).encode())
        for path in inputs:
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        return digest.hexdigest()[:16]


# ---- data -----------------------------------------------------------------------------------


def split_heldout(lines: list[str], count: int) -> tuple[list[str], list[str]]:
    """(train, heldout): the held-out lines are those with the smallest content hash, so the
    split does not depend on the corpus order and a line is never in both."""
    held = set(_ranked_by_hash(lines, min(count, len(lines) // 10)))
    return ([line for i, line in enumerate(lines) if i not in held],
            [line for i, line in enumerate(lines) if i in held])


def _ranked_by_hash(lines: Iterable[str], count: int) -> list[int]:
    """The indices of the ``count`` lines with the smallest SHA-1, smallest first, ties by
    position: ``sorted(range(n), key=sha1)[:count]``, keeping ``count`` of them in memory, not
    ``n``. Reads every line (also for a count of 0)."""
    hashes = ((hashlib.sha1(line.encode()).digest(), i) for i, line in enumerate(lines))
    ranked = [i for _, i in heapq.nsmallest(count, hashes)]
    for _ in hashes:  # nsmallest reads nothing for a count of 0
        pass
    return ranked


def corpus_lines(path: str | Path) -> Iterator[str]:
    """The corpus's non-empty lines, stripped, read as they are needed (:func:`read_corpus`'s)."""
    for _, line in iter_utf8_lines(path):
        line = line.strip()
        if line:
            yield line


def read_split_corpus(path: str | Path, count: int) -> tuple[Callable[[], Iterator[str]], int, list[str]]:
    """:func:`split_heldout` of the corpus at ``path``, reading it twice instead of holding it:
    (a function giving the training lines anew, their number, the held-out lines). The same
    lines as ``split_heldout(read_corpus(path), count)``; memory: the held-out lines only."""
    n = 0

    def counted() -> Iterator[str]:
        nonlocal n
        for n, line in enumerate(corpus_lines(path), start=1):
            yield line

    ranked = _ranked_by_hash(counted(), count)  # the count is capped below, once n is known
    if n == 0:
        raise InputError(f"{path}: the corpus is empty")
    held = set(ranked[:min(count, n // 10)])
    heldout = [line for i, line in enumerate(corpus_lines(path)) if i in held] if held else []

    def train_lines() -> Iterator[str]:
        return (line for i, line in enumerate(corpus_lines(path)) if i not in held)

    return train_lines, n - len(held), heldout


def pack_sequences(lines: Iterable[str], tokenizer, seq_len: int, *, chunk_lines: int = 100_000,
                   progress: bool = False, total: int | None = None,
                   dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Token ids of all lines, concatenated with the separator token and cut into sequences of
    exactly ``seq_len`` (``cls ... sep``): no position is padding, so no compute is wasted on it.
    The last partial sequence is dropped unless it is the only one.

    The lines (any iterable, read ``chunk_lines`` at a time; ``total``: their number, for the
    progress bar) are tokenised by the Rust tokenizer into int32 parts (4 bytes a token; the
    Python wrapper's lists over the whole corpus took ~2 GiB per 1M lines,
    benchmarks/pack_corpus.py), and each part is moved into its rows of the int32 sequences and
    freed, so the tokens are held about once. The sequences are of ``dtype``: int64 by default,
    as the model and the loss take them (a copy); the LA keeps int32, half the memory, and
    :func:`mask_tokens` widens each batch."""
    import itertools

    import numpy as np
    from tqdm.auto import tqdm

    body = seq_len - 2
    if body < 1:
        raise InputError(f"language_adapter.seq_len must be at least 3, got {seq_len}")
    sep = tokenizer.sep_token_id
    backend = getattr(tokenizer, "backend_tokenizer", None)
    parts = []
    if total is None and hasattr(lines, "__len__"):
        total = len(lines)
    lines = iter(lines)
    with tqdm(total=total, desc="tokenising", unit="line", disable=not progress) as bar:
        while chunk := list(itertools.islice(lines, chunk_lines)):
            if backend is not None:  # the Rust tokenizer itself: half the time of the Python wrapper
                encoded = [e.ids for e in backend.encode_batch(chunk, add_special_tokens=False) if e.ids]
            else:
                encoded = [ids for ids in tokenizer(chunk, add_special_tokens=False)["input_ids"] if ids]
            lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
            part = np.empty(int(lengths.sum()) + len(encoded), dtype=np.int32)
            seps = np.cumsum(lengths + 1) - 1  # each line's tokens, then a separator
            tokens = np.ones(len(part), dtype=bool)
            tokens[seps] = False
            part[tokens] = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int32,
                                       count=len(part) - len(encoded))
            part[seps] = sep
            parts.append(part)
            bar.update(len(chunk))
    length = sum(map(len, parts))
    if not length:
        raise InputError("the corpus has no tokens")
    n = max(1, length // body)  # the last partial sequence dropped, unless it is the only one
    packed = np.empty((n, seq_len), dtype=np.int32)
    packed[:, 0] = tokenizer.cls_token_id
    packed[:, -1] = sep
    if length < body:
        packed[0, 1 + length:-1] = tokenizer.pad_token_id
    position, end = 0, n * body
    parts.reverse()
    while parts and position < end:  # each part moved into its rows and freed: no second copy of the stream
        part = parts.pop()[:end - position]
        row, column = divmod(position, body)
        head = min(len(part), body - column) if column else 0
        packed[row, 1 + column:1 + column + head] = part[:head]
        full = (len(part) - head) // body
        rows = (position + head) // body
        packed[rows:rows + full, 1:-1] = part[head:head + full * body].reshape(full, body)
        tail = part[head + full * body:]
        if len(tail):
            packed[rows + full, 1:1 + len(tail)] = tail
        position += len(part)
    packed = torch.from_numpy(packed)
    return packed if dtype == torch.int32 else packed.to(dtype)


SEQUENCES_FORMAT = 1  # of the prepared sequences' folder: a change of how they are made bumps it
SEQUENCES_MANIFEST = "manifest.json"
# How long the other processes of a data-parallel LA wait for the main one to tokenise the
# corpus (~5M lines a minute on 2 cores: the paper's 10M sentences take minutes)
SEQUENCES_WAIT = datetime.timedelta(hours=12)


def sequences_path(out_dir: str | Path) -> Path:
    """Where the LA that writes ``out_dir`` keeps its tokenised corpus while it trains:
    ``{out}.sequences`` beside the output (and beside its ``.checkpoint``), removed with the
    checkpoint when the LA is written."""
    out_dir = Path(out_dir)
    return out_dir.with_name(out_dir.name + ".sequences")


def sequences_key(tokenizer_dir: str | Path, corpus_path: str | Path, cfg: "LanguageAdapterConfig") -> str:
    """What prepared sequences are made of: the format, the tokenizer directory's files (the
    vocabulary and the special tokens' ids), the corpus's bytes, the sequence length and the
    held-out count (nothing else of the LA's settings)."""
    from modsent.training.checkpoints import fingerprint

    return fingerprint({"sequences_format": SEQUENCES_FORMAT, "seq_len": cfg.seq_len,
                        "eval_sentences": cfg.eval_sentences}, tokenizer_dir, corpus_path)


def _tokenised(corpus_path, tokenizer, cfg, progress: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The corpus's training and held-out sequences (int32) and their counts, made in memory."""
    # read twice rather than held (the held-out lines by hash, then the rest tokenised in
    # chunks), kept as int32 sequences: the lines of split_heldout(read_corpus(...)), in half the
    # memory of int64 and without the corpus's text (benchmarks/pack_corpus.py --la)
    train_lines, n_train, heldout_lines = read_split_corpus(corpus_path, cfg.eval_sentences)
    train = pack_sequences(train_lines(), tokenizer, cfg.seq_len, progress=progress, total=n_train,
                           dtype=torch.int32)
    heldout = pack_sequences(heldout_lines, tokenizer, cfg.seq_len, dtype=torch.int32) if heldout_lines else train[:0]
    return train, heldout, {"train_lines": n_train, "heldout_lines": len(heldout_lines)}


def _load_sequences(folder: Path, key: str, seq_len: int) -> tuple[torch.Tensor, torch.Tensor, dict] | None:
    """The sequences prepared in ``folder`` for ``key``, memory-mapped copy-on-write (the
    processes of a node share one copy in the page cache), or None when there are none of that
    key, or files that do not hold what the manifest says (a folder a crash left incomplete)."""
    import numpy as np

    try:
        manifest = json.loads((folder / SEQUENCES_MANIFEST).read_text(encoding="utf-8"))
        if not isinstance(manifest, dict) or manifest.get("key") != key:
            return None
        train, heldout = (np.load(folder / f"{name}.npy", mmap_mode="c") for name in ("train", "heldout"))
        counts = {name: int(manifest["counts"][name]) for name in ("train_lines", "heldout_lines")}
        shapes = [(manifest["train_sequences"], seq_len), (manifest["heldout_sequences"], seq_len)]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if [train.shape, heldout.shape] != shapes or train.dtype != heldout.dtype or train.dtype != np.int32:
        return None
    return torch.from_numpy(train), torch.from_numpy(heldout), counts


def prepared_sequences(corpus_path: str | Path, tokenizer, tokenizer_dir: str | Path,
                       cfg: "LanguageAdapterConfig", folder: str | Path, *,
                       progress: bool = False) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(training sequences, held-out sequences, {"train_lines", "heldout_lines"}) of the LA:
    the corpus tokenised once per training, not once per process and once per restart.

    The main process tokenises the corpus (:func:`read_split_corpus`, :func:`pack_sequences`)
    and writes the int32 sequences to ``folder`` (``train.npy``, ``heldout.npy`` and a manifest
    naming what they were made of, :func:`sequences_key`, and their shapes; atomically), while
    the others wait for it (in a gloo group of their own, blocked rather than spinning on a GPU,
    up to :data:`SEQUENCES_WAIT`); every process then maps them copy-on-write, so the processes
    of a data-parallel LA share them in the page cache rather than each holding its own, and a
    rerun after a kill or a time limit maps them again instead of tokenising. Sequences made of
    another tokenizer, corpus, ``seq_len`` or ``eval_sentences``, or files that do not match
    their manifest, are made anew. When the main process fails (bad input, a full disk) every
    process raises: the others with an error that points to the main process's."""
    import numpy as np

    folder = Path(folder)
    main, failed = distributed.is_main(), None
    # the others wait for the main process in a CPU (gloo) group of their own: blocked in a
    # socket, not spinning on a GPU synchronisation beside the main process's tokenizer threads,
    # and for up to SEQUENCES_WAIT rather than the process group's 60 minutes
    group = torch.distributed.new_group(backend="gloo", timeout=SEQUENCES_WAIT) if distributed.is_initialized() else None
    loaded = None
    if main:
        try:
            key = sequences_key(tokenizer_dir, corpus_path, cfg)
            loaded = _load_sequences(folder, key, cfg.seq_len)
            if loaded is None:
                train, heldout, counts = _tokenised(corpus_path, tokenizer, cfg, progress)
                with atomic_path(folder, directory=True) as tmp:
                    np.save(tmp / "train.npy", train.numpy())
                    np.save(tmp / "heldout.npy", heldout.numpy())
                    (tmp / SEQUENCES_MANIFEST).write_text(json.dumps(
                        {"key": key, "counts": counts, "corpus": str(corpus_path), "seq_len": cfg.seq_len,
                         "train_sequences": len(train), "heldout_sequences": len(heldout)}, indent=2) + "\n",
                        encoding="utf-8")
                del train, heldout  # the mapped file's pages stand for them from here on
            else:
                log.info("the corpus's sequences, tokenised by an earlier run, are read from %s", folder)
        except BaseException as error:  # the others are waiting: tell them, then raise
            failed = error
    status = torch.tensor([0 if failed is None else 1])  # whether the main process failed, told to all
    if group is not None:
        try:
            torch.distributed.broadcast(status, src=0, group=group)
        finally:
            torch.distributed.destroy_process_group(group)
    if failed is not None:
        raise failed
    if status.item():
        raise RuntimeError(f"process {distributed.rank()}: the main process could not prepare the sequences "
                           f"of {corpus_path} in {folder} (its error is in the log)")
    if loaded is None:  # just written, or another process
        loaded = _load_sequences(folder, key if main else sequences_key(tokenizer_dir, corpus_path, cfg), cfg.seq_len)
    if loaded is None:
        raise InputError(f"{folder}: process {distributed.rank()} cannot read the sequences the main process "
                         "wrote there")
    return loaded


def mask_tokens(input_ids: torch.Tensor, tokenizer, probability: float,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: choose ``probability`` of the non-special positions; of those 80% become
    the mask token, 10% a random token, 10% stay. Returns (inputs, labels with -100 elsewhere).
    Seeded by ``generator`` so a resumed run masks exactly as an uninterrupted one. Ids of a
    narrower integer type (the LA's int32 sequences) are widened to int64 first."""
    input_ids = input_ids.long()
    special = torch.zeros_like(input_ids, dtype=torch.bool)
    for token_id in set(tokenizer.all_special_ids):
        special |= input_ids == token_id
    chosen = (torch.rand(input_ids.shape, generator=generator) < probability) & ~special
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
    inputs = input_ids.clone()
    roll = torch.rand(input_ids.shape, generator=generator)
    inputs[chosen & (roll < 0.8)] = tokenizer.mask_token_id
    random_positions = chosen & (roll >= 0.8) & (roll < 0.9)
    random_tokens = torch.randint(len(tokenizer), input_ids.shape, generator=generator)
    inputs[random_positions] = random_tokens[random_positions]
    return inputs, labels


# ---- model ----------------------------------------------------------------------------------


def mlm_loss(model, input_ids: torch.Tensor, labels: torch.Tensor,
             reduction: str = "mean") -> torch.Tensor:
    """:class:`modsent.losses.MaskedLanguageModelingLoss` of ``model`` on one batch: masked
    positions only, averaged (or summed, ``reduction="sum"``)."""
    return MaskedLanguageModelingLoss(reduction)(model, input_ids, labels)


def share_of_mlm_loss(model, input_ids: torch.Tensor, labels: torch.Tensor, rank: int,
                      world: int, device) -> torch.Tensor:
    """One process's part of the MLM loss of a global batch split over ``world`` processes.

    The process takes its contiguous rows of the batch and sums the cross-entropy over their
    masked positions; dividing by the masked positions of the *whole* batch (known to every
    process: masks are drawn for the whole batch) and multiplying by ``world`` makes the mean
    over the processes, and the mean of their gradients (:func:`distributed.average_gradients`),
    equal the single-process ``mlm_loss`` of the whole batch and its gradient, however the
    masked positions fall between the processes."""
    rows = distributed.local_slice(len(input_ids), rank, world)
    masked = int((labels != -100).sum())
    loss = mlm_loss(model, to_device(input_ids[rows], device), labels[rows], reduction="sum")
    return loss * (world / max(masked, 1))


def load_focus_embeddings(model, embeddings_path: Path, vocab_size: int) -> None:
    """Resize ``model`` to the new vocabulary and load FOCUS (or trained) embeddings."""
    tensors = read_safetensors(embeddings_path)
    weights = tensors["input_embeddings"]
    if weights.shape[0] != vocab_size:
        raise InputError(f"{embeddings_path}: {weights.shape[0]} embedding rows but the tokenizer "
                         f"has {vocab_size} tokens: embeddings and tokenizer do not belong together")
    model.resize_token_embeddings(vocab_size, mean_resizing=False)
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(weights)
        output = model.get_output_embeddings()
        if "output_embeddings" in tensors and output is not None and output.weight is not model.get_input_embeddings().weight:
            output.weight.copy_(tensors["output_embeddings"])
        if "output_bias" in tensors and output is not None and getattr(output, "bias", None) is not None:
            output.bias.copy_(tensors["output_bias"])
        head_state = {k[len("mlm_head."):]: v for k, v in tensors.items() if k.startswith("mlm_head.")}
        if head_state:
            mlm_parts(model)[1].load_state_dict(head_state, strict=False)


def build_model(base_model_dir: str | Path, tokenizer, embeddings_path: str | Path,
                cfg: LanguageAdapterConfig):
    """The base model with the language's embeddings and a fresh LoRA adapter, ready to train."""
    import transformers
    from peft import LoraConfig, get_peft_model

    transformers.logging.set_verbosity_error()  # "newly initialised MLM head" is expected
    model = transformers.AutoModelForMaskedLM.from_pretrained(
        str(base_model_dir), attn_implementation="sdpa", dtype=torch.float32)
    transformers.logging.set_verbosity_warning()
    load_focus_embeddings(model, Path(embeddings_path), len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=list(cfg.target_modules), bias="none")
    model = get_peft_model(model, lora)
    # besides LoRA: the embeddings (tied to the decoder) and the MLM head
    model.get_input_embeddings().weight.requires_grad_(True)
    for param in mlm_parts(model)[1].parameters():
        param.requires_grad_(True)
    return model


def save_language_adapter(model, tokenizer, out_dir: Path) -> None:
    """tokenizer files + embeddings.safetensors + adapter/ (PEFT)."""
    from safetensors.torch import save_file

    tokenizer.save_pretrained(str(out_dir))
    record_added_tokens(out_dir)
    inner = model.get_base_model()
    tensors = {"input_embeddings": inner.get_input_embeddings().weight.detach().clone()}
    output = inner.get_output_embeddings()
    if output is not None and output.weight is not inner.get_input_embeddings().weight:
        tensors["output_embeddings"] = output.weight.detach().clone()
    head = mlm_parts(model)[1]
    for name, value in head.state_dict().items():
        if value.data_ptr() != inner.get_input_embeddings().weight.data_ptr():
            tensors[f"mlm_head.{name}"] = value.detach().clone()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / EMBEDDINGS_NAME))
    model.save_pretrained(str(out_dir / ADAPTER_DIR), save_embedding_layers=False)
    canonical_adapter_config(out_dir / ADAPTER_DIR)


def load_language_model(base_model_dir: str | Path, la_dir: str | Path, *, mlm: bool = True):
    """(model, tokenizer) of a trained LA: the base model, the language's embeddings and its
    LoRA adapter (PEFT, inference mode). ``mlm=False`` gives the encoder without the head."""
    import transformers
    from peft import PeftModel

    la_dir = Path(la_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(la_dir))
    transformers.logging.set_verbosity_error()
    model = transformers.AutoModelForMaskedLM.from_pretrained(
        str(base_model_dir), attn_implementation="sdpa", dtype=torch.float32)
    transformers.logging.set_verbosity_warning()
    load_focus_embeddings(model, la_dir / EMBEDDINGS_NAME, len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    check_model_files(la_dir / ADAPTER_DIR)  # a damaged file named, not peft's bare error
    model = PeftModel.from_pretrained(model, str(la_dir / ADAPTER_DIR), is_trainable=False)
    model.eval()
    if not mlm:
        model = mlm_parts(model)[0]
    return model, tokenizer


# ---- evaluation -------------------------------------------------------------------------------


@torch.no_grad()
def heldout_mlm_loss(model, sequences: torch.Tensor, tokenizer, *, batch_size: int,
                     probability: float = 0.15, seed: int = 1234, device="cpu",
                     precision: str = "auto") -> float:
    """Mean cross-entropy over masked tokens of held-out sequences, with fixed masks."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    total, count = 0.0, 0
    for start in range(0, len(sequences), batch_size):
        inputs, labels = mask_tokens(sequences[start:start + batch_size], tokenizer, probability, generator)
        n = int((labels != -100).sum())
        if n == 0:
            continue
        with autocast(device, precision):
            loss = mlm_loss(model, inputs.to(device), labels.to(device))
        total += float(loss) * n
        count += n
    model.train(was_training)
    return total / max(count, 1)


# ---- training ----------------------------------------------------------------------------------


def learning_rate(step: int, cfg: LanguageAdapterConfig) -> float:
    """Linear warm-up, then linear decay to zero at the last step."""
    return schedules.warmup_linear(step, cfg.steps, cfg.warmup_steps, cfg.learning_rate)


def batch_indices(step: int, n_sequences: int, batch_size: int, seed: int) -> torch.Tensor:
    """The sequences of training step ``step``: a pure function of the step, so a resumed run
    sees exactly the batches an uninterrupted one would (a new permutation every epoch)."""
    batch_size = min(batch_size, n_sequences)
    per_epoch = n_sequences // batch_size
    epoch, offset = divmod(step, per_epoch)
    order = torch.randperm(n_sequences, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return order[offset * batch_size:(offset + 1) * batch_size]


def warm_up_head(model, train: torch.Tensor, tokenizer, cfg: LanguageAdapterConfig, device) -> None:
    """``cfg.head_warmup_steps`` steps training the MLM head alone (its own optimizer), before
    the "before" loss is measured. Uses steps past the end of the LA's batch sequence."""
    if cfg.head_warmup_steps <= 0:
        return
    head = mlm_parts(model)[1]
    tied = model.get_input_embeddings().weight
    params = [p for p in head.parameters() if p.requires_grad and p is not tied]
    frozen = [p for p in model.parameters() if p.requires_grad and all(p is not q for q in params)]
    for p in frozen:
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, **step_options(params))
    scaler = grad_scaler(device, cfg.precision)
    model.train()
    for i in range(cfg.head_warmup_steps):
        step = cfg.steps + i  # batches the LA's own steps do not use in the same epoch order
        index = batch_indices(step, len(train), cfg.batch_size, cfg.seed)
        inputs, labels = mask_tokens(train[index], tokenizer, cfg.mlm_probability,
                                     step_generator(step, cfg.seed + 1))
        with autocast(device, cfg.precision):
            loss = mlm_loss(model, to_device(inputs, device), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    for p in frozen:
        p.requires_grad_(True)
    log.info("MLM head warmed up alone for %d steps (last loss %.3f)", cfg.head_warmup_steps, loss.item())


def read_corpus(path: str | Path) -> list[str]:
    """The corpus's non-empty lines, stripped, in a list."""
    lines = list(corpus_lines(path))
    if not lines:
        raise InputError(f"{path}: the corpus is empty")
    return lines


# models whose learned positions start after the padding index (RoBERTa's convention):
# max_position_embeddings - (pad_token_id + 1) of them are usable
_PADDING_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "mpnet", "data2vec-text",
                             "roberta-prelayernorm", "xmod", "longformer", "luke", "ibert")


def position_limit(base_model_dir: str | Path) -> int | None:
    """The most tokens a sequence of the base model can hold (its learned absolute positions),
    from its config.json; None when the config sets no limit (relative positions)."""
    path = Path(base_model_dir) / "config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    limit = config.get("max_position_embeddings")
    if not isinstance(limit, int) or config.get("position_embedding_type", "absolute") != "absolute" \
            or config.get("position_biased_input") is False:  # relative positions only (DeBERTa-v2/v3)
        return None
    if config.get("model_type") in _PADDING_OFFSET_POSITIONS:
        limit -= int(config.get("pad_token_id") or 0) + 1
    return limit


def train_language_adapter(base_model_dir: str | Path, tokenizer_dir: str | Path,
                           embeddings_dir: str | Path, corpus_path: str | Path,
                           out_dir: str | Path, cfg: LanguageAdapterConfig, *,
                           checkpoint_dir: str | Path | None = None,
                           tracking_dir: str | Path | None = None, device: str | None = None,
                           progress: bool = True, on_step=None) -> dict:
    """Train the LA of one language and write its directory (atomically); return the metrics.

    ``on_step(step)`` is called after every optimizer step and checkpoint (tests use it to
    kill the process midway).

    In a process group of several processes (torchrun, :func:`distributed.setup`; ``device``
    is then this process's GPU) the training is data-parallel: every process builds the whole
    step's batch and masks, as one process would, and computes the loss of its contiguous rows
    (:func:`share_of_mlm_loss`); the gradients of the trainable tensors are averaged over the
    processes after backward, so every process takes the same optimizer step and holds the same
    weights and AdamW moments. The results equal a single process's up to the order of float
    additions, dropout aside (each process draws its own masks, :func:`dropout_seed`). Only the
    main process evaluates, writes checkpoints, the output, the tracking and the progress bar;
    it returns the metrics, the others None. Checkpoints do not depend on the number of
    processes: a run resumes with any number."""
    import transformers
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else checkpoint_path(out_dir)
    device = default_device(device)
    rank, world = distributed.rank(), distributed.world_size()
    main = rank == 0
    torch.manual_seed(cfg.seed)
    if cfg.compile:  # before the corpus is tokenised: a missing compiler is an input error
        fastpath.check_compilable(device, "language_adapter.compile")
    # Triton's kernels: on a GPU without Triton, refused here (before the corpus is tokenised)
    kernels_run = cfg.kernels == "triton" and fastpath.check_kernels(device, "language_adapter.kernels")
    limit = position_limit(base_model_dir)
    if limit is not None and cfg.seq_len > limit:  # packed sequences are seq_len tokens long, every one
        raise InputError(f"language_adapter.seq_len {cfg.seq_len}: the base model {base_model_dir} has "
                         f"positions for {limit} tokens; set it to {limit} or less")

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    sequences_dir = sequences_path(out_dir)
    train, heldout, counts = prepared_sequences(corpus_path, tokenizer, tokenizer_dir, cfg, sequences_dir,
                                                progress=progress and main)
    n_train = counts["train_lines"]
    log.info("corpus %s: %d training lines → %d sequences of %d tokens; %d held-out lines",
             corpus_path, n_train, len(train), cfg.seq_len, counts["heldout_lines"])
    if world > 1:
        if min(cfg.batch_size, len(train)) < world:
            raise InputError(f"a batch of {min(cfg.batch_size, len(train))} sequences cannot be "
                             f"split over {world} processes: raise language_adapter.batch_size "
                             f"or lower language_adapter.gpus")
        log.info("data-parallel over %d processes: each takes its share of the %d sequences "
                 "of a step", world, min(cfg.batch_size, len(train)))

    model = build_model(base_model_dir, tokenizer, Path(embeddings_dir) / EMBEDDINGS_NAME, cfg).to(device)
    fastpath.speed_up(model)  # same parameters and results, fewer kernels under autocast
    if cfg.residual_stream == "bf16":
        fastpath.bf16_residual_stream(model)
        if resolve_precision(device, cfg.precision) != "bf16":
            log.info("language_adapter.residual_stream: bf16 changes nothing here: %s runs without bf16 autocast",
                     device)
    if kernels_run and cfg.compile:  # the loss is outside the compiled encoder
        fastpath.fuse_cross_entropy(mlm_parts(model)[1])
        log.info("language_adapter.kernels: triton with language_adapter.compile: true: the compiled encoder runs "
                 "the kernels Inductor makes for it; the MLM loss, outside it, runs as a Triton kernel")
    elif kernels_run:
        lora_layers, norms, heads = fastpath.use_triton_kernels(model, mlm_head=mlm_parts(model)[1])
        log.info("language_adapter.kernels: triton: %d LoRA layers' dropout, %d dropout + residual add + "
                 "LayerNorm steps and %d MLM loss run as Triton kernels", lora_layers, norms, heads)
    elif cfg.kernels == "triton":
        log.info("language_adapter.kernels: triton changes nothing here: the kernels run on CUDA GPUs, this job on %s",
                 device)
    if cfg.compile:  # the encoder body; the head runs on the masked positions, a varying count
        fastpath.compile_in_place(mlm_parts(model)[0], device, "language_adapter.compile")
        log.info("the encoder is compiled (torch.compile) at its first forward of each shape and mode")
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in {id(p): p for p in trainable}.values())
    n_total = sum(p.numel() for p in model.parameters())
    log.info("trainable parameters: %d of %d (%.2f%%)", n_trainable, n_total, 100 * n_trainable / n_total)

    body = efficiency.start(mlm_parts(model)[0], device)  # for the model FLOPs of metrics.json
    optimizer = adamw([p for p in model.parameters() if p.requires_grad], cfg.learning_rate, cfg.weight_decay)
    eval_batch = max(1, min(cfg.batch_size, 64))

    fingerprint = cfg.fingerprint(Path(tokenizer_dir) / "tokenizer.json",
                                  Path(embeddings_dir) / EMBEDDINGS_NAME, corpus_path)
    step, history = 0, []
    scaler = grad_scaler(device, cfg.precision)  # fp16: the loss scaler; else a pass-through
    resumed = load_checkpoint(checkpoint_dir, model, optimizer, fingerprint, scaler)
    if resumed is not None:
        step, history = resumed
        loss_before = history.pop(0)[1] if history and history[0][0] == "before" else None
        log.info("resuming from checkpoint %s at step %d", checkpoint_dir, step)
    else:
        # Base sentence encoders ship without an MLM head: a new head would make the "before"
        # loss meaningless (worse than uniform guessing). Fit the head alone first, everything
        # else frozen; the held-out loss after that is the base model's with FOCUS embeddings.
        # (with several processes every one warms the head up alike: same seed, same batches)
        warm_up_head(model, train, tokenizer, cfg, device)
        loss_before = heldout_mlm_loss(model, heldout, tokenizer, batch_size=eval_batch,
                                       probability=cfg.mlm_probability, device=device,
                                       precision=cfg.precision) if len(heldout) and main else None
    # every process starts from the main process's weights, as DistributedDataParallel does
    distributed.broadcast_from_main(trainable)

    tracker = Tracker(cfg.tracking if main else "none",
                      Path(tracking_dir or out_dir.with_name(out_dir.name + ".tracking")),
                      f"LA {out_dir.name}", dataclasses.asdict(cfg),
                      project=(tracking.job_settings() or {}).get("project", "modsent"))
    model.train()
    scale_watch = LossScaleWatch(scaler if main else None, f"LA {out_dir.name}", step)  # fp16's skipped steps
    tokens_seen, masked_seen, start_time = 0, 0, time.perf_counter()
    bar = tqdm(total=cfg.steps, initial=step, desc=f"LA {out_dir.name}",
               disable=not (progress and main), unit="step")
    while step < cfg.steps:
        index = batch_indices(step, len(train), cfg.batch_size, cfg.seed)
        inputs, labels = mask_tokens(train[index], tokenizer, cfg.mlm_probability,
                                     step_generator(step, cfg.seed))
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, cfg)
        if world == 1:
            with autocast(device, cfg.precision):
                # labels stay on the CPU: the loss finds the masked positions there (no GPU wait)
                loss = mlm_loss(model, to_device(inputs, device), labels)
            scaler.scale(loss).backward()
        else:
            torch.manual_seed(dropout_seed(step, cfg.seed, rank))
            with autocast(device, cfg.precision):
                loss = share_of_mlm_loss(model, inputs, labels, rank, world, device)
            scaler.scale(loss).backward()
            distributed.average_gradients(trainable)
        optimizer_step(optimizer, trainable, 1.0, scaler)
        step += 1
        tokens_seen += inputs.numel()
        masked_seen += int((labels != -100).sum())  # the head's positions (labels on the host)
        if step % cfg.log_every == 0 or step == cfg.steps:
            value = distributed.all_reduce_mean(loss.detach().clone()).item()  # the whole batch's
            scale_watch.check(step)
            history.append([step, value, optimizer.param_groups[0]["lr"]])
            bar.set_postfix(loss=f"{value:.3f}")
            if main:
                report_step(f"LA {out_dir.name}", step, cfg.steps, value, optimizer.param_groups[0]["lr"], tracker)
        bar.update(1)
        if step % cfg.checkpoint_every == 0 and step < cfg.steps and main:
            save_checkpoint(checkpoint_dir, model, optimizer, step, fingerprint,
                            [["before", loss_before, 0.0]] + history, scaler)
        if on_step is not None:
            on_step(step)
    bar.close()
    scale_watch.close()
    elapsed = time.perf_counter() - start_time
    # every sequence of a step as long as the step's (packed); the whole batch's, over the processes
    figures = efficiency.run_figures(
        efficiency.encoder_flops(body, tokens_seen, tokens_seen * train.shape[1])
        + efficiency.mlm_head_flops(mlm_parts(model)[1], masked_seen), elapsed, device, processes=world)
    if not main:
        del train, heldout  # unmapped before the main process removes their files (an NFS keeps mapped ones)
        distributed.barrier()  # while the main process evaluates and writes the output
        return None

    loss_after = heldout_mlm_loss(model, heldout, tokenizer, batch_size=eval_batch,
                                  probability=cfg.mlm_probability, device=device,
                                  precision=cfg.precision) if len(heldout) else None
    tracker.log(step, {"heldout/mlm_loss_before": loss_before or math.nan,
                       "heldout/mlm_loss_after": loss_after or math.nan})
    tracker.close()
    metrics = {
        "heldout_mlm_loss_before": loss_before, "heldout_mlm_loss_after": loss_after,
        "uniform_guess_loss": math.log(len(tokenizer)), "head_warmup_steps": cfg.head_warmup_steps,
        "heldout_lines": counts["heldout_lines"], "train_lines": n_train,
        "train_sequences": len(train), "steps": cfg.steps, "resumed_from_step": resumed[0] if resumed else 0,
        "tokens_per_second": tokens_seen / elapsed if elapsed > 0 else None,
        # packed: only the last sequence can hold padding (a corpus shorter than one sequence)
        "padding_fraction": int((train[-1] == tokenizer.pad_token_id).sum()) / train.numel()
        if len(train) and tokenizer.pad_token_id is not None else 0.0,
        **figures,  # model FLOPs (the head's on the masked positions), their rate, MFU, peak memory
        "trainable_parameters": n_trainable, "total_parameters": n_total,
        "device": str(device), "config": dataclasses.asdict(cfg),
    }
    with atomic_path(out_dir, directory=True) as tmp:
        save_language_adapter(model, tokenizer, tmp)
        (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        write_loss_curve(history, tmp, title=f"language adapter {out_dir.name}", ylabel="MLM loss",
                         lines={"held-out before": loss_before, "held-out after": loss_after})
    log.info("LA %s: held-out MLM loss %s → %s; %.0f tokens/s, %s", out_dir.name,
             _fmt(loss_before), _fmt(loss_after), metrics["tokens_per_second"] or 0, efficiency.describe(figures))
    del train, heldout  # unmapped before their files are removed
    distributed.barrier()  # every process got here: only now is the checkpoint not needed by a rerun
    shutil.rmtree(checkpoint_dir, ignore_errors=True)
    shutil.rmtree(sequences_dir, ignore_errors=True)
    return metrics


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


MFU_NOTE = ("MFU: the run's model FLOPs per second against its GPU's dense bf16 peak "
            "(modsent.training.efficiency; n/a on the CPU or a GPU of unknown peak).")


def _percent(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def write_summary(la_dirs: list[str], table_path: str | Path, plot_path: str | Path) -> None:
    """Held-out MLM loss before/after LA per language (Markdown table and a bar plot)."""
    from modsent.io import atomic_open

    rows = []
    for directory in la_dirs:
        metrics = json.loads((Path(directory) / "metrics.json").read_text(encoding="utf-8"))
        rows.append((Path(directory).name, metrics))
    lines = ["# Language adapters: held-out MLM loss", "",
             "The MLM head is new (sentence encoders ship without one): it is first trained alone, then",
             "\"before\" is measured; \"uniform\" is ln(vocabulary size), the loss of a uniform guess.",
             MFU_NOTE, "",
             "| language | uniform | before | after | change | steps | tokens/s | MFU % | trainable params |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for lang, m in rows:
        before, after = m["heldout_mlm_loss_before"], m["heldout_mlm_loss_after"]
        change = f"{after - before:+.3f}" if before is not None and after is not None else "n/a"
        lines.append(f"| {lang} | {_fmt(m.get('uniform_guess_loss'))} | {_fmt(before)} | {_fmt(after)} | {change} | {m['steps']} | "
                     f"{m['tokens_per_second'] or 0:.0f} | {_percent(m.get('mfu'))} | {m['trainable_parameters']:,} |")
    with atomic_open(table_path) as handle:
        handle.write("\n".join(lines) + "\n")
    write_before_after_bars([lang for lang, _ in rows], [m["heldout_mlm_loss_before"] for _, m in rows],
                            [m["heldout_mlm_loss_after"] for _, m in rows], plot_path, stage="LA",
                            ylabel="held-out MLM loss", better="lower", digits=2)


# ---- command line: one LA per process group (the workflow's form for several GPUs) -----------


def cli_arguments(base_model_dir, tokenizer_dir, embeddings_dir, corpus_path, out_dir,
                  cfg: LanguageAdapterConfig, *, tracking_dir=None, log_path=None,
                  threads: int | None = None, progress: bool = True) -> list[str]:
    """The arguments of ``python -m modsent.modular.language_adapter`` that train like
    ``train_language_adapter`` with these inputs (:func:`main` reads them back)."""
    args = ["--base", base_model_dir, "--tokenizer", tokenizer_dir, "--embeddings", embeddings_dir,
            "--corpus", corpus_path, "--out", out_dir,
            "--config", json.dumps(dataclasses.asdict(cfg), sort_keys=True)]
    if tracking_dir is not None:
        args += ["--tracking-dir", tracking_dir]
    if log_path is not None:
        args += ["--log-file", log_path]
    if threads is not None:
        args += ["--threads", threads]
    if not progress:
        args.append("--no-progress")
    return [str(a) for a in args]


def main(argv: list[str] | None = None) -> int:
    """``python -m modsent.modular.language_adapter --base ... --out ... --config JSON``: train one LA.

    Run directly, one process; under torchrun (``modsent.distributed.launch_command``), one
    process per GPU of the node, data-parallel (see :func:`train_language_adapter`)."""
    parser = argparse.ArgumentParser(prog="python -m modsent.modular.language_adapter",
                                     description="Train the language adapter of one language.")
    for name in ("--base", "--tokenizer", "--embeddings", "--corpus", "--out"):
        parser.add_argument(name, required=True)
    parser.add_argument("--config", required=True,
                        help="LanguageAdapterConfig as JSON (its field names, e.g. from cli_arguments)")
    parser.add_argument("--tracking-dir")
    distributed.add_process_arguments(parser)
    args = parser.parse_args(argv)

    fields = json.loads(args.config)
    cfg = LanguageAdapterConfig(**{**fields, "target_modules": tuple(fields["target_modules"])})
    with distributed.trainer_process(args) as device:
        train_language_adapter(args.base, args.tokenizer, args.embeddings, args.corpus, args.out,
                               cfg, tracking_dir=args.tracking_dir, device=str(device),
                               progress=not args.no_progress)
    return 0


if __name__ == "__main__":
    # run the imported module's main, so that log records and classes carry its real name
    from modsent.modular.language_adapter import main as _main

    sys.exit(_main())

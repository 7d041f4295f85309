"""The parts of a training step that every stage shares. Each stage writes its own loop with
them, top to bottom (set the rate, seed the step's dropout, the loss under autocast, backward,
clip and step, record, checkpoint), so a reader sees the whole step in one place and no stage
hands its step to a framework of callbacks. Precision and fp16's loss scaler:
modsent.training.precision.

    scaler = grad_scaler(device, cfg.precision)
    resumed = resume(checkpoint_dir, model, optimizer, fingerprint, scaler)
    log = TrainingLog(total_steps, start, "SE de", progress, cfg.log_every, resumed, scaler)
    model.train()
    for step, (batch, features) in enumerate(ahead(batches, prepare), start=start):
        lr = set_learning_rate(optimizer, learning_rate(step))
        torch.manual_seed(dropout_seed(step, cfg.seed))
        with autocast(device, cfg.precision):
            loss = batch_loss(batch, features)  # features: tokenised by ahead's thread
        scaler.scale(loss).backward()
        optimizer_step(optimizer, trainable, cfg.max_grad_norm, scaler)
        log.record(step, loss, lr, len(batch), features)  # a tensor: read back at logged steps only
        if checkpoint_due(step + 1, cfg.checkpoint_every, total_steps, checkpoint_dir):
            save_checkpoint(checkpoint_dir, model, optimizer, step + 1, fingerprint, log.state(...), scaler)
    losses, history, pairs_seen, seconds = log.close()
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from collections.abc import Mapping
from typing import Callable, Iterable, Iterator, TypeVar

import torch

from modsent.training.fastpath import attention_for_varying_shapes

T = TypeVar("T")
R = TypeVar("R")

log = logging.getLogger(__name__)


def pinned(value, device):
    """``value`` in pinned memory when it is a CPU tensor bound for a GPU ``device`` (what a batch
    prepared ahead on a thread holds, so that :func:`to_device` sends it without blocking and
    without pinning it again); anything else as it is."""
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and torch.device(device).type == "cuda":
        return value.pin_memory()
    return value


def to_device(tensor: torch.Tensor, device) -> torch.Tensor:
    """``tensor`` on ``device``. From the CPU to a GPU the copy goes through pinned memory and
    does not block the host, which can go on queueing work while the GPU finishes the previous
    step (a plain ``.to(device)`` from pageable memory waits for the GPU). A tensor that is
    pinned already is sent itself: do not change it in place before the GPU has read it."""
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


# On the CPU a step's forward pass runs in sub-passes of this many sentences of similar length
# (split_by_length): the demo's German SE batches (16 pairs, multilingual-e5-small with its LA,
# one thread) were 58% padding in one pass and 26% in chunks of 16, and a step ran 1.4-1.8x as
# fast (chunks of 8 or 12: no faster; benchmarks/results/pair_throughput_chunks_cpu.txt). A GPU
# keeps one pass: at the paper's batch its step is bound by kernel launches, not by padded
# FLOPs (benchmarks/results/pair_throughput*_h200.txt).
CPU_CHUNK_SENTENCES = 16


class LengthChunks(tuple):
    """One forward pass's tokenised texts as sub-batches of sentences of similar length, each
    padded only to its own longest (a tuple of feature mappings). ``order[i]`` is the row, in
    the whole batch, of the i-th row of the chunks taken in turn; :meth:`restore` puts the
    chunks' outputs back in the batch's order."""

    order: torch.Tensor

    def restore(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        """The chunks' outputs (one tensor per chunk, a row per sentence) in the batch's order."""
        stacked = torch.cat(outputs)
        return stacked[torch.argsort(self.order).to(stacked.device)]  # a permutation's inverse


def split_by_length(features: Mapping[str, torch.Tensor], size: int = CPU_CHUNK_SENTENCES):
    """``features`` (tokenised texts on the host: ``attention_mask`` and the other per-token
    tensors, [sentences, width], padded on the right) cut into :class:`LengthChunks` of at most
    ``size`` sentences sorted by length, each cut to its own longest sentence; ``features``
    themselves when they make one chunk, have no mask or are padded on the left (cutting
    leading columns would move the tokens' absolute positions). Each sentence's embedding is
    the one a single pass gives (the attention masks keep padding out), so a loss over the
    batch is unchanged but for float rounding and dropout's draws."""
    mask = features.get("attention_mask")
    if mask is None or not len(mask) or not bool(mask[:, 0].all()):
        return features
    chunks = math.ceil(len(mask) / size)
    if chunks < 2:
        return features
    lengths = mask.sum(dim=1)
    order = torch.sort(lengths, stable=True).indices
    parts = []
    for rows in torch.tensor_split(order, chunks):
        width = int(lengths[rows].max())
        parts.append({key: value[rows][:, :width] if value.dim() == 2 and value.shape == mask.shape
                      else value[rows] for key, value in features.items()})
    out = LengthChunks(parts)
    out.order = order
    return out


def ahead(items: Iterable[T], prepare: Callable[[T], R], *, enabled: bool = True) -> Iterator[tuple[T, R]]:
    """``(item, prepare(item))`` for every item, in order, with ``prepare`` of the next item
    running on a worker thread while the caller works on this one: a pair stage tokenises (and
    pins) batch ``i + 1`` while the GPU and the main thread run step ``i``. The Rust tokenizers
    and the copy to pinned memory release the GIL, so on a GPU the host's share of a step
    shrinks by the tokenising; the results are those of calling ``prepare`` in the loop
    (``enabled=False`` does exactly that). An error in ``prepare`` is raised at its item.
    ``prepare`` must not share mutable state with the caller's step: a tokenizer used here is
    used by nobody else until the loop is over (a fast tokenizer called from two threads at
    once fails with "Already borrowed"). Closing the iterator early waits for the item in flight."""
    if not enabled:
        for item in items:
            yield item, prepare(item)
        return
    iterator = iter(items)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="modsent-ahead")
    try:
        pending = None
        for item in iterator:
            if pending is None:
                pending = (item, pool.submit(prepare, item))
                continue
            current, future = pending
            pending = (item, pool.submit(prepare, item))  # queued behind the one in flight
            yield current, future.result()
        if pending is not None:
            yield pending[0], pending[1].result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class HostCopies:
    """The results of a loop over batches (an encoding pass), brought from the device to the host
    without stopping the loop. ``.cpu()`` on each batch's result makes the host wait for the GPU
    to finish that batch before it can launch the next one's kernels, so the GPU idles while the
    host launches; :meth:`add` instead queues the copy into pinned memory behind the kernels
    that compute the result and returns at once. The host waits only for the copy of the batch
    ``lag`` batches back (so pinned memory holds at most ``lag + 1`` batches), and
    :meth:`numpy` for the rest. On other devices it is a plain ``.cpu()``. Values and order are those of
    ``np.concatenate([t.cpu().numpy() for t in results])``."""

    def __init__(self, lag: int = 2):
        import collections

        self.lag = lag
        self._pending = collections.deque()  # (event, pinned host tensor), oldest first
        self._done = []

    def add(self, tensor: torch.Tensor) -> None:
        """Queue ``tensor``'s copy to the host (its values as they are once the kernels queued
        so far have run)."""
        tensor = tensor.detach()
        if tensor.device.type != "cuda":
            self._done.append(tensor.cpu().numpy())
            return
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(tensor.device))
        self._pending.append((event, host))
        while len(self._pending) > self.lag:
            self._finish_oldest()

    def _finish_oldest(self) -> None:
        event, host = self._pending.popleft()
        event.synchronize()
        self._done.append(host.numpy().copy())  # pageable: the pinned block goes back to be reused

    def numpy(self):
        """Every added tensor's rows, in order, concatenated (None when nothing was added)."""
        import numpy as np

        while self._pending:
            self._finish_oldest()
        return np.concatenate(self._done) if self._done else None


def encoding_order(sentences: list[str], count: Callable | None = None, *, chunk: int = 1024):
    """The order in which :func:`encode_in_batches` encodes ``sentences``: longest first, by
    ``count(texts) -> each text's token count`` (called on up to ``chunk`` texts at a time) when
    given, else by characters; ties by characters, then in the given order. A model pads to
    tokens, not characters: a new tokenizer's pieces, Chinese characters and short ASCII words
    make characters a poor stand-in. The demo's 767 German evaluation sentences in batches of
    64, sorted by characters, were 49% padding with German's tokenizer, 33% sorted by tokens
    (benchmarks/encode_order.py)."""
    import numpy as np

    chars = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
    if count is None or not sentences:
        return np.argsort(-chars, kind="stable")
    tokens = np.concatenate([np.asarray(count(sentences[i:i + chunk]), dtype=np.int64).reshape(-1)
                             for i in range(0, len(sentences), chunk)])
    if len(tokens) != len(sentences):
        raise ValueError(f"count gave {len(tokens)} token counts for {len(sentences)} sentences")
    return np.lexsort((-chars, -tokens))  # the last key first; stable: ties keep the given order


def token_counts(features: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Each text's token count in a tokenised batch (``attention_mask``'s row sums; without a
    mask, every text counts as the padded width): what :func:`encoding_order` sorts by."""
    mask = features.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        return mask.sum(dim=1)
    ids = features["input_ids"]
    return torch.full((ids.shape[0],), ids.shape[-1])


@attention_for_varying_shapes()
def encode_in_batches(sentences: list[str], batch_size: int, prepare: Callable, forward: Callable, *,
                      normalize: bool = True, count: Callable | None = None):
    """An encoding pass: ``sentences`` in batches of ``batch_size``, longest first (less
    padding: :func:`encoding_order`, by ``count``'s token counts when given), each batch's
    texts prepared by ``prepare(texts)`` one
    batch ahead on a thread (:func:`ahead`), encoded by ``forward(prepared) -> [n, dim]``, as
    float32, L2-normalised unless ``normalize=False``, and copied back without waiting
    (:class:`HostCopies`): float32 numpy rows in the caller's order, None for no sentences.
    The caller sets inference mode and precision around it."""
    import numpy as np

    order = encoding_order(sentences, count)
    copies = HostCopies()
    for _, prepared in ahead(range(0, len(sentences), batch_size),
                             lambda start: prepare([sentences[i] for i in order[start:start + batch_size]])):
        vectors = forward(prepared).float()
        if normalize:
            vectors = torch.nn.functional.normalize(vectors, dim=-1)
        copies.add(vectors)
    stacked = copies.numpy()
    if stacked is None:
        return None
    out = np.empty_like(stacked)
    out[order] = stacked  # back to the caller's order
    return out


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> float:
    """Every parameter group's rate for the coming step; returns it."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def optimizer_step(optimizer: torch.optim.Optimizer, trainable, max_grad_norm: float,
                   scaler: torch.amp.GradScaler | None = None) -> None:
    """Clip the gradients of ``trainable`` to ``max_grad_norm`` (global L2), step, clear them.
    With fp16's ``scaler`` (modsent.training.precision.grad_scaler) the gradients are unscaled
    before clipping, and a step whose gradients overflowed is skipped and the scale lowered; a
    disabled scaler changes nothing."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(trainable, max_grad_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def checkpoint_due(step: int, every: int, total_steps: int, checkpoint_dir) -> bool:
    """Whether a checkpoint is written after ``step`` steps: every ``every`` steps, not after
    the last (the output follows), only by the main process of a process group, and only when
    there is a ``checkpoint_dir``."""
    from modsent import distributed

    return (checkpoint_dir is not None and distributed.is_main()
            and step % every == 0 and step < total_steps)


def report_step(desc: str, step: int, total_steps: int, loss: float, lr: float, tracker=None) -> None:
    """A logged step, in the main process: a line of the log (the rule's log) and, when the
    job reports somewhere (modsent.training.tracking), the tracker's loss and rate."""
    log.info("%s: step %d/%d, loss %.4f, lr %.3g", desc, step, total_steps, loss, lr)
    if tracker is not None:
        tracker.log(step, {"train/loss": loss, "train/lr": lr})


class LossScaleWatch:
    """Steps that fp16's loss scaler skipped, read from its scale at the logged steps (reading the
    scale waits for the GPU, as reading the loss there does anyway). A scale that fell by
    ``2**k`` since the last logged step means at least ``k`` of those steps overflowed and were
    skipped (the scale halves at each overflow and grows only every 2,000 good steps). When a
    window of 50 steps or more (up to about 100, from one logged step to another) had at least
    :attr:`SKIPPED_WARNING` skipped steps, and half of its steps or more, the log warns, once a
    window: fp16 is then mostly not training (``precision: bf16`` or ``fp32``); also when the
    scale has fallen to 0. The few overflows of a run's first steps, while the scale comes down
    from 65,536 to what the gradients allow, stay below that. Without a scaler, or with a
    disabled one (bf16, fp32), it does nothing."""

    SKIPPED_WARNING = 8

    def __init__(self, scaler: torch.amp.GradScaler | None, desc: str, start_step: int):
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self.desc = desc
        self._scale = self.scaler.get_scale() if self.scaler is not None else None
        self._step = start_step
        self.skipped_steps = 0  # steps known to have overflowed in this run (a lower bound)
        self._window = [0, 0, False]  # steps, skipped steps, warned, of the current window
        self._zero_warned = False

    def check(self, step: int) -> None:
        """``step`` steps are done (a logged step): count and judge the skipped ones since the last."""
        if self.scaler is None:
            return
        scale = self.scaler.get_scale()
        steps = step - self._step
        if scale <= 0:  # halved until float32 gives 0: every step overflows, and will
            skipped = steps
            if not self._zero_warned:
                log.warning("%s: fp16's loss scale reached 0: every step overflows and none trains; "
                            "precision bf16 or fp32 avoids it", self.desc)
                self._zero_warned = True
        else:
            skipped = min(steps, round(math.log2(self._scale / scale))) if scale < self._scale else 0
        self.skipped_steps += skipped
        if self._window[0] >= 100:  # a new window
            self._window = [0, 0, False]
        self._window[0] += steps
        self._window[1] += skipped
        steps, skipped, warned = self._window
        if not warned and steps >= 50 and skipped >= self.SKIPPED_WARNING and 2 * skipped >= steps:
            log.warning("%s: at least %d of the last %d steps overflowed in fp16 and were skipped "
                        "(loss scale now %g); precision bf16 or fp32 avoids it", self.desc, skipped, steps, scale)
            self._window[2] = True
        self._scale, self._step = scale, step

    def close(self) -> None:
        """The run is over: its skipped steps, if any, in the log."""
        if self.skipped_steps:
            log.info("%s: at least %d steps overflowed in fp16 and were skipped", self.desc, self.skipped_steps)


class TrainingLog:
    """The losses of every step, the logged history (``[step, loss, lr]`` every ``log_every``
    steps, the first and the last), pairs seen and seconds of this run, and a progress bar.
    ``resumed``: the checkpoint's extra state (its ``losses`` and ``history`` continue). Each
    logged step also goes to the log (the rule's log) and, in the main process, to the job's
    tracker (config ``tracking.report_to``: modsent.training.tracking).

    A step's loss may be given as the loss tensor itself: it is then read back with the others
    at the next logged step, checkpoint or close (one wait for the GPU per ``log_every`` steps,
    not one per step, so the host can queue the next step while the GPU finishes this one).
    ``losses`` is complete after :meth:`state` and :meth:`close`.

    ``scaler``: fp16's loss scaler, watched at the logged steps (:class:`LossScaleWatch`).

    The step's tokenised inputs, given to :meth:`record` (or :meth:`count_padding`), are counted
    for :attr:`padding_fraction`: the share of the encoded positions that were padding, this
    run's steps (this process's share of each batch under data parallelism), and for
    :meth:`efficiency`: the real tokens and their sequences' lengths. The masks are the host's
    copies, so counting never waits for the GPU."""

    def __init__(self, total_steps: int, start_step: int, desc: str, progress: bool, log_every: int,
                 resumed: dict | None = None, scaler: torch.amp.GradScaler | None = None):
        from tqdm.auto import tqdm

        from modsent import distributed
        from modsent.training import tracking

        self.main = distributed.is_main()
        self.tracker = tracking.job_tracker(desc) if self.main else None
        self.desc = desc
        self.total_steps, self.log_every = total_steps, log_every
        self.losses: list[float] = list(resumed["losses"]) if resumed else []
        self.history: list[list[float]] = [list(row) for row in resumed["history"]] if resumed else []
        self.pairs_seen, self.start_time = 0, time.perf_counter()
        # encoded positions of this run's steps, the real tokens among them, and the sum of each
        # sequence's real length squared (modsent.training.efficiency)
        self.positions, self.tokens, self.token_squares = 0, 0, 0
        self.bar = tqdm(total=total_steps, initial=start_step, desc=desc, disable=not progress, unit="step")
        self._pending: list[tuple[int, torch.Tensor]] = []  # (index in losses, loss not yet read)
        self.scale_watch = LossScaleWatch(scaler if self.main else None, desc, start_step)

    def _read_losses(self) -> None:
        """Every loss given as a tensor into ``losses``, with one read-back for all of them."""
        if self._pending:
            values = torch.stack([value for _, value in self._pending]).tolist()
            for (index, _), value in zip(self._pending, values):
                self.losses[index] = value
            self._pending.clear()

    def count_padding(self, *inputs) -> None:
        """Count the positions and padding of tokenised inputs: each argument an attention mask
        on the host (1: a token, 0: padding), or features (a mapping holding one under
        ``attention_mask``, or lists and tuples of such). Only an argument itself is taken as a
        bare mask: tensors inside features, lists and tuples (the CLA's English vectors beside
        its features, labels) are passed over."""
        for item in inputs:
            for mask in [item] if isinstance(item, torch.Tensor) else _feature_masks(item):
                if mask.device.type != "cpu":  # counting it would make the host wait for the GPU
                    raise ValueError(f"padding is counted on the host's masks, got one on {mask.device}")
                lengths = (mask != 0).reshape(-1, mask.shape[-1] if mask.dim() else 1).sum(dim=1)
                self.positions += mask.numel()
                self.tokens += int(lengths.sum())
                self.token_squares += int(lengths.square().sum())

    @property
    def padded(self) -> int:
        """Padding among the counted positions."""
        return self.positions - self.tokens

    @property
    def padding_fraction(self) -> float | None:
        """Padding among the counted positions (None: nothing counted)."""
        return self.padded / self.positions if self.positions else None

    def efficiency(self, shape: tuple[int, int, int], seconds: float, device, processes: int = 1) -> dict:
        """:mod:`modsent.training.efficiency`'s figures of the counted tokens, encoded by a
        transformer of ``shape`` (:func:`~modsent.training.efficiency.start`) in ``seconds``: this
        process's share, or with ``processes`` > 1 (a data-parallel stage, in every process) the
        whole batches', the counts summed over the processes first."""
        from modsent.training import efficiency

        tokens, squares = self.totals(device, processes)
        return efficiency.run_figures(efficiency.encoder_flops(shape, tokens, squares), seconds, device, processes)

    def totals(self, device, processes: int = 1) -> tuple[int, int]:
        """(real tokens, their sequences' squared lengths) counted in this run: this process's,
        or with ``processes`` > 1 (a data-parallel stage, in every process) the sums over the
        processes."""
        from modsent import distributed

        counts = (self.tokens, self.token_squares)
        if processes > 1:
            summed = torch.tensor(counts, dtype=torch.float64, device=device)  # exact below 2^53
            distributed.all_reduce_mean(summed)
            counts = tuple(round(value * processes) for value in summed.tolist())
        return counts

    def record(self, step: int, loss: float | torch.Tensor, lr: float, pairs: int, inputs=None) -> None:
        """Step ``step`` (0-based) is done: its loss (a number, or the loss tensor to be read
        later), rate, number of pairs and, for :attr:`padding_fraction`, its tokenised inputs
        (:meth:`count_padding`)."""
        self.pairs_seen += pairs
        if inputs is not None:
            self.count_padding(inputs)
        if isinstance(loss, torch.Tensor):
            self._pending.append((len(self.losses), loss.detach().double().reshape(())))  # .item()'s value
            self.losses.append(math.nan)
        else:
            self.losses.append(float(loss))
        if (step + 1) % self.log_every == 0 or step == 0 or step + 1 == self.total_steps:
            self._read_losses()
            loss = self.losses[-1]
            self.scale_watch.check(step + 1)
            self.history.append([step + 1, loss, lr])
            self.bar.set_postfix(loss=f"{loss:.3f}")
            if self.main:
                report_step(self.desc, step + 1, self.total_steps, loss, lr, self.tracker)
        self.bar.update(1)

    def state(self, **extra) -> dict:
        """What a checkpoint keeps of the log (and ``extra``), as JSON."""
        self._read_losses()
        return {"losses": self.losses, "history": self.history, **extra}

    def close(self) -> tuple[list[float], list[list[float]], int, float]:
        """(losses, history, pairs seen, seconds); the last two count this run's steps only."""
        self._read_losses()
        self.bar.close()
        if self.tracker is not None:
            self.tracker.close()
        self.scale_watch.close()
        if self.positions:
            log.info("%s: %.1f%% of the %d encoded positions were padding", self.desc,
                     100 * self.padding_fraction, self.positions)
        return self.losses, self.history, self.pairs_seen, time.perf_counter() - self.start_time


def _feature_masks(value) -> Iterator[torch.Tensor]:
    """The attention masks of features (:meth:`TrainingLog.count_padding`): a mapping's
    ``attention_mask``, through lists and tuples; any other tensor is passed over."""
    if isinstance(value, Mapping):
        mask = value.get("attention_mask")
        if isinstance(mask, torch.Tensor):
            yield mask
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _feature_masks(item)

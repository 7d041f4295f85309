"""The host's share of an SE step, measured side by side: tokenising through the tokenizer's call
or modsent.tokenizing's lean reading, in the step or ahead on a thread, reading the loss back
every step or at the logged steps only, and the padding mask checked by transformers on the
device or decided on the host.

    python benchmarks/pair_pipeline.py                                     # small random BERT, CPU
    python benchmarks/pair_pipeline.py --size tiny --batch-size 64 --steps 30   # the host's share large
    python benchmarks/pair_pipeline.py --labse-random --device cuda --batch-size 128 --steps 60

The SE stage's own step (modsent.modular.sentence_adapter): a random BERT with a WordPiece
vocabulary learnt from real sentences (modsent.testing.make_tiny_bert; LaBSE's 12 x 768 with
--labse-random), its SE LoRA on every linear layer, sentences of modsent.testing.sample_texts
(English prose of 5-40 words) paired at random, tokenised by the model's tokenizer, MNRL, the
shared step (precision ``auto``: bf16 or fp16 on a GPU, fp32 on the CPU; fused AdamW on a GPU).
pair_throughput.py times the GPU's share of the same step with ids made up on the device; this
one times whole runs of ``--steps`` steps (one wait for the device at the end), so what the
host does between the device's kernels counts. Variants:

- ``call, in step, read each``: the batch tokenised by the tokenizer's own call in the step, and
  ``loss.item()`` after every step (the step before modsent.tokenizing and this benchmark);
- ``lean, in step, read each``: tokenised by modsent.tokenizing (the same tensors);
- ``lean, in step, read logged``: the loss read back with the others at the logged steps
  (modsent.training.loop.TrainingLog, ``--log-every``);
- ``lean, ahead, read logged``: also tokenised one step ahead on a thread
  (modsent.training.loop.ahead);
- ``lean, ahead, logged, host mask``: also the padding mask decided from the host's copy
  (modsent.tokenizing.encoder_attention_mask), where the others let transformers ask the device
  whether the batch has padding (one wait per forward): modsent's step.

Each variant runs ``--repeats`` times, in turn with the others (this machine's load changes);
the median run is printed, with the ratio against the first variant, and the time the host
takes to tokenise one batch on its own. Pairs carry no hard negatives here (the stage tokenises
them with the rest: ~18% more sentences per step in the paper's data). Last, encoding
(``SentenceEncoderModel.encode``, the SE model with its LoRA unmerged, as the stages' held-out
retrieval encodes; the evaluation's ModularEncoder merges the LoRA into the weights, the same
host work on less GPU work) of ``--encode-sentences`` sentences in batches of ``--encode-batch``,
bf16/fp16 or fp32 as in training: tokenised by the call in the loop, the mask checked on the device and each batch's
vectors waited for (``.cpu()``), against lean tokenising ahead, then also the host's mask and the
copies back without waiting (modsent.training.loop.HostCopies); and a monolithic system (the
base saved as a sentence-transformers model, fp32) through sentence-transformers' ``encode``
against modsent.encoders.systems.encode_sentence_transformer (preprocessing ahead, no waits).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import unittest.mock
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SIZES = {"tiny": dict(hidden=64, layers=2, heads=2, intermediate=256),
         "small": dict(hidden=256, layers=4, heads=4, intermediate=1024),
         "labse": dict(hidden=768, layers=12, heads=12, intermediate=3072)}
VARIANTS = ("call, in step, read each", "lean, in step, read each", "lean, in step, read logged",
            "lean, ahead, read logged", "lean, ahead, logged, host mask")
ENCODINGS = ("call, in loop, wait each", "lean, ahead, wait each", "lean, ahead, host mask, no wait")


def device_mask(config, host_mask, device_mask):
    """transformers decides from the mask on the device (the step before the host's mask)."""
    return device_mask


def pairs_frame(n: int, seed: int):
    """``n`` pairs of real sentences drawn at random, without hard negatives."""
    import pandas as pd

    from modsent.testing import sample_texts

    texts = sample_texts(1200)
    generator = torch.Generator().manual_seed(seed)
    pick = torch.randint(len(texts), (n, 2), generator=generator).tolist()
    return pd.DataFrame({"anchor": [texts[a] for a, _ in pick], "positive": [texts[b] for _, b in pick],
                         "negative": [None] * n})


def run(model, pairs, batches, variant: str, device: str, log_every: int) -> float:
    """Seconds for the steps of ``batches``, until the last loss is read."""
    from modsent.losses import MultipleNegativesRankingLoss
    from modsent.modular import sentence_adapter as sa
    from modsent.training.loop import TrainingLog, ahead, optimizer_step
    from modsent.training.optim import adamw
    from modsent.training.precision import autocast, grad_scaler
    from modsent import tokenizing

    tokenizing._VERDICTS[model.tokenizer] = variant.startswith("lean")  # decided here, not on a first batch
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = adamw(trainable, 2e-5, 0.01)
    scaler = grad_scaler(device, "auto")
    loss_fn = MultipleNegativesRankingLoss(20.0)
    log = TrainingLog(len(batches), 0, variant, progress=False, log_every=log_every)
    in_step = ", in step," in variant

    def prepare(batch):
        return None if in_step else model.features(sa.batch_texts(pairs.iloc[batch]))

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    mask = sa.encoder_attention_mask if variant.endswith("host mask") else device_mask
    with unittest.mock.patch("modsent.modular.sentence_adapter.encoder_attention_mask", mask):
        for step, (batch, features) in enumerate(ahead(batches, prepare, enabled=not in_step)):
            with autocast(device, "auto"):
                loss = sa.batch_loss(model, loss_fn, pairs.iloc[batch], features)
            scaler.scale(loss).backward()
            optimizer_step(optimizer, trainable, 1.0, scaler)
            log.record(step, loss.item() if variant.endswith("read each") else loss, 2e-5, len(batch))
        log.close()  # reads the losses still pending: the device is done
    return time.perf_counter() - start


def main() -> None:
    from modsent.modular import sentence_adapter as sa
    from modsent.testing import make_tiny_bert, sample_texts
    from modsent.training import fastpath

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--labse-random", action="store_true", help="a LaBSE-sized BERT (default: --size)")
    parser.add_argument("--size", choices=sorted(SIZES), default="small",
                        help="tiny: 2 x 64, where the host's work is a large share of a CPU step")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=32, help="pairs per batch (the paper: 128)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=12, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each variant (the median is kept)")
    parser.add_argument("--log-every", type=int, default=10, help="sentence_adapter.log_every's default")
    parser.add_argument("--encode-sentences", type=int, default=1024)
    parser.add_argument("--encode-batch", type=int, default=64, help="evaluation's batch (the CPU default: 64)")
    args = parser.parse_args()

    cuda = args.device.startswith("cuda")
    size = "labse" if args.labse_random else args.size
    tmp = tempfile.TemporaryDirectory()
    base = make_tiny_bert(Path(tmp.name) / "base", sample_texts(1200), vocab_size=8000, max_seq_length=args.seq_len,
                          **SIZES[size])
    cfg = sa.SentenceAdapterConfig(batch_size=args.batch_size, seq_len=args.seq_len)
    model = sa.build_model(base, None, cfg).to(args.device)
    fastpath.speed_up(model)
    model.train()
    pairs = pairs_frame(args.batch_size * (args.steps + 1), seed=1)
    batches = [list(range(k, k + args.batch_size)) for k in range(0, len(pairs), args.batch_size)]
    warmup, batches = batches[:1], batches[1:]
    body = sum(p.numel() for n, p in model.named_parameters() if "embeddings" not in n)
    print(f"{size} random BERT ({body / 1e6:.1f}M non-embedding parameters, {len(model.tokenizer)} pieces) "
          f"+ SE LoRA r{cfg.lora_r} on every linear layer; {args.device} "
          f"({torch.cuda.get_device_name(args.device) if cuda else 'CPU'}); torch {torch.__version__}; "
          f"{args.batch_size} pairs per batch, {args.steps} steps per run, median of {args.repeats} runs; "
          f"loss logged every {args.log_every} steps")

    from modsent.tokenizing import BatchTokenizer

    texts = [sa.batch_texts(pairs.iloc[batch]) for batch in batches]
    batcher = BatchTokenizer(model.tokenizer, model.max_seq_length)
    timing = {}
    for lean in (False, True):
        batcher.lean = lean
        start = time.perf_counter()
        for batch_texts in texts:
            batcher(batch_texts)
        timing[lean] = 1000 * (time.perf_counter() - start) / len(texts)
    print(f"tokenising one batch ({2 * args.batch_size} sentences) on the host alone: {timing[False]:.1f} ms "
          f"by the tokenizer's call, {timing[True]:.1f} ms lean ({timing[False] / timing[True]:.2f}x)")

    for variant in VARIANTS:  # each shape and kernel once, untimed
        run(model, pairs, warmup, variant, args.device, args.log_every)
    seconds = {variant: [] for variant in VARIANTS}
    for _ in range(args.repeats):
        for variant in VARIANTS:
            seconds[variant].append(run(model, pairs, batches, variant, args.device, args.log_every))
    print(f"{'variant':32} {'pairs/s':>9} {'ms/step':>8} {'ratio':>6}")
    base_rate = None
    for variant in VARIANTS:
        median = statistics.median(seconds[variant])
        rate = args.batch_size * len(batches) / median
        base_rate = base_rate or rate
        print(f"{variant:32} {rate:9.1f} {1000 * median / len(batches):8.1f} {rate / base_rate:6.2f}", flush=True)

    sentences = (sample_texts(1200) * (args.encode_sentences // 1200 + 1))[:args.encode_sentences]
    encode_seconds = {name: [] for name in ENCODINGS}
    for repeat in range(args.repeats + 1):
        for name in encode_seconds:
            encode_seconds[name].append(encode(model, sentences, args.encode_batch, name, args.device))
    print(f"encoding {len(sentences)} sentences, batches of {args.encode_batch}:")
    print(f"{'variant':32} {'sent./s':>9} {'ratio':>6}")
    base_rate = None
    for name, times in encode_seconds.items():
        rate = len(sentences) / statistics.median(times[1:])  # the first run is untimed
        base_rate = base_rate or rate
        print(f"{name:32} {rate:9.1f} {rate / base_rate:6.2f}", flush=True)

    from sentence_transformers import SentenceTransformer

    from modsent.encoders.systems import encode_sentence_transformer

    import transformers

    transformers.logging.set_verbosity_error()  # the MLM head the base directory also holds
    monolithic = SentenceTransformer(str(base), device=args.device)
    transformers.logging.set_verbosity_warning()
    timings = {"sentence-transformers' encode": [], "modsent's (ahead, no wait)": []}
    for repeat in range(args.repeats + 1):
        for name, times in timings.items():
            if cuda:
                torch.cuda.synchronize(args.device)
            start = time.perf_counter()
            if name.startswith("modsent"):
                # fp32, as sentence-transformers' encode beside it: the host's work compared, not bf16
                encode_sentence_transformer(monolithic, sentences, args.encode_batch, precision="fp32")
            else:
                monolithic.encode(sentences, batch_size=args.encode_batch, prompt="", normalize_embeddings=True)
            times.append(time.perf_counter() - start)
    print(f"a monolithic system (sentence-transformers model, fp32), {len(sentences)} sentences, "
          f"batches of {args.encode_batch}:")
    base_rate = None
    for name, times in timings.items():
        rate = len(sentences) / statistics.median(times[1:])
        base_rate = base_rate or rate
        print(f"{name:32} {rate:9.1f} {rate / base_rate:6.2f}", flush=True)
    tmp.cleanup()


def encode(model, sentences, batch_size: int, variant: str, device: str) -> float:
    """Seconds for ``model.encode(sentences)`` as ``variant`` of ENCODINGS: ``call, in loop``: the
    tokenizer's call in the loop (``ahead`` disabled); ``wait each``: the mask left to
    transformers and each batch's vectors waited for (HostCopies with no lag: ``.cpu()``)."""
    from modsent import tokenizing
    from modsent.training import loop

    lean = variant.startswith("lean")
    tokenizing._VERDICTS[model.tokenizer] = lean
    threaded, copies = loop.ahead, loop.HostCopies  # encode's loop is loop.encode_in_batches
    ahead = threaded if lean else (lambda items, prepare: threaded(items, prepare, enabled=False))
    waiting = variant.endswith("wait each")
    with unittest.mock.patch("modsent.training.loop.ahead", ahead), \
            unittest.mock.patch("modsent.training.loop.HostCopies", (lambda: copies(lag=0)) if waiting else copies), \
            unittest.mock.patch("modsent.modular.sentence_adapter.encoder_attention_mask",
                                device_mask if waiting else tokenizing.encoder_attention_mask):
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        model.encode(sentences, batch_size)
        return time.perf_counter() - start


if __name__ == "__main__":
    main()

"""SE and CLA training throughput (pairs/s, MFU, peak memory, padding), measured side by side.

    python benchmarks/pair_throughput.py                                   # small random BERT, CPU
    python benchmarks/pair_throughput.py --labse-random --device cuda --seq-len 128 256 --batch-size 128

The step as the SE stage runs it (modsent.modular.sentence_adapter): a BERT encoder, frozen, with
LoRA (r 8) on every linear layer, mean pooling, MNRL (scale 20) over a batch of pairs with both
sides and the hard negatives encoded in one forward pass, gradients clipped to norm 1
(loop.optimizer_step). The CLA's pp step (modsent.modular.alignment) trains parallel adapters
(modsent.modular.parallel_adapter, the default shape: 768 -> 384 -> 768 beside every FFN) on
the same encoder with its LoRA frozen, encodes only L's side (positives and hard negatives) and
scores it against English vectors computed once. --negative-share of each batch's pairs carry a
hard negative (default 0.37: the paper's English data, configs/paper-labse.yaml, where MNLI's
128K and Quora's ~102K of ~624K pairs are triplets; the same count in every batch, where the
stages' count varies with the draw: the same work on average, fewer batch shapes). Random
weights of a LaBSE-sized BERT (12 x 768; a 50,000-piece per-language vocabulary; the adapters
768 -> 384 -> 768) with --labse-random, a small one (4 x 256) without; nothing is downloaded.

Sentence lengths are real: the word counts of modsent.testing.sample_texts (English prose of
5-40 words) times 1.3 pieces per word, plus [CLS] and [SEP], capped at --seq-len. Batches are
padded to their longest sentence, as modsent's pair stages pad them (--pad-multiple N rounds
the width up to a multiple of N: fewer distinct shapes, which CUDA graphs need), and the encoder
gets the padding mask the stages give it (modsent.tokenizing.encoder_attention_mask: decided
from the host's copy, so the forward never asks the GPU whether there is padding). Variants:

- ``fp32, random``: the step without mixed precision or fused AdamW (the unoptimised path);
- ``bf16, random``: bf16 autocast and fused AdamW, batches drawn at random, PEFT's LoRA forward;
- ``bf16, random, fast``: the same with modsent.training.fastpath's LoRA and frozen-Linear
  forwards (modsent's step);
- ``bf16, grouped``: the same with length-grouped batches (``--group`` batches' worth of pairs
  drawn at random, sorted by length, cut into batches, the batches shuffled): less padding,
  at the price of in-batch negatives of similar length (and ``bf16, grouped, fast``);
- with ``--two-datasets`` (every variant's pairs drawn from the tests' fixture of two kinds of
  very different lengths, modsent.testing.two_length_datasets: names of 1-6 words in three
  small built-in datasets, and docstring sentences; each pair labelled with its dataset):
  ``bf16, strata, fast`` (CPU: ``fp32, strata``), grouped as the stages' ``length_groups: k``
  groups them (k = ``--group``; each pair ranked by length within its own dataset, so that
  every batch keeps each dataset's share; the key, as for ``grouped``, the pair's longer side,
  where the stages also count its hard negative): between ``random`` and ``grouped`` in
  padding, the trade-off of benchmarks/pair_batching.py timed on the device;
- ``fp32, fast, chunks 16``: the stages' step on the CPU (``SentenceEncoderModel.step_features``):
  each step's pass in sub-passes of up to 16 sentences sorted by length, each padded to its own
  longest (modsent.training.loop.split_by_length; the same batches and loss, less padding). On a
  GPU (``bf16, fast, chunks 16``) only when ``--only`` names it: there it ran at 0.19-0.20x the
  fp32 step (an H200, 128 pairs), as the stages expect (they split on the CPU only);
- on a GPU, two answers to the cost of new shapes (below), each beside ``bf16, random, fast``:
  ``bf16, fast, pad 8`` pads widths to a multiple of 8 (fewer shapes; the same results up to
  float rounding), and the one the stages take: every variant but ``bf16, fast, cuDNN`` runs
  SDPA without cuDNN's attention kernel, as the stages do
  (modsent.training.fastpath.attention_for_varying_shapes: the memory-efficient kernel with a
  padding mask, no plan per shape); ``bf16, fast, cuDNN`` lets PyTorch choose, which on Hopper
  GPUs is cuDNN's kernel with a plan built for each new shape;
- with ``--triton``, ``bf16, Triton``: ``bf16, random, fast`` with each LoRA layer's dropout
  drawn inside its products and each dropout + residual add + LayerNorm as one kernel each way,
  Triton kernels (modsent.training.fastpath.fuse_lora_dropout and fuse_residual_norms; on the
  CPU, ``fp32, Triton`` in Triton's interpreter: a check that it runs, no speed).

Each prints pairs/s (timed steps run back to back with one wait at the end, as the stages run
them, over their total time; with ``--rounds N`` the median of N such blocks, the variants taking
turns, each round in another order, and a ``spread`` column, (slowest - fastest) / median: the
pair steps at 128 pairs are bound by the host, whose speed drifts; timed after --warmup untimed
steps and an
untimed step of each batch shape, sentences x padded width, the timed steps meet that the
warm-up did not, two under CUDA graphs: a new shape is slow once, while PyTorch's cuDNN
attention builds its plan or a CUDA graph is recorded), the share of padding, the ratio against
``fp32, random``, what a step of a new shape takes more than a steady step (the untimed
first steps of their shape, the very first excepted: the stages meet many shapes, since their
batches vary in width and in the number of hard negatives, and pay this once for each) and, on
a GPU, the
model FLOPs utilisation against --peak-tflops (bf16 dense peak, default 989 for an H100/H200
SXM; "6N": 6N + 12·L·d·s FLOPs per real token, s its sentence's length; "4N": 4N + 12·L·d·s, the
work of a frozen body with LoRA, as in mlm_throughput.py) and the peak memory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SIZES = {"small": (256, 4, 4, 1024, 8000), "labse": (768, 12, 12, 3072, 50_000)}
PAPER_NEGATIVE_SHARE = 0.37  # pairs with a hard negative in configs/paper-labse.yaml's English data


def build(size: str, device: str, stage: str = "SE"):
    """The model a stage trains, random weights: (PEFT model, BertConfig). SE: LoRA r 8 on every
    linear layer, trained. CLA: the same with its LoRA frozen and parallel adapters (the default
    shape) beside every FFN, trained (alignment.build_alignment_model)."""
    import transformers
    from peft import LoraConfig, get_peft_model

    hidden, layers, heads, intermediate, vocab = SIZES[size]
    config = transformers.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=heads, intermediate_size=intermediate,
                                     max_position_embeddings=512)
    config._attn_implementation = "sdpa"
    encoder = transformers.BertModel(config, add_pooling_layer=False)
    encoder.requires_grad_(False)
    encoder = get_peft_model(encoder, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules="all-linear"))
    for name, param in encoder.named_parameters():
        param.requires_grad_("lora_" in name)
    if stage == "CLA":
        from modsent.modular import parallel_adapter as pa

        pa.add_parallel_adapters(encoder, pa.ParallelAdapterConfig())
        pa.freeze_all_but_adapters(encoder)
    return encoder.to(device).train(), config


def sentence_lengths(seq_len: int) -> list[int]:
    from modsent.testing import sample_texts

    return [min(seq_len, round(1.3 * len(text.split())) + 2) for text in sample_texts(800)]


def dataset_rows(seq_len: int) -> list[tuple[int, int, str]]:
    """The pairs of the tests' fixture (modsent.testing.two_length_datasets: names of countries
    and currencies of 1-6 words in three built-in datasets, and docstring sentences of 5-35
    words) as (anchor length, positive length, dataset), lengths estimated as
    :func:`sentence_lengths` does."""
    from modsent.testing import two_length_datasets

    def pieces(text: str) -> int:
        return min(seq_len, round(1.3 * len(text.split())) + 2)

    frame = two_length_datasets()
    return [(pieces(a), pieces(p), d) for a, p, d in zip(frame["anchor"], frame["positive"], frame["dataset"])]


def make_batches(lengths: list, pairs: int, batch_size: int, group: int, seed: int,
                 negative_share: float = 0.0, strata: bool = False) -> list[list[tuple[int, ...]]]:
    """``pairs`` random (anchor, positive) length pairs cut into batches at random or grouped by
    length, ``round(negative_share * batch_size)`` pairs of each batch (drawn at random) with a
    hard negative's length as a third. A fixed count per batch is the stages' share on average
    and keeps the number of sentences a step encodes, so the number of batch shapes, small.

    ``lengths``: sentence lengths (a row: three drawn at random) or labelled pairs
    (:func:`dataset_rows`; a row: a pair drawn at random, the positive of a random pair of its
    dataset the third, as a dataset's hard negatives are its own sentences).
    Grouped (``group`` > 1): each pool of ``group`` batches ordered by
    modsent.training.pairs.length_grouped_order, as the stages' ``length_groups`` orders it: by
    length alone, or with ``strata`` each pair ranked within its own dataset."""
    from modsent.training.pairs import length_grouped_order

    generator = torch.Generator().manual_seed(seed)
    pick = torch.randint(len(lengths), (pairs, 3), generator=generator).tolist()
    if lengths and isinstance(lengths[0], tuple):
        members = {}  # each dataset's pairs: a hard negative comes from the pair's own dataset
        for i, row in enumerate(lengths):
            members.setdefault(row[2], []).append(i)
        labels = [lengths[i][2] for i, _, _ in pick]
        rows = [(lengths[i][0], lengths[i][1], lengths[members[d][k % len(members[d])]][1])
                for (i, _, k), d in zip(pick, labels)]
    else:
        rows = [tuple(lengths[i] for i in ids) for ids in pick]
        labels = None
    if strata and labels is None:
        raise ValueError("make_batches: strata need labelled pairs (dataset_rows)")
    if group <= 1:
        batches = [rows[k:k + batch_size] for k in range(0, len(rows) - batch_size + 1, batch_size)]
    else:
        batches = []
        pool = group * batch_size
        for k in range(0, len(rows) - pool + 1, pool):
            order = length_grouped_order(range(pool), [max(row[:2]) for row in rows[k:k + pool]], pool,
                                         labels[k:k + pool] if strata else None)
            chunk = [rows[k + i] for i in order]
            batches += [chunk[i:i + batch_size] for i in range(0, pool, batch_size)]
        order = torch.randperm(len(batches), generator=generator).tolist()
        batches = [batches[i] for i in order]
    negatives = round(negative_share * batch_size)
    out = []
    for batch in batches:
        keep = set(torch.randperm(len(batch), generator=generator)[:negatives].tolist())
        out.append([row if i in keep else row[:2] for i, row in enumerate(batch)])
    return out


def padded_width(lengths: list[int], multiple: int) -> int:
    """The longest of ``lengths`` rounded up to a multiple of ``multiple``."""
    return -(-max(lengths) // multiple) * multiple


def padded(lengths: list[int], config, device: str, generator: torch.Generator, multiple: int):
    """Random ids for sentences of these lengths, padded to the longest rounded up to ``multiple``
    (1: as modsent pads), on ``device``: (ids, the 2D mask, the mask the encoder gets, as
    modsent.modular.sentence_adapter gives it: None without padding, else 4D boolean)."""
    from modsent.tokenizing import encoder_attention_mask

    cols = padded_width(lengths, multiple)
    ids = torch.randint(5, config.vocab_size, (len(lengths), cols), generator=generator)
    mask = (torch.arange(cols)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = ids * mask
    device_mask = mask.to(device)
    return ids.to(device), device_mask, encoder_attention_mask(config, mask, device_mask)


def sentences(batch: list[tuple[int, ...]], stage: str) -> list[int]:
    """The lengths one step encodes, in the order the stages encode them: anchors, positives,
    then the hard negatives (SE: sentence_adapter.batch_texts); L's positives, then its hard
    negatives (CLA: alignment.batch_inputs)."""
    anchors = [row[0] for row in batch] if stage == "SE" else []
    return anchors + [row[1] for row in batch] + [row[2] for row in batch if len(row) > 2]


def shape(batch: list[tuple[int, ...]], stage: str, multiple: int) -> tuple[int, int]:
    """The shape of a step's batch as :func:`padded` makes it: (sentences, padded width)."""
    lengths = sentences(batch, stage)
    return len(lengths), padded_width(lengths, multiple)


def warm_schedule(shapes: list, warmup: int, repeats: int = 1) -> tuple[list[int], int]:
    """The order to run batches of these shapes in, and how many of its first steps go untimed:
    the first ``warmup`` batches, then ``repeats`` times the first batch of each shape that the
    timed ones (the rest) meet and the warm-up did not, then the timed ones. A new shape is slow
    once (PyTorch's cuDNN attention builds a plan per shape; CUDA graphs run a new shape once
    and record it at the second call: ``repeats=2``), so no timed step is a first."""
    warmed = set(shapes[:warmup])
    extra = {}
    for k in range(warmup, len(shapes)):
        if shapes[k] not in warmed:
            extra.setdefault(shapes[k], k)
    schedule = list(range(warmup)) + [k for k in extra.values() for _ in range(repeats)]
    return schedule + list(range(warmup, len(shapes))), warmup + repeats * len(extra)


def first_of_shape(shapes: list, schedule: list[int]) -> list[int]:
    """The positions in ``schedule`` (past the first) that run a shape for the first time: their
    steps, less a step of a shape met before, are what a new shape costs."""
    seen, firsts = set(), []
    for i, k in enumerate(schedule):
        if shapes[k] not in seen:
            seen.add(shapes[k])
            if i:
                firsts.append(i)
    return firsts


def attention_kernels(cudnn: bool):
    """A context in which SDPA chooses its kernel as PyTorch does by default (``cudnn``: on Hopper
    GPUs, cuDNN's), or as the stages run it: without cuDNN's kernel
    (fastpath.attention_for_varying_shapes)."""
    import contextlib

    from modsent.training import fastpath

    return contextlib.nullcontext() if cudnn else fastpath.attention_for_varying_shapes()


def chunk_inputs(config, chunk: dict, device: str):
    """One chunk of a pass split by length (on the host) on ``device``, as
    SentenceEncoderModel.forward gives it to the encoder: (ids, the 2D mask, the encoder's mask)."""
    from modsent.tokenizing import encoder_attention_mask

    device_mask = chunk["attention_mask"].to(device)
    return (chunk["input_ids"].to(device), device_mask,
            encoder_attention_mask(config, chunk["attention_mask"], device_mask))


def to_device(inputs, device: str):
    """A step's inputs (tensors, in tuples and lists, and the host's chunk plan, which stays) on
    ``device``."""
    if isinstance(inputs, torch.Tensor):
        return inputs.to(device)
    if type(inputs) in (tuple, list):  # not LengthChunks, a tuple that carries its order
        return type(inputs)(to_device(item, device) for item in inputs)
    return inputs


def move_state(optimizer: torch.optim.Optimizer, device: str) -> None:
    """The optimizer's state (AdamW's moments and step counts) to ``device``: a variant waiting for
    its turn keeps its state on the host, so the peak memory of the one that runs is its own."""
    fused = bool(optimizer.param_groups[0].get("fused"))
    for state in optimizer.state.values():
        for key, value in state.items():
            # the step counts: on the parameters' device for fused AdamW, on the host otherwise
            if isinstance(value, torch.Tensor) and (value.dim() or fused):
                state[key] = value.to(device)


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)


def variant_table(args, cuda: bool) -> dict:
    """{variant name: (bf16 autocast, length groups, fast LoRA)} that these options time on a GPU
    (``cuda``) or the CPU, in the order they run (gpu.sh's ``--only`` names are checked against it:
    tests/test_gpu_blocks.py)."""
    from modsent.training.loop import CPU_CHUNK_SENTENCES

    variants = {"fp32, random": (False, 1, False), "bf16, random": (True, 1, False),
                "bf16, random, fast": (True, 1, True), "bf16, grouped": (True, args.group, False),
                "bf16, grouped, fast": (True, args.group, True)}
    if not cuda:
        variants = {"fp32, random": (False, 1, False), "fp32, random, fast": (False, 1, True),
                    "fp32, grouped": (False, args.group, False)}
    # the stages' CPU step: the pass in sub-passes by length (on a GPU only when --only names it:
    # there it ran at 0.19-0.20x the fp32 step on an H200, and takes a minute per stage)
    chunks = ("bf16" if cuda else "fp32") + f", fast, chunks {CPU_CHUNK_SENTENCES}"
    if not cuda or chunks in (args.only or ()):
        variants[chunks] = (cuda, 1, True)
    if cuda:
        variants["bf16, fast, pad 8"] = (True, 1, True)
        variants["bf16, fast, cuDNN"] = (True, 1, True)
    if args.bf16_residual and cuda:
        variants["bf16, fast, bf16 res."] = (True, 1, True)
    if args.triton:
        variants["bf16, Triton" if cuda else "fp32, Triton"] = (cuda, 1, True)
    if args.two_datasets:  # the stages' length_groups: each pair ranked by length within its dataset
        variants["bf16, strata, fast" if cuda else "fp32, strata"] = (cuda, args.group, cuda)
    if args.compile:
        # the fast path, as modsent trains (under torch.compile its frozen layers leave the casts
        # to the compiler: one graph, tests/test_fastpath.py)
        name = ("bf16" if cuda else "fp32") + (", fast, graphs" if args.compile_mode == "reduce-overhead"
                                               else ", fast, compiled")
        variants[name] = (cuda, 1, True)
    return variants


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What the options' types cannot check (tests/test_gpu_blocks.py runs it on gpu.sh's lines;
    --only against the variants, main checks)."""
    if args.rounds < 1:
        parser.error(f"--rounds: at least 1, got {args.rounds}")


def main() -> None:
    from modsent.losses import MultipleNegativesRankingLoss
    from modsent.modular import alignment as al, sentence_adapter as sa
    from modsent.training import fastpath

    from modsent.training.loop import LengthChunks, optimizer_step, split_by_length
    from modsent.training.optim import step_options

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--labse-random", action="store_true", help="a LaBSE-sized BERT (default: a small one)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=16, help="pairs per batch (the paper: 128)")
    parser.add_argument("--seq-len", type=int, nargs="+", default=[128], help="the longest a sentence may be")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (after --warmup steps)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (each new shape is slow once)")
    parser.add_argument("--pad-multiple", type=int, default=1,
                        help="pad each batch to a multiple of this (1: to its longest sentence, as modsent does)")
    parser.add_argument("--group", type=int, default=8, help="batches per length-sorted pool")
    parser.add_argument("--two-datasets", action="store_true",
                        help="pairs of the tests' fixture (short names, long sentences), each labelled "
                             "with its dataset, and a variant grouped as length_groups groups them ('strata')")
    parser.add_argument("--negative-share", type=float, default=PAPER_NEGATIVE_SHARE,
                        help="the share of pairs with a hard negative (the paper's data: 0.37)")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--bf16-residual", action="store_true",
                        help="also time 'bf16, random, fast' with the residual stream in bf16 (an experiment: "
                             "other numerics; fastpath.bf16_residual_stream)")
    parser.add_argument("--compile", action="store_true",
                        help="also time 'bf16, random' with the encoder under torch.compile")
    parser.add_argument("--compile-mode", default=None,
                        help="torch.compile's mode: reduce-overhead replays CUDA graphs (one per padded "
                             "width: --pad-multiple keeps them few), the launch cost the SE and CLA steps "
                             "at 128 pairs are bound by")
    parser.add_argument("--triton", action="store_true",
                        help="also time the fast path with the LoRA layers and the residual norms as Triton kernels "
                             "(fastpath.fuse_lora_dropout, fuse_residual_norms(kernel='triton'); on the CPU: Triton's "
                             "interpreter, no speed)")
    parser.add_argument("--only", nargs="+", metavar="VARIANT",
                        help="time only these variants (their names as printed) besides 'fp32, random'")
    parser.add_argument("--stages", nargs="+", choices=("SE", "CLA"), default=["SE", "CLA"])
    parser.add_argument("--rounds", type=int, default=1,
                        help="time every variant's steps this many times, the variants in turn (each round "
                             "in another order), and report the median round: a host whose speed drifts "
                             "then slows every variant alike; 'spread' is (slowest - fastest) / median")
    args = parser.parse_args()
    check_options(parser, args)
    if args.triton and not args.device.startswith("cuda"):
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the CPU: Triton's interpreter, before Triton is imported
    cuda = args.device.startswith("cuda")
    size = "labse" if args.labse_random else "small"
    hidden, layers = SIZES[size][:2]
    loss_fn = MultipleNegativesRankingLoss(20.0)
    print(f"{'LaBSE-sized' if args.labse_random else 'small'} random BERT ({layers} x {hidden}) + LoRA r8 on every "
          f"linear layer (CLA: frozen, parallel adapters trained); {args.device} "
          f"({torch.cuda.get_device_name() if cuda else 'CPU'}); torch {torch.__version__}; "
          f"{args.batch_size} pairs per batch, {round(args.negative_share * args.batch_size)} of them with a "
          f"hard negative")
    print("ratio: against 'fp32, random' of the same stage in the same run; new shape: what a step of a "
          "batch shape not met before takes more than a steady step (untimed steps of the warm-up)")
    print(f"{'stage':5} {'seq':>4} {'variant':21} {'pairs/s':>9} {'padding':>8} {'ratio':>6} {'new shape':>11}"
          + (f" {'MFU 6N':>6} {'MFU 4N':>6} {'peak GiB':>9}" if cuda else "")
          + (f" {'spread':>7}" if args.rounds > 1 else ""))
    variants = variant_table(args, cuda)
    if args.only:
        unknown = set(args.only) - set(variants)
        if unknown:
            parser.error(f"--only: no variant {sorted(unknown)}; the variants: {list(variants)}")
        variants = {name: spec for name, spec in variants.items() if name == "fp32, random" or name in args.only}
    for seq_len in args.seq_len:
        lengths = dataset_rows(seq_len) if args.two_datasets else sentence_lengths(seq_len)
        for stage in args.stages:
            # one stage's model at a time: the peak memory is the stage's
            model, config = build(size, args.device, stage)
            # a wrapper: `model` stays eager
            compiled = torch.compile(model, dynamic=True, mode=args.compile_mode) if args.compile else None
            trainable = [p for p in model.parameters() if p.requires_grad]
            n_model = sum(p.numel() for n, p in model.named_parameters() if "embeddings" not in n)
            results, setups = {}, {}

            def activate(name):
                """The model in the variant's mode: the fast path or PEFT's forwards, the residual
                stream's dtype (both switched in place; a compiled variant's graphs stay valid)."""
                if variants[name][2]:
                    fastpath.speed_up(model)
                else:
                    fastpath.restore(model)
                fastpath.bf16_residual_stream(model, name.endswith("bf16 res."))
                fastpath.fuse_lora_dropout(model, name.endswith("Triton"))
                fastpath.fuse_residual_norms(model, args.device, "--triton", name.endswith("Triton"), kernel="triton")

            for name, (bf16, group, _) in variants.items():
                activate(name)
                net = compiled if name.endswith(("compiled", "graphs")) else model
                optimizer = torch.optim.AdamW(trainable, lr=2e-5, **(step_options(trainable) if bf16 else {}))
                autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and cuda
                            else torch.autocast(args.device.split(":")[0], enabled=False))
                pool = max(group, 1) * args.batch_size
                n_pairs = ((args.steps + args.warmup) * args.batch_size + pool - 1) // pool * pool
                batches = make_batches(lengths, n_pairs, args.batch_size, group, seed=1,
                                       negative_share=args.negative_share,
                                       strata="strata" in name)[:args.steps + args.warmup]
                generator = torch.Generator().manual_seed(2)
                english = nn.functional.normalize(torch.randn(args.batch_size, config.hidden_size,
                                                              generator=generator), dim=-1).to(args.device)
                multiple = 8 if name.endswith("pad 8") else args.pad_multiple
                shapes = [shape(b, stage, multiple) for b in batches]
                schedule, untimed = warm_schedule(shapes, args.warmup, 2 if name.endswith("graphs") else 1)
                firsts = set(first_of_shape(shapes, schedule))
                first_times, real, total, flops, flops_frozen = [], 0, 0, 0.0, 0.0
                chunked = "chunks" in name

                def prepare(batch, device=args.device, chunked=chunked, generator=generator, multiple=multiple):
                    """A step's inputs on ``device``, as the stages prepare them on a thread:
                    (lengths, inputs, padded positions)."""
                    sent = sentences(batch, stage)
                    ids, mask, attention = padded(sent, config, "cpu" if chunked else device, generator, multiple)
                    if not chunked:
                        return sent, (ids, mask, attention), ids.numel()
                    # split and sent before the clock, as the stages prepare it on a thread
                    parts = split_by_length({"input_ids": ids, "attention_mask": mask})
                    parts = parts if isinstance(parts, LengthChunks) else [parts]
                    inputs = [chunk_inputs(config, chunk, device) for chunk in parts]
                    return sent, (parts, inputs), sum(chunk["input_ids"].numel() for chunk in parts)

                def run(n_pairs, inputs, name=name, net=net, optimizer=optimizer, autocast=autocast,
                        chunked=chunked, english=english):
                    with autocast, attention_kernels(cudnn=name.endswith("cuDNN")):
                        if chunked:  # the stages' step on the CPU: SentenceEncoderModel.step_features
                            parts, chunks = inputs
                            outputs = [mean_pool(net(input_ids=c_ids, attention_mask=c_attention).last_hidden_state,
                                                 c_mask) for c_ids, c_mask, c_attention in chunks]
                            emb = parts.restore(outputs) if isinstance(parts, LengthChunks) else outputs[0]
                        else:
                            ids, mask, attention = inputs
                            emb = mean_pool(net(input_ids=ids, attention_mask=attention).last_hidden_state, mask)
                        loss = (sa.pass_loss(loss_fn, emb, n_pairs) if stage == "SE"
                                else al.pp_pass_loss(loss_fn, english[:n_pairs], emb))
                    loss.backward()
                    optimizer_step(optimizer, trainable, 1.0)  # the stages': clip to norm 1, step, clear

                # the untimed steps one by one, each timed up to a wait (what a new shape costs)
                warm_start = time.perf_counter()
                for i, k in enumerate(schedule[:untimed]):
                    sent, inputs, _ = prepare(batches[k])
                    if cuda:
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    run(len(batches[k]), inputs)
                    if cuda:
                        torch.cuda.synchronize()
                    if i in firsts:
                        first_times.append(time.perf_counter() - start)
                if net is not model:  # compiling can outlast a run's time limit: the rows come at the end
                    print(f"# {stage} {seq_len} {name!r}: warm-up and compilation, {untimed} steps in "
                          f"{time.perf_counter() - warm_start:.0f} s", flush=True)
                # the timed steps' inputs, prepared before the clock as the stages prepare them ahead (kept
                # on the host until their variant's turn: on the device they would count in the others' peak)
                timed = [(len(batches[k]), *prepare(batches[k], "cpu")) for k in schedule[untimed:]]
                for _, sent, _, positions in timed:
                    real += sum(sent)
                    total += positions
                    attn_flops = sum(12 * config.num_hidden_layers * config.hidden_size * s * s for s in sent)
                    flops += 6 * n_model * sum(sent) + attn_flops
                    flops_frozen += 4 * n_model * sum(sent) + attn_flops
                setups[name] = {"run": run, "timed": timed, "optimizer": optimizer, "real": real, "total": total,
                                "flops": flops, "flops_frozen": flops_frozen, "first_times": first_times,
                                "seconds": [], "peak": 0.0}
                move_state(optimizer, "cpu")  # inactive: its state off the device, out of the others' peak

            # the timed steps back to back, with one wait at the end, as the stages run them (they never
            # wait for the GPU between steps: the host queues a step while the GPU runs the last); in
            # --rounds rounds, each round in another order, so that a slow spell of a noisy host falls
            # on every variant alike
            names = list(variants)
            for r in range(args.rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    setup = setups[name]
                    activate(name)
                    move_state(setup["optimizer"], args.device)
                    steps = [(n_pairs, to_device(inputs, args.device)) for n_pairs, _, inputs, _ in setup["timed"]]
                    if cuda:
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()  # the timed steps' peak
                    start = time.perf_counter()
                    for n_pairs, inputs in steps:
                        setup["run"](n_pairs, inputs)
                    if cuda:
                        torch.cuda.synchronize()
                    setup["seconds"].append(time.perf_counter() - start)
                    if cuda:
                        setup["peak"] = max(setup["peak"], torch.cuda.max_memory_allocated() / 2**30)
                    move_state(setup["optimizer"], "cpu")
                    steps = None
            for name, setup in setups.items():
                seconds = statistics.median(setup["seconds"])
                steady = seconds / args.steps
                first_times = setup["first_times"]
                new_shape = (statistics.median(first_times) - steady) if first_times else None
                spread = (max(setup["seconds"]) - min(setup["seconds"])) / seconds
                results[name] = (args.batch_size * args.steps / seconds, 1 - setup["real"] / setup["total"],
                                 setup["flops"] / seconds, setup["flops_frozen"] / seconds,
                                 setup["peak"] if cuda else None, new_shape, spread)
            setups = run = None
            fastpath.restore(model)
            model = compiled = net = optimizer = trainable = None  # freed before the next stage's model
            if cuda:
                torch.cuda.empty_cache()
            base = results["fp32, random"][0]
            for name, (pps, pad, fps, fps_frozen, peak, new_shape, spread) in results.items():
                extra = "-" if new_shape is None else f"{new_shape * 1e3:+.0f}ms"
                line = f"{stage:5} {seq_len:4d} {name:21} {pps:9.1f} {pad:8.1%} {pps / base:6.2f} {extra:>11}"
                if cuda:
                    line += f" {fps / (args.peak_tflops * 1e12):6.1%} {fps_frozen / (args.peak_tflops * 1e12):6.1%} {peak:9.1f}"
                if args.rounds > 1:
                    line += f" {spread:7.0%}"
                print(line, flush=True)


if __name__ == "__main__":
    main()

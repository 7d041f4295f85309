"""Evaluation encoding throughput (sentences/s, MFU, peak memory, padding), measured side by side.

    python benchmarks/encode_throughput.py                                  # small random BERT, CPU
    python benchmarks/encode_throughput.py --labse-random --device cuda --batch-size 64 256

The forward pass the evaluation runs for every system and sentence
(modsent.modular.sentence_adapter.SentenceEncoderModel.encode): a BERT encoder with LoRA (r 8)
on every linear layer, mean pooling, no gradients. Random weights of a LaBSE-sized BERT with
--labse-random (the model of pair_throughput.py); sentence lengths are those of
modsent.testing.sample_texts (English prose of 5-40 words, 1.3 pieces a word), --sentences of
them. Tokenisation is not timed (it runs on the CPU, the same in every variant). Every variant
encodes as the evaluation's loop does (modsent.training.loop.encode_in_batches, which always
sorts by length): each batch padded to its longest sentence, the encoder given the mask decided
on the host (modsent.tokenizing.encoder_attention_mask), the vectors normalised and copied back
without waiting (loop.HostCopies). Variants:

- ``fp32, given order``: full precision, batches in the order the sentences come (the
  unoptimised path);
- ``fp32, by length``: batches of sentences sorted by length (less padding), full precision;
- ``bf16, by length``: the same under bf16 autocast, which is what ``precision: auto`` runs on a
  GPU;
- ``bf16, by length, merged``: the same with the LoRA terms merged into the weights (one matrix
  product per layer), as modsent's evaluation encodes (ModularEncoder with ``merge_lora``).

Each prints sentences/s over --repeat passes after one untimed pass, the share of padding, the
ratio against ``fp32, given order`` at the same batch size and, on a GPU, the model FLOPs
utilisation against --peak-tflops (2N + 4·L·d·s FLOPs per real token, the forward pass) and
the peak memory.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.pair_throughput import SIZES, build, mean_pool, padded, sentence_lengths  # noqa: E402
from modsent.training.loop import HostCopies  # noqa: E402


def batches(lengths: list[int], batch_size: int, by_length: bool) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i]) if by_length else list(range(len(lengths)))
    return [[lengths[i] for i in order[k:k + batch_size]] for k in range(0, len(order), batch_size)]


def main() -> None:
    from modsent.training.precision import autocast

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--labse-random", action="store_true", help="a LaBSE-sized BERT (default: a small one)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[64])
    parser.add_argument("--seq-len", type=int, default=128, help="the longest a sentence may be")
    parser.add_argument("--sentences", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()

    torch.manual_seed(0)
    size = "labse" if args.labse_random else "small"
    model, config = build(size, args.device)
    model.eval()
    hidden, layers = SIZES[size][:2]
    non_embedding = sum(p.numel() for n, p in model.named_parameters() if "embeddings" not in n)
    base = sentence_lengths(args.seq_len)
    lengths = [base[i % len(base)] for i in range(args.sentences)]
    real = sum(lengths)
    flops = 2 * non_embedding * real + 4 * layers * hidden * sum(s * s for s in lengths)
    cuda = args.device.startswith("cuda")
    name = torch.cuda.get_device_name(args.device) if cuda else "cpu"
    print(f"model: {size} random BERT with LoRA r 8 on every linear layer; {non_embedding / 1e6:.1f}M "
          f"non-embedding parameters; device {args.device} ({name}); torch {torch.__version__}; "
          f"{args.sentences} sentences, {real} real tokens, longest {args.seq_len}")
    print("ratio: against 'fp32, given order' at the same batch size, in the same run")
    print(f"{'batch':>5}  {'variant':<24} {'sent/s':>10} {'padding':>8} {'ratio':>6} {'MFU':>6} {'peak GiB':>9}")
    variants = [("fp32, given order", "fp32", False, False), ("fp32, by length", "fp32", True, False),
                ("bf16, by length", "auto", True, False), ("bf16, by length, merged", "auto", True, True)]
    for batch_size in args.batch_size:
        reference = None
        for label, precision, by_length, merge in variants:
            if merge:
                model.merge_adapter()
            plan = batches(lengths, batch_size, by_length)
            generator = torch.Generator().manual_seed(1)
            inputs = [padded(rows, config, args.device, generator, 1) for rows in plan]
            padding = 1 - real / sum(ids.numel() for ids, _, _ in inputs)
            if cuda:
                torch.cuda.reset_peak_memory_stats(args.device)
            times = []
            for rep in range(args.repeat + 1):
                if cuda:
                    torch.cuda.synchronize(args.device)
                start = time.perf_counter()
                copies = HostCopies()
                with torch.no_grad():
                    for ids, mask, attention in inputs:
                        with autocast(args.device, precision):
                            out = mean_pool(model(input_ids=ids, attention_mask=attention).last_hidden_state, mask)
                        copies.add(torch.nn.functional.normalize(out.float(), dim=-1))
                copies.numpy()
                if cuda:
                    torch.cuda.synchronize(args.device)
                if rep:
                    times.append(time.perf_counter() - start)
            seconds = sorted(times)[len(times) // 2]
            rate = args.sentences / seconds
            reference = reference or rate
            mfu = f"{flops / seconds / (args.peak_tflops * 1e12):.1%}" if cuda else "-"
            peak = f"{torch.cuda.max_memory_allocated(args.device) / 2**30:.1f}" if cuda else "-"
            if merge:
                model.unmerge_adapter()
            print(f"{batch_size:>5}  {label:<24} {rate:>10.0f} {padding:>8.1%} {rate / reference:>6.2f} {mfu:>6} {peak:>9}")


if __name__ == "__main__":
    main()

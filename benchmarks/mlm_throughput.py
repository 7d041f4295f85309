"""MLM training throughput of the language-adapter step (tokens/s), measured side by side.

    python benchmarks/mlm_throughput.py                       # the demo base model on the CPU
    python benchmarks/mlm_throughput.py --labse-random --device cuda --seq-len 128 256

Compares, in one run and on the same batches, the LA step as modsent runs it (MLM head on the
masked positions only) with the usual full-sequence head (transformers' own MLM loss), and prints
tokens/s and their ratio. On a GPU (--device cuda) it also prints the model FLOPs utilisation
(MFU) against the GPU's bf16 peak (--peak-tflops, default 989 for an H100 SXM), counting
6N + 12·L·d·s FLOPs per token (N: non-embedding parameters, L layers, width d, sequence s: the
usual dense estimate plus attention scores). Frozen weights still cost their backward through
activations, so 6N holds for adapter training as for full fine-tuning, minus the weight
gradients of frozen layers (so this slightly overstates the work done).

--labse-random builds a LaBSE-sized BERT (12 layers, hidden 768, 501,153-token vocabulary is
replaced by a 50,000-token per-language vocabulary as in the method) from its config with
random weights: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def build(args):
    import transformers
    from peft import LoraConfig, get_peft_model

    if args.labse_random:
        config = transformers.BertConfig(vocab_size=50_000, hidden_size=768, num_hidden_layers=12,
                                         num_attention_heads=12, intermediate_size=3072,
                                         max_position_embeddings=512)
        config._attn_implementation = "sdpa"
        model = transformers.BertForMaskedLM(config)
        vocab = 50_000
    else:
        base = Path(args.base)
        transformers.logging.set_verbosity_error()
        model = transformers.AutoModelForMaskedLM.from_pretrained(str(base), attn_implementation="sdpa")
        vocab = args.vocab
        model.resize_token_embeddings(vocab, mean_resizing=False)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1,
                                             target_modules=["query", "key", "value"]))
    model.get_input_embeddings().weight.requires_grad_(True)
    return model.to(args.device), vocab


def main() -> None:
    from modsent.modular.language_adapter import mlm_loss

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default=str(REPO / "resources/base_models/me5-small"),
                        help="model directory (default: the demo's converted multilingual-e5-small)")
    parser.add_argument("--vocab", type=int, default=4000, help="per-language vocabulary size")
    parser.add_argument("--labse-random", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, nargs="+", default=[64])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()

    model, vocab = build(args)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    encoder_params = sum(p.numel() for n, p in model.named_parameters() if "embeddings" not in n)
    cuda = args.device.startswith("cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    print(f"model: {'LaBSE-sized random BERT' if args.labse_random else args.base}; "
          f"{encoder_params / 1e6:.1f}M non-embedding parameters; device {args.device}; "
          f"torch threads {torch.get_num_threads()}")
    print("seq_len  variant               tokens/s   ratio" + ("   MFU" if cuda else ""))
    for seq_len in args.seq_len:
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(5, vocab, (args.batch_size, seq_len), generator=generator)
        chosen = torch.rand(ids.shape, generator=generator) < 0.15
        labels = torch.where(chosen, ids, torch.full_like(ids, -100)).to(args.device)
        inputs = torch.where(chosen, torch.full_like(ids, 4), ids).to(args.device)

        def step_masked():
            with autocast:
                loss = mlm_loss(model, inputs, labels)
            loss.backward()

        def step_full():
            with autocast:
                loss = model(input_ids=inputs, labels=labels).loss
            loss.backward()

        results = {}
        for name, step in (("masked positions only", step_masked), ("full-sequence head", step_full)):
            step()  # warm-up
            optimizer.zero_grad(set_to_none=True)
            times = []
            for _ in range(args.steps):
                if cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                step()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if cuda:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            results[name] = args.batch_size * seq_len / statistics.median(times)
        base = results["full-sequence head"]
        for name, tps in results.items():
            line = f"{seq_len:7d}  {name:21s} {tps:9.0f}  {tps / base:6.2f}"
            if cuda:
                cfg = model.get_base_model().config
                flops = 6 * encoder_params + 12 * cfg.num_hidden_layers * cfg.hidden_size * seq_len
                line += f"  {flops * tps / (args.peak_tflops * 1e12):5.1%}"
            print(line)


if __name__ == "__main__":
    main()

"""MLM training throughput of the language-adapter step (tokens/s), measured side by side.

    python benchmarks/mlm_throughput.py                       # the demo base model on the CPU
    python benchmarks/mlm_throughput.py --labse-random --device cuda --seq-len 256 --batch-size 128 --compile
    python benchmarks/mlm_throughput.py --labse-random --device cuda --seq-len 128 256 --batch-size 64
    python benchmarks/mlm_throughput.py --labse-random --device cuda --seq-len 256 --batch-size 128 --graphs --bf16-residual
    python benchmarks/mlm_throughput.py --labse-random --device cuda --seq-len 256 --batch-size 128 --triton --bf16-residual

Compares, in one run and on the same batches, the LA step as modsent runs it (MLM head on the
masked positions only; "fast": modsent.training.fastpath's LoRA and frozen-Linear forwards) with
PEFT's own LoRA forward and the usual full-sequence head (transformers' own MLM loss), and prints
tokens/s and their ratio. Every variant trains what the LA trains (language_adapter.build_model:
LoRA r 8 on query, key and value, the embeddings tied to the decoder, the MLM head) in training
mode, and steps as its loop does (loop.optimizer_step: gradients clipped to norm 1). On a GPU
(--device cuda) it also prints the model FLOPs utilisation (MFU) against the GPU's bf16 peak (--peak-tflops, default 989 for an H100 SXM) in three
conventions: "6N" counts 6N + 12·L·d·s FLOPs per token (N: non-embedding parameters, L layers,
width d, sequence s: the usual dense estimate of training plus attention scores); "4N" counts
4N + 12·L·d·s, the work a frozen body really needs (forward, and the backward through the
activations, but no weight gradients except LoRA's, which are tiny). 6N is what most published
MFU figures use; 4N is 1.5x smaller for the dense part. "+head" adds to 6N the MLM head's
vocabulary projection, which the step also does and N leaves out (its weight is the embeddings):
6·m·d·V per token for the masked share m (15%) of the positions and V words (trained: tied to
the embeddings). The head's transform is in N already, counted at every position.

--labse-random builds a LaBSE-sized BERT (12 layers, hidden 768, 501,153-token vocabulary is
replaced by a 50,000-token per-language vocabulary as in the method) from its config with
random weights: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def build(args, layers: int = 12, labse_vocab: int = 50_000):
    """The LA's model (``--labse-random``: ``layers`` LaBSE-wide layers, ``labse_vocab`` words) in
    training mode on ``args.device``, and its vocabulary size."""
    import transformers
    from peft import LoraConfig, get_peft_model

    if args.labse_random:
        config = transformers.BertConfig(vocab_size=labse_vocab, hidden_size=768, num_hidden_layers=layers,
                                         num_attention_heads=12, intermediate_size=3072,
                                         max_position_embeddings=512)
        config._attn_implementation = "sdpa"
        model = transformers.BertForMaskedLM(config)
        vocab = labse_vocab
    else:
        base = Path(args.base)
        transformers.logging.set_verbosity_error()
        model = transformers.AutoModelForMaskedLM.from_pretrained(str(base), attn_implementation="sdpa")
        vocab = args.vocab
        model.resize_token_embeddings(vocab, mean_resizing=False)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1,
                                             target_modules=["query", "key", "value"]))
    # what the LA trains besides LoRA (language_adapter.build_model): the embeddings (tied to
    # the decoder) and the MLM head; in training mode (dropout), as the LA's loop runs it
    from modsent.losses import mlm_parts

    model.get_input_embeddings().weight.requires_grad_(True)
    for param in mlm_parts(model)[1].parameters():
        param.requires_grad_(True)
    return model.to(args.device).train(), vocab


VARIANTS = {  # name: (MLM head on the masked positions only, bf16 autocast, fused AdamW, fast LoRA)
    "masked, bf16, fused, fast": (True, True, True, True),
    "masked, bf16, fused": (True, True, True, False),
    "masked, bf16": (True, True, False, False),
    "full head, bf16": (False, True, False, False),
    "masked, fp32, fast": (True, False, False, True),
    "masked, fp32": (True, False, False, False),
    "full head, fp32": (False, False, False, False),
}


def variant_table(args, cuda: bool) -> dict:
    """{variant name: (MLM head on the masked positions only, bf16 autocast, fused AdamW, fast LoRA)}
    that these options time on a GPU (``cuda``) or the CPU, in the order they run (gpu.sh's
    ``--only`` names are checked against it: tests/test_gpu_blocks.py)."""
    variants = dict(VARIANTS) if cuda else {name: VARIANTS[name] for name in
                                            ("masked, fp32, fast", "masked, fp32", "full head, fp32")}
    if args.bf16_residual and cuda:
        variants["masked, bf16, fused, fast, bf16 residual"] = (True, True, True, True)
    # modsent's step, the base of the variants below (the CPU's: fp32, foreach AdamW)
    prefix = "masked, bf16, fused, fast" if cuda else "masked, fp32, fast"
    flags = (True, True, True, True) if cuda else (True, False, False, True)
    if args.fused:  # eager products and attention: only the LayerNorm steps compiled, as small functions
        for what in ("fused projections", "fused norms", "fused norms and projections"):
            variants[f"{prefix}, {what}"] = flags
            if args.bf16_residual and cuda:
                variants[f"{prefix}, {what}, bf16 residual"] = flags
    if args.triton:  # the LoRA branches, the residual norms, the MLM loss as Triton kernels; products, attention eager
        for what in ("Triton LoRA", "Triton LoRA alone", "Triton norms", "Triton cross-entropy",
                     "Triton LoRA and norms", "Triton LoRA, norms and cross-entropy"):  # the last: kernels: triton
            variants[f"{prefix}, {what}"] = flags
            if args.bf16_residual and cuda:
                variants[f"{prefix}, {what}, bf16 residual"] = flags
    if args.compile:  # last: it compiles the encoder in place (on the CPU: in fp32, as every CPU variant)
        variants[f"{prefix}, compiled"] = flags
        if args.bf16_residual and cuda:  # both: Inductor fusing a residual stream held in bf16
            variants[f"{prefix}, compiled, bf16 residual"] = flags
        # the attention kept out of the graphs (fastpath.attention_outside_graph): the eager
        # step's attention kernel, Inductor fusing only the element-wise work between the products
        variants[f"{prefix}, compiled, attention outside"] = flags
        if args.bf16_residual and cuda:
            variants[f"{prefix}, compiled, attention outside, bf16 residual"] = flags
    if args.graphs:  # after the compiled ones: the encoder's graphs are recorded in place, kernels as eager
        variants[f"{prefix}, graphs"] = flags
        if args.bf16_residual and cuda:
            variants[f"{prefix}, graphs, bf16 residual"] = flags
    return variants


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What the options' types cannot check (tests/test_gpu_blocks.py runs it on gpu.sh's lines; what
    the device can run, and --only against the variants, main checks)."""
    if (args.compile or args.graphs) and len(args.seq_len) > 1:
        parser.error("--compile and --graphs compile the encoder in place: give one --seq-len")


def main() -> None:
    from modsent.losses import mlm_parts
    from modsent.modular.language_adapter import mlm_loss
    from modsent.training import fastpath
    from modsent.training.loop import optimizer_step
    from modsent.training.optim import step_options

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default=str(REPO / "resources/base_models/me5-small"),
                        help="model directory (default: the demo's converted multilingual-e5-small)")
    parser.add_argument("--vocab", type=int, default=4000, help="per-language vocabulary size")
    parser.add_argument("--labse-random", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, nargs="+", default=[64])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per run, back to back")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of --steps (their median)")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--compile", action="store_true",
                        help="also time modsent's step with the encoder under torch.compile (on the CPU in fp32: a check that it runs)")
    parser.add_argument("--graphs", action="store_true",
                        help="also time modsent's step with the encoder replayed as CUDA graphs and its "
                             "eager kernels (torch.compile's cudagraphs backend, no Inductor): what the "
                             "host's launching costs the step (on the CPU: no graphs, a check that it runs)")
    parser.add_argument("--bf16-residual", action="store_true",
                        help="also time modsent's step with the residual stream in bf16 (language_adapter."
                             "residual_stream: bf16; other numerics: fastpath.bf16_residual_stream)")
    parser.add_argument("--fused", action="store_true",
                        help="also time modsent's step with one product for each attention's query, key and value "
                             "(fastpath.fuse_projections), with dropout, residual add and LayerNorm compiled into "
                             "one kernel each way (fastpath.fuse_residual_norms), and with both (each with the "
                             "bf16 stream where --bf16-residual)")
    parser.add_argument("--triton", action="store_true",
                        help="also time modsent's step with each LoRA layer's dropout drawn inside its products "
                             "(fastpath.fuse_lora_dropout: an attention's query, key and value through one kernel "
                             "each way, and 'Triton LoRA alone': each layer through its own), with each dropout + "
                             "residual add + LayerNorm as one "
                             "kernel each way (fastpath.fuse_residual_norms(kernel='triton')), with the MLM loss's "
                             "cross-entropy as one kernel each way (fastpath.fuse_cross_entropy), with the first two "
                             "and with all three (language_adapter.kernels: triton): "
                             "Triton kernels (a GPU, or the CPU in Triton's interpreter, no speed there); with the "
                             "bf16 stream where --bf16-residual")
    parser.add_argument("--only", nargs="+", metavar="VARIANT",
                        help="time only these variants (and the unoptimised one the ratios need)")
    args = parser.parse_args()
    check_options(parser, args)

    if args.triton:
        if not args.device.startswith("cuda"):
            os.environ.setdefault("TRITON_INTERPRET", "1")  # the CPU: Triton's interpreter, before Triton is imported
        from modsent.training import kernels

        if not kernels.runs_on(args.device):
            parser.error(f"--triton: Triton's kernels cannot run on {args.device} here (Triton installed? on the "
                         f"CPU, TRITON_INTERPRET=1 before Triton is imported)")
    cuda = args.device.startswith("cuda")
    variants = variant_table(args, cuda)
    if args.only:
        unknown = set(args.only) - set(variants)
        if unknown:
            parser.error(f"--only: no variant {sorted(unknown)} here; the variants: {sorted(variants)}")
        variants = {name: flags for name, flags in variants.items() if name in args.only or name == "full head, fp32"}
    model, vocab = build(args)
    params = [p for p in model.parameters() if p.requires_grad]
    encoder_params = sum(p.numel() for n, p in model.named_parameters() if "embeddings" not in n)
    name_gpu = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"model: {'LaBSE-sized random BERT' if args.labse_random else args.base}; "
          f"{encoder_params / 1e6:.1f}M non-embedding parameters; vocabulary {vocab}; device {args.device} "
          f"({name_gpu}); torch {torch.__version__}; threads {torch.get_num_threads()}; batch {args.batch_size}")
    print("ratio: against the unoptimised step (full-sequence head, fp32, foreach AdamW) in the same run")
    print(f"seq_len  {'variant':72s}  tokens/s   ratio" + ("  MFU 6N  MFU 4N   +head  peak GiB" if cuda else ""))
    for seq_len in args.seq_len:
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(5, vocab, (args.batch_size, seq_len), generator=generator)
        chosen = torch.rand(ids.shape, generator=generator) < 0.15
        share = float(chosen.float().mean())  # the masked positions' share, for the head's FLOPs
        host_labels = torch.where(chosen, ids, torch.full_like(ids, -100))  # the LA's: on the CPU
        labels = host_labels.to(args.device)
        inputs = torch.where(chosen, torch.full_like(ids, 4), ids).to(args.device)

        def row(name: str, tps: float, peak: float | None, base: float) -> str:
            line = f"{seq_len:7d}  {name:72s} {tps:9.0f}  {tps / base:6.2f}"
            if cuda:
                cfg = model.get_base_model().config
                attention = 12 * cfg.num_hidden_layers * cfg.hidden_size * seq_len
                peak_flops = args.peak_tflops * 1e12
                # +head: 6N plus the vocabulary projection on the masked positions (trained: tied
                # to the embeddings, so outside N; the head's transform is in N at every position)
                head = 6 * share * cfg.hidden_size * vocab
                line += (f"  {(6 * encoder_params + attention) * tps / peak_flops:6.1%}"
                         f"  {(4 * encoder_params + attention) * tps / peak_flops:6.1%}"
                         f"  {(6 * encoder_params + attention + head) * tps / peak_flops:6.1%}  {peak:8.1f}")
            return line

        # the unoptimised step first, so that each variant's row prints as soon as it is measured
        # (a compiled or graphs variant that crashes the process loses only the rows after it)
        order = ["full head, fp32"] + [name for name in variants if name != "full head, fp32"]
        base = None
        for name in order:
            masked, bf16, fused, fast = variants[name]
            if fast:
                fastpath.speed_up(model)
            else:
                fastpath.restore(model)
            fastpath.bf16_residual_stream(model, "bf16 residual" in name)  # language_adapter.residual_stream
            fastpath.fuse_projections(model, fast and "projections" in name)
            # "alone": each LoRA layer's own kernels, else an attention's query, key and value together
            fastpath.fuse_lora_dropout(model, fast and "Triton LoRA" in name, shared_input="LoRA alone" not in name)
            fastpath.fuse_cross_entropy(mlm_parts(model)[1], fast and "cross-entropy" in name)
            if "Triton" in name and "norms" in name:
                fastpath.fuse_residual_norms(model, args.device, "--triton", kernel="triton")
            else:
                fastpath.fuse_residual_norms(model, args.device, "--fused", "fused norms" in name)
            fastpath.attention_outside_graph(mlm_parts(model)[0], "attention outside" in name)
            graphs = "graphs" in name
            optimizer = torch.optim.AdamW(params, lr=1e-4, **(step_options(params) if fused else {}))
            autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and cuda
                        else torch.autocast(args.device.split(":")[0], enabled=False))

            def step():
                if graphs:  # a new step: the graphs' outputs of the last one are no longer read
                    torch.compiler.cudagraph_mark_step_begin()
                with autocast:
                    loss = (mlm_loss(model, inputs, host_labels) if masked
                            else model(input_ids=inputs, labels=labels).loss)
                loss.backward()
                optimizer_step(optimizer, params, 1.0)  # the LA's: clip to norm 1, step, clear

            try:
                if "compiled" in name:
                    torch._dynamo.reset()  # a compiled variant after another traces the model as it is now
                    # as the LA trains with language_adapter.compile: the encoder itself (mlm_loss
                    # calls it directly, then the head on the masked positions)
                    fastpath.compile_in_place(mlm_parts(model)[0], args.device, "--compile")
                if graphs:  # the same encoder, its eager kernels recorded once and replayed (one shape)
                    torch._dynamo.reset()
                    torch._dynamo.utils.counters.clear()
                    mlm_parts(model)[0].compile(backend="cudagraphs", dynamic=False)
                if cuda and graphs:  # the graphs' memory pool is allocated while they are recorded
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                for _ in range(2 if not ("compiled" in name or graphs or "fused norms" in name) else 3):  # warm-up (compilation, recording)
                    step()
                if cuda:
                    torch.cuda.synchronize()
                    if not graphs:
                        torch.cuda.reset_peak_memory_stats()
                if graphs:  # the backend runs the graph eagerly where it cannot record it: say so
                    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
                    if skips or not cuda:
                        print(f"# {name}: no CUDA graphs ({'the CPU' if not cuda else f'{skips} skipped'}): "
                              f"the row is the traced step run eagerly", flush=True)
                # the timed steps back to back with one wait at the end, as the LA's loop runs them
                # (it never waits for the GPU between steps): the host queues a step while the GPU
                # runs the one before; the median of --repeats such runs
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    for _ in range(args.steps):
                        step()
                    if cuda:
                        torch.cuda.synchronize()
                    times.append((time.perf_counter() - start) / args.steps)
            except Exception as err:  # noqa: BLE001 (a compiled variant failing loses its row, not the run's)
                if base is None:
                    raise
                print(f"{seq_len:7d}  {name:72s} failed: {type(err).__name__}: {str(err)[:300]}", flush=True)
                continue
            peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
            tps = args.batch_size * seq_len / statistics.median(times)
            base = base or tps
            print(row(name, tps, peak, base), flush=True)


if __name__ == "__main__":
    main()

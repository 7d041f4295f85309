"""What torch.compile makes of the LA's encoder: the graphs, the attention kernel, the products'
dtypes and what each graph keeps for the backward, beside the eager step's.

    python -m benchmarks.la_graphs                              # the CPU, a 2-layer LaBSE-wide body
    python -m benchmarks.la_graphs --device cuda --layers 12 --batch-size 128 --seq-len 256

On an H200 the LA step compiled whole ran at 0.70-0.83x the eager step, compiled with its
attention kept out of the graphs at 0.46x and replayed as CUDA graphs of its eager kernels at
0.45x, the last two holding 24 GiB against the eager step's 12.7
(benchmarks/results/README.md). The compiled step's profile showed the attention computed by
its decomposition (``bmm`` and a softmax) with 24 fp32 products a step, a reading of kernel
names. This script reads the graphs themselves: it traces the encoder as the LA compiles it
(``fastpath.compile_in_place``'s settings, the LA's model, LoRA and training mode, bf16 autocast
on a GPU and the CPU), with a backend that keeps AOTAutograd's forward and backward ATen graphs
(the ones Inductor or the CUDA-graphs backend would be given) and runs them as they are, and
prints for each variant:

- ``graphs``: forward graphs (more than one: graph breaks);
- ``attention``: the attention operators in the forward graphs (``_scaled_dot_product_cudnn_attention``,
  ``_flash_``, ``_efficient_``, or ``math`` where the graph holds ``bmm`` and a softmax instead);
- ``products``: the matrix products (``mm``, ``addmm``, ``bmm``) forward and backward, by input dtype;
- ``kept MiB``: what the forward graphs keep for the backward (their outputs beyond the encoder's
  own), by dtype, each graph once (with the attention outside, one graph serves every layer:
  its bytes are one layer's); for the eager step, the tensors autograd saves
  (``saved_tensors_hooks``, each storage once).

Variants: ``eager``; ``compiled`` (the encoder whole); ``compiled, no cuDNN attention`` (traced
inside ``fastpath.attention_for_varying_shapes``, which leaves flash and memory-efficient
attention to SDPA); ``compiled, attention outside`` (``fastpath.attention_outside_graph``);
``compiled, no attention dropout`` (not the LA's: the attention probabilities' dropout set to 0,
to see whether the dropout is what makes the graph decompose the attention); each also with
``--bf16-residual``'s stream when given. Nothing is timed: ``mlm_throughput.py`` times.
"""

from __future__ import annotations

import argparse
import collections
import contextlib

import torch

ATTENTION_OPS = ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention", "_flash_attention_forward",
                 "_efficient_attention_forward", "_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_fused_attention_overrideable")


def mib(counter: collections.Counter) -> str:
    return ", ".join(f"{dtype.removeprefix('torch.')} {size / 2**20:.1f}" for dtype, size in sorted(counter.items())) or "-"


def saved_storage(run, skip: frozenset = frozenset()) -> collections.Counter:
    """Bytes by dtype of what ``run()`` saves for its backward (autograd's saved tensors, each
    storage once), besides the storages whose data pointers are in ``skip``."""
    saved, seen = collections.Counter(), set()

    def pack(tensor):
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), tensor.dtype)
        if key not in seen and storage.data_ptr() not in skip:
            seen.add(key)
            saved[str(tensor.dtype)] += storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return saved


def graph_facts(graphs: dict) -> dict:
    """The attention operators, products by input dtype and kept bytes of captured AOT graphs."""
    attention, products, kept = collections.Counter(), collections.Counter(), collections.Counter()
    for kind in ("fw", "bw"):
        for gm in graphs[kind]:
            softmax = bmm = 0
            for node in gm.graph.nodes:
                if node.op != "call_function":
                    continue
                name = str(node.target).removeprefix("aten.").split(".")[0]
                if kind == "fw" and name in ATTENTION_OPS:
                    attention[name] += 1
                softmax += "softmax" in name
                if name in ("mm", "addmm", "bmm"):
                    bmm += name == "bmm"
                    dtypes = sorted({str(arg.meta["val"].dtype).removeprefix("torch.") for arg in node.args
                                     if hasattr(arg, "meta") and isinstance(arg.meta.get("val"), torch.Tensor)})
                    products[f"{kind} {name} {'/'.join(dtypes)}"] += 1
            if kind == "fw" and softmax and bmm:
                attention["math (bmm + softmax)"] += softmax
    for gm, outputs in zip(graphs["fw"], graphs["fw_user_outputs"]):
        out = [node for node in gm.graph.nodes if node.op == "output"][0].args[0]
        for node in out[outputs:]:  # AOTAutograd's forward returns the user outputs, then what it keeps
            value = node.meta.get("val") if hasattr(node, "meta") else None
            if isinstance(value, torch.Tensor):
                kept[str(value.dtype)] += value.numel() * value.element_size()
    return {"graphs": len(graphs["fw"]), "attention": attention, "products": products, "kept": kept}


def main() -> None:
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from benchmarks import mlm_throughput
    from modsent.losses import mlm_parts
    from modsent.modular.language_adapter import mlm_loss
    from modsent.training import fastpath

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=5000)
    parser.add_argument("--bf16-residual", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    model, _ = mlm_throughput.build(argparse.Namespace(labse_random=True, device=args.device),
                                    layers=args.layers, labse_vocab=args.vocab)
    fastpath.speed_up(model)
    fastpath.bf16_residual_stream(model, args.bf16_residual)
    encoder = mlm_parts(model)[0]
    kind = args.device.split(":")[0]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, args.vocab, (args.batch_size, args.seq_len), generator=generator)
    chosen = torch.rand(ids.shape, generator=generator) < 0.15
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    inputs = torch.where(chosen, torch.full_like(ids, 4), ids).to(args.device)

    def step():
        with torch.autocast(kind, dtype=torch.bfloat16):
            loss = mlm_loss(model, inputs, labels)
        loss.backward()
        model.zero_grad(set_to_none=True)

    print(f"LaBSE-wide random BERT, {args.layers} layers, batch {args.batch_size} x {args.seq_len}, device "
          f"{args.device}, torch {torch.__version__}, bf16 autocast"
          f"{', bf16 residual stream' if args.bf16_residual else ''}")

    print(f"\n== eager: kept MiB {mib(saved_storage(step))}")

    attention_dropouts = [module for name, module in encoder.named_modules()
                          if name.endswith("attention.self") and isinstance(getattr(module, "dropout", None), torch.nn.Dropout)]
    rate = attention_dropouts[0].dropout.p
    for variant in ("compiled", "compiled, no cuDNN attention", "compiled, attention outside",
                    "compiled, no attention dropout"):
        graphs = {"fw": [], "bw": [], "fw_user_outputs": []}

        def forward_compiler(gm, example_inputs):
            graphs["fw"].append(gm)
            return make_boxed_func(gm.forward)

        def backward_compiler(gm, example_inputs):
            graphs["bw"].append(gm)
            return make_boxed_func(gm.forward)

        def partition(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
            from torch._functorch.partitioners import default_partition

            graphs["fw_user_outputs"].append(num_fwd_outputs)
            return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

        torch._dynamo.reset()
        fastpath.attention_outside_graph(encoder, "outside" in variant)
        for module in attention_dropouts:  # not the LA's: whether the attention's dropout decides the kernel
            module.dropout.p = 0.0 if "no attention dropout" in variant else rate
        # the LA's compile (fastpath.compile_in_place: static shapes), with a backend that keeps the graphs
        encoder.compile(backend=aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler,
                                             partition_fn=partition), dynamic=False)
        context = fastpath.attention_for_varying_shapes() if "no cuDNN" in variant else contextlib.nullcontext()
        with context:
            step()
        facts = graph_facts(graphs)
        print(f"\n== {variant}: graphs {facts['graphs']}; attention "
              f"{dict(facts['attention']) or 'none in the graphs'}; kept MiB {mib(facts['kept'])}")
        for name, count in sorted(facts["products"].items()):
            print(f"   {count:4d}  {name}")
        encoder._compiled_call_impl = None  # nn.Module.compile's wrapper gone: the next variant compiles anew
    fastpath.attention_outside_graph(encoder, False)


if __name__ == "__main__":
    main()

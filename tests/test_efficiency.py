"""modsent.training.efficiency: the model FLOPs the stages record, against PyTorch's own FLOP
counter (torch.utils.flop_counter), the device peaks, and the counts TrainingLog keeps."""

import pytest
import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

from modsent.losses import MaskedLanguageModelingLoss, mlm_parts
from modsent.training import efficiency
from modsent.training.loop import TrainingLog

CONFIG = dict(vocab_size=3000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=512, max_position_embeddings=256)


def counted(run) -> int:
    """FLOPs of ``run()`` (its forward and backward), as PyTorch's counter sees its products."""
    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()


@pytest.mark.parametrize("lengths", [[7, 19, 100], [256]])
def test_the_encoder_count_is_what_the_flop_counter_counts_for_a_trained_body(lengths):
    torch.manual_seed(0)
    config = transformers.BertConfig(**CONFIG, attn_implementation="eager")  # its products are counted
    model = transformers.BertModel(config, add_pooling_layer=False)

    def run():  # every sequence alone: no padding, each its own length
        for s in lengths:
            model(input_ids=torch.randint(5, 3000, (1, s))).last_hidden_state.sum().backward()

    shape = efficiency.body_shape(model)
    assert shape[1:] == (2, 128)
    ours = efficiency.encoder_flops(shape, sum(lengths), sum(s * s for s in lengths))
    # N holds the biases and LayerNorms too, which no product computes: 13 of 12·d + 13 per d²
    assert counted(run) == pytest.approx(ours, rel=0.015)
    assert counted(run) < ours
    # the attention's share is what a count without it misses
    assert efficiency.encoder_flops(shape, sum(lengths), 0) < 0.97 * counted(run)


def test_a_t5_encoder_counts_its_attention_width_and_no_lookup_tables():
    """m-ST5's body: T5's shared embeddings and relative position biases are lookups, and its
    attention is d_kv x num_heads wide, which in mT5-small (64 x 6 of 512) is not d_model."""
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=3000, d_model=96, d_kv=16, num_heads=4, d_ff=192, num_layers=2,
                                   feed_forward_proj="gated-gelu", relative_attention_num_buckets=8,
                                   dropout_rate=0.0, attn_implementation="eager")
    model = transformers.T5EncoderModel(config)
    lengths = [9, 40, 120]

    def run():
        for s in lengths:
            model(input_ids=torch.randint(5, 3000, (1, s))).last_hidden_state.sum().backward()

    shape = efficiency.body_shape(model)
    assert shape[1:] == (2, 64)
    lookups = model.shared.weight.numel() + model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.numel()
    assert shape[0] == sum(p.numel() for p in model.parameters()) - lookups
    # its first block only: block 1's weights left out, by the block's index, not its sub-layer's
    second = sum(p.numel() for name, p in model.named_parameters() if name.startswith("encoder.block.1."))
    assert efficiency.body_shape(model, 1) == (shape[0] - second, 1, 64)
    ours = efficiency.encoder_flops(shape, sum(lengths), sum(s * s for s in lengths))
    assert 0.99 * ours < counted(run) <= ours  # the LayerNorms' weights are in N: T5 has no biases
    # the model's width in the attention term would count more than the counter sees
    wide = efficiency.encoder_flops((shape[0], 2, 96), sum(lengths), sum(s * s for s in lengths))
    assert counted(run) < 0.99 * wide


def test_the_la_count_adds_the_head_on_the_masked_positions_only():
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(transformers.BertConfig(**CONFIG, attn_implementation="eager"))
    ids = torch.randint(5, 3000, (4, 64))
    labels = torch.full_like(ids, -100)
    chosen = torch.rand(ids.shape) < 0.15
    labels[chosen] = ids[chosen]
    masked = int(chosen.sum())

    def run():
        MaskedLanguageModelingLoss()(model, ids, labels).backward()

    encoder, head = mlm_parts(model)
    ours = (efficiency.encoder_flops(efficiency.body_shape(encoder), ids.numel(), ids.numel() * 64)
            + efficiency.mlm_head_flops(head, masked))
    assert counted(run) == pytest.approx(ours, rel=0.015)
    # the head counted at every position would be 6x too many for it
    assert efficiency.mlm_head_flops(head, ids.numel()) > 3 * (ours - efficiency.encoder_flops(
        efficiency.body_shape(encoder), ids.numel(), ids.numel() * 64))


def test_body_shape_counts_lora_once_and_leaves_out_embeddings_and_the_pooler():
    from peft import LoraConfig, get_peft_model

    model = transformers.BertModel(transformers.BertConfig(**CONFIG))  # with its pooler
    body = sum(p.numel() for name, p in model.named_parameters()
               if not name.startswith(("embeddings.", "pooler.")))
    assert efficiency.body_shape(model) == (body, 2, 128)
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["query", "value"]))
    added = sum(p.numel() for name, p in lora.named_parameters() if "lora_" in name)
    assert added == 2 * 2 * 4 * (128 + 128)
    assert efficiency.body_shape(lora) == (body + added, 2, 128)
    with pytest.raises(ValueError, match="no transformers model"):
        efficiency.body_shape(torch.nn.Linear(3, 3))
    # the first layer only (a vector read below the top): the second layer's weights and LoRA left out
    second = sum(p.numel() for name, p in lora.named_parameters() if ".layer.1." in name)
    assert efficiency.body_shape(lora, 1) == (body + added - second, 1, 128)
    with pytest.raises(ValueError, match="3 of a 2-layer"):
        efficiency.body_shape(model, 3)


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.5), ("NVIDIA H100 NVL", 835.5),
    ("NVIDIA H200", 989.4), ("NVIDIA H200 NVL", 835.5), ("NVIDIA GH200 480GB", 989.4),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100 80GB PCIe", 312.0), ("NVIDIA A10", 125.0),
    ("NVIDIA L40S", 362.05), ("NVIDIA L40", 181.05), ("NVIDIA L4", 121.0), ("NVIDIA B200", 2250.0),
    ("Tesla V100-SXM2-32GB", 125.0), ("Tesla V100-PCIE-32GB", 112.0), ("Tesla T4", 65.0),
    ("NVIDIA GB200", 2500.0), ("NVIDIA A30", 165.0), ("AMD Instinct MI300X", 1307.4),
    ("NVIDIA A10G", None), ("NVIDIA GeForce RTX 4090", None), ("NVIDIA H20", None),
])
def test_the_peak_table_tells_similar_names_apart(name, peak):
    assert efficiency.peak_of_name(name)[0] == peak


def test_an_unknown_gpu_has_no_peak_unless_the_environment_gives_one(monkeypatch):
    value, why = efficiency.peak_of_name("NVIDIA RTX 6000 Ada Generation")
    assert value is None and efficiency.PEAK_ENV in why
    assert efficiency.peak_tflops("cpu") == (None, "no GPU")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA RTX 6000 Ada Generation")
    assert efficiency.peak_tflops("cuda:0")[0] is None
    monkeypatch.setenv(efficiency.PEAK_ENV, "364.2")
    assert efficiency.peak_tflops("cuda:0") == (364.2, efficiency.PEAK_ENV)
    for bad in ("fast", "0", "-3", "nan"):
        monkeypatch.setenv(efficiency.PEAK_ENV, bad)
        with pytest.raises(ValueError, match=efficiency.PEAK_ENV):
            efficiency.peak_tflops("cuda:0")


def test_run_figures_divide_by_the_seconds_processes_and_peak(monkeypatch):
    cpu = efficiency.run_figures(6e12, 2.0, "cpu")
    assert cpu == {"model_flops": 6e12, "model_tflops_per_second": 3.0, "mfu": None, "peak_tflops": None,
                   "gpu_peak_memory_gib": None}
    assert efficiency.describe(cpu) == "3 model TFLOP/s"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2 ** 30)
    gpu = efficiency.run_figures(989.4e12 * 8, 10.0, "cuda", processes=2)  # 4 s of the peak a GPU
    assert gpu["mfu"] == pytest.approx(0.4) and gpu["gpu_peak_memory_gib"] == 3.0
    assert efficiency.describe(gpu) == "396 model TFLOP/s (40.0% MFU of 989.4, peak 3.0 GiB)"
    assert efficiency.run_figures(1.0, 0.0, "cpu")["model_tflops_per_second"] is None
    nothing = efficiency.run_figures(0.0, 3.0, "cuda")  # a run resumed at its end: no rate, no MFU
    assert nothing["model_tflops_per_second"] is None and nothing["mfu"] is None


def test_the_training_log_counts_real_tokens_and_their_sequences_squares():
    log = TrainingLog(3, 0, "test", False, 10)
    masks = [torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]), torch.tensor([[1, 1], [1, 1], [1, 0]])]
    log.record(0, 1.0, 0.1, 2, {"attention_mask": masks[0]})
    log.record(1, 1.0, 0.1, 3, [{"attention_mask": masks[1]}, {"input_ids": torch.ones(2, 2)}])
    log.count_padding(torch.tensor([1, 1, 1]))  # a bare mask of one sequence
    lengths = [3, 1, 2, 2, 1, 3]
    assert (log.tokens, log.token_squares) == (sum(lengths), sum(s * s for s in lengths))
    assert log.padded == 8 + 6 + 3 - sum(lengths) and log.positions == 17
    model = transformers.BertModel(transformers.BertConfig(**CONFIG))
    shape = efficiency.start(model, "cpu")
    assert shape == efficiency.body_shape(model)
    figures = log.efficiency(shape, 2.0, "cpu")
    assert figures["model_flops"] == efficiency.encoder_flops(shape, 12, 28)
    log.close()


def test_a_stage_start_checks_the_environment_and_the_model_before_any_step(monkeypatch):
    monkeypatch.setenv(efficiency.PEAK_ENV, "fast")
    with pytest.raises(ValueError, match=efficiency.PEAK_ENV):
        efficiency.start(transformers.BertModel(transformers.BertConfig(**CONFIG)), "cpu")
    monkeypatch.delenv(efficiency.PEAK_ENV)
    with pytest.raises(ValueError, match="no transformers model"):
        efficiency.start(torch.nn.Linear(2, 2), "cpu")

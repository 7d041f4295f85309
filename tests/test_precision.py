"""Mixed precision (modsent.training.precision): what runs where, fp16's loss scaler in the shared
optimizer step, and the scaler's state in checkpoints. fp16 runs on the CPU here by forcing
``resolve``: CPU autocast and GradScaler do what they do on a GPU, more slowly."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from conftest import simulated_gpus
from modsent.schema import PRECISIONS, load_schema
from modsent.training import checkpoints, precision
from modsent.training.loop import TrainingLog, optimizer_step


def test_resolve_says_what_runs_on_each_device(monkeypatch):
    for name in PRECISIONS:
        assert precision.resolve("cpu", name) == "fp32"  # never CPU autocast
        assert isinstance(precision.autocast("cpu", name), contextlib.nullcontext)
        assert not precision.grad_scaler("cpu", name).is_enabled()
    for has_bf16, auto in ((True, "bf16"), (False, "fp16")):  # A100/H100; V100/T4
        simulated_gpus(monkeypatch, [has_bf16, has_bf16])
        for device in ("cuda", "cuda:1", torch.device("cuda", 0)):
            assert precision.resolve(device, "auto") == auto
            assert precision.resolve(device, "fp16") == "fp16"
            assert precision.resolve(device, "fp32") == "fp32"
    # a node of mixed GPUs (an A100 as GPU 0, a V100 as GPU 1): each device is asked about itself
    simulated_gpus(monkeypatch, [True, False])
    assert [precision.resolve(d, "auto") for d in ("cuda", "cuda:0", "cuda:1", torch.device("cuda", 1))] == \
        ["bf16", "bf16", "fp16", "fp16"]
    with pytest.raises(ValueError, match="precision must be one of auto, fp16, fp32"):
        precision.resolve("cuda", "bf16")
    assert load_schema()["$defs"]["precision"]["enum"] == list(PRECISIONS)


def test_the_first_scaler_of_a_process_logs_where_and_how_it_trains(monkeypatch, caplog):
    """Each training loop makes its scaler before its first step: the job's log says once per
    device and precision where it trains, so a job that asked for a GPU and ran on the CPU shows."""
    monkeypatch.setattr(precision, "_DESCRIBED", set())
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    with caplog.at_level("INFO", logger="modsent.training.precision"):
        precision.grad_scaler("cpu", "auto")
        precision.grad_scaler("cpu", "fp32")  # the same device and precision: not again
    assert [r.getMessage() for r in caplog.records] == ["training on cpu (3 threads) in fp32"]
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert precision.describe_device("cpu") == "cpu (1 thread)"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"GPU number {index}")
    assert precision.describe_device("cuda") == "cuda:0 (GPU number 0)"
    assert precision.describe_device(torch.device("cuda", 1)) == "cuda:1 (GPU number 1)"


def test_work_goes_to_the_gpu_unless_a_device_is_given(monkeypatch):
    for available, default in ((False, "cpu"), (True, "cuda")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda v=available: v)
        assert precision.default_device() == precision.default_device(None) == default
        assert precision.default_device("cpu") == "cpu"
        assert precision.default_device(torch.device("cuda", 1)) == torch.device("cuda", 1)


def test_t5_bodies_stay_out_of_fp16_under_auto(monkeypatch, caplog):
    """mT5 overflows in fp16: where auto would run fp16 (a GPU without bf16), m-ST5 trains in
    fp32; elsewhere, and for other bodies, the precision is the config's."""
    import transformers

    t5 = transformers.T5EncoderModel(transformers.T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32,
                                                           num_layers=1, num_heads=2))
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=32))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    with caplog.at_level("WARNING"):
        assert precision.for_model(t5, "cuda", "auto") == "fp32"
    assert "t5 overflows in fp16; fp32 instead" in caplog.text
    assert precision.for_model(t5, "cuda", "fp16") == "fp16"  # asked for: kept, with a warning
    assert precision.for_model(bert, "cuda", "auto") == "auto"
    assert precision.for_model(t5, "cpu", "auto") == "auto"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert precision.for_model(t5, "cuda", "auto") == "auto"


@pytest.fixture
def fp16(monkeypatch):
    """``fp16`` runs fp16 with its scaler on the CPU, as on a GPU; the other precisions as before."""
    resolve = precision.resolve
    monkeypatch.setattr(precision, "resolve", lambda device, name="auto": "fp16" if name == "fp16" else resolve(device, name))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def _train(name: str, steps: int = 30) -> tuple[list[float], torch.nn.Module, torch.amp.GradScaler]:
    model = _model()
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    scaler = precision.grad_scaler("cpu", name)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 16, generator=generator), torch.randint(4, (64,), generator=generator)
    losses = []
    for _ in range(steps):
        with precision.autocast("cpu", name):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()
        optimizer_step(optimizer, params, 1.0, scaler)
        losses.append(loss.item())
    return losses, model, scaler


def test_fp16_with_the_scaler_trains_like_fp32(fp16):
    half, _, scaler = _train("fp16")
    full, _, off = _train("fp32")
    assert scaler.is_enabled() and not off.is_enabled()
    assert scaler.get_scale() == 2.0 ** 16  # no overflow in 30 steps, growth after 2,000
    assert full[-1] < 0.5 * full[0] and half[-1] < 0.5 * half[0]
    assert max(abs(a - b) for a, b in zip(half, full)) < 0.02
    assert half != full  # fp16 really ran


def _scaled_gradients_of_three():
    """A model whose every gradient is 3 times fp16's starting scale, as backward through the
    scaler leaves a gradient of 3: (parameters, AdamW, scaler, the parameters' values)."""
    params = list(_model().parameters())
    scaler = precision.grad_scaler("cpu", "fp16")
    for p in params:
        p.grad = torch.full_like(p, 3.0) * scaler.get_scale()
    return params, torch.optim.AdamW(params, lr=1e-2), scaler, [p.detach().clone() for p in params]


def test_a_step_whose_gradients_overflow_is_skipped_and_the_scale_lowered(fp16):
    """GradScaler's definition: gradients unscaled before clipping; inf/nan in any of them skips
    the optimizer step and halves the scale; otherwise the step is AdamW's on the true gradients."""
    params, optimizer, scaler, before = _scaled_gradients_of_three()
    params[0].grad[0, 0] = float("inf")
    optimizer_step(optimizer, params, 1.0, scaler)
    assert all(torch.equal(p, q) for p, q in zip(params, before)) and all(p.grad is None for p in params)
    assert scaler.get_scale() == 2.0 ** 15

    reference = _model()  # the same step by hand: unscaled gradients, clipped to norm 1, AdamW
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    for p, q in zip(params, reference.parameters()):
        p.grad = torch.full_like(p, 3.0) * scaler.get_scale()
        q.grad = torch.full_like(q, 3.0)
    torch.nn.utils.clip_grad_norm_(list(reference.parameters()), 1.0)
    reference_optimizer.step()
    optimizer_step(optimizer, params, 1.0, scaler)
    assert all(torch.allclose(p, q) for p, q in zip(params, reference.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(params, before))


def test_a_process_with_no_share_of_a_batch_steps_with_the_others(fp16):
    """Data-parallel: a process that had no text in a tiny batch scales no loss; the all-reduce
    gives it the others' scaled gradients (modsent.distributed.average_gradients), and it
    unscales and steps with them (its scale exists from the start, not from its first loss)."""
    params, optimizer, scaler, before = _scaled_gradients_of_three()
    optimizer_step(optimizer, params, 1.0, scaler)
    assert not any(torch.equal(p, q) for p, q in zip(params, before)) and scaler.get_scale() == 2.0 ** 16


def test_checkpoints_keep_the_scale_of_an_fp16_run(fp16, tmp_path):
    model = _model()
    for p in model.parameters():
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = precision.grad_scaler("cpu", "fp16")
    scaler.update(new_scale=1024.0)
    checkpoints.save_checkpoint(tmp_path / "half", model, optimizer, 7, "fp", {"losses": []}, scaler)
    assert json.loads((tmp_path / "half" / checkpoints.META).read_text())["scaler"]["scale"] == 1024.0
    again = precision.grad_scaler("cpu", "fp16")
    resumed = checkpoints.resume(tmp_path / "half", model, optimizer, "fp", again)
    assert resumed["step"] == 7 and again.get_scale() == 1024.0

    off = precision.grad_scaler("cpu", "fp32")  # bf16/fp32: nothing saved, nothing restored
    checkpoints.save_checkpoint(tmp_path / "full", model, optimizer, 7, "fp", {"losses": []}, off)
    assert "scaler" not in json.loads((tmp_path / "full" / checkpoints.META).read_text())
    fresh = precision.grad_scaler("cpu", "fp16")  # an fp16 run resuming a checkpoint without a scale
    checkpoints.resume(tmp_path / "full", model, optimizer, "fp", fresh)
    assert fresh.get_scale() == 2.0 ** 16

    # MEXMA's earlier checkpoints kept the scale in their progress
    checkpoints.save_checkpoint(tmp_path / "mexma", model, optimizer, 7, "fp", {"scaler": {**scaler.state_dict(), "scale": 512.0}})
    earlier = precision.grad_scaler("cpu", "fp16")
    checkpoints.resume(tmp_path / "mexma", model, optimizer, "fp", earlier)
    assert earlier.get_scale() == 512.0


def test_a_checkpoint_keeps_the_gpu_generator_where_cuda_runs(monkeypatch, tmp_path):
    """On a GPU dropout draws from the device's generator: a checkpoint saves its state and a
    resume restores it (CUDA stood in for on the CPU; the GPU test below resumes real dropout)."""
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # (a GPU machine's tests may have started CUDA)
    checkpoints.save_checkpoint(tmp_path / "cpu", model, optimizer, 3, "fp", {})
    from safetensors.torch import load_file

    assert "rng/cuda" not in load_file(str(tmp_path / "cpu" / checkpoints.STATE))  # no CUDA: none
    state = torch.arange(16, dtype=torch.uint8)
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": state.clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda value, device="cuda": restored.append(value))
    checkpoints.save_checkpoint(tmp_path / "gpu", model, optimizer, 3, "fp", {})
    assert checkpoints.resume(tmp_path / "gpu", model, optimizer, "fp")["step"] == 3
    assert len(restored) == 1 and torch.equal(restored[0], state)
    checkpoints.resume(tmp_path / "cpu", model, optimizer, "fp")  # a checkpoint made without CUDA: nothing to restore
    assert len(restored) == 1


def _resume_fused(device: str, tmp_path) -> None:
    """AdamW's step counts come back where the optimizer keeps them: with fused AdamW (modsent's
    on GPUs) on the parameters' device in float32, and the resumed optimizer steps."""
    model = _model().to(device)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-2, fused=True)
    model(torch.randn(4, 16, device=device)).sum().backward()
    optimizer.step()
    checkpoints.save_checkpoint(tmp_path / "fused", model, optimizer, 1, "fp", {})
    again = torch.optim.AdamW(params, lr=1e-2, fused=True)
    checkpoints.resume(tmp_path / "fused", model, again, "fp")
    for param in params:
        step = again.state[param]["step"]
        assert step.device == param.device and step.dtype == torch.float32 and step.item() == 1
    model(torch.randn(4, 16, device=device)).sum().backward()
    again.step()
    assert all(again.state[p]["step"].item() == 2 for p in params)


def test_a_weight_frozen_since_the_checkpoint_gets_no_moments(tmp_path):
    """A checkpoint made while every weight trained, resumed by a run that trains fewer (DuEAM's
    unused pooler, frozen since): the optimizer gets moments for its own parameters only, so it
    neither saves stale ones again nor fails to describe its state."""
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    checkpoints.save_checkpoint(tmp_path / "all", model, optimizer, 1, "fp", {})
    model[2].requires_grad_(False)
    trained = [p for p in model.parameters() if p.requires_grad]
    again = torch.optim.AdamW(trained, lr=1e-2)
    assert checkpoints.resume(tmp_path / "all", model, again, "fp")["step"] == 1
    assert set(map(id, again.state)) == set(map(id, trained))
    assert len(again.state_dict()["state"]) == len(trained)


def test_fused_adamw_resumes_with_its_step_counts_on_the_parameters_device(tmp_path):
    _resume_fused("cpu", tmp_path)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (benchmarks/gpu.sh runs it)")


@cuda
def test_on_a_gpu_auto_and_fp16_train_and_copies_do_not_wait():
    from modsent.training.loop import to_device

    expected = "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"
    assert precision.resolve("cuda", "auto") == expected
    host = torch.arange(1000)
    moved = to_device(host, "cuda")
    assert moved.device.type == "cuda" and torch.equal(moved.cpu(), host)
    for name in ("auto", "fp16"):
        model = _model().cuda()
        params = list(model.parameters())
        optimizer = torch.optim.AdamW(params, lr=1e-2)
        scaler = precision.grad_scaler("cuda", name)
        assert scaler.is_enabled() == (precision.resolve("cuda", name) == "fp16")
        x, y = torch.randn(64, 16, device="cuda"), torch.randint(4, (64,), device="cuda")
        losses = []
        for _ in range(30):
            with precision.autocast("cuda", name):
                loss = torch.nn.functional.cross_entropy(model(x).float(), y)
            scaler.scale(loss).backward()
            optimizer_step(optimizer, params, 1.0, scaler)
            losses.append(loss.item())
        assert losses[-1] < 0.5 * losses[0], name


@cuda
def test_on_a_gpu_fused_adamw_resumes(tmp_path):
    _resume_fused("cuda", tmp_path)


@cuda
def test_on_a_gpu_a_resumed_run_draws_the_unbroken_run_s_dropout_masks(tmp_path):
    model = _model().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.ones(64, 16, device="cuda")
    torch.nn.functional.dropout(x, 0.5)  # the generator moved on by a step
    checkpoints.save_checkpoint(tmp_path / "ck", model, optimizer, 1, "fp", {})
    unbroken = torch.nn.functional.dropout(x, 0.5)
    torch.cuda.manual_seed(12345)  # a fresh process's generator
    checkpoints.resume(tmp_path / "ck", model, optimizer, "fp")
    assert torch.equal(torch.nn.functional.dropout(x, 0.5), unbroken)


def _logged_fp16_run(overflowing, steps: int, log_every: int, caplog) -> tuple[list[str], TrainingLog]:
    """``steps`` fp16 steps through the shared step and a TrainingLog that watches the scaler;
    the steps in ``overflowing`` have an inf gradient (skipped, the scale halved). The warnings."""
    import logging

    params, optimizer, scaler, _ = _scaled_gradients_of_three()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="modsent.training.loop"):
        training = TrainingLog(steps, 0, "SE de", progress=False, log_every=log_every, scaler=scaler)
        for step in range(steps):
            for p in params:
                p.grad = torch.full_like(p, 3.0) * scaler.get_scale()
            if step in overflowing:
                params[0].grad[0, 0] = float("inf")
            optimizer_step(optimizer, params, 1.0, scaler)
            training.record(step, torch.tensor(1.0), 1e-3, 4)
        training.close()
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"], training


def test_the_log_warns_when_fp16_skips_most_steps(fp16, caplog):
    """A scale that keeps falling means skipped steps: the log says so once a window of 50 steps
    or more holds 8 or more, and half of its steps or more, known to have overflowed; the few
    overflows of a run's first steps (the scale finding its level) do not warn, whatever the
    logging cadence, and a scale halved down to 0 is said, not divided by."""
    warnings, training = _logged_fp16_run(set(range(5, 60)), 60, 10, caplog)
    assert training.scale_watch.skipped_steps == 55
    assert len(warnings) == 1  # once a window of about 100 steps
    assert warnings[0].startswith("SE de: at least 45 of the last 50 steps overflowed in fp16")
    assert f"loss scale now {2.0 ** (16 - 45):g}" in warnings[0]
    for overflowing, log_every in (({0, 1, 2}, 10), (set(range(8)), 2), (set(range(8)), 1)):
        warnings, training = _logged_fp16_run(overflowing, 60, log_every, caplog)
        assert training.scale_watch.skipped_steps == len(overflowing) and not warnings
    warnings, training = _logged_fp16_run(set(range(0, 120, 2)), 120, 1, caplog)  # every other step
    assert training.scale_watch.skipped_steps == 60 and len(warnings) == 1  # steps 1-100; 101-120 is too short
    assert warnings[0].startswith("SE de: at least 25 of the last 50 steps")
    warnings, training = _logged_fp16_run(set(range(0, 300, 16)), 300, 10, caplog)  # 1 in 16: fine
    assert training.scale_watch.skipped_steps == 19 and not warnings
    warnings, training = _logged_fp16_run(set(range(200)), 200, 10, caplog)  # float32 reaches 0 at 166
    assert training.scale_watch.skipped_steps == 200 and training.scale_watch.scaler.get_scale() == 0
    assert sum("loss scale reached 0" in w for w in warnings) == 1

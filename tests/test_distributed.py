"""Data-parallel training of the LA, the full baselines and the data-parallel methods: two CPU
processes (torchrun, gloo) train what one process trains."""

import json
import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from modsent.methods import baselines as bl
from modsent import distributed
from modsent.modular import language_adapter as la
from modsent.modular.fasttext_embeddings import train_token_fasttext
from modsent.modular.focus import initialize_embeddings
from modsent.sources.builtin import builtin_corpus
from modsent.testing import make_tiny_xlmr, sample_texts
from modsent.modular.tokenizer_training import train_tokenizer
from tiny_modules import pairs_in, tiny_base_and_data

pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="torch.distributed with gloo is not available")

# No dropout anywhere (LoRA here, the base model in the fixture): with dropout each process
# draws its own masks, and the runs agree in distribution only. An odd batch size: the two
# processes take 3 and 2 sequences.
CFG = la.LanguageAdapterConfig(steps=6, batch_size=5, seq_len=32, learning_rate=2e-3,
                               warmup_steps=1, eval_sentences=60, checkpoint_every=3, log_every=1,
                               head_warmup_steps=2, lora_dropout=0.0)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A tiny random XLM-R base model without dropout, a German corpus, tokenizer, FOCUS."""
    root = tmp_path_factory.mktemp("ddp")
    base = make_tiny_xlmr(root / "base", sample_texts(600))
    config = json.loads((base / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (base / "config.json").write_text(json.dumps(config))
    corpus = root / "de.txt"
    corpus.write_text("\n".join(builtin_corpus("de")[:1500]) + "\n", encoding="utf-8")
    train_tokenizer(corpus, base, root / "tok", vocab_size=500)
    train_token_fasttext(corpus, root / "tok", root / "ft", dim=16, epochs=2, min_count=2)
    initialize_embeddings(base, root / "tok", root / "ft", root / "emb")
    return {"base": base, "corpus": corpus, "tok": root / "tok", "emb": root / "emb"}


def _arguments(inputs):
    return (inputs["base"], inputs["tok"], inputs["emb"], inputs["corpus"])


def _torchrun(inputs, out, nproc=2):
    """Train under torchrun with ``nproc`` CPU processes, as the workflow script does on GPUs."""
    log = out.with_name(out.name + ".log")
    command = distributed.launch_command(
        "modsent.modular.language_adapter",
        la.cli_arguments(*_arguments(inputs), out, CFG, log_path=log, threads=1, progress=False)
        + ["--device", "cpu"], nproc)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return log.read_text(encoding="utf-8")


def _assert_same_loss_curve(a, b, steps: int) -> None:
    """Two runs' loss.tsv: the same steps and learning rates, losses within 1e-5."""
    curve_a, curve_b = ((d / "loss.tsv").read_text().splitlines() for d in (a, b))
    assert len(curve_a) == len(curve_b) == steps + 1
    for row_a, row_b in zip(curve_a[1:], curve_b[1:]):
        (step_a, loss_a, lr_a), (step_b, loss_b, lr_b) = row_a.split("\t"), row_b.split("\t")
        assert step_a == step_b and lr_a == lr_b
        assert float(loss_b) == pytest.approx(float(loss_a), rel=1e-5)


def _assert_close_but_for_sign_flips(y: torch.Tensor, x: torch.Tensor, what: str, *, lr: float = CFG.learning_rate,
                                     steps: int = CFG.steps, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Within float-addition order, but for a few elements that one Adam step apart: the tied MLM
    head gives every embedding row a gradient, a sum of many small terms of both signs, and where
    that sum is below its rounding noise the two summation orders can give it opposite signs,
    which Adam turns into steps of +lr and -lr (a new tokenizer each run makes this rare, not
    never). A wrong data-parallel step moves far more than a few elements. ``x`` and ``y`` may be
    a whole model's tensors flattened into one (at most one element in a thousand, and at least
    one, may be off)."""
    diff = (y - x).abs()
    off = diff > atol + rtol * x.abs()
    assert int(off.sum()) <= max(1, off.numel() // 1000) and diff.max() <= 2 * lr * steps, (
        f"{what}: {int(off.sum())} of {off.numel()} elements differ, by up to {float(diff.max()):.3g}")


def _assert_same_training(a: Path, b: Path):
    """Same files, same tensors within float-addition order, same steps and curve."""
    assert sorted(p.relative_to(a) for p in a.rglob("*")) == sorted(p.relative_to(b) for p in b.rglob("*"))
    for name in ("embeddings.safetensors", "adapter/adapter_model.safetensors"):
        x, y = load_file(str(a / name)), load_file(str(b / name))
        assert x.keys() == y.keys()
        for key in x:
            if name == "embeddings.safetensors":
                _assert_close_but_for_sign_flips(y[key], x[key], f"{name}: {key}")
            else:
                torch.testing.assert_close(y[key], x[key], rtol=1e-5, atol=1e-6,
                                           msg=lambda default, name=name, key=key: f"{name}: {key}: {default}")
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (a, b))
    assert ma.keys() == mb.keys()
    for key in ("steps", "train_sequences", "heldout_lines", "trainable_parameters", "config"):
        assert ma[key] == mb[key], key
    for key in ("heldout_mlm_loss_before", "heldout_mlm_loss_after"):
        assert mb[key] == pytest.approx(ma[key], rel=1e-5), key
    _assert_same_loss_curve(a, b, CFG.steps)


@pytest.fixture(scope="module")
def single(inputs, tmp_path_factory):
    """The reference: one process, in this one."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("single") / "de"
    la.train_language_adapter(*_arguments(inputs), out, CFG, progress=False)
    return out


def test_two_processes_train_what_one_process_trains(inputs, single, tmp_path):
    out = tmp_path / "de"
    log = _torchrun(inputs, out)
    _assert_same_training(single, out)
    # the model FLOPs are the whole batches' (modsent.training.efficiency), however many processes
    one, two = (json.loads((d / "metrics.json").read_text())["model_flops"] for d in (single, out))
    assert two == pytest.approx(one) and one > 0
    assert "data-parallel over 2 processes" in log  # the main process's records reach the log
    assert "[rank 1]" not in log  # the others' do not
    assert not Path(str(out) + ".checkpoint").exists() and not la.sequences_path(out).exists()


def _train_and_die(inputs, out, die_at):
    def die(step):
        if step == die_at:
            os.kill(os.getpid(), signal.SIGKILL)

    torch.set_num_threads(1)
    la.train_language_adapter(*_arguments(inputs), out, CFG, progress=False, on_step=die)


def test_a_checkpoint_of_one_process_resumes_on_two(inputs, single, tmp_path):
    out = tmp_path / "de"
    process = multiprocessing.get_context("fork").Process(target=_train_and_die, args=(inputs, out, 4))
    process.start()
    process.join()
    assert process.exitcode == -signal.SIGKILL
    assert json.loads((Path(str(out) + ".checkpoint") / "meta.json").read_text())["step"] == 3
    assert (la.sequences_path(out) / la.SEQUENCES_MANIFEST).is_file()
    log = _torchrun(inputs, out)
    assert "tokenised by an earlier run, are read from" in log  # the processes map the killed run's sequences
    assert not la.sequences_path(out).exists()
    assert json.loads((out / "metrics.json").read_text())["resumed_from_step"] == 3
    _assert_same_training(single, out)


def test_launch_command():
    command = distributed.launch_command("modsent.modular.language_adapter", ["--out", Path("x/y")], 4)
    assert command == [sys.executable, "-m", "torch.distributed.run", "--standalone",
                       "--nproc_per_node=4", "-m", "modsent.modular.language_adapter", "--out", "x/y"]
    script = distributed.launch_command("tools/train.py", [], 2)
    assert script[-1] == "tools/train.py" and "-m" not in script[3:]
    with pytest.raises(ValueError, match="nproc"):
        distributed.launch_command("modsent.modular.language_adapter", [], 0)


def test_local_slices_cover_the_batch_in_order():
    for size in (1, 5, 8, 128):
        for world in range(1, min(size, 8) + 1):
            rows = [list(range(size))[distributed.local_slice(size, r, world)] for r in range(world)]
            assert sum(rows, []) == list(range(size))
            assert max(map(len, rows)) - min(map(len, rows)) <= 1
            assert distributed.share_sizes(size, world) == [len(r) for r in rows]  # every share holds a row
    assert distributed.share_sizes(2, 3) is None  # an empty share: the shapes are exchanged


def test_cli_arguments_round_trip(inputs, tmp_path, monkeypatch):
    """main() reads back what cli_arguments() writes: the same config (and checkpoint fingerprint)."""
    seen = {}

    def fake_train(*args, **kwargs):
        seen["args"], seen["kwargs"] = args, kwargs

    monkeypatch.setattr(la, "train_language_adapter", fake_train)
    monkeypatch.setattr(distributed, "process_logging", lambda *a: None)
    for name in distributed.LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    args = la.cli_arguments(*_arguments(inputs), tmp_path / "de", CFG, tracking_dir=tmp_path / "tb",
                            threads=torch.get_num_threads(), progress=False)
    assert la.main(args + ["--device", "cpu"]) == 0
    assert seen["args"][5] == CFG
    assert seen["args"][:5] == tuple(str(p) for p in (*_arguments(inputs), tmp_path / "de"))
    assert seen["kwargs"] == {"tracking_dir": str(tmp_path / "tb"), "device": "cpu", "progress": False}


# ---- the full baselines ----------------------------------------------------------------------------

# Full_m (batches of one language, en or de) without dropout (the fixture's base). Batches of 7
# pairs with a hard negative for most: 12-14 texts, so the processes' shares differ in size and
# mix anchors, positives and negatives.
BL_CFG = bl.FullTrainingConfig(batch_size=7, seq_len=32, learning_rate=1e-3, max_steps=4, eval_pairs=10,
                               log_every=1, checkpoint_every=2)


@pytest.fixture(scope="module")
def baseline_inputs(tmp_path_factory):
    """A tiny random XLM-R base without dropout and the built-in pairs in en and de."""
    root = tmp_path_factory.mktemp("ddp-baselines")
    base, english, units = tiny_base_and_data(root)
    config = json.loads((base / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (base / "config.json").write_text(json.dumps(config))
    paths = {}
    for lang in ("en", "de"):
        paths[lang] = root / f"pairs-{lang}.parquet"
        (english if lang == "en" else pairs_in(lang, english, units)).to_parquet(paths[lang], index=False)
    return {"base": base, "paths": paths}


@pytest.fixture(scope="module")
def single_baseline(baseline_inputs, tmp_path_factory):
    """The reference: Full_m trained by one process, in this one."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("single-baseline") / "Full_m"
    bl.train_full_baseline("Full_m", baseline_inputs["base"], baseline_inputs["paths"], out, BL_CFG, device="cpu",
                           progress=False)
    return out


def _torchrun_baseline(inputs, out, nproc=2):
    log = out.with_name(out.name + ".log")
    command = distributed.launch_command(
        "modsent.methods.baselines",
        bl.cli_arguments("Full_m", inputs["base"], inputs["paths"], out, BL_CFG, log_path=log, threads=1,
                         progress=False) + ["--device", "cpu"], nproc)
    result = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return log.read_text(encoding="utf-8")


def _assert_same_baseline(a: Path, b: Path):
    """Same files, same weights within float-addition order (but for the few elements whose
    near-zero gradient AdamW turns into a step either way: 2.6e-6 with Full_m's per-batch
    languages), same steps, curve and accuracies."""
    assert sorted(p.relative_to(a) for p in a.rglob("*")) == sorted(p.relative_to(b) for p in b.rglob("*"))
    x, y = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert x.keys() == y.keys()
    _assert_close_but_for_sign_flips(torch.cat([y[key].flatten() for key in x]), torch.cat([x[key].flatten() for key in x]),
                                     "Full_m's model", lr=BL_CFG.learning_rate, steps=BL_CFG.max_steps)
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (a, b))
    for key in ("steps", "train_rows", "heldout_pairs", "trainable_parameters", "config",
                "heldout_retrieval_accuracy_before", "heldout_retrieval_accuracy_after",
                "heldout_crosslingual_retrieval_accuracy_after"):
        assert ma[key] == mb[key], key
    _assert_same_loss_curve(a, b, BL_CFG.max_steps)


def test_two_processes_train_the_full_baseline_one_process_trains(baseline_inputs, single_baseline, tmp_path):
    """The in-batch negatives span both processes: the loss, and so the weights, are one process's."""
    out = tmp_path / "Full_m"
    log = _torchrun_baseline(baseline_inputs, out)
    _assert_same_baseline(single_baseline, out)
    assert json.loads((out / "metrics.json").read_text())["processes"] == 2
    # each process counts its share of the texts; the metrics hold their sum
    one, two = (json.loads((d / "metrics.json").read_text())["model_flops"] for d in (single_baseline, out))
    assert two == pytest.approx(one) and one > 0
    assert "data-parallel over 2 processes" in log and "[rank 1]" not in log
    assert not Path(f"{out}.checkpoint").exists()


def _train_baseline_and_die(inputs, out, die_at):
    def die(step):
        if step == die_at:
            os.kill(os.getpid(), signal.SIGKILL)

    torch.set_num_threads(1)
    bl.train_full_baseline("Full_m", inputs["base"], inputs["paths"], out, BL_CFG, device="cpu", progress=False,
                           on_step=die)


def test_a_full_baseline_checkpoint_of_one_process_resumes_on_two(baseline_inputs, single_baseline, tmp_path):
    out = tmp_path / "Full_m"
    process = multiprocessing.get_context("fork").Process(target=_train_baseline_and_die,
                                                          args=(baseline_inputs, out, 3))
    process.start()
    process.join()
    assert process.exitcode == -signal.SIGKILL
    assert json.loads((Path(f"{out}.checkpoint") / "meta.json").read_text())["step"] == 2
    _torchrun_baseline(baseline_inputs, out)
    assert json.loads((out / "metrics.json").read_text())["resumed_from_step"] == 2
    _assert_same_baseline(single_baseline, out)


# ---- a data-parallel training method (modsent.methods), launched as the workflow does ---------------

# DuEAM (every term a function of one pair): batches of 7 weak pairs, shares of 4 and 3
DUEAM = {"datasets": None, "eval_pairs": 10, "batch_size": 7, "max_steps": 4, "learning_rate": 1e-3,
         "warmup_steps": 1, "log_every": 1, "seq_len": 32, "checkpoint_every": 2}


def test_a_data_parallel_method_trains_on_two_processes_what_it_trains_on_one(baseline_inputs, tmp_path, caplog):
    from modsent import methods
    from modsent.methods import launch

    methods.load()
    assert methods.get("DuEAM-weak").data_parallel and not methods.get("mST5-xnli").data_parallel
    assert methods.get("DuEAM-weak").schema()["properties"]["gpus"]["x-role"] == "runtime"
    inputs = {"base": baseline_inputs["base"], "pairs": baseline_inputs["paths"]}
    torch.set_num_threads(1)
    # gpus 2 without CUDA: one process, here, with a warning
    assert launch.train("DuEAM-weak", inputs, tmp_path / "one", {**DUEAM, "gpus": 2}, threads=1) == 0
    assert "sees no GPU" in caplog.text
    log = tmp_path / "two.log"
    command = distributed.launch_command("modsent.methods.launch", launch.cli_arguments(
        "DuEAM-weak", inputs, tmp_path / "two", {**DUEAM, "gpus": 2}, log_path=log, threads=1,
        progress=False) + ["--device", "cpu"], 2)
    assert "--gpus" not in command and '"gpus"' not in " ".join(command)  # a launch concern, not a setting
    result = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    one, two = tmp_path / "one", tmp_path / "two"
    assert sorted(p.relative_to(one) for p in one.rglob("*")) == sorted(p.relative_to(two) for p in two.rglob("*"))
    x, y = load_file(str(one / "model.safetensors")), load_file(str(two / "model.safetensors"))
    assert x.keys() == y.keys()
    # the unused pooler is frozen: AdamW decays no zero-averaged gradient on two processes only
    pooler = [key for key in x if key.startswith("pooler.")]
    assert pooler and all(torch.equal(x[key], y[key]) for key in pooler)
    # every other weight trains: Adam divides by the gradients' own size, so rounding of near-zero
    # gradients shows, and a gradient below its rounding noise can flip sign (one element in 33K did)
    _assert_close_but_for_sign_flips(torch.cat([y[key].flatten() for key in x]), torch.cat([x[key].flatten() for key in x]),
                                     "DuEAM's model", lr=DUEAM["learning_rate"], steps=DUEAM["max_steps"],
                                     rtol=1e-4, atol=2e-5)
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (one, two))
    assert (ma["processes"], mb["processes"]) == (1, 2)
    # model_flops: every process's share of the texts, so the one process's count
    for key in ("steps", "train_pairs", "heldout_retrieval_accuracy_after", "heldout_crosslingual_retrieval_accuracy_after",
                "model_flops"):
        assert ma[key] == mb[key], key
    for (_, la_a, lb_a), (_, la_b, lb_b) in zip(ma["loss_components"]["rows"], mb["loss_components"]["rows"]):
        assert (la_b, lb_b) == pytest.approx((la_a, lb_a), rel=1e-5)
    _assert_same_loss_curve(one, two, DUEAM["max_steps"])
    assert "data-parallel over 2 processes" in log.read_text() and "[rank 1]" not in log.read_text()
    assert not Path(f"{two}.checkpoint").exists()


def _gather_rows_process(rank: int, world: int, store: str, sizes: list[int], results) -> None:
    """One process of test_all_gather_rows: gather rows of its own count, back-propagate a loss."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        start = sum(sizes[:rank])
        mine = torch.arange(start * 3, (start + sizes[rank]) * 3, dtype=torch.float32).view(-1, 3)
        mine = mine if len(mine) else torch.zeros(0, 0)  # an empty share may not know the width
        mine.requires_grad_(True)
        gathered = distributed.all_gather_rows(mine)
        weights = torch.arange(1, sum(sizes) * 3 + 1, dtype=torch.float32).view(-1, 3)
        if gathered.requires_grad:
            (gathered * weights).sum().backward()
        results.put((rank, gathered.detach().tolist(), None if mine.grad is None else mine.grad.tolist()))
    finally:
        torch.distributed.destroy_process_group()


def test_all_gather_rows_stacks_uneven_shares_and_keeps_each_process_s_gradient(tmp_path):
    sizes = [2, 0, 3]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_gather_rows_process,
                                 args=(rank, len(sizes), str(tmp_path / "store"), sizes, results))
                 for rank in range(len(sizes))]
    for process in processes:
        process.start()
    received = {}
    for _ in processes:
        rank, gathered, grad = results.get(timeout=120)
        received[rank] = (gathered, grad)
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    expected = torch.arange(sum(sizes) * 3, dtype=torch.float32).view(-1, 3).tolist()
    weights = torch.arange(1, sum(sizes) * 3 + 1, dtype=torch.float32).view(-1, 3).tolist()
    for rank, (gathered, grad) in received.items():
        assert gathered == expected  # every process holds every row, in rank order
        start = sum(sizes[:rank])
        if sizes[rank]:
            assert grad == weights[start:start + sizes[rank]]  # the gradient of its own rows only
        else:
            assert grad is None  # nothing of its own to back-propagate into
    single = torch.ones(2, 3)
    assert distributed.all_gather_rows(single) is single  # no process group: the tensor itself


def _sequences_process(rank: int, store: str, inputs: dict, folder: str, fail: bool, results) -> None:
    """One of two processes of test_only_the_main_process_tokenises...: prepare the LA's sequences."""
    import hashlib

    import numpy as np
    from transformers import AutoTokenizer

    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    groups, new_group = [], torch.distributed.new_group
    torch.distributed.new_group = lambda *a, **k: groups.append(k) or new_group(*a, **k)
    calls, pack = [], la.pack_sequences
    la.pack_sequences = lambda *a, **k: calls.append(1) or pack(*a, **k)
    if fail and rank == 0:
        def full_disk(*args, **kwargs):
            raise OSError(28, "No space left on device")
        np.save = full_disk
    try:
        train, heldout, counts = la.prepared_sequences(inputs["corpus"], AutoTokenizer.from_pretrained(str(inputs["tok"])),
                                                       inputs["tok"], CFG, Path(folder))
        with open("/proc/self/maps", encoding="utf-8") as maps:
            mapped = str(Path(folder) / "train.npy") in maps.read()
        # the others waited in a CPU group of their own, with its own timeout
        assert groups == [{"backend": "gloo", "timeout": la.SEQUENCES_WAIT}], groups
        results.put((rank, len(calls), hashlib.sha256(train.numpy().tobytes()).hexdigest(), counts, mapped))
    except Exception as error:
        results.put((rank, len(calls), type(error).__name__, str(error), None))
    finally:
        torch.distributed.destroy_process_group()


def test_only_the_main_process_tokenises_and_its_failure_stops_every_process(inputs, tmp_path):
    """The LA's corpus is tokenised by the main process alone and mapped by every process; when
    the main process fails to write it (a full disk here), the other one raises as well rather
    than tokenising for itself."""
    context = multiprocessing.get_context("spawn")
    received = {}
    for fail in (False, True):
        results = context.Queue()
        folder, store = tmp_path / f"de{fail}.sequences", tmp_path / f"store{fail}"
        processes = [context.Process(target=_sequences_process, args=(rank, str(store), inputs, str(folder), fail, results))
                     for rank in range(2)]
        for process in processes:
            process.start()
        received[fail] = dict((item[0], item[1:]) for item in (results.get(timeout=180) for _ in processes))
        for process in processes:
            process.join(timeout=60)
            assert process.exitcode == 0
    (calls0, digest0, counts0, mapped0), (calls1, digest1, counts1, mapped1) = received[False][0], received[False][1]
    assert (calls0, calls1) == (2, 0)  # training and held-out sequences, in the main process only
    assert digest0 == digest1 and counts0 == counts1 and mapped0 and mapped1
    (calls0, error0, message0, _), (calls1, error1, message1, _) = received[True][0], received[True][1]
    assert (error0, error1) == ("OSError", "RuntimeError") and calls1 == 0
    assert "No space left" in message0 and "the main process could not prepare the sequences" in message1
    assert not (tmp_path / "deTrue.sequences").exists()


# ---- the workflow scripts' side ---------------------------------------------------------------------


def test_launched_processes_follow_the_gpus_the_job_sees(monkeypatch, caplog):
    for name in distributed.LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert distributed.launched_processes(1, "baselines.gpus") == 1  # one GPU: in the job's own process
    assert distributed.launched_processes(2, "baselines.gpus") == 2
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)  # fewer than asked (--resources gpu=3): as many
    with caplog.at_level("WARNING"):
        assert distributed.launched_processes(4, "baselines.gpus") == 3
    assert "baselines.gpus is 4 but this job sees 3 GPU(s)" in caplog.text
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert distributed.launched_processes(2, "baselines.gpus") == 1  # one GPU: in the job's own process
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert distributed.launched_processes(2, "baselines.gpus") == 1
    assert "sees no GPU" in caplog.text
    for name in distributed.LAUNCH_VARIABLES:
        monkeypatch.setenv(name, "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert distributed.launched_processes(2, "baselines.gpus") == 1  # already one of torchrun's processes


def test_run_launched_hands_the_log_to_the_trainers_and_takes_it_back_on_failure(tmp_path):
    import logging

    from modsent.logs import setup_logging

    log_path = tmp_path / "job.log"
    setup_logging(str(log_path)).info("the job starts")
    append = "import sys; open(sys.argv[1], 'a').write('the trainer writes\\n'); sys.exit(int(sys.argv[2]))"
    try:
        assert distributed.run_launched([sys.executable, "-c", append, str(log_path), "0"], log_path, 1) == 0
        assert distributed.run_launched([sys.executable, "-c", append, str(log_path), "3"], log_path, 1) == 3
        logging.getLogger("modsent").info("after the failure")
    finally:
        for handler in logging.getLogger().handlers[:]:
            logging.getLogger().removeHandler(handler)
            handler.close()
    lines = log_path.read_text().splitlines()
    assert lines[0] == "==== attempt 1 ====" and "CUDA_VISIBLE_DEVICES" in lines[1]
    assert "the job starts" in lines[2] and "python" in lines[3]  # the host line, then the command
    assert lines[4] == "the trainer writes" and lines[5] == "the trainer writes"
    assert "torchrun exited with status 3" in lines[6] and "after the failure" in lines[7]


def test_a_failure_in_the_trainer_processes_reaches_the_job_s_log(inputs, tmp_path):
    """An error that only several processes meet (a batch of 1 sequence over 2 processes) ends
    the trainer processes; the rule's log gets its message and traceback (not only "torchrun
    exited"), after the script's lines, and the console gets bad input as its message, not a
    traceback. (Which process logs first is a race: torchrun stops the other when one fails.)"""
    import dataclasses

    log = tmp_path / "de.log"
    log.write_text("the workflow script's lines\n")
    command = distributed.launch_command(
        "modsent.modular.language_adapter",
        la.cli_arguments(*_arguments(inputs), tmp_path / "de", dataclasses.replace(CFG, batch_size=1),
                         log_path=log, threads=1, progress=False) + ["--device", "cpu"], 2)
    result = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode != 0
    text = log.read_text(encoding="utf-8")
    message = "a batch of 1 sequences cannot be split over 2 processes: raise language_adapter.batch_size"
    assert text.startswith("the workflow script's lines\n")
    assert f"the job failed: InputError: {message}" in text and "Traceback (most recent call last)" in text
    assert f"InputError: {message}" in result.stderr
    assert 'raise InputError(f"a batch of' not in result.stderr  # the traceback stays in the log
    assert not (tmp_path / "de").exists()


@pytest.fixture
def restored_logging():
    """Logging as it was before the test: process_logging sets the root logger's handlers and
    level, the exception hook and the warnings' capture for the whole process."""
    import logging

    root = logging.getLogger()
    kept = root.handlers[:], root.level, sys.excepthook
    yield
    for handler in root.handlers[:]:
        root.removeHandler(handler)
        handler.close()
    for handler in kept[0]:
        root.addHandler(handler)
    root.setLevel(kept[1])
    sys.excepthook = kept[2]
    logging.captureWarnings(False)


def test_a_trainer_process_other_than_the_main_appends_its_errors_to_the_log(tmp_path, restored_logging):
    """Process 1 of a group: warnings and errors on the console, errors (a failure's record
    with its traceback) also in the rule's log, which the main process writes."""
    import logging

    log = tmp_path / "job.log"
    log.write_text("the workflow script's lines\n")
    hook = sys.excepthook
    distributed.process_logging(str(log), 1)
    assert sys.excepthook is not hook  # a failure that ends the process is logged
    logging.getLogger("modsent.x").info("progress of process 1")
    logging.getLogger("modsent.x").warning("a warning of process 1")
    try:
        raise ValueError("process 1 broke")
    except ValueError:
        logging.getLogger("modsent.x").error("the job failed", exc_info=True)
    for handler in logging.getLogger().handlers:
        handler.flush()
    lines = log.read_text().splitlines()
    assert lines[0] == "the workflow script's lines"
    assert lines[1].startswith("[rank 1] ") and lines[1].endswith("the job failed")
    assert "ValueError: process 1 broke" in lines[-1] and len(lines) > 3  # with its traceback
    assert "progress" not in "\n".join(lines) and "warning" not in "\n".join(lines)


def test_a_trainer_process_logs_its_failure_before_leaving_the_group(tmp_path, monkeypatch, restored_logging):
    """A process that fails writes the failure to the log first and then leaves without the
    group's collective goodbye (with the others inside a collective it could hang until the
    timeout, the failure unlogged); a process that finishes leaves the group as usual."""
    import argparse

    log = tmp_path / "job.log"
    left = []
    monkeypatch.setattr(distributed, "setup", lambda device: (0, 1, "cpu"))
    monkeypatch.setattr(distributed, "cleanup", lambda: left.append(log.read_text()))
    args = argparse.Namespace(threads=None, device="cpu", log_file=str(log))
    with pytest.raises(ValueError, match="one process broke"):
        with distributed.trainer_process(args):
            raise ValueError("one process broke")
    text = log.read_text()
    assert left == [] and "the job failed: ValueError: one process broke" in text and "Traceback" in text
    with distributed.trainer_process(args):
        pass
    assert len(left) == 1

    def teardown_fails():
        raise RuntimeError("NCCL communicator abort")

    monkeypatch.setattr(distributed, "cleanup", teardown_fails)
    with distributed.trainer_process(args):  # the work finished: the job succeeds, the log says why
        pass
    assert "leaving the process group failed after the work finished (RuntimeError: NCCL communicator abort); " \
           "the outputs are complete" in log.read_text()


TEARDOWN_CRASH = """
import argparse, os, sys
from pathlib import Path
from modsent import distributed

log, crash, out = sys.argv[1:4]
distributed.cleanup = os.abort  # leaving the group kills the process outside Python, as NCCL can
with distributed.trainer_process(argparse.Namespace(threads=1, device="cpu", log_file=log)):
    if crash == "work" and os.environ["RANK"] == "1":
        os.abort()
    Path(f"{out}.{os.environ['RANK']}").write_text("written")
"""


def test_a_crash_while_leaving_the_group_after_the_work_finished_fails_no_job(tmp_path):
    """Two trainer processes that both finish their work and then crash outside Python while
    leaving the process group (an abort: no exception a process could catch): the job
    succeeds, its log says why; a crash during the work still fails it."""
    import logging

    from modsent.logs import setup_logging

    script = tmp_path / "trainer.py"
    script.write_text(TEARDOWN_CRASH)
    log_path = tmp_path / "job.log"
    setup_logging(str(log_path))
    try:
        status = distributed.run_launched(distributed.launch_command(
            script, [log_path, "teardown", tmp_path / "out"], 2), log_path, 1)
        assert status == 0 and {p.name for p in tmp_path.glob("out.*")} == {"out.0", "out.1"}
        assert distributed.run_launched(distributed.launch_command(
            script, [log_path, "work", tmp_path / "again"], 2), log_path, 1) != 0
    finally:
        for handler in logging.getLogger().handlers[:]:
            logging.getLogger().removeHandler(handler)
            handler.close()
    text = log_path.read_text()
    assert "after every process had finished its work (a crash while leaving the process group); " \
           "the outputs are complete" in text
    assert text.count("torchrun exited with status") == 2 and text.rstrip().endswith(
        text[text.rindex("torchrun exited with status"):].splitlines()[0])

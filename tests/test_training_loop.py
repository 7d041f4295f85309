"""The shared parts of the training loops (modsent.training.loop) that change when the host
waits: ``ahead`` prepares the next batch on a thread while the step runs, and ``TrainingLog``
reads losses given as tensors back at the logged steps only, and ``HostCopies`` brings an
encoding pass's results to the host without waiting at each batch."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from modsent.training.loop import HostCopies, LengthChunks, TrainingLog, ahead, split_by_length


def test_ahead_gives_what_preparing_in_the_loop_gives_in_order():
    items = list(range(7))
    assert list(ahead(items, lambda i: i * i)) == [(i, i * i) for i in items]
    assert list(ahead(items, lambda i: i * i, enabled=False)) == [(i, i * i) for i in items]
    assert list(ahead([], str)) == [] and list(ahead([3], str)) == [(3, "3")]
    assert list(ahead(iter(items), str)) == [(i, str(i)) for i in items]  # any iterable, read once


def test_ahead_prepares_the_next_item_while_the_caller_works_on_this_one():
    """The caller's work on item 0 waits for the preparation of item 1 to start: serially this
    could never happen (the wait would time out); on a thread it does."""
    started = {i: threading.Event() for i in range(3)}
    main = threading.get_ident()
    threads = []

    def prepare(i):
        threads.append(threading.get_ident())
        started[i].set()
        return i

    for i, prepared in ahead(range(3), prepare):
        assert prepared == i
        if i < 2:
            assert started[i + 1].wait(timeout=10), f"item {i + 1} was not prepared while item {i} ran"
    assert threads and main not in threads


def test_ahead_raises_the_error_of_preparing_at_its_item_and_closing_waits():
    def prepare(i):
        if i == 2:
            raise ValueError("batch 2 is bad")
        return i

    seen = []
    with pytest.raises(ValueError, match="batch 2 is bad"):
        for i, _ in ahead(range(5), prepare):
            seen.append(i)
    assert seen == [0, 1]

    running, done = threading.Event(), []

    def slow(i):
        if i == 1:
            running.set()
            threading.Event().wait(0.3)
        done.append(i)
        return i

    batches = ahead(range(10), slow)
    assert next(batches) == (0, 0)
    assert running.wait(timeout=10)
    batches.close()  # the caller stops (an error in its step): the item in flight finishes first
    assert done == [0, 1]


def test_losses_given_as_tensors_are_read_at_the_logged_steps_and_equal_the_numbers():
    values = [2.0, 1.5, 1.25, 1.0, 0.75, 0.5, 0.25]
    numbers = TrainingLog(len(values), 0, "SE de", progress=False, log_every=3)
    tensors = TrainingLog(len(values), 0, "SE de", progress=False, log_every=3)
    for step, value in enumerate(values):
        numbers.record(step, value, 1e-3, 4)
        loss = torch.tensor(value, requires_grad=True) * 1.0  # as a step leaves it: in the graph
        tensors.record(step, loss if step != 4 else value, 1e-3, 4)  # numbers and tensors mix
        if step == 1:  # step 2 is not logged: its loss is not read yet
            assert tensors.losses[0] == 2.0 and math.isnan(tensors.losses[1])
    assert tensors.history == numbers.history == [[1, 2.0, 1e-3], [3, 1.25, 1e-3], [6, 0.5, 1e-3],
                                                  [7, 0.25, 1e-3]]
    assert not math.isnan(tensors.losses[-1])  # the last step is always logged
    state = tensors.state(extra=1)
    assert state["losses"] == values and state["extra"] == 1
    assert tensors.close()[:3] == numbers.close()[:3] == (values, numbers.history, 28)


def test_a_checkpoint_between_logged_steps_holds_every_loss():
    training = TrainingLog(10, 0, "SE de", progress=False, log_every=5)
    for step in range(3):
        training.record(step, torch.tensor(float(step)), 1e-3, 2)
    assert training.state()["losses"] == [0.0, 1.0, 2.0]  # step 3 is no logged step
    resumed = TrainingLog(10, 3, "SE de", progress=False, log_every=5, resumed=training.state())
    for step in range(3, 10):
        resumed.record(step, torch.tensor(float(step)), 1e-3, 2)
    losses, history, pairs, _ = resumed.close()
    assert losses == [float(s) for s in range(10)] and pairs == 14
    assert history == [[1, 0.0, 1e-3], [5, 4.0, 1e-3], [10, 9.0, 1e-3]]


def test_padding_is_counted_from_the_host_masks_of_every_shape_of_inputs(caplog):
    training = TrainingLog(3, 0, "SE de", progress=False, log_every=3)
    assert training.padding_fraction is None  # nothing counted yet
    features = {"input_ids": torch.ones(2, 4, dtype=torch.long),
                "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])}  # 2 of 8 padding
    vectors = torch.zeros(2, 8)  # the CLA's English vectors beside its features: no mask
    training.record(0, 1.0, 1e-3, 2, (vectors, features))
    training.record(1, 1.0, 1e-3, 2, [features, {"attention_mask": torch.ones(3, 2)}])  # m-ST5's three parts
    training.count_padding(torch.tensor([[1, 0, 0]]), torch.tensor([[1, 1, 0]]))  # MEXMA's bare masks
    training.record(2, 1.0, 1e-3, 2)
    assert (training.positions, training.padded) == (8 + 8 + 6 + 6, 2 + 2 + 0 + 3)
    assert training.padding_fraction == pytest.approx(7 / 28)
    with caplog.at_level("INFO", logger="modsent.training.loop"):
        training.close()
    assert "SE de: 25.0% of the 28 encoded positions were padding" in caplog.text
    if torch.cuda.is_available():  # counting a GPU's mask would wait for the GPU: refused
        with pytest.raises(ValueError, match="host's masks"):
            training.count_padding({"attention_mask": torch.ones(1, 2, device="cuda")})


def test_split_by_length_cuts_a_pass_into_sorted_chunks_that_restore_its_order():
    """Each chunk keeps its sentences' tokens, in order, cut to its own longest sentence;
    restore() gives every row back at its place. Left padding, or no mask, stays one pass
    (cutting leading columns would move the tokens' positions)."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 30, (37,), generator=generator)
    width = int(lengths.max())
    mask = (torch.arange(width) < lengths[:, None]).long()
    ids = torch.randint(5, 100, (37, width), generator=generator) * mask
    features = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    chunks = split_by_length(features, size=16)
    assert isinstance(chunks, LengthChunks) and [len(c["input_ids"]) for c in chunks] == [13, 12, 12]
    assert sorted(chunks.order.tolist()) == list(range(37))
    seen = []
    for chunk, rows in zip(chunks, torch.tensor_split(chunks.order, 3)):
        assert chunk["attention_mask"].shape[1] == int(lengths[rows].max())  # its own longest
        for row, chunk_ids, chunk_mask in zip(rows.tolist(), chunk["input_ids"], chunk["attention_mask"]):
            assert chunk_ids[chunk_mask.bool()].tolist() == ids[row][mask[row].bool()].tolist()
            seen.append(int(lengths[row]))
    assert seen == sorted(seen)  # shortest first: each chunk holds sentences of similar length
    assert sum(c["attention_mask"].numel() for c in chunks) < mask.numel()  # less padding
    # outputs computed chunk by chunk come back in the batch's order
    outputs = [chunk["attention_mask"].sum(dim=1, keepdim=True).float() for chunk in chunks]
    assert torch.equal(chunks.restore(outputs)[:, 0], lengths.float())
    # a pass of at most one chunk stays as it is
    small = {k: v[:16] for k, v in features.items()}
    assert split_by_length(small, size=16) is small
    left = {**features, "attention_mask": mask.flip(1)}
    assert split_by_length(left, size=16) is left
    unmasked = {"input_ids": ids}
    assert split_by_length(unmasked, size=16) is unmasked


def test_host_copies_give_every_batch_in_order_as_the_plain_copies_do():
    generator = torch.Generator().manual_seed(1)
    results = [torch.randn(n, 5, generator=generator) for n in (4, 1, 7, 3)]
    copies = HostCopies()
    for result in results:
        copies.add(result)
    got = copies.numpy()
    assert got.shape == (15, 5) and got.dtype == results[0].numpy().dtype
    assert (got == torch.cat(results).numpy()).all()
    assert HostCopies().numpy() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (benchmarks/gpu.sh runs it)")
def test_on_a_gpu_host_copies_wait_only_for_old_batches_and_get_each_result_as_it_was():
    generator = torch.Generator().manual_seed(2)
    batches = [torch.randn(512, 768, generator=generator) for _ in range(12)]
    copies = HostCopies(lag=2)
    for batch in batches:
        on_gpu = batch.to("cuda")
        result = (on_gpu @ on_gpu.T @ on_gpu).sum(dim=1, keepdim=True) * 0 + on_gpu  # work queued before the copy
        copies.add(result)
        assert len(copies._pending) <= 2
        result.zero_()  # queued after the copy: must not reach it
    got = copies.numpy()
    assert (got == torch.cat(batches).numpy()).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (benchmarks/gpu.sh runs it)")
def test_on_a_gpu_batches_pinned_on_the_thread_arrive_intact_and_losses_read_later_are_right():
    """What the pair stages do on a GPU: each batch pinned on ahead's thread, copied without
    blocking (loop.to_device), its result left on the GPU for TrainingLog to read at logged steps."""
    from modsent.training.loop import to_device

    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 50_000, (64, 128), generator=generator) for _ in range(20)]
    training = TrainingLog(len(batches), 0, "SE de", progress=False, log_every=7)
    for step, (batch, pinned) in enumerate(ahead(batches, lambda b: b.pin_memory())):
        assert pinned.is_pinned() and pinned is not batch
        on_gpu = to_device(pinned, "cuda")
        training.record(step, on_gpu.sum().double(), 1e-3, len(batch))  # exact in float64
    losses = training.close()[0]
    assert losses == [float(batch.sum()) for batch in batches]


def test_encoding_order_puts_the_most_tokens_first_then_the_most_characters_then_the_given_order():
    from modsent.training.loop import encoding_order

    sentences = ["Donaudampfschiff", "a b c d e f", "x y", "ab cd", "z w", "一二三四五六七"]
    words = lambda texts: [len(text.split()) for text in texts]  # noqa: E731 - a tokenizer of words
    expected = sorted(range(len(sentences)), key=lambda i: (-len(sentences[i].split()), -len(sentences[i]), i))
    assert encoding_order(sentences, words).tolist() == expected == [1, 3, 2, 4, 0, 5]
    assert encoding_order(sentences).tolist() == sorted(range(6), key=lambda i: (-len(sentences[i]), i))
    # counted a chunk at a time, the same order
    assert encoding_order(sentences, words, chunk=4).tolist() == expected
    assert encoding_order([], words).tolist() == []
    with pytest.raises(ValueError, match="2 token counts for 6 sentences"):
        encoding_order(sentences, lambda texts: [1, 2])


def test_encoding_by_token_counts_pads_less_and_gives_each_sentence_its_own_vector():
    """A batch is padded to its longest sentence in tokens: sorted by characters, long words and
    Chinese characters land beside many short words; sorted by tokens, batches hold like counts.
    The vectors come back in the caller's order, each the one its text alone gives."""
    import numpy as np

    from modsent.training.loop import encode_in_batches, token_counts

    rng = np.random.default_rng(0)
    vocabulary = ["Donaudampfschiffahrt", "a", "bc", "Kraftfahrzeug", "中文字", "x"]
    sentences = [" ".join(rng.choice(vocabulary, size=rng.integers(1, 12))) for _ in range(40)]

    def prepare(texts):
        width = max(len(text.split()) for text in texts)
        mask = torch.tensor([[1] * len(text.split()) + [0] * (width - len(text.split())) for text in texts])
        return {"attention_mask": mask, "texts": list(texts)}

    def vector(text):
        return torch.tensor([len(text), len(text.split()), sum(map(ord, text)) % 97, 1.0])

    def run(count):
        batches = []

        def forward(features):
            batches.append(features["attention_mask"])
            return torch.stack([vector(text) for text in features["texts"]])

        out = encode_in_batches(sentences, 8, prepare, forward, normalize=False, count=count)
        return out, sum(mask.numel() for mask in batches), batches

    by_tokens, padded_tokens, batches = run(lambda texts: token_counts(prepare(texts)))
    by_chars, padded_chars, _ = run(None)
    expected = torch.stack([vector(text) for text in sentences]).numpy()
    assert np.array_equal(by_tokens, expected) and np.array_equal(by_chars, expected)
    real = sum(len(text.split()) for text in sentences)
    assert real <= padded_tokens < padded_chars
    longest = [int(mask.sum(dim=1).max()) for mask in batches]
    assert longest == sorted(longest, reverse=True)  # the most tokens first
    assert token_counts({"input_ids": torch.zeros(3, 5, dtype=torch.long)}).tolist() == [5, 5, 5]

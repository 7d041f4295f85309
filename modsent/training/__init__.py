"""The training toolkit every stage uses and no stage owns.

* :mod:`~modsent.training.checkpoints` — resumable checkpoints (trainable weights, AdamW
  moments, RNG state, progress as JSON), where they live, and the fingerprint a checkpoint must
  match to be resumed;
* :mod:`~modsent.training.seeding` — random streams that are pure functions of the step (a
  resumed run draws what an unbroken one draws), and the private stream fresh weights are drawn
  from;
* :mod:`~modsent.training.schedules` — learning-rate schedules;
* :mod:`~modsent.training.precision` — the default device, autocast on GPUs;
* :mod:`~modsent.training.efficiency` — a run's model FLOPs, FLOP rate, MFU and peak GPU memory;
* :mod:`~modsent.training.fastpath` — LoRA and frozen-Linear forwards with fewer kernels under
  autocast, same parameters and results (the LoRA stages call ``speed_up`` on their model).

Helpers take plain values (a model, an optimizer, numbers), never a stage's config object.
The objectives are in :mod:`modsent.losses`.
"""

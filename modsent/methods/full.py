"""Full-parameter training methods: every weight of the base model trained like the full
baselines (:mod:`modsent.methods.baselines`: the same batches, schedule, checkpoints,
resumption and data parallelism) with a new objective. A method module registers one with

    from modsent import methods
    from modsent.methods.full import full_parameter_method

    methods.register(full_parameter_method("Sym-MNRL", "...", objective=make_loss))

This module imports nothing heavy (the workflow imports method modules while it plans): the
training code is imported when the method trains.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from modsent.methods import Method, PairTraining
from modsent.schema import ROLE_KEY, SELECTION, inline_refs, load_schema


def full_training_schema() -> dict[str, dict]:
    """The settings every full-parameter method shares: the ``baselines`` section's training
    keys (modsent/schemas/config.schema.yaml), with their defaults and roles."""
    schema = load_schema()
    properties = schema["properties"]["baselines"]["properties"]
    return {key: inline_refs(value, schema) for key, value in properties.items()
            if value.get(ROLE_KEY) != SELECTION and key != "gpus"}  # Method.data_parallel adds its own


def full_parameter_method(name: str, description: str, *, objective: Callable[[dict], object],
                          data: str = "monolingual", english_only: bool = False,
                          settings_schema: Mapping[str, dict] | None = None) -> Method:
    """A method that trains every weight of the base model like the full baselines (the same
    batches: ``monolingual`` or ``crosslingual`` pairs; the same schedule, checkpoints and
    resumption, data-parallel on several GPUs like them: the method's ``gpus``) with
    ``objective(settings)``: a loss over a batch's (anchors, positives, negatives or None)
    embeddings (:mod:`modsent.losses`). The training code (:mod:`modsent.methods.baselines`)
    is imported when the method trains, not when it is registered."""
    if data not in ("monolingual", "crosslingual"):
        raise ValueError(f"method {name}: data must be 'monolingual' or 'crosslingual', got {data!r}")
    recipe = PairTraining(name, description, data, english_only=english_only)

    def train(inputs: dict, out_dir, settings: dict, *, device=None, progress=True) -> dict:
        from modsent.methods.baselines import FullTrainingConfig, train_full_baseline

        own = set(settings_schema or {})
        cfg = FullTrainingConfig.from_config({k: v for k, v in settings.items() if k not in own})
        return train_full_baseline(name, inputs["base"], inputs["pairs"], out_dir, cfg, device=device,
                                   progress=progress, recipe=recipe, objective=objective(settings))

    schema = {**full_training_schema(), **dict(settings_schema or {})}
    return Method(name, description, train, ("base", "pairs"), schema, english_only, data_parallel=True)

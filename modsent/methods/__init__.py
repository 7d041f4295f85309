"""Training methods beyond the modular encoder, registered in one place.

A method trains one system from the data the workflow already makes (the base model, the
multi-parallel paraphrase pairs, the translations) and writes a sentence-transformers
directory, ``results/{base}/methods/{name}``; the evaluation suite scores it beside the modular
systems and it is one more row of ``summary.md``. Adding one is one module:

    from modsent import methods
    from modsent.methods.full import full_parameter_method

    def symmetric_mnrl(settings):
        from modsent import losses  # torch: imported when the method trains, not while planning

        class SymmetricMNRL(losses.MultipleNegativesRankingLoss):
            def forward(self, anchors, positives, negatives=None):
                return (super().forward(anchors, positives, negatives) + super().forward(positives, anchors)) / 2

        return SymmetricMNRL(settings["scale"])

    methods.register(full_parameter_method(
        "Sym-MNRL", "every weight, MNRL in both directions", objective=symmetric_mnrl))

and the config names it: ``method_modules: [my_module]`` (importable module names; the
methods of ``modsent.methods``' own submodules are always there) and ``methods: {Sym-MNRL: {}}``
(its settings; every key has a default). Each method declares its settings as JSON-schema
properties with defaults: ``modsent check-config`` checks them, naming the key, before anything
runs. ``x-role: runtime`` keys (how the job runs) are not part of the job's params.

Cluster resources: every method's settings have a runtime key ``resources`` (:data:`RESOURCES`):
its training job's SLURM request over the ``gpu_train`` kind's (rules/resources.smk), e.g. a
larger GPU for one large model (``constraint``, ``gpu_model``), more memory or time.

Several GPUs: a method whose ``train`` is data-parallel (it runs in every process of a torchrun
group, :mod:`modsent.distributed`, and writes only from the main one) says so with
``data_parallel=True``; its settings then have a runtime key ``gpus`` (default 1), its training
job requests that many GPUs of one node, and :mod:`modsent.methods.launch` starts one process
per GPU.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import pkgutil
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from modsent.io import InputError
from modsent.languages import PIVOT_LANGUAGE
from modsent.schema import ROLE_KEY, RUNTIME, inline_refs, load_schema

# A system name: a summary row and a directory name; must not look like a modular variant's
NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_.][A-Za-z0-9]+)*")
RESERVED = re.compile(r"base|modular|full|(?:Full|Mod)_.*")  # systems and evaluation groups
INPUT_KINDS = ("base", "pairs", "translations")


@dataclasses.dataclass(frozen=True)
class Method:
    """One trainable system.

    ``train(inputs, out_dir, settings, *, device, progress)`` writes the sentence-transformers
    directory ``out_dir`` (atomically, with a ``metrics.json``) and returns its metrics.
    ``inputs``: ``base`` (the base model directory), ``pairs`` ({language: paraphrase pair
    file}) and ``translations`` ({language: translation file}, non-English languages), as
    ``uses`` asks, their languages sorted (the order of the config's ``languages`` is spelling:
    reordering it replans no method). A setting named ``datasets`` means a list of labels of the pair files'
    ``dataset`` column (null: every row): the workflow reads it so; one named ``model`` or
    ``*_model`` a Hub id or a local directory (``check-config`` checks it is one, and
    ``modsent fetch`` prefetches it, with its ``revision``/``*_revision``). An ``english_only`` method's
    English pair file also holds the paraphrase datasets that are not translated
    (``paraphrases.{name}.english_only``), when there are any and its ``datasets`` setting,
    where it has one, is null or names one of them: ``results/paraphrase/en.all.parquet``
    (``modsent.config.reads_english_only``); a method that trains on every language's pairs
    may not name one (``check-config`` says so). ``settings``: the config's ``methods.{name}``
    with the defaults of ``settings_schema`` filled in, without ``gpus`` and ``resources`` (the
    workflow's: the processes it starts, the job's cluster request).

    A method with stages of its own before training (a cache, a teacher's outputs) writes them
    with rules in ``rules/methods/{module}.smk`` (the Snakefile includes every file there) and
    names them in ``extra_inputs(base, settings, languages) -> {key: path or [paths]}`` (the
    languages sorted): they
    become inputs of its training job and reach ``train`` as ``inputs[key]``.

    ``data_parallel``: ``train`` may run in every process of a torchrun group (one per GPU):
    each process takes its share of every batch, gradients are averaged, only the main process
    (rank 0) evaluates and writes ``out_dir``, and the others return None after it. The
    settings then get the runtime key ``gpus`` (:data:`GPUS_SETTING`). Every trainable
    parameter must reach the loss: freeze the others (an unused pooler), or several processes
    would decay them where one leaves them alone (:func:`modsent.distributed.average_gradients`).

    ``requires``: other methods whose outputs it reads (named in ``extra_inputs`` through
    :func:`modsent.layout.method_output`, so Snakemake trains them first); a config that
    configures it without them is an error naming the missing ``methods.NAME`` keys.

    ``check_settings(settings) -> [problem]``: what the settings schema cannot say (settings
    that contradict each other or the GPU count), given the settings with their defaults filled
    in (``gpus`` included); each problem starts with the key it names. ``check-config`` and
    the workflow report them before any job runs.

    ``check_required(settings_by_name) -> [problem]``: what its settings and those of the
    methods it ``requires`` must agree on (InteMATs' fusion attaches InteMATs-DT's adapters to
    InteMATs-ST's saved backbone, so the two are saved in one dtype), given every configured
    method's settings with their defaults filled in; each problem starts with
    ``methods.NAME.key``. Reported like ``check_settings``'s.

    ``family``: the evaluation-embeddings group of the system (default: its own name). The
    systems of one family (a recipe and its ablations) encode each language's evaluation
    sentences in one job, which loads the libraries and the data once; adding a system
    re-encodes only its own family."""

    name: str
    description: str
    train: Callable[..., dict]
    uses: tuple[str, ...] = ("base", "pairs")
    settings_schema: Mapping[str, dict] = dataclasses.field(default_factory=dict)
    english_only: bool = False
    extra_inputs: Callable[[str, Mapping, Sequence[str]], dict[str, str | list[str]]] | None = None
    requires: tuple[str, ...] = ()
    data_parallel: bool = False
    family: str = ""
    check_settings: Callable[[Mapping], list[str]] | None = None
    check_required: Callable[[Mapping[str, Mapping]], list[str]] | None = None

    def __post_init__(self):
        for what, value in (("name", self.name), ("family", self.group)):
            if not NAME.fullmatch(value) or RESERVED.fullmatch(value):
                raise ValueError(f"method {what} {value!r}: letters and digits, words joined by - _ or ., "
                                 "not base, modular, full, Full_* or Mod_* (the paper's systems and groups)")
        if RESOURCES in self.settings_schema:
            raise ValueError(f"method {self.name}: {RESOURCES!r} is every method's key (its job's cluster "
                             "request, modsent.methods.resources_setting), not a setting of its own")
        unknown = sorted(set(self.uses) - set(INPUT_KINDS))
        if unknown:
            raise ValueError(f"method {self.name}: unknown input kind(s) {unknown}; kinds: {', '.join(INPUT_KINDS)}")

    def training_languages(self, languages: Sequence[str]) -> list[str]:
        """The languages whose pairs it trains on."""
        return [PIVOT_LANGUAGE] if self.english_only else list(languages)

    @property
    def group(self) -> str:
        """The evaluation-embeddings group (``family``, or the name when it has none)."""
        return self.family or self.name

    def schema(self) -> dict:
        """The JSON schema of the method's settings (``methods.{name}``): ``resources``
        (:func:`resources_setting`) and, for a data-parallel method, ``gpus`` (unless it
        declares its own)."""
        properties = copy.deepcopy(dict(self.settings_schema))
        if self.data_parallel:
            properties.setdefault("gpus", copy.deepcopy(GPUS_SETTING))
        properties[RESOURCES] = resources_setting()
        return {"type": "object", "additionalProperties": False, "default": {}, "properties": properties}


REGISTRY: dict[str, Method] = {}

# the runtime key of every data-parallel method (Method.data_parallel)
GPUS_SETTING = {
    "type": "integer", "minimum": 1, "default": 1, ROLE_KEY: RUNTIME,
    "description": "GPUs of one node; more than 1 trains under torchrun, one data-parallel process per GPU, "
                   "each on its share of every batch (the batch size is the total). Changing it reruns nothing"}


# the runtime key of every method: its training job's resources (rules/resources.smk)
RESOURCES = "resources"
# the keys of the config's `resources: {kind: ...}` that a method may set for its own job: not
# the GPU count (its `gpus`), nor the partition and account, which the SLURM profile sets per
# rule (slurm/config.yaml's set-resources, which Snakemake applies over a rule's own)
RESOURCE_KEYS = ("cpus", "mem_mb", "runtime", "max_runtime", "constraint", "gpu_model", "qos", "slurm_extra")


def resources_setting() -> dict:
    """The schema of a method's ``resources``: the keys of :data:`RESOURCE_KEYS`, as the
    config's ``resources`` section defines them (modsent/schemas/config.schema.yaml)."""
    return copy.deepcopy(_resources_setting())


@functools.cache
def _resources_setting() -> dict:
    schema = load_schema()
    kind = schema["properties"]["resources"]["additionalProperties"]["properties"]
    return {
        "type": "object", "additionalProperties": False, "default": {}, ROLE_KEY: RUNTIME,
        "properties": {key: inline_refs(kind[key], schema) for key in RESOURCE_KEYS},
        "description": "this method's training job's resources over the gpu_train kind's (rules/resources.smk, "
                       "the config's resources.gpu_train): CPUs and memory (MB) per GPU, runtime (minutes), "
                       "a node feature (constraint) or GPU model for a large model, QOS, extra sbatch options. "
                       "The partition is the profile's (slurm/config.yaml, train_method), which also wins over "
                       "a constraint or gpu_model set there. Changing it reruns nothing"}


@dataclasses.dataclass(frozen=True)
class PairTraining:
    """Which paraphrase pairs a full-parameter training reads and how it batches them:
    ``objective`` ``monolingual`` (each batch one language's pairs) or ``crosslingual`` (anchor
    and positive in randomly drawn languages); ``english_only``: English pairs only; ``init``:
    the system whose weights it starts from (None: the base model)."""

    name: str
    description: str
    objective: str
    english_only: bool = False
    init: str | None = None

    def training_languages(self, languages: Sequence[str]) -> list[str]:
        """The languages whose pairs it trains on."""
        return [PIVOT_LANGUAGE] if self.english_only else list(languages)


def register(method: Method) -> Method:
    """Add ``method`` to the registry (again with the same definition: nothing happens)."""
    known = REGISTRY.get(method.name)
    if known is not None and known.train.__module__ != method.train.__module__:
        raise ValueError(f"a method named {method.name!r} is already registered (by {known.train.__module__})")
    REGISTRY[method.name] = method
    return method


def load(modules: Sequence[str] = ()) -> dict[str, Method]:
    """Import modsent's own methods (each subpackage of :mod:`modsent.methods`) and ``modules``
    (importable names, the config's ``method_modules``), each of which registers its methods;
    the registry. The workflow calls this while planning, so a method's ``__init__`` imports
    nothing heavy (no torch): its training code lives in a submodule that ``train`` imports."""
    package = Path(__file__).parent
    for info in pkgutil.iter_modules([str(package)]):
        if info.ispkg:  # a method is a subpackage; plain modules (baselines) are libraries
            importlib.import_module(f"{__name__}.{info.name}")
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise InputError(f"method_modules: cannot import {name!r}: {err}") from err
    return REGISTRY


def settings_config(cls, name: str, settings: Mapping, *, allowed: Sequence[str] | None = None,
                    renames: Mapping[str, str] | None = None, tuples: Sequence[str] = ()):
    """A method's settings (``methods.{name}``, defaults filled in or not) as dataclass ``cls``:
    each setting renamed to its field (``renames``: setting -> field, e.g. ``lambda`` ->
    ``lambda_``), the lists of ``tuples`` as tuples (hashable, as the fields are), then
    ``cfg.check(name)``. A key outside ``allowed`` (default: the fields' settings) is an
    InputError naming it and the allowed keys. The recipes' configs are built this way."""
    renames = dict(renames or {})
    back = {field: key for key, field in renames.items()}
    if allowed is None:
        allowed = [back.get(f.name, f.name) for f in dataclasses.fields(cls)]
    unknown = sorted(set(settings) - set(allowed))
    if unknown:
        raise InputError(f"methods.{name}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    values = {renames.get(key, key): value for key, value in dict(settings).items()}
    for key in tuples:
        if values.get(key) is not None:
            values[key] = tuple(values[key])
    cfg = cls(**values)
    cfg.check(name)
    return cfg


def get(name: str) -> Method:
    if name not in REGISTRY:
        raise InputError(f"unknown method {name!r}; registered: {', '.join(sorted(REGISTRY)) or 'none'} "
                         "(a method outside modsent needs its module in method_modules)")
    return REGISTRY[name]


def configured(config: Mapping) -> list[str]:
    """The methods a (schema-filled) config trains and evaluates, in its order."""
    return list((config.get("methods") or {}))

"""Cost before commitment: the jobs of a config per stage, and the GPU-hours and disk of its
training stages, estimated before anything runs (``modsent plan``).

The jobs are Snakemake's own plan (a dry run in the given directory: a fresh one plans
everything, a working directory what is left). GPU-hours come from per-stage rates measured on
one GPU for a LaBSE-sized body (12 x 768): the paper's Table 5 on an A100 40G (20 h per language
adapter of 200K x 128 x 256 tokens, 20 min per 600K pairs of SE or CLA training), or modsent's
own benchmarks on an H200 or an H100 (``benchmarks/results/*_fast_h200.txt``, ``*_fast_h100.txt``).
A larger body costs proportionally more; ``--scale`` multiplies every time. The work of a job is
what its config settings say it is: steps x batch x sequence length for a language adapter;
epochs x pairs for SE and CLA (the language's paraphrase pairs when the directory already holds
them, otherwise the paper's 600K, said so); for a translation shard its share of the English
units (counted when prepared, otherwise twice the paper's pairs), at the rate measured for the
engine and the NLLB size (H200 only). Stages without a measured rate are listed with their jobs
only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from modsent import layout
from modsent.io import InputError

REPO = Path(__file__).resolve().parent.parent
PAPER_PAIRS = 600_000  # the paper's paraphrase pairs per language (and bilingual pairs for CLA)


@dataclasses.dataclass(frozen=True)
class Rates:
    """Throughput of one GPU for a LaBSE-sized body, and of translation: sentences/s per
    (engine, NLLB size) in bf16, beam 4, 32 generated tokens per sentence, batches of 64
    (benchmarks/translation_speed.py); sizes without a measurement get no estimate."""

    name: str
    source: str
    la_tokens_per_s: float
    se_pairs_per_s: float
    cla_pairs_per_s: float
    translation_sentences_per_s: dict = dataclasses.field(default_factory=dict)
    # the LA with language_adapter.residual_stream: bf16, where measured (else the fp32 stream's rate)
    la_bf16_stream_tokens_per_s: float | None = None
    # SE and CLA with their `compile: true` (a runtime setting), where measured (else the eager rate)
    se_compiled_pairs_per_s: float | None = None
    cla_compiled_pairs_per_s: float | None = None


RATES = {
    "a100-paper": Rates("a100-paper", "the paper's Table 5 (A100 40G)", 200_000 * 128 * 256 / (20 * 3600),
                        PAPER_PAIRS / (20 * 60), PAPER_PAIRS / (20 * 60)),
    # modsent's own steps (bf16, fused AdamW, modsent.training.fastpath; 128 x 256 tokens, 128
    # random pairs), benchmarks/results/*_fast_*.txt; SE and CLA: the mean of the runs there.
    # Those SE and CLA runs had no hard negatives and timed a LoRA step for CLA (the CLA trains
    # parallel adapters): at 128 pairs, bound by the host, likely close; the next GPU run of
    # benchmarks/pair_throughput.py times the stages' own steps (benchmarks/results/README.md); it did
    # on 2026-11-28 at 128 pairs with the paper's hard negatives: SE 2,044, CLA 1,889 pairs/s (H200)
    "h200": Rates("h200", "benchmarks/results/*_fast_h200.txt (H200, bf16, fused AdamW, fast LoRA)",
                  # the LA: mlm_throughput_compiled_h200.txt, its steps back to back as the stage runs them
                  524_300, 1_998, 1_824,
                  # translation_speed_h200.txt (the later run) and translation_speed_3.3B_h200.txt
                  {("ctranslate2", "600M"): 364.0, ("transformers", "600M"): 82.3,
                   ("ctranslate2", "3.3B"): 175.2, ("transformers", "3.3B"): 51.2},
                  # the same run: 1.19x the fp32 stream
                  la_bf16_stream_tokens_per_s=625_900,
                  # pair_throughput_compiled_se_h200.txt: the SE step compiled at 128 pairs (the CLA's not measured)
                  se_compiled_pairs_per_s=3_400),
    "h100": Rates("h100", "benchmarks/results/*_fast_h100.txt (H100 SXM, bf16, fused AdamW, fast LoRA)",
                  441_800, 1_822, 1_823),
}


# the rules that train on pairs, and the config section of their settings
PAIR_STAGES = {"sentence_adapter": "sentence_adapter", "ablation_sentence_adapter": "sentence_adapter",
               "alignment_adapter": "alignment", "ablation_alignment_adapter": "alignment"}


# the resource kind (rules/resources.smk) of each rule priced here, named when a job's estimate
# exceeds its first attempt's time (tests/test_planning.py checks it against the rules)
RULE_KINDS = {"language_adapter": "gpu_train", "translate_shard": "gpu_translate",
              **{rule: "gpu_adapter" for rule in PAIR_STAGES}}


@dataclasses.dataclass
class Estimate:
    rule: str
    jobs: int
    gpu_hours: float | None = None
    disk_gb: float | None = None
    note: str = ""
    # the longest priced job's wall hours (GPU-hours over its GPUs), and the time (minutes) a first
    # attempt of that rule's jobs asks for (the longest), from the dry run's resources
    longest_hours: float | None = None
    runtime_minutes: int | None = None
    over_runtime: int = 0  # priced jobs whose estimate exceeds their first attempt's time
    # (hours, minutes asked) of the job that most outgrows its first attempt's time
    worst: tuple[float, int] | None = None


# the environment variable through which a dry run learns that it plans a SLURM run (PlanRequests)
PLAN_REQUESTS_ENV = "MODSENT_PLAN_REQUESTS"
# the SLURM plugin's settings (profile key: the plugin's name for it) that the checks of a job's
# request read (rules/resources.smk)
SLURM_SETTINGS = {"slurm-qos": "qos", "slurm-partition-config": "partition_config", "slurm-array-jobs": "array_jobs"}
# the cores a SLURM plan's dry run is given: Snakemake caps a job's threads at them (at one in a
# dry run without --cores), and a SLURM run caps them at nothing
UNCAPPED_CORES = 1_000_000


@dataclasses.dataclass(frozen=True)
class PlanRequests:
    """What a dry run of ``modsent plan`` under a SLURM profile gets (``$MODSENT_PLAN_REQUESTS``,
    JSON): the file to write its check of every job's request to, and the profile's SLURM
    settings the check reads (``qos``, ``partition_config``, ``array_jobs``), which a dry run does not have."""

    path: Path
    settings: dict


@dataclasses.dataclass(frozen=True)
class ClusterCheck:
    """The dry run's check of every job's request against the SLURM cluster, as the run makes it
    before it submits anything: the nodes sinfo listed (None: sinfo did not answer), the jobs
    checked and every rule's problem (rules/resources.smk: request_problems)."""

    nodes: int | None
    jobs: int
    problems: tuple[str, ...]
    error: str | None = None  # why the check could not run


def plan_requests_setting() -> PlanRequests | None:
    """This process's PlanRequests (a dry run of ``modsent plan`` under a SLURM profile), else None."""
    value = os.environ.get(PLAN_REQUESTS_ENV)
    if not value:
        return None
    data = json.loads(value)
    return PlanRequests(Path(data["path"]), dict(data.get("settings") or {}))


def profile_settings(profile: str) -> dict:
    """The settings of the Snakemake profile ``profile`` (its config.yaml, found and read as
    Snakemake finds and reads it: a path, or a name in this directory or Snakemake's user and
    site config folders; YAML, with yte's templating where the file asks for it); empty when
    none is found or it is no mapping (Snakemake's dry run says so)."""
    import yte
    from snakemake.cli import get_profile_dir

    found = get_profile_dir(str(profile))
    if found is None:
        return {}
    with open(found[1], encoding="utf-8") as stream:
        settings = yte.process_yaml(stream, require_use_yte=True)
    return settings if isinstance(settings, dict) else {}


def planned_jobs(configfile: str | Path, directory: str | Path, snakefile: Path = REPO / "Snakefile",
                 profile: str | None = None) -> list[tuple[str, dict, dict]]:
    """(rule, wildcards, resources) of every job Snakemake would run in ``directory`` for
    ``configfile`` (dry_run's jobs)."""
    return dry_run(configfile, directory, snakefile, profile)[0]


def snakemake_command(configfile: str | Path, directory: str | Path, snakefile: Path = REPO / "Snakefile") -> list[str]:
    """The start of a Snakemake command for modsent's workflow on ``configfile`` in
    ``directory``: the Snakemake of this interpreter's environment, else the one on PATH. The
    workflow is a clone's (``Snakefile``, ``rules/``): a modsent installed from a wheel has the
    library only, and is told so."""
    if not Path(snakefile).is_file():
        raise InputError(f"{snakefile}: no Snakefile: the workflow commands (plan, fetch) run the workflow of a clone "
                         f"of modsent (git clone, then pip install -e . in it); this modsent is installed without it "
                         f"({Path(__file__).resolve().parent})")
    exe = Path(sys.executable).parent / "snakemake"
    return [str(exe) if exe.exists() else "snakemake", "--snakefile", str(snakefile), "--configfile",
            str(Path(configfile).resolve()), "--directory", str(directory)]


def dry_run(configfile: str | Path, directory: str | Path, snakefile: Path = REPO / "Snakefile",
            profile: str | None = None) -> tuple[list[tuple[str, dict, dict]], ClusterCheck | None]:
    """(rule, wildcards, resources) of every job Snakemake would run in ``directory`` for
    ``configfile`` (under ``profile``, when given: its set-resources and default-resources
    apply); resources: the dry run's integer ones (runtime in minutes, gpu, mem_mb) of a first
    attempt. Under a SLURM profile (``executor: slurm``) the dry run asks sinfo for the nodes as
    the run would: each rule's memory and time are fitted to them (capped by the partitions'
    time limits), and every job's request is checked as the run checks it before it submits
    anything (the ClusterCheck; None for another profile, or none). ``profile`` defaults to
    $SNAKEMAKE_PROFILE, as Snakemake's."""
    cmd = snakemake_command(configfile, directory, snakefile) + ["--dry-run"]
    env = None
    profile = profile or os.environ.get("SNAKEMAKE_PROFILE") or None
    settings = profile_settings(profile) if profile else {}
    slurm = settings.get("executor") == "slurm"
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "requests.json"
        if profile:
            cmd += ["--profile", str(profile)]
        if slurm:
            env = {**os.environ, PLAN_REQUESTS_ENV: json.dumps(
                {"path": str(report), "settings": {name: settings[key] for key, name in SLURM_SETTINGS.items()
                                                   if settings.get(key) is not None}})}
            if "cores" not in settings and "c" not in settings:
                # a dry run caps every job's threads at one core, a SLURM run at none (its jobs'
                # CPUs are the threads): as many as any job asks for
                cmd += ["--cores", str(UNCAPPED_CORES)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            error = _dry_run_error(proc.stdout, proc.stderr)
            hint = ("\n(a config with relative local: paths needs --directory, the run's own directory)"
                    if re.search(r"missing input|does not exist|no such file", error, flags=re.I) else "")
            raise InputError(f"snakemake --dry-run of {configfile} in {directory} failed:\n{error}{hint}")
        check = None
        if report.is_file():
            data = json.loads(report.read_text(encoding="utf-8"))
            check = ClusterCheck(data.get("nodes"), data.get("jobs", 0), tuple(data.get("problems", ())),
                                 data.get("error"))
        elif slurm:
            check = ClusterCheck(None, 0, (), "the dry run wrote no report (modsent's Snakefile writes one at its exit)")
    return _parse_dry_run(proc.stdout), check


def _dry_run_error(stdout: str, stderr: str) -> str:
    """What a failed dry run said: its error onwards (a dry run prints it on stdout, after the
    jobs it had listed; a failed parse on stderr), at most 3,000 characters."""
    for text in (stdout, stderr):
        match = re.search(r"^(\S*(Error|Exception)\b|\S+: error:).*$", text, flags=re.M)
        if match:
            return text[match.start():][:3000]
    return (stderr + stdout)[-3000:]


def _parse_dry_run(stdout: str) -> list[tuple[str, dict, dict]]:
    """The jobs of a dry run's output (planned_jobs)."""
    jobs, rule = [], None
    for line in stdout.splitlines():
        match = re.match(r"^(?:local)?rule (\w+):$", line.strip())
        if match:
            rule = match.group(1)
            jobs.append((rule, {}, {}))
            continue
        match = re.match(r"^\s*(wildcards|resources): (.*)$", line)
        if match and jobs:
            values = dict(part.split("=", 1) for part in match.group(2).split(", ") if "=" in part)
            if match.group(1) == "wildcards":
                jobs[-1][1].update(values)
            else:
                jobs[-1][2].update((key, int(value)) for key, value in values.items() if value.isdigit())
    return jobs


def _rows(path: Path, assumed: int) -> tuple[int, bool]:
    """(rows of the parquet file at ``path``, True) when it is prepared, else (``assumed``, False)."""
    if path.is_file():
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows, True
    return assumed, False


def _pairs(directory: Path, lang: str) -> tuple[int, bool]:
    """The language's paraphrase pairs in ``directory`` (counted), else the paper's (assumed)."""
    return _rows(directory / layout.PAIRS.format(lang=lang), PAPER_PAIRS)


def _translation_units(directory: Path) -> tuple[int, bool]:
    """The English sentences to translate (counted when prepared), else twice the paper's pairs."""
    return _rows(directory / layout.TRANSLATION_UNITS, 2 * PAPER_PAIRS)


def translation_size(model: str) -> str | None:
    """The parameter count in an NLLB/M2M100 model id (``facebook/nllb-200-3.3B`` → ``3.3B``,
    ``facebook/nllb-200-distilled-600M`` → ``600M``); None when the name has none."""
    match = re.search(r"[-_](\d+(?:\.\d+)?[MB])$", model.rstrip("/"))
    return match.group(1) if match else None


def _hidden_size(directory: Path, config: dict) -> int:
    """The base model's width, from its prepared directory when present; LaBSE's 768 otherwise."""
    import json

    path = directory / "resources" / "base_models" / config["base_model"]["name"] / "config.json"
    if path.is_file():
        return int(json.loads(path.read_text(encoding="utf-8")).get("hidden_size", 768))
    return 768


def estimate(config: dict, jobs: list[tuple], directory: str | Path, rates: Rates,
             scale: float = 1.0) -> list[Estimate]:
    """Per rule: its jobs and, for the training stages with a rate, GPU-hours and output disk.
    ``jobs``: planned_jobs' (rule, wildcards, resources), or (rule, wildcards) without resources."""
    directory = Path(directory)
    counts = Counter(job[0] for job in jobs)
    out = {rule: Estimate(rule, count) for rule, count in sorted(counts.items())}
    hidden = _hidden_size(directory, config)
    assumed = set()
    for rule, wildcards, *rest in jobs:
        item = out[rule]
        job_hours = _estimate_job(config, rule, wildcards, item, directory, rates, scale, hidden, assumed)
        if job_hours is None:
            continue
        item.gpu_hours = (item.gpu_hours or 0) + job_hours
        if rest:
            resources = rest[0]
            hours = job_hours / max(resources.get("gpu", 1), 1)
            item.longest_hours = max(item.longest_hours or 0, hours)
            if "runtime" in resources:
                asked = max(resources["runtime"], 1)
                item.runtime_minutes = max(item.runtime_minutes or 0, asked)
                if hours * 60 > asked:
                    item.over_runtime += 1
                    if item.worst is None or hours * 60 / asked > item.worst[0] * 60 / item.worst[1]:
                        item.worst = (hours, asked)
    return list(out.values())


def _estimate_job(config: dict, rule: str, wildcards: dict, item: Estimate, directory: Path, rates: Rates,
                  scale: float, hidden: int, assumed: set) -> float | None:
    """One job's GPU-hours (None: not priced); its disk and the rule's note go to ``item``, its
    rule's estimate."""
    from modsent import config as modsent_config

    lang = wildcards.get("lang")
    if rule == "language_adapter" and lang:
        la = modsent_config.language_adapter_settings(config, lang)
        tokens = la["steps"] * la["batch_size"] * la["seq_len"]
        vocab = modsent_config.tokenizer_settings(config, lang).get("vocab_size", 50_000)
        rate, item.note = rates.la_tokens_per_s, "steps x batch x seq_len tokens"
        if la.get("residual_stream") == "bf16":
            if rates.la_bf16_stream_tokens_per_s:
                rate, item.note = rates.la_bf16_stream_tokens_per_s, item.note + ", bf16 residual stream"
            else:
                item.note += ", bf16 residual stream priced as fp32 (no rate measured)"
        item.disk_gb = (item.disk_gb or 0) + vocab * hidden * 4 / 1e9  # the trained fp32 embeddings
        return scale * tokens / rate / 3600
    elif rule in PAIR_STAGES and lang:
        section = PAIR_STAGES[rule]
        settings = modsent_config.job_settings(config, section)
        if settings.get("max_steps"):
            pairs = settings["max_steps"] * settings["batch_size"]
        else:
            n, counted = _pairs(directory, lang)
            if not counted:
                assumed.add(rule)
            pairs = settings.get("epochs", 1) * n
        se = section == "sentence_adapter"
        rate, how = (rates.se_pairs_per_s if se else rates.cla_pairs_per_s), ""
        if modsent_config.runtime_settings(config, section, lang).get("compile"):
            compiled = rates.se_compiled_pairs_per_s if se else rates.cla_compiled_pairs_per_s
            rate, how = (compiled, ", compiled") if compiled else (rate, ", compiled but priced eager (no rate measured)")
        item.note = "epochs x pairs" + how + (f" ({PAPER_PAIRS:,} pairs per language assumed: not prepared yet)"
                                              if rule in assumed else "")
        return scale * pairs / rate / 3600
    elif rule == "translate_shard":
        settings = config["translation"]
        size = translation_size(str(settings["model"]))
        rate = rates.translation_sentences_per_s.get((settings["engine"], size))
        if rate is None:
            item.note = (f"no measured rate for {settings['engine']} with {settings['model']} "
                         f"on {rates.name}")
            return None
        units, counted = _translation_units(directory)
        item.note = (f"units / shards at {rate:g} sentences/s ({settings['engine']}, NLLB-{size}, bf16, "
                     f"32 tokens each)" + ("" if counted else
                                            f"; {2 * PAPER_PAIRS:,} units assumed: not prepared yet"))
        return scale * units / settings["shards"] / rate / 3600
    return None


def format_plan(estimates: list[Estimate], rates: Rates, configfile: str, directory: str, scale: float,
                profile: str | None = None, cluster: ClusterCheck | None = None) -> str:
    lines = [f"modsent plan: {configfile} in {directory}",
             f"rates: {rates.name} — {rates.source}; a LaBSE-sized body" + (f", times x{scale:g}" if scale != 1 else ""),
             "", f"{'rule':32} {'jobs':>5} {'GPU-hours':>10} {'disk GB':>8} {'job h':>7} {'asks h':>7}  how"]
    for item in estimates:
        hours = "" if item.gpu_hours is None else f"{item.gpu_hours:10.2f}"
        disk = "" if item.disk_gb is None else f"{item.disk_gb:8.2f}"
        longest = "" if item.longest_hours is None else f"{item.longest_hours:7.2f}"
        asks = "" if item.runtime_minutes is None else f"{item.runtime_minutes / 60:7.1f}"
        lines.append(f"{item.rule:32} {item.jobs:5d} {hours:>10} {disk:>8} {longest:>7} {asks:>7}  {item.note}")
    total_jobs = sum(item.jobs for item in estimates)
    total_hours = sum(item.gpu_hours or 0 for item in estimates)
    lines += ["", f"{'total':32} {total_jobs:5d} {total_hours:10.2f}",
              "GPU-hours cover the language, sentence-encoding and alignment adapters and, where measured, "
              "translation; full baselines, recipes and evaluation have no measured rate yet (their jobs "
              "are listed). job h: the longest job's hours on its GPUs; asks h: the longest time a first "
              "attempt of the rule asks the cluster for (rules/resources.smk, the config's resources:"
              + (f", the profile {profile}'s set-resources)." if profile else
                 "; the profile's set-resources apply with --profile).")]
    for item in estimates:
        if item.over_runtime:
            kind = RULE_KINDS.get(item.rule, "KIND")
            hours, asked = item.worst
            lines.append(f"warning: {item.over_runtime} {item.rule} job(s) need more time than their first attempt "
                         f"asks for (one: {hours:.1f} h at these rates, against {asked / 60:g} h): each times out "
                         f"and resumes from its checkpoint on a retry (the profile's `retries`, 1.5x the time "
                         f"each), or set resources.{kind}.runtime (or the rule's runtime in the profile's "
                         f"set-resources) to at least {math.ceil(round(item.longest_hours * 60 * 1.2, 6))} "
                         f"minutes (the longest estimate and a fifth)"
                         + ("; under SLURM the run caps a job's time, a retry's too, at the longest time limit "
                            "of a partition that can run it (sinfo): beyond that, only a partition or a QOS "
                            "that allows more (the rule's slurm_partition or qos in the profile's set-resources) "
                            "gives it more" if cluster is not None and cluster.nodes is not None else ""))
    lines += format_cluster_check(cluster, profile)
    return "\n".join(lines)


def format_cluster_check(cluster: ClusterCheck | None, profile: str | None) -> list[str]:
    """The plan's lines on the SLURM check of every job's request (dry_run)."""
    if cluster is None:
        return []
    if cluster.error is not None:
        return [f"SLURM (the profile {profile}): the jobs' requests could not be checked ({cluster.error}); "
                f"the run checks them before it submits anything."]
    unchecked = (f"SLURM (the profile {profile}): sinfo did not answer here, so the jobs' requests were not "
                 f"checked against the nodes; the run checks them before it submits anything.")
    lines = []
    if cluster.problems:
        lines = [f"error: SLURM (the profile {profile}): the run would stop before it submits anything, for these "
                 f"jobs' requests"
                 f"{f' (checked against the {cluster.nodes} nodes sinfo lists)' if cluster.nodes is not None else ''}:",
                 *(f"  - {problem}" for problem in cluster.problems)]
    if cluster.nodes is None:
        return [*lines, unchecked]
    if lines:
        return lines
    if not cluster.jobs:
        return [f"SLURM (the profile {profile}): no job to submit."]
    return [f"SLURM (the profile {profile}): every job's request ({cluster.jobs} jobs) fits a node of the "
            f"{cluster.nodes} sinfo lists, as sbatch will get it: the rules' memory and time fitted to the "
            f"nodes (asks h: capped by the partitions' time limits), the profile's values as it sets them."]


def load_filled_config(configfile: str | Path) -> dict:
    """The config as the workflow runs it: checked (a ConfigError names every problem) and with
    the schema's defaults filled in."""
    from modsent import config as modsent_config

    path = Path(configfile)
    if not path.is_file():
        raise InputError(f"{path}: no such config file")
    try:
        config = modsent_config.read_config_file(path)
    except modsent_config.ConfigError as err:
        raise InputError(str(err)) from None
    try:
        modsent_config.check_config(config)
    except modsent_config.ConfigError as err:
        raise InputError(f"{path}: {err}") from None
    schema = modsent_config.load_schema()
    return modsent_config.fill_defaults(config, modsent_config.inline_refs(schema, schema))

# modsent: modular multilingual sentence encoders.
#
#   snakemake --cores 2                     # the embedded demo (config.yaml), offline, CPU
#   snakemake --configfile configs/paper-labse.yaml --executor slurm ...   # on a cluster
#
# The config is checked against modsent/schemas/config.schema.yaml before anything is planned.

from pathlib import Path

from snakemake.utils import min_version, validate

min_version("9.0")


# The embedded demo config, unless the command line names one: Snakemake would otherwise
# deep-merge the demo's keys (its languages, datasets and built-in sources) into that config.
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"



include: "rules/resources.smk"
include: "rules/common.smk"


check_and_fill_config(config)
validate(config, "modsent/schemas/config.schema.yaml")  # fills in the schema's defaults
fill_method_settings(config)  # the training methods' own settings (modsent.methods)
normalize_config(config)  # one spelling per meaning: rules' params are canonical


scattergather:
    translation=config["translation"]["shards"],


wildcard_constraints:
    lang=LANGUAGE_REGEX,
    base=BASE_REGEX,
    dataset=SLUG_REGEX,
    kind="pp|pl",
    weight=r"0(\.[0-9]+)?|1",
    variant=modsent_variants.name_pattern(configured_methods()),
    method=method_regex(),
    subset=SUBSET_REGEX,
    group=modsent_variants.group_pattern(configured_methods()),


include: "rules/base_model.smk"
include: "rules/inputs.smk"
include: "rules/specialization.smk"
include: "rules/paraphrase.smk"
include: "rules/sentence_encoding.smk"
include: "rules/alignment.smk"
include: "rules/baselines.smk"
include: "rules/methods.smk"
for method_rules in sorted(Path(workflow.basedir, "rules", "methods").glob("*.smk")):  # a method's own stages

    include: method_rules
include: "rules/evaluation.smk"


onstart:
    # Before any output is removed or any job submitted: refuse to start while a job of an
    # earlier run (Snakemake killed, the session lost) still produces an output (modsent.leases)
    from modsent import leases as modsent_leases

    jobs = list(workflow.dag.needrun_jobs())
    try:  # only this run's outputs: a concurrent --nolock run's jobs are not orphans
        modsent_leases.check_no_running_holders(outputs=[str(f) for job in jobs for f in job.output])
    except modsent_leases.LeaseError as err:
        raise WorkflowError(str(err)) from None
    # every job's resources now, under SLURM checked against the nodes (rules/resources.smk),
    # the profile's values too: a request no node can meet stops the run here, before any job
    # is submitted, not when the scheduler reaches that job (it would cancel the jobs already
    # running); every rule's problem at once
    problems = request_problems(jobs)
    if problems:
        raise WorkflowError("\n".join(problems))


if PLAN_REQUESTS is not None:  # a dry run of `modsent plan`: no onstart; the same check at its exit
    import atexit

    atexit.register(write_planned_requests)


rule all:
    input:
        all_targets(),
    default_target: True

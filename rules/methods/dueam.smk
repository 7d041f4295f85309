# DuEAM (modsent.methods.dueam): the word mover's distance of every training pair of a DuEAM
# method, between the frozen anchor model's token states of its two texts. One job per shard
# (methods.NAME.wmd_shards; a pair's shard is a hash of its pair id) under a folder named by a
# digest of the settings that decide the pairs and the distances ({wmd}), so DuEAM methods that
# share them (DuEAM-weak and its loss ablations) share the jobs. Each job reads and extends the
# content-addressed cache results/{base}/methods/DuEAM.wmd/cache/: a rerun computes nothing
# again. train_method reads the shards (Method.extra_inputs: inputs["wmd"]). The input
# functions are modsent.methods.dueam's.

from modsent.methods import dueam as modsent_dueam


rule dueam_wmd:
    """One shard of a DuEAM method's pairs scored by the anchor's word mover's distance: the
    pair files (translations for parallel data; the base model when it is the anchor) in, the
    shard's distances out. Params: the settings that decide the pairs and their distances."""
    input:
        unpack(lambda wildcards: modsent_dueam.wmd_inputs(
            modsent_dueam.wmd_settings_of(config["methods"], wildcards.wmd)["settings"], wildcards.base,
            training_languages())),
    output:
        modsent_dueam.WMD_SHARD,
    params:
        settings=lambda wildcards: canonical(
            modsent_dueam.wmd_settings_of(config["methods"], wildcards.wmd)["settings"]),
        languages=training_languages(),
    wildcard_constraints:
        wmd=modsent_dueam.WMD_DIGEST,
        shard=r"[0-9]+",
        shards=r"[0-9]+",
    threads: job_threads("gpu_encode")
    resources:
        **job_resources("gpu_encode"),
    priority: 1
    log:
        "logs/{base}/methods/DuEAM.wmd/{wmd}/{shard}-of-{shards}.log",
    benchmark:
        "logs/{base}/benchmarks/methods/DuEAM.wmd/{wmd}/{shard}-of-{shards}.tsv"
    conda:
        "../../envs/modsent.yaml"
    script:
        "../../workflow_scripts/dueam_wmd.py"

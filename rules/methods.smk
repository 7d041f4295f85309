# Training methods registered in modsent.methods (the config's `methods:`), each trained from the
# contract files into a sentence-transformers directory and evaluated like the baselines.


rule train_method:
    """One registered training method (modsent.methods): the base model and the paraphrase pairs
    or translations it uses in, results/{base}/methods/{method} out; a data-parallel method
    on methods.{method}.gpus GPUs of one node (torchrun); its job asks for the gpu_train kind's
    resources with methods.{method}.resources over them."""
    input:
        unpack(method_inputs),
    output:
        directory(layout.METHOD),
    params:
        settings=method_settings,
        languages=method_languages,
    threads: job_threads("gpu_train", gpus=method_gpus, overrides=method_resources)
    resources:
        **job_resources("gpu_train", gpus=method_gpus, overrides=method_resources, own_keys=method_resource_keys()),
    priority: 1
    log:
        "logs/{base}/methods/{method}.log",
    benchmark:
        "logs/{base}/benchmarks/methods/{method}.tsv"
    conda:
        ENV
    script:
        "../workflow_scripts/train_method.py"

# The base multilingual sentence encoder, as a local sentence-transformers directory.


rule base_model:
    """Convert the built-in model, download a Hub model (safetensors only) or copy a local one."""
    input:
        local=base_model_local_files,
    output:
        directory(layout.BASE_MODEL),
    wildcard_constraints:
        base=SLUG_REGEX,  # one base model for every seed replicate (base@seed{r})
    params:
        source=config["base_model"]["source"],
        revision=config["base_model"].get("revision"),
        trust_remote_code=config["base_model"]["trust_remote_code"],
        prompts=canonical(config["base_model"].get("prompts")),
        default_prompt_name=config["base_model"].get("default_prompt_name"),
    resources:
        **job_resources("cpu_heavy"),
    priority: 5
    log:
        "logs/base_model/{base}.log",
    conda:
        ENV
    script:
        "../workflow_scripts/base_model.py"

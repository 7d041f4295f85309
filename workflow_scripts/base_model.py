# rule base_model: the base model as a local sentence-transformers directory.
from modsent.encoders.base_models import prepare_base_model
from modsent.logs import start_job

start_job(snakemake)
prepare_base_model(
    snakemake.params.source,
    snakemake.output[0],
    revision=snakemake.params.revision,
    trust_remote_code=snakemake.params.trust_remote_code,
    prompts=snakemake.params.prompts,
    default_prompt_name=snakemake.params.default_prompt_name,
)

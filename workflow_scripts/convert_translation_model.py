# rule convert_translation_model: the NLLB/M2M100 checkpoint converted for CTranslate2.
from modsent.logs import start_job
from modsent.data.translation import convert_checkpoint

start_job(snakemake)
convert_checkpoint(snakemake.params.model, snakemake.output[0], quantization=snakemake.params.compute_type,
                   revision=snakemake.params.revision)

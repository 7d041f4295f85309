# rule train_method: a registered training method (modsent.methods) writes its system.
# Its runtime keys (gpus, checkpoint_every, log_every) are read from the config, not the params.
# A data-parallel method with gpus > 1 on a node with GPUs trains under torchrun, one process
# per GPU (python -m modsent.methods.launch); otherwise in this process.
import sys

from modsent import methods
from modsent.config import method_runtime_settings
from modsent.languages import PIVOT_LANGUAGE
from modsent.logs import start_job
from modsent.methods import launch

start_job(snakemake)
modules = snakemake.config["method_modules"]
methods.load(modules)
name = snakemake.wildcards.method
pairs = snakemake.input.get("pairs", [])
pairs = [pairs] if isinstance(pairs, str) else list(pairs)
translations = snakemake.input.get("translations", [])
translations = [translations] if isinstance(translations, str) else list(translations)
inputs = {"base": snakemake.input.base}
if pairs:  # the method uses them (Method.uses): its training languages'
    inputs["pairs"] = dict(zip(snakemake.params.languages, pairs, strict=True))
if translations:  # the method uses them (Method.uses): every non-English language's, sorted (method_inputs)
    inputs["translations"] = dict(zip(sorted(lang for lang in snakemake.config["languages"] if lang != PIVOT_LANGUAGE),
                                      translations, strict=True))
for key in snakemake.input.keys():  # what the method's own rules made (Method.extra_inputs)
    if key not in ("base", "pairs", "translations"):
        value = snakemake.input[key]
        inputs[key] = value if isinstance(value, str) else list(value)
settings = {**snakemake.params.settings, **method_runtime_settings(snakemake.config, name)}
sys.exit(launch.train(name, inputs, snakemake.output[0], settings, modules=modules, log_path=snakemake.log[0],
                      threads=snakemake.threads))

# rule train_method: a registered training method (modsent.methods) writes its system.
# Its runtime keys (checkpoint_every, log_every) are read from the config, not the params.
import torch

from modsent import methods
from modsent.config import method_runtime_settings
from modsent.languages import PIVOT_LANGUAGE
from modsent.logs import setup_logging

setup_logging(snakemake.log[0])
torch.set_num_threads(snakemake.threads)
methods.load(snakemake.config["method_modules"])
name = snakemake.wildcards.method
pairs = snakemake.input.get("pairs", [])
pairs = [pairs] if isinstance(pairs, str) else list(pairs)
translations = snakemake.input.get("translations", [])
translations = [translations] if isinstance(translations, str) else list(translations)
inputs = {"base": snakemake.input.base, "pairs": dict(zip(snakemake.params.languages, pairs, strict=True))}
if translations:  # the method uses them (Method.uses): every non-English language's
    inputs["translations"] = dict(zip([lang for lang in snakemake.config["languages"] if lang != PIVOT_LANGUAGE],
                                      translations, strict=True))
for key in snakemake.input.keys():  # what the method's own rules made (Method.extra_inputs)
    if key not in ("base", "pairs", "translations"):
        inputs[key] = snakemake.input[key]
settings = {**snakemake.params.settings, **method_runtime_settings(snakemake.config, name)}
methods.get(name).train(inputs, snakemake.output[0], settings)

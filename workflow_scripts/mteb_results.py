# rule mteb_results: one system's scores on the datasets that are mteb tasks, as mteb result files.
from pathlib import Path

from modsent.evaluation import mteb_results
from modsent.evaluation.suite import read_dataset
from modsent.logs import start_job

log = start_job(snakemake)
settings = snakemake.params.settings
variant = snakemake.wildcards.variant
datasets = {}
for name, spec in settings["datasets"].items():
    root = Path(spec["embeddings"])
    frames, embeddings = read_dataset(spec["subsets"], {lang: root / lang / variant / f"{name}.parquet"
                                                        for lang in spec["languages"]})
    datasets[name] = {"frames": frames, "embeddings": embeddings, "source": spec["source"]}
written = mteb_results.write_results(snakemake.output[0], snakemake.wildcards.base, variant, datasets,
                                     settings["languages"])
log.info("%s: %d mteb result file(s): %s", variant, len(written), ", ".join(path.name for path in written) or "none")

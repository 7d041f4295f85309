# rule seeds_summary: each score's mean ± sample std over the config's seed replicates.
from modsent.evaluation import suite
from modsent.logs import start_job

log = start_job(snakemake)
mean, std = suite.seeds_summary(list(snakemake.input), csv_path=snakemake.output.csv, md_path=snakemake.output.md,
                                html_path=snakemake.output.html, base=snakemake.wildcards.base)
log.info("%d systems x %d scores over %d seeds; largest std %.2f", *mean.shape, len(snakemake.input),
         float(std.max().max()) if std.notna().any().any() else float("nan"))

# rule evaluation_summary: the summary table, per-language tables and plots.
from modsent.evaluation import suite as evaluation
from modsent.logs import start_job

start_job(snakemake)
out = snakemake.output
evaluation.aggregate(snakemake.input, snakemake.params.variants, csv_path=out.csv, md_path=out.md, html_path=out.html,
                     plot_path=out.plot, heatmap_path=out.heatmap, per_language_dir=out.per_language,
                     missing=snakemake.params.missing, base=snakemake.wildcards.base)

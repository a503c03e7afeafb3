# One rule per figure, so that `snakemake figures/<experiment>/<name>.png` redraws just that one.
# Light and local: under a cluster profile they run beside Snakemake, not as jobs.


localrules:
    figure_loss,
    figure_nll,
    figure_downstream,
    figure_telemetry,
    figure_target,
    figure_throughput,


rule figure_loss:
    input:
        metrics=per_run(f"{RESULTS}/train/{{recipe}}/seed{{seed}}/metrics.parquet"),
        final_loss=per_run(f"{RESULTS}/eval/{{recipe}}/seed{{seed}}/final_loss.json"),
    output:
        png=figure("loss"),
        pdf=f"figures/{EXP.name}/loss.pdf",
    log:
        f"{LOGS}/figures/loss.log",
    resources:
        **LIGHT,
    shell:
        plot("loss")


rule figure_nll:
    input:
        nll=per_run(f"{RESULTS}/eval/{{recipe}}/seed{{seed}}/nll.parquet"),
        # per held-out document: the paired bootstrap of a one-seed difference (as the report's)
        documents=per_run(f"{RESULTS}/eval/{{recipe}}/seed{{seed}}/nll_documents.parquet"),
    output:
        png=figure("nll"),
        pdf=f"figures/{EXP.name}/nll.pdf",
    log:
        f"{LOGS}/figures/nll.log",
    resources:
        **LIGHT,
    shell:
        plot("nll")


rule figure_downstream:
    input:
        downstream=per_run(f"{RESULTS}/eval/{{recipe}}/seed{{seed}}/downstream.parquet"),
        # per item: the paired item-level test of a one-seed difference (as the report's)
        downstream_items=per_run(f"{RESULTS}/eval/{{recipe}}/seed{{seed}}/downstream_items.parquet"),
    output:
        png=figure("downstream"),
        pdf=f"figures/{EXP.name}/downstream.pdf",
    log:
        f"{LOGS}/figures/downstream.log",
    resources:
        **LIGHT,
    shell:
        plot("downstream")


rule figure_telemetry:
    input:
        per_run(f"{RESULTS}/train/{{recipe}}/seed{{seed}}/telemetry.parquet"),
    output:
        png=figure("telemetry"),
        pdf=f"figures/{EXP.name}/telemetry.pdf",
    log:
        f"{LOGS}/figures/telemetry.log",
    resources:
        **LIGHT,
    shell:
        plot("telemetry")


rule figure_target:
    input:
        # every run's: the automatic T from its `target` column, the fixed T of the others as references
        per_run(f"{RESULTS}/train/{{recipe}}/seed{{seed}}/telemetry.parquet"),
    output:
        png=figure("target"),
        pdf=f"figures/{EXP.name}/target.pdf",
    log:
        f"{LOGS}/figures/target.log",
    resources:
        **LIGHT,
    shell:
        plot("target")


rule figure_throughput:
    input:
        THROUGHPUT_FILES,
    output:
        png=figure("throughput"),
        pdf=f"figures/{EXP.name}/throughput.pdf",
    params:
        model=STUDY.model.name,
        # the measured files; with none, the folder, so that the figure says nothing was measured
        sources=lambda wildcards, input: list(input) or [THROUGHPUT_FOLDER],
    log:
        f"{LOGS}/figures/throughput.log",
    resources:
        **LIGHT,
    shell:
        "fp4repro plot throughput --model {params.model} --out {output.png} {params.sources} 2> {log}"

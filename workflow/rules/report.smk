localrules:
    report,


rule report:
    """Each claim of the claims file beside what this experiment measured."""
    input:
        claims=str(claims_path()),
        final_loss=per_run(f"{RESULTS}/eval/{{recipe}}/seed{{seed}}/final_loss.json"),
        nll=per_run(f"{RESULTS}/eval/{{recipe}}/seed{{seed}}/nll.parquet"),
        nll_documents=per_run(f"{RESULTS}/eval/{{recipe}}/seed{{seed}}/nll_documents.parquet"),
        downstream=per_run(f"{RESULTS}/eval/{{recipe}}/seed{{seed}}/downstream.parquet"),
        downstream_items=per_run(f"{RESULTS}/eval/{{recipe}}/seed{{seed}}/downstream_items.parquet"),
        metrics=per_run(f"{RESULTS}/train/{{recipe}}/seed{{seed}}/metrics.parquet"),
        telemetry=per_run(f"{RESULTS}/train/{{recipe}}/seed{{seed}}/telemetry.parquet"),
        throughput=THROUGHPUT_FILES,
        figures=FIGURE_FILES,
    output:
        report(REPORT, caption="../report/claims.rst", category="Claims"),
    params:
        study=STUDY_ARGS,
    log:
        f"{LOGS}/report.log",
    resources:
        **LIGHT,
    shell:
        "fp4repro report {params.study} --claims {input.claims} --results results "
        "--out {output} {input.figures} 2> {log}"

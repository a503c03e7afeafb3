localrules:
    report,


rule report:
    """Each claim of the claims file beside what this experiment measured."""
    input:
        claims=str(claims_path()),
        final_loss=per_recipe(f"{RESULTS}/eval/{{recipe}}/final_loss.json"),
        nll=per_recipe(f"{RESULTS}/eval/{{recipe}}/nll.parquet"),
        downstream=per_recipe(f"{RESULTS}/eval/{{recipe}}/downstream.parquet"),
        telemetry=per_recipe(f"{RESULTS}/train/{{recipe}}/telemetry.parquet"),
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

rule report:
    """Each claim of paper/claims.yaml beside what this experiment measured."""
    input:
        claims=str(REPO_ROOT / "paper" / "claims.yaml"),
        final_loss=per_recipe(f"{RESULTS}/eval/{{recipe}}/final_loss.json"),
        nll=per_recipe(f"{RESULTS}/eval/{{recipe}}/nll.parquet"),
        downstream=per_recipe(f"{RESULTS}/eval/{{recipe}}/downstream.parquet"),
        telemetry=per_recipe(f"{RESULTS}/train/{{recipe}}/telemetry.parquet"),
        figures=FIGURE_FILES,
    output:
        REPORT,
    log:
        f"{LOGS}/report.log",
    resources:
        **LIGHT,
    shell:
        "{FP4REPRO} report --experiment {EXPERIMENT} --claims {input.claims} --results results "
        "--out {output} {input.figures} 2> {log}"

rule evaluate:
    """Every checkpoint x policy: held-out NLL, lm-eval aggregates, final-window loss."""
    input:
        manifest=rules.prepare_data.output.manifest,
        done=rules.train.output.done,
        metrics=rules.train.output.metrics,
    output:
        nll=f"{RESULTS}/eval/{{recipe}}/seed{{seed}}/nll.parquet",
        nll_documents=f"{RESULTS}/eval/{{recipe}}/seed{{seed}}/nll_documents.parquet",
        downstream=f"{RESULTS}/eval/{{recipe}}/seed{{seed}}/downstream.parquet",
        downstream_items=f"{RESULTS}/eval/{{recipe}}/seed{{seed}}/downstream_items.parquet",
        final_loss=f"{RESULTS}/eval/{{recipe}}/seed{{seed}}/final_loss.json",
    params:
        eval=section("eval"),
        final_window=EXP.train.final_window,
        recipe=recipe_arg,
        data=lambda wildcards, input: os.path.dirname(input.manifest),
    log:
        f"{LOGS}/evaluate/{{recipe}}/seed{{seed}}.log",
    threads: threads_of("evaluate")
    resources:
        **resources_of("evaluate"),
    shell:
        "OMP_NUM_THREADS={threads} fp4repro evaluate {params.recipe} "
        "--results results --data {params.data} 2> {log}"

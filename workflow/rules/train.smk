rule train:
    """One recipe over every stage; resumes from its newest resume checkpoint when rerun."""
    input:
        manifest=rules.prepare_data.output.manifest,
        recipe=recipe_file,
        model=str(model_config_path(EXP.model)),
    output:
        done=f"{RESULTS}/train/{{recipe}}/done.json",
        metrics=f"{RESULTS}/train/{{recipe}}/metrics.parquet",
        telemetry=f"{RESULTS}/train/{{recipe}}/telemetry.parquet",
    params:
        train=section("train"),
        backend=EXP.backend,
    log:
        f"{LOGS}/train/{{recipe}}.log",
    threads: threads_of("train")
    resources:
        **resources_of("train"),
    shell:
        "OMP_NUM_THREADS={threads} {FP4REPRO} train --experiment {EXPERIMENT} --recipe {wildcards.recipe} "
        "--data {RESULTS}/data --out {RESULTS}/train/{wildcards.recipe} 2> {log}"

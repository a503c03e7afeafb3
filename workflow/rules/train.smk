rule train:
    """One recipe over every stage; resumes from its newest resume checkpoint when rerun."""
    input:
        manifest=rules.prepare_data.output.manifest,
        recipe=recipe_files,
        model=str(model_config_path(EXP.model)),
    output:
        done=f"{RESULTS}/train/{{recipe}}/seed{{seed}}/done.json",
        metrics=f"{RESULTS}/train/{{recipe}}/seed{{seed}}/metrics.parquet",
        telemetry=f"{RESULTS}/train/{{recipe}}/seed{{seed}}/telemetry.parquet",
    params:
        # what changes the numbers (TrainConfig.NUMERIC_FIELDS): a change of telemetry or resume
        # cadence, or of the final window, resumes nothing and reruns nothing here
        train=repr(EXP.train.numerics()),
        backend=EXP.backend,
        recipe=recipe_arg,
        data=lambda wildcards, input: os.path.dirname(input.manifest),
        out=lambda wildcards, output: os.path.dirname(output.done),
        launch=launcher("train"),
    log:
        f"{LOGS}/train/{{recipe}}/seed{{seed}}.log",
    threads: threads_of("train")
    # trainings before evaluations when both are ready: the DAG ends one evaluation after its last
    # training, so on few cores a training started last (the longest jobs) decides the wall time
    priority: 1
    resources:
        **resources_of("train"),
        **launcher_resources(),
    shell:
        "OMP_NUM_THREADS={threads} {params.launch}fp4repro train {params.recipe} "
        "--data {params.data} --out {params.out} 2> {log}"

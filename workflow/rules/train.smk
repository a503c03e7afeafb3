rule train:
    """One recipe over every stage; resumes from its newest resume checkpoint when rerun."""
    input:
        manifest=rules.prepare_data.output.manifest,
        recipe=recipe_file,
        model=str(REPO / "configs" / "models" / f"{EXP.model}.yaml"),
    output:
        done=f"{RESULTS}/train/{{recipe}}/done.json",
        metrics=f"{RESULTS}/train/{{recipe}}/metrics.parquet",
        telemetry=f"{RESULTS}/train/{{recipe}}/telemetry.parquet",
    params:
        train=section("train"),
        backend=EXP.backend,
    log:
        f"{LOGS}/train/{{recipe}}.log",
    threads: resource("train", "threads", 1)
    resources:
        mem_mb=resource("train", "mem_mb", 4000),
        runtime=resource("train", "runtime", 60),
        nodes=resource("train", "nodes", 1),
        tasks=resource("train", "tasks", 1),
        gres=resource("train", "gres", ""),
    shell:
        "OMP_NUM_THREADS={threads} {FP4REPRO} train --experiment {EXPERIMENT} --recipe {wildcards.recipe} "
        "--data {RESULTS}/data --out {RESULTS}/train/{wildcards.recipe} 2> {log}"

rule prepare_data:
    """Corpora -> dedup -> split -> tokenizer -> Megatron indexed datasets; manifest.json last."""
    output:
        manifest=f"{RESULTS}/data/manifest.json",
    params:
        data=section("data"),
    log:
        f"{LOGS}/prepare_data.log",
    threads: resource("prepare_data", "threads", 1)
    resources:
        mem_mb=resource("prepare_data", "mem_mb", 4000),
        runtime=resource("prepare_data", "runtime", 30),
    shell:
        "OMP_NUM_THREADS={threads} {FP4REPRO} prepare-data --experiment {EXPERIMENT} "
        "--out {RESULTS}/data 2> {log}"

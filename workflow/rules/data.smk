rule prepare_data:
    """Corpora -> dedup -> split -> tokenizer -> Megatron indexed datasets; manifest.json last."""
    output:
        manifest=f"{RESULTS}/data/manifest.json",
    params:
        data=section("data"),
    log:
        f"{LOGS}/prepare_data.log",
    threads: threads_of("prepare_data")
    resources:
        **resources_of("prepare_data"),
    shell:
        "OMP_NUM_THREADS={threads} {FP4REPRO} prepare-data --experiment {EXPERIMENT} "
        "--out {RESULTS}/data 2> {log}"

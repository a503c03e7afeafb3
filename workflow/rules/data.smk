rule prepare_data:
    """Corpora -> dedup -> split -> tokenizer -> Megatron indexed datasets; manifest.json last."""
    input:
        # the source files (globs expanded), indexed .bin/.idx and a given tokenizer
        sources=[str(p) for p in EXP.data.input_files()],
    output:
        manifest=f"{RESULTS}/data/manifest.json",
    params:
        data=section("data"),
        stdlib=EXP.data.stdlib(),  # the standard library is an input of stdlib sources
        experiment=EXPERIMENT_ARG,
        out=lambda wildcards, output: os.path.dirname(output.manifest),
    log:
        f"{LOGS}/prepare_data.log",
    threads: threads_of("prepare_data")
    resources:
        **resources_of("prepare_data"),
    shell:
        "OMP_NUM_THREADS={threads} fp4repro prepare-data {params.experiment} --out {params.out} 2> {log}"

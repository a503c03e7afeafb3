# Body throughput of the experiment's model on the GPU visible to Snakemake, when this device has no
# file of that model yet (results/bench/throughput_<device>_<model>.json; `--forcerun
# bench_throughput` measures again, and the file records how far the medians moved). Without a GPU
# this rule is not defined: the figure and the report draw from the committed files.
if THROUGHPUT_HERE:

    rule bench_throughput:
        output:
            THROUGHPUT_HERE,
        params:
            study=STUDY_ARGS,
        log:
            f"{LOGS}/bench/throughput.log",
        threads: EXP.resources.get("bench_throughput", {}).get("threads", 1)
        resources:
            **resources_of("bench_throughput"),
        shell:
            "fp4repro bench throughput {params.study} --quiet --out {output} > {log} 2>&1"

# Body throughput of the experiment's model on the GPU visible here, when this device has no file
# yet (a committed file is not measured again; `--forcerun bench_throughput` replaces it, and the
# new file records how far it moved). Without a GPU this rule is not defined: the figure and the
# report draw from the committed files.
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

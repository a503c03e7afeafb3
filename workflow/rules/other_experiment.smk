# A figure or the report of an experiment this invocation does not study (`snakemake
# figures/smoke/nll.png` while the study is tiny): Snakemake alone would say only "No rule to
# produce"; these rules stop the planning with the --config that makes it.

localrules:
    figure_of_another_experiment,
    report_of_another_experiment,


rule figure_of_another_experiment:
    """Stops the planning: says which --config draws a figure of another experiment."""
    input:
        another_experiment,
    output:
        "figures/{experiment}/{name}",
    wildcard_constraints:
        experiment=OTHER_EXPERIMENT,


rule report_of_another_experiment:
    """Stops the planning: says which --config writes the report of another experiment."""
    input:
        another_experiment,
    output:
        "paper/{experiment}/report.md",
    wildcard_constraints:
        experiment=OTHER_EXPERIMENT,

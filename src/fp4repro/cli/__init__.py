"""The ``fp4repro`` command line: one subcommand per step of the study.

Each module of this package holds one group of subcommands and adds their parsers
(``COMMANDS``); this one assembles the parser and runs a command. The modules import what a
command needs inside it, so that ``fp4repro --help`` and a light command load neither torch nor
matplotlib.
"""

from __future__ import annotations

import argparse
import sys

from fp4repro.cli import bench, configs, evaluate, figures, parity, runs

DESCRIPTION = """\
fp4repro reproduces and benchmarks FP4 (E2M1) LLM pretraining with UE5M3 block scales.

Every step of the study is a subcommand; the Snakemake workflow calls them, and you can too.
Numerics: x̂ = q · s_b / g with g = Emax·T/amax (tensor scale), s_b the block scale in the
recipe's scale format and q the E2M1 element (see README, "Numerics").
"""

#: The order `fp4repro --help` lists the commands in. It crosses the groups, so it is kept here, in
#: one place, rather than following the order the group modules are imported in.
ORDER = (
    "formats",
    "recipe",
    "experiment",
    "prepare-data",
    "train",
    "evaluate",
    "model",
    "explain",
    "plot",
    "bench",
    "report",
    "parity",
    "parity-curves",
    "inventory",
    "runs",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fp4repro", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--debug",
        action="store_true",
        help="show the traceback of every error (by default, errors in configs and inputs print one line)",
    )
    sub = p.add_subparsers(dest="command", metavar="<command>")
    adders = {}
    for group in (configs, runs, evaluate, figures, bench, parity):
        adders.update(group.COMMANDS)
    # a command a group adds but ORDER forgets would silently vanish from the command line
    assert sorted(adders) == sorted(ORDER), f"commands of the groups {sorted(adders)} are not those of ORDER"
    for command in ORDER:
        adders[command](sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command. A configuration error prints one line and exits 2; another error about the
    user's input (data, checkpoints, results files) one line and exit 1; anything else keeps its
    traceback (exit 1). ``--debug`` shows the traceback of every error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    from fp4repro.errors import ConfigError, FP4ReproError

    try:
        return args.func(args)
    except FP4ReproError as err:
        if args.debug:
            raise
        print(f"fp4repro {args.command}: error: {err}", file=sys.stderr)
        return 2 if isinstance(err, ConfigError) else 1

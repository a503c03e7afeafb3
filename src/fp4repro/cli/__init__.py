"""The ``fp4repro`` command line: one subcommand per step of the study.

Each module of this package holds one group of subcommands and adds their parsers
(``COMMANDS``); this one assembles the parser and runs a command. The modules import what a
command needs inside it, so that ``fp4repro --help`` and a light command load neither torch nor
matplotlib.
"""

from __future__ import annotations

import argparse
import sys

from fp4repro.cli import bench, configs, docs, evaluate, figures, parity, runs

DESCRIPTION = """\
fp4repro reproduces and benchmarks FP4 (E2M1) LLM pretraining with UE5M3 block scales.

Every step of the study is a subcommand; the Snakemake workflow calls them, and you can too.
Numerics: x̂ = q · s_b / g with g = Emax·T/amax (tensor scale), s_b the block scale in the
recipe's scale format and q the E2M1 element (see docs/numerics.md).
"""

#: The order `fp4repro --help` lists the commands in. It crosses the groups, so it is kept here, in
#: one place, rather than following the order the group modules are imported in.
ORDER = (
    "formats",
    "recipe",
    "experiment",
    "prepare-data",
    "train",
    "verify",
    "evaluate",
    "model",
    "explain",
    "plot",
    "bench",
    "report",
    "docs",
    "parity",
    "parity-curves",
    "inventory",
    "runs",
)


DEBUG = "--debug"  # fp4repro's own option, given before the command


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fp4repro", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        DEBUG,
        action="store_true",
        help="show the traceback of every error (by default, errors in configs and inputs print one line)",
    )
    sub = p.add_subparsers(dest="command", metavar="<command>")
    adders = {}
    for group in (configs, runs, evaluate, figures, bench, parity, docs):
        adders.update(group.COMMANDS)
    # a command a group adds but ORDER forgets would silently vanish from the command line
    assert sorted(adders) == sorted(ORDER), f"commands of the groups {sorted(adders)} are not those of ORDER"
    for command in ORDER:
        adders[command](sub)
    p.set_defaults(command_line=p)  # for `docs`, which renders what commands print
    p.commands = sub.choices  # command -> its parser: an unknown option is told with the command's usage
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command. A configuration error prints one line and exits 2; another error about the
    user's input (data, checkpoints, results files), a full disk or a file that is not UTF-8 text
    one line and exit 1; a reader that closes the pipe (``| head``) ends the command quietly with
    141, as a command killed by SIGPIPE; anything else keeps its traceback (exit 1). ``--debug``
    shows the traceback of every error."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # argparse names them all under fp4repro's own usage; one the command does not have is told
        # with the command's, one given before the command or of fp4repro's own (--debug after
        # the command) with fp4repro's
        before = argv[: argv.index(args.command)] if args.command in argv else argv
        misplaced = any(t in before or t.split("=")[0] == DEBUG for t in unknown)
        owner = parser if misplaced or args.command is None else parser.commands[args.command]
        owner.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.print_help()
        return 0
    from fp4repro.errors import ConfigError

    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not as an error at the interpreter's exit
        return code
    except BrokenPipeError:
        if args.debug:
            raise
        return _pipe_closed()
    except Exception as err:
        message = None if args.debug else _one_line(err)
        if message is None:
            raise
        print(f"fp4repro {args.command}: error: {message}", file=sys.stderr)
        return 2 if isinstance(err, ConfigError) else 1


def _one_line(err: Exception) -> str | None:
    """The one line that explains ``err`` to the user, or None for an error that keeps its traceback."""
    import errno

    from fp4repro.errors import FP4ReproError
    from fp4repro.util import free_bytes

    if isinstance(err, FP4ReproError):
        return str(err)
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:  # a writer other than fp4repro.util's atomic ones
        if not err.filename:  # a failed write names no file, and the free space of another disk would mislead
            return "disk full writing a file; run with --debug to see which"
        free = free_bytes(err.filename)
        return f"disk full writing {err.filename}; {'an unknown number of' if free is None else f'{free:,}'} bytes free"
    if isinstance(err, UnicodeDecodeError):  # a reader without its own check; --debug shows which file
        return f"a file is not UTF-8 text ({err}); run with --debug to see which"
    return None


def _pipe_closed() -> int:
    """Stop writing to a pipe whose reader has gone: stdout goes to /dev/null, so that the
    interpreter's last flush at exit does not fail again; 141 is a shell's status of a command
    killed by SIGPIPE."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout replaced by something without a file descriptor
        pass
    return 141

"""The errors fp4repro reports to its user as one line (the CLI prints them without a traceback).

    FP4ReproError   a problem with the user's input whose message names everything needed to fix
                    it (the file, the field or record, the value, what is allowed): exit code 1
    ConfigError     a configuration file or option that cannot be used: exit code 2, raised
                    before any compute
    DiskFullError   a write that found its filesystem full (``fp4repro.util``'s atomic writers
                    raise it, naming the file and the free space): exit code 1

Anything else is a bug or an environment failure and keeps its traceback (exit code 1).
"""

from __future__ import annotations


class FP4ReproError(Exception):
    """An unusable input, explained completely by the message."""


class ConfigError(FP4ReproError):
    """A configuration (experiment, recipe, model, eval section, workflow option) that cannot be used."""


class DiskFullError(FP4ReproError):
    """A write that found its filesystem full; an atomic write leaves the file it would have
    replaced as it was."""

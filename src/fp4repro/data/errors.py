"""The one error type of data preparation and sampling."""

from __future__ import annotations

from fp4repro.errors import FP4ReproError


class DataError(FP4ReproError):
    """Input data or prepared data that cannot be used; the message names the source and the path."""

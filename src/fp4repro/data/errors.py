"""The one error type of data preparation and sampling."""

from __future__ import annotations


class DataError(ValueError):
    """Input data or prepared data that cannot be used; the message names the source and the path."""

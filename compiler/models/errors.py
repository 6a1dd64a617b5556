"""A model that cannot be indexed: the caller turns this into a located diagnostic."""

from __future__ import annotations


class ModelError(Exception):
    """A model that cannot be found or read, with its diagnostic code and help."""
    def __init__(self, code: str, message: str, help: str = ""):
        super().__init__(message)
        self.code, self.message, self.help = code, message, help

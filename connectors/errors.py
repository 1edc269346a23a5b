"""Errors that stop a run before any output is written (exit code 2, one line on stderr)."""

from __future__ import annotations


class InputError(Exception):
    """Bad arguments or input: a missing path, a directory that is not a store, a malformed
    offsets file. The message is one line that names the path and what is wrong."""

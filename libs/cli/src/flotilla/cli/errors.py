"""The one error type the command prints as a single line and exits non-zero with.

Everything a user can get wrong (a missing file, an unknown cluster, no running
environment, invalid YAML) is raised as `CliError` with a message that says what
to do; `flotilla.cli.commands` turns it (and Flotilla's own errors) into one line
on stderr, never a traceback.
"""

from __future__ import annotations


class CliError(Exception):
    """A user-facing failure: printed as ``error: <message>``, exit code 1."""

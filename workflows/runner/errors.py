"""Errors of the local runner."""

from __future__ import annotations

from collections.abc import Sequence

from steps.errors import DsxError, InputError

__all__ = ["HostCommandsRefused", "NodeError", "UnsupportedConstruct"]


class UnsupportedConstruct(InputError):
    """The workflow uses a construct the local runner does not carry out; raised before the run starts.

    ``problems`` holds one line per construct, each naming it and where it is (template and field path).
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class NodeError(DsxError):
    """A failure of one node while the workflow runs (its node ends in phase Error with this message)."""


class HostCommandsRefused(InputError):
    """The workflow would start commands on this machine that the user did not allow; raised before the run.

    ``templates`` names each container or script template that is not one of dsx's own steps.
    """

    def __init__(self, message: str, templates: Sequence[str]) -> None:
        self.templates = list(templates)
        super().__init__(message)

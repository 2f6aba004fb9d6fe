"""The runtime part's vocabularies, with nothing to import: the recipe criteria's values, the drift
scopes and the bundle formats.

The steps check values against these, the workflow templates offer them as their parameters' enums, and
the CLI writes them into its help; the CLI imports this module at start-up, so it stays free of pydantic
and pandas (``benchmarks/cli_startup.py``).
"""

from __future__ import annotations

from typing import Literal

__all__ = ["ALLOWED", "ANY", "BUNDLE_FORMATS", "FIELDS", "PARTS", "SCOPES", "Part"]

ANY = "any"
"""Leaves a criteria field open (on an overlay); in a query it matches only open overlays."""

ALLOWED: dict[str, tuple[str, ...]] = {
    "service": ("eks", "gke", "aks", "oke", "bare-metal", "local"),
    "accelerator": ("h100", "h200", "b200", "gb200", "a100", "cpu"),
    "os": ("ubuntu", "rhel"),
    "intent": ("training", "inference"),
    "platform": ("kubeflow", "none"),
}
"""The allowed values of each string field (``any`` is allowed everywhere as well)."""

FIELDS: tuple[str, ...] = ("service", "accelerator", "os", "intent", "platform", "nodes")
"""Every criteria field, in the order they are shown."""

Part = Literal["nodes", "components"]
PARTS: tuple[Part, ...] = ("nodes", "components")
"""What drift compares: the nodes' software, and the components the recipe deploys."""

SCOPES: dict[str, tuple[Part, ...]] = {"all": PARTS, **{part: (part,) for part in PARTS}}
"""Each drift scope (``dsx drift --scope``, the ``dsx-drift`` workflow's ``scope``) and the parts it
compares; ``all``, the default, first."""

BUNDLE_FORMATS: tuple[str, ...] = ("helm", "argocd", "flux")
"""The deployment tools a bundle can target (:class:`steps.runtime.bundle.BundleFormat`)."""

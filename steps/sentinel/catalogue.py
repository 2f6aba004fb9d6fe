"""The fault catalogue: what each XID and each NVML or sysfs condition means (severity, action), and the
mode of every check, read from the data in ``recipes/faults/`` and a cluster's overrides.

``xid.yaml`` holds NVIDIA's XID catalogue (each XID's resolution bucket) and what dsx does about each
bucket; ``conditions.yaml`` the conditions the probes find and the modes. An overrides file (kind
``FaultOverrides``) changes severities, actions and modes for one cluster. An XID the catalogue does not
list gets its ``default`` and keeps its raw code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError

from steps.cluster import vocabulary as vocab
from steps.errors import InputError
from steps.models import Camel, Frozen, input_error, read_model
from steps.sentinel.events import CHECKS, Action, Severity
from steps.sentinel.history import FaultHistory, load_history
from steps.yamlio import shipped

__all__ = [
    "CatalogueEntry",
    "FaultCatalogue",
    "FaultOverrides",
    "Mode",
    "Rule",
    "default_faults_dir",
    "given_catalogue",
    "load_catalogue",
]

Mode = Literal["enforce", "observe", "off"]


class Rule(Frozen):
    """What a fault means: its severity, the action that repairs it, the mode of its check."""

    severity: Severity
    action: Action
    mode: Mode = "enforce"
    threshold: float | None = None


class _Bucket(Frozen):
    severity: Severity
    action: Action


class _Xid(Frozen):
    code: int
    mnemonic: str
    bucket: str


class _MessageRule(Frozen):
    contains: str
    severity: Severity
    action: Action


class _XidFile(Camel):
    api_version: Literal["dsx.dev/v1alpha1"]
    kind: Literal["XidCatalogue"]
    buckets: dict[str, _Bucket]
    default: _Bucket
    sxid_default: _Bucket
    xids: list[_Xid]
    by_message: dict[int, list[_MessageRule]] = Field(default_factory=dict)


class _Condition(Frozen):
    check: str
    code: str
    severity: Severity
    action: Action
    threshold: float | None = None
    description: str = ""


class _ConditionFile(Frozen):
    apiVersion: Literal["dsx.dev/v1alpha1"]
    kind: Literal["ConditionCatalogue"]
    modes: dict[str, Mode]
    conditions: list[_Condition]


class _Override(Frozen):
    check: str
    code: str
    severity: Severity | None = None
    action: Action | None = None
    threshold: float | None = None


class FaultOverrides(Frozen):
    """A cluster's changes to the catalogue (kind ``FaultOverrides``).

    Attributes:
        modes: check to mode (``enforce``, ``observe``, ``off``).
        entries: per check and code, a new severity, action or threshold; for ``xid`` and ``sxid`` a
            code the catalogue lacks is added.
        history: the fault history rules, in place of the shipped ones (``recipes/faults/history.yaml``).
    """

    apiVersion: Literal["dsx.dev/v1alpha1"]
    kind: Literal["FaultOverrides"]
    cluster: str = ""
    modes: dict[str, Mode] = Field(default_factory=dict)
    entries: list[_Override] = Field(default_factory=list)
    history: FaultHistory | None = None


class CatalogueEntry(Frozen):
    """One line of the effective catalogue, as ``dsx sentinel catalog`` prints it."""

    check: str
    code: str
    severity: Severity
    action: Action
    mode: Mode
    source: str = ""
    """NVIDIA's resolution bucket for an XID, ``condition`` for an NVML or sysfs condition,
    ``default`` for the fallback of an unlisted code; ``override`` when the cluster changed it."""
    description: str = ""


def _order(entry: CatalogueEntry) -> tuple[int, int, str]:
    checks = list(CHECKS)
    code = int(entry.code) if entry.code.isdigit() else -1
    return (checks.index(entry.check), code, entry.code)


class FaultCatalogue:
    """The effective catalogue: lookups for the probes and the listing for people."""

    def __init__(
        self,
        entries: dict[tuple[str, str], CatalogueEntry],
        thresholds: dict[tuple[str, str], float],
        modes: dict[str, Mode],
        defaults: dict[str, CatalogueEntry],
        by_message: dict[str, list[_MessageRule]],
        history: FaultHistory | None = None,
    ) -> None:
        self.history = history or FaultHistory()
        """The fault history rules in force (:mod:`steps.sentinel.history`)."""
        self._entries = entries
        self._thresholds = thresholds
        self._modes = modes
        self._defaults = defaults
        self._by_message = by_message

    def mode(self, check: str) -> Mode:
        """The check's mode (``enforce`` where the data names none)."""
        return self._modes.get(check, "enforce")

    def rule(self, check: str, code: str, message: str = "") -> Rule:
        """What ``code`` of ``check`` means; an unlisted XID or SXid gets the catalogue's default.

        Raises:
            KeyError: a condition code the catalogue does not know (a defect of a probe).
        """
        entry = self._entries.get((check, code)) or self._defaults.get(check)
        if entry is None:
            raise KeyError(f"fault catalogue: no entry for check {check!r} code {code!r}")
        severity, action = entry.severity, entry.action
        for rule in self._by_message.get(f"{check}/{code}", []):
            if rule.contains in message:
                severity, action = rule.severity, rule.action
                break
        return Rule(
            severity=severity,
            action=action,
            mode=self.mode(check),
            threshold=self._thresholds.get((check, code)),
        )

    def describe(self, check: str, code: str) -> str:
        """The entry's description (an XID's mnemonic), or ``""``."""
        entry = self._entries.get((check, code))
        return entry.description if entry else ""

    def entries(self) -> list[CatalogueEntry]:
        """Every entry, the defaults included (code ``*``), in check order then by code."""
        rows = [e.model_copy(update={"mode": self.mode(e.check)}) for e in self._entries.values()]
        rows += [e.model_copy(update={"mode": self.mode(e.check)}) for e in self._defaults.values()]
        return sorted(rows, key=_order)


def default_faults_dir() -> Path:
    """``recipes/faults`` as shipped in the ``recipes`` package."""
    return shipped("faults")


def load_catalogue(
    folder: Path | None = None,
    overrides: Path | None = None,
    changes: FaultOverrides | None = None,
    source: str = "",
) -> FaultCatalogue:
    """Read the catalogue from ``folder`` (default the shipped one) and apply ``overrides`` (a file), or
    ``changes`` already read (from ``source``, for messages).

    Raises:
        InputError: a file is missing, is not YAML or does not fit its kind; an override names an
            unknown check, mode or condition code (file and line in the message).
    """
    where = folder or default_faults_dir()
    xids = read_model(where / "xid.yaml", _XidFile, what="XidCatalogue")
    conditions = read_model(where / "conditions.yaml", _ConditionFile, what="ConditionCatalogue")
    entries: dict[tuple[str, str], CatalogueEntry] = {}
    thresholds: dict[tuple[str, str], float] = {}
    for xid in xids.xids:
        bucket = xids.buckets.get(xid.bucket)
        if bucket is None:
            raise InputError(f"{where / 'xid.yaml'}: XID {xid.code}: unknown bucket {xid.bucket!r}")
        entries[("xid", str(xid.code))] = CatalogueEntry(
            check="xid",
            code=str(xid.code),
            severity=bucket.severity,
            action=bucket.action,
            mode="enforce",
            source=xid.bucket,
            description=xid.mnemonic,
        )
    for cond in conditions.conditions:
        if cond.check not in CHECKS:
            raise InputError(f"{where / 'conditions.yaml'}: unknown check {cond.check!r}")
        entries[(cond.check, cond.code)] = CatalogueEntry(
            check=cond.check,
            code=cond.code,
            severity=cond.severity,
            action=cond.action,
            mode="enforce",
            source="condition",
            description=cond.description,
        )
        if cond.threshold is not None:
            thresholds[(cond.check, cond.code)] = cond.threshold
    defaults = {
        "xid": CatalogueEntry(
            check="xid",
            code="*",
            mode="enforce",
            source="default",
            description="an XID not listed",
            **xids.default.model_dump(),
        ),
        "sxid": CatalogueEntry(
            check="sxid",
            code="*",
            mode="enforce",
            source="default",
            description="an NVSwitch SXid",
            **xids.sxid_default.model_dump(),
        ),
    }
    modes: dict[str, Mode] = dict(conditions.modes)
    history = load_history(where / "history.yaml") if (where / "history.yaml").exists() else FaultHistory()
    if overrides is not None:
        changes, source = read_model(overrides, FaultOverrides, what="FaultOverrides"), str(overrides)
    if changes is not None:
        _apply(changes, source or "overrides", entries, thresholds, modes)
        history = changes.history or history
    by_message = {f"xid/{code}": rules for code, rules in xids.by_message.items()}
    return FaultCatalogue(entries, thresholds, modes, defaults, by_message, history)


def given_catalogue() -> FaultCatalogue:
    """The catalogue with the cluster's overrides where this process is given them: the whole overrides
    body in :data:`~steps.cluster.vocabulary.ENV_FAULT_OVERRIDES` (JSON or YAML, as the chart gives
    dsx-reconcile its ``sentinel.overrides``), else the file
    :data:`~steps.cluster.vocabulary.ENV_SENTINEL_OVERRIDES` names (as the agent is given it), else none.

    Raises:
        InputError: the overrides do not read as a FaultOverrides, or name what the catalogue lacks (the
            variable named).
    """
    given = os.environ.get(vocab.ENV_FAULT_OVERRIDES, "").strip()
    if given:
        where = f"${vocab.ENV_FAULT_OVERRIDES}"
        try:
            body = yaml.safe_load(given)
        except yaml.YAMLError as exc:
            raise InputError(f"{where}: not YAML or JSON ({exc})") from None
        if not isinstance(body, dict):
            raise InputError(f"{where}: expected a FaultOverrides object (modes, entries, history)")
        body = {"apiVersion": "dsx.dev/v1alpha1", "kind": "FaultOverrides", **body}
        try:
            changes = FaultOverrides.model_validate(body)
        except ValidationError as exc:
            raise input_error(exc, where) from None
        return load_catalogue(changes=changes, source=where)
    file = os.environ.get(vocab.ENV_SENTINEL_OVERRIDES)
    return load_catalogue(overrides=Path(file) if file else None)


def _apply(
    changes: FaultOverrides,
    path: Path | str,
    entries: dict[tuple[str, str], CatalogueEntry],
    thresholds: dict[tuple[str, str], float],
    modes: dict[str, Mode],
) -> None:
    for check, mode in changes.modes.items():
        if check not in CHECKS:
            raise InputError(f"{path}: modes: unknown check {check!r}; checks: {', '.join(CHECKS)}")
        modes[check] = mode
    for change in changes.entries:
        key = (change.check, change.code)
        if change.check not in CHECKS:
            raise InputError(f"{path}: entries: unknown check {change.check!r}; checks: {', '.join(CHECKS)}")
        known = entries.get(key)
        if known is None:
            if change.check not in ("xid", "sxid") or not change.code.isdigit():
                raise InputError(f"{path}: entries: {change.check} has no code {change.code!r}")
            if change.severity is None or change.action is None:
                raise InputError(
                    f"{path}: entries: new {change.check} {change.code} needs severity and action"
                )
            known = CatalogueEntry(
                check=change.check,
                code=change.code,
                severity=change.severity,
                action=change.action,
                mode="enforce",
            )
        update: dict[str, object] = {"source": "override"}
        if change.severity is not None:
            update["severity"] = change.severity
        if change.action is not None:
            update["action"] = change.action
        entries[key] = known.model_copy(update=update)
        if change.threshold is not None:
            thresholds[key] = change.threshold

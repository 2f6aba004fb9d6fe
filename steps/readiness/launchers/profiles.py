"""What a rank pod needs to reach the fabric: device resources, NCCL's environment, /dev/shm and the rest.

A group test's pods reach the fabric only if they ask for it: the EFA or RDMA devices as extended
resources, the environment NCCL and libfabric read, a /dev/shm larger than the container runtime's 64 MiB,
capabilities for RDMA memory registration, Multus annotations for secondary networks, tolerations and a
priority class. Without them NCCL falls back to TCP sockets and every multi-node group misses the recipe's
floor. Two sources describe a rank pod, merged field by field:

1. the recipe's ``fabric.rankPod`` (per service and accelerator: EFA on EKS, the Network Operator's RDMA
   shared device elsewhere), read with :func:`recipe_profile`;
2. the operator's chart value ``rankPods``, which the chart renders as JSON into ``DSX_RANK_POD`` on the
   certify steps, read with :func:`profile_from_env`. It wins (:func:`merge_profiles`).

:func:`apply_profile` writes the merged profile into a group Job's pod template; :func:`rank_pod_patch`
does all three and returns the patch.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from steps.cluster import vocabulary as vocab
from steps.errors import InputError
from steps.models import Camel

__all__ = [
    "DEFAULT_SHM_SIZE",
    "ENV_VAR",
    "RANKS_CONTAINER",
    "EnvVar",
    "RankPodProfile",
    "Toleration",
    "apply_profile",
    "merge_profiles",
    "parse_profile",
    "profile_from_env",
    "rank_pod_patch",
    "recipe_profile",
]

ENV_VAR = vocab.ENV_RANK_POD
"""The environment variable holding the operator's profile as JSON (the chart value ``rankPods``)."""
RANKS_CONTAINER = "ranks"
"""The container of a group Job's pod that runs torchrun."""
DEFAULT_SHM_SIZE = "16Gi"
SHM_VOLUME = "dshm"
SHM_PATH = "/dev/shm"

# Kubernetes' quantity grammar (k8s.io/apimachinery/pkg/api/resource/quantity.go): a signed decimal number
# with an optional binary-SI, decimal-SI or decimal-exponent suffix.
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(?:\.{_DNS_LABEL})*$")
_NAME_PART = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
# Without the RelaxedEnvironmentVariableValidation gate (beta and on only from Kubernetes 1.32), the API
# server takes names of letters, digits, '_', '-' and '.', not starting with a digit.
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_CAPABILITY = re.compile(r"^[A-Z][A-Z0-9_]*$")
_CONTAINER_RESOURCES = {"cpu", "memory", "ephemeral-storage"}
_MAP_FIELDS = ("resources", "annotations", "labels", "node_selector")


def _qualified_name(key: str) -> str | None:
    """Why ``key`` is not a Kubernetes qualified name (``[prefix/]name``, as label keys are), else None."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return f"{key!r}: the prefix before '/' must be a DNS subdomain (lowercase, at most 253 characters)"
    if not name or len(name) > 63 or not _NAME_PART.match(name):
        return (
            f"{key!r}: the name must be at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def _label_value(value: str) -> str | None:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return (
            f"value {value!r} must be at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


class _KeyProblem(ValueError):
    """A bad entry of a map field; ``key`` joins the field in the error's location."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _quantity(value: Any) -> Any:
    """Numbers become their text (a chart value may write ``32`` for ``"32"``); booleans are refused."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int | float):
        return str(value)
    return value


def _quantity_value(value: str) -> Decimal:
    """The number a Kubernetes quantity stands for.

    Raises:
        ValueError: ``value`` is not in Kubernetes' quantity grammar.
    """
    match = _QUANTITY.match(value)
    if match is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 8, 500m, 16Gi, 1e3)")
    number = Decimal(match.group(1).rstrip(".") or "0")
    suffix = match.group(2) or ""
    if suffix.endswith("i"):
        return number * Decimal(1024) ** ("KMGTPE".index(suffix[0]) + 1)
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return number.scaleb(int(suffix[1:]))
    return number.scaleb(_DECIMAL_SI[suffix])


class EnvVar(Camel):
    """One environment variable of the rank container. A ``null`` value removes an earlier profile's."""

    name: str
    value: str | None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _ENV_NAME.match(name):
            raise ValueError(
                f"{name!r} is not an environment variable name (letters, digits, '_', '-', '.'; "
                "not starting with a digit)"
            )
        if name.startswith("DSX_"):
            raise ValueError(f"{name!r}: names starting with DSX_ are dsx's own; the profile cannot set them")
        return name


class Toleration(Camel):
    """A Kubernetes toleration, checked as the API server checks it."""

    key: str = ""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    toleration_seconds: int | None = None

    @model_validator(mode="after")
    def _rules(self) -> Toleration:
        if self.key:
            problem = _qualified_name(self.key)
            if problem:
                raise ValueError(f"key {problem}")
        elif self.operator != "Exists":
            raise ValueError("a toleration without a key must use operator Exists")
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value")
        if self.operator == "Equal":
            problem = _label_value(self.value)
            if problem:
                raise ValueError(problem)
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds needs effect NoExecute")
        return self

    def manifest(self) -> dict[str, Any]:
        """The toleration as it goes into a pod spec (empty fields left out)."""
        out: dict[str, Any] = {"operator": self.operator}
        if self.key:
            out["key"] = self.key
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


class RankPodProfile(Camel):
    """What a rank pod needs beyond what dsx renders, camelCase as the chart value ``rankPods``.

    In the maps (``resources``, ``annotations``, ``labels``, ``nodeSelector``) and in ``env``, a ``null``
    value removes what an earlier profile set (as ``null`` deletes a key when recipe overlays merge). Which
    fields a profile sets explicitly (``model_fields_set``) decides what it overrides in
    :func:`merge_profiles`; ``shmSize: null`` leaves /dev/shm to the container runtime.
    """

    resources: dict[str, str | None] = Field(
        default_factory=dict,
        description="extended or standard resources added to the rank container's limits and requests",
    )
    env: list[EnvVar] = Field(default_factory=list, description="variables of the rank container")
    annotations: dict[str, str | None] = Field(default_factory=dict, description="pod annotations")
    labels: dict[str, str | None] = Field(default_factory=dict, description="pod labels")
    tolerations: list[Toleration] = Field(default_factory=list)
    priority_class_name: str | None = None
    shm_size: str | None = Field(default=DEFAULT_SHM_SIZE, description="size of /dev/shm (memory-backed)")
    capabilities: list[str] = Field(default_factory=list, description="Linux capabilities added (IPC_LOCK)")
    host_network: bool = Field(default=False, description="run in the node's network namespace")
    node_selector: dict[str, str | None] = Field(default_factory=dict)
    image_pull_secrets: list[str] = Field(default_factory=list, description="names of Secrets")

    @field_validator("resources", mode="before")
    @classmethod
    def _numbers(cls, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: None if v is None else _quantity(v) for k, v in value.items()}
        return value

    @field_validator("shm_size", mode="before")
    @classmethod
    def _shm_number(cls, value: Any) -> Any:
        return None if value is None else _quantity(value)

    @field_validator("resources")
    @classmethod
    def _resources(cls, value: dict[str, str | None]) -> dict[str, str | None]:
        for name, quantity in value.items():
            problem = _qualified_name(name)
            if problem:
                raise _KeyProblem(name, f"not a resource name: {problem}")
            if "/" not in name and name not in _CONTAINER_RESOURCES and not name.startswith("hugepages-"):
                raise _KeyProblem(
                    name,
                    "a resource without a domain must be cpu, memory, ephemeral-storage or hugepages-<size>; "
                    "devices are domain/name (vpc.amazonaws.com/efa)",
                )
            if quantity is None:
                continue
            try:
                amount = _quantity_value(quantity)
            except ValueError as exc:
                raise _KeyProblem(name, str(exc)) from None
            if amount < 0:
                raise _KeyProblem(name, f"{quantity!r} is negative")
            # The API server takes only whole numbers of extended resources (devices); see
            # validateResourceQuantityValue in pkg/apis/core/validation.
            native = "/" not in name or name.split("/", 1)[0].endswith("kubernetes.io")
            if not native and amount != amount.to_integral_value():
                raise _KeyProblem(name, f"{quantity!r}: a device count must be a whole number")
        return value

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, value: str | None) -> str | None:
        if value is not None and _quantity_value(value) <= 0:
            raise ValueError(f"{value!r}: /dev/shm needs a positive size")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: list[EnvVar]) -> list[EnvVar]:
        seen: set[str] = set()
        for item in value:
            if item.name in seen:
                raise ValueError(f"{item.name!r} is listed twice")
            seen.add(item.name)
        return value

    @field_validator("labels", "node_selector")
    @classmethod
    def _label_map(cls, value: dict[str, str | None]) -> dict[str, str | None]:
        for key, text in value.items():
            problem = _qualified_name(key)
            if problem:
                raise _KeyProblem(key, f"not a label key: {problem}")
            if text is not None:
                problem = _label_value(text)
                if problem:
                    raise _KeyProblem(key, problem)
        return value

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, value: dict[str, str | None]) -> dict[str, str | None]:
        for key in value:
            problem = _qualified_name(key)
            if problem:
                raise _KeyProblem(key, f"not an annotation key: {problem}")
        return value

    @field_validator("priority_class_name")
    @classmethod
    def _priority(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 253 or not _DNS_SUBDOMAIN.match(value)):
            raise ValueError(f"{value!r} is not a PriorityClass name (a lowercase DNS subdomain)")
        return value

    @field_validator("capabilities")
    @classmethod
    def _capabilities(cls, value: list[str]) -> list[str]:
        for item in value:
            if not _CAPABILITY.match(item):
                raise ValueError(f"{item!r} is not a Linux capability name (IPC_LOCK, SYS_RESOURCE...)")
        return list(dict.fromkeys(value))

    @field_validator("image_pull_secrets")
    @classmethod
    def _secrets(cls, value: list[str]) -> list[str]:
        for item in value:
            if len(item) > 253 or not _DNS_SUBDOMAIN.match(item):
                raise ValueError(f"{item!r} is not a Secret name (a lowercase DNS subdomain)")
        return list(dict.fromkeys(value))


def _location(loc: tuple[int | str, ...]) -> str:
    """``env[2].name``, ``resources[vpc.amazonaws.com/efa]``: the field of a validation error."""
    text = ""
    for index, part in enumerate(loc):
        keyed = index == 1 and loc[0] in ("resources", "annotations", "labels", "nodeSelector")
        if isinstance(part, int) or keyed:
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(profile)"


def parse_profile(data: Any, source: str) -> RankPodProfile:
    """Validate a rank pod profile (a mapping with the chart value's camelCase keys).

    Raises:
        InputError: not a mapping, an unknown field or a bad value; the message names ``source`` and the
            field (``DSX_RANK_POD: resources[vpc.amazonaws.com/efa]: '3.5': a device count ...``).
    """
    if not isinstance(data, Mapping):
        raise InputError(f"{source}: a rank pod profile is a mapping, not {type(data).__name__}")
    if data.get("priorityClassName") == "":
        # The chart's default (values.yaml: "empty: none"): no priority class, and nothing overridden.
        data = {k: v for k, v in data.items() if k != "priorityClassName"}
    try:
        return RankPodProfile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(first["loc"])
        problem = (first.get("ctx") or {}).get("error")
        if isinstance(problem, _KeyProblem):
            loc = (*loc, problem.key)
        message = str(first["msg"]).removeprefix("Value error, ")
        raise InputError(f"{source}: {_location(loc)}: {message}") from None


def profile_from_env(environ: Mapping[str, str] | None = None) -> RankPodProfile | None:
    """The operator's profile from ``DSX_RANK_POD`` (JSON); None when it is unset or empty.

    Raises:
        InputError: malformed JSON (with its line and column) or a bad field, naming DSX_RANK_POD.
    """
    text = (os.environ if environ is None else environ).get(ENV_VAR, "")
    if not text.strip():
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{ENV_VAR}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "set the chart value rankPods to a mapping"
        ) from None
    if data is None:
        return None
    return parse_profile(data, ENV_VAR)


def recipe_profile(recipe: Mapping[str, Any] | None) -> RankPodProfile | None:
    """The profile a resolved recipe (or its summary) asks for: its ``fabric.rankPod``; None without one.

    Raises:
        InputError: the recipe's ``fabric.rankPod`` is not a valid profile (naming the field).
    """
    if not recipe:
        return None
    fabric = recipe.get("fabric")
    if fabric is None:
        return None
    if not isinstance(fabric, Mapping):
        raise InputError(f"recipe fabric: a mapping with rankPod and sources, not {type(fabric).__name__}")
    data = fabric.get("rankPod")
    return None if data is None else parse_profile(data, "recipe fabric.rankPod")


def _merge_map(first: Mapping[str, str | None], second: Mapping[str, str | None]) -> dict[str, str]:
    merged: dict[str, str | None] = {**first, **second}
    return {k: v for k, v in merged.items() if v is not None}


def _merge_env(first: list[EnvVar], second: list[EnvVar]) -> list[EnvVar]:
    merged: dict[str, EnvVar] = {item.name: item for item in first}
    for item in second:
        merged[item.name] = item  # a name seen before keeps its place
    return [item for item in merged.values() if item.value is not None]


def merge_profiles(
    recipe_fabric: RankPodProfile | None, operator_profile: RankPodProfile | None
) -> RankPodProfile:
    """The operator's profile over the recipe's, field by field; either may be None.

    Maps (``resources``, ``annotations``, ``labels``, ``nodeSelector``) merge key by key and ``env`` name by
    name, the operator's entry winning and a ``null`` removing the recipe's. Every other field (the lists
    ``tolerations``, ``capabilities``, ``imagePullSecrets`` among them) is the operator's when the operator
    set it, else the recipe's: so an operator can also take out what the recipe asks for. Unset everywhere,
    ``shmSize`` is 16Gi.
    """
    base = recipe_fabric or RankPodProfile()
    top = operator_profile or RankPodProfile()
    chosen: dict[str, Any] = {}
    for name in RankPodProfile.model_fields:
        if name not in base.model_fields_set and name not in top.model_fields_set:
            continue
        if name in _MAP_FIELDS:
            chosen[name] = _merge_map(getattr(base, name), getattr(top, name))
        elif name == "env":
            chosen[name] = _merge_env(base.env, top.env)
        elif name in top.model_fields_set:
            chosen[name] = getattr(top, name)
        else:
            chosen[name] = getattr(base, name)
    return RankPodProfile(**chosen)


def _mapping(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """``parent[key]``, created empty when absent (or null)."""
    value = parent.get(key)
    if value is None:
        value = {}
        parent[key] = value
    if not isinstance(value, dict):
        raise InputError(f"pod template: {where} is not a mapping")
    return value


def _list(parent: dict[str, Any], key: str, where: str) -> list[Any]:
    value = parent.get(key)
    if value is None:
        value = []
        parent[key] = value
    if not isinstance(value, list):
        raise InputError(f"pod template: {where} is not a list")
    return value


def _add_keys(target: dict[str, Any], extra: Mapping[str, str | None], what: str) -> None:
    """Add ``extra`` to ``target``; a key dsx already set to another value is an error, never overwritten."""
    for key, value in extra.items():
        if value is None:
            continue
        if key in target and str(target[key]) != value:
            raise InputError(
                f"rank pod profile: {what} {key!r} is {value!r}, but dsx sets it to {target[key]!r} "
                "for the group test; leave it out of the profile"
            )
        target[key] = value


def apply_profile(
    pod_template: Mapping[str, Any], profile: RankPodProfile, container: str = RANKS_CONTAINER
) -> dict[str, Any]:
    """A new pod *template* (``{"metadata": ..., "spec": ...}``, as in a Job's ``spec.template``) with
    ``profile`` applied; the argument is left unchanged. It takes the whole template, not only its spec,
    because labels and annotations (Multus networks) belong to the template's metadata.

    - ``resources`` go into the limits and the requests of ``container`` (extended resources need both,
      equal), ``env`` into its environment: a variable of the same name is replaced where it stands,
      new ones are appended in the profile's order;
    - ``labels`` and ``annotations`` go to the template's metadata, ``nodeSelector`` to the spec;
    - ``tolerations`` and ``imagePullSecrets`` are appended unless already there, ``capabilities`` are
      added to the container's ``securityContext.capabilities.add``;
    - ``shmSize`` mounts a memory-backed emptyDir of that size at /dev/shm (replacing a ``dshm`` volume or
      any other mount there): the runtime's default of 64 MiB is too small for NCCL's shared-memory
      transport between the ranks of a node;
    - ``hostNetwork`` puts the pod in the node's network namespace with ``dnsPolicy:
      ClusterFirstWithHostNet``, so it still resolves the group's headless Service;
    - ``priorityClassName`` is set.

    A resource, label, annotation, node selector or priority class that dsx itself set to another value is
    an error rather than silently changed: the group test's selectors and GPU count depend on them.

    Raises:
        InputError: ``container`` is not in the template, the template is malformed, or a conflict above.
    """
    template: dict[str, Any] = copy.deepcopy(dict(pod_template))
    spec = _mapping(template, "spec", "spec")
    containers = _list(spec, "containers", "spec.containers")
    target = next((c for c in containers if isinstance(c, dict) and c.get("name") == container), None)
    if target is None:
        names = ", ".join(str(c.get("name")) for c in containers if isinstance(c, dict)) or "none"
        raise InputError(
            f"pod template: no container {container!r} to apply the rank pod profile to ({names})"
        )

    _apply_metadata(_mapping(template, "metadata", "metadata"), profile)
    _apply_container(target, profile, container)
    _apply_spec(spec, profile)
    return template


def _apply_metadata(metadata: dict[str, Any], profile: RankPodProfile) -> None:
    """The profile's labels and annotations on the pod template's metadata (empty maps left out)."""
    _add_keys(_mapping(metadata, "labels", "metadata.labels"), profile.labels, "label")
    _add_keys(_mapping(metadata, "annotations", "metadata.annotations"), profile.annotations, "annotation")
    for key in ("labels", "annotations"):
        if not metadata[key]:
            del metadata[key]


def _apply_container(target: dict[str, Any], profile: RankPodProfile, container: str) -> None:
    """The profile's resources, env, capabilities and /dev/shm mount on the rank container."""
    resources = _mapping(target, "resources", f"container {container}: resources")
    for kind in ("limits", "requests"):
        if any(v is not None for v in profile.resources.values()):
            section = _mapping(resources, kind, f"container {container}: resources.{kind}")
            _add_keys(section, profile.resources, f"resources.{kind}")
    if profile.env:
        env = _list(target, "env", f"container {container}: env")
        index = {item.get("name"): i for i, item in enumerate(env) if isinstance(item, dict)}
        for item in profile.env:
            if item.value is None:
                continue
            entry = {"name": item.name, "value": item.value}
            if item.name in index:
                env[index[item.name]] = entry
            else:
                index[item.name] = len(env)
                env.append(entry)
    if profile.capabilities:
        security = _mapping(target, "securityContext", f"container {container}: securityContext")
        capabilities = _mapping(
            security, "capabilities", f"container {container}: securityContext.capabilities"
        )
        added = _list(capabilities, "add", f"container {container}: securityContext.capabilities.add")
        added.extend(c for c in profile.capabilities if c not in added)
    if profile.shm_size is not None:
        mounts = [
            m
            for m in _list(target, "volumeMounts", f"container {container}: volumeMounts")
            if m.get("name") != SHM_VOLUME and m.get("mountPath") != SHM_PATH
        ]
        mounts.append({"name": SHM_VOLUME, "mountPath": SHM_PATH})
        target["volumeMounts"] = mounts


def _apply_spec(spec: dict[str, Any], profile: RankPodProfile) -> None:
    """The profile's /dev/shm volume, tolerations, pull secrets, node selector, priority and host
    network on the pod's spec."""
    if profile.shm_size is not None:
        volumes = [v for v in _list(spec, "volumes", "spec.volumes") if v.get("name") != SHM_VOLUME]
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": profile.shm_size}})
        spec["volumes"] = volumes
    if profile.tolerations:
        tolerations = _list(spec, "tolerations", "spec.tolerations")
        tolerations.extend(t.manifest() for t in profile.tolerations if t.manifest() not in tolerations)
    if profile.image_pull_secrets:
        secrets = _list(spec, "imagePullSecrets", "spec.imagePullSecrets")
        present = {s.get("name") for s in secrets if isinstance(s, dict)}
        secrets.extend({"name": name} for name in profile.image_pull_secrets if name not in present)
    if any(v is not None for v in profile.node_selector.values()):
        _add_keys(_mapping(spec, "nodeSelector", "spec.nodeSelector"), profile.node_selector, "nodeSelector")
    if profile.priority_class_name is not None:
        _add_keys(spec, {"priorityClassName": profile.priority_class_name}, "field")
    if profile.host_network:
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"


def rank_pod_patch(
    recipe: Mapping[str, Any] | None,
    environ: Mapping[str, str] | None = None,
    container: str = RANKS_CONTAINER,
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The patch a group Job's pod template gets: the recipe's profile under the operator's.

    Both are read and checked now, so a bad ``DSX_RANK_POD`` fails the step before any Job exists.

    Raises:
        InputError: the recipe's ``fabric.rankPod`` or ``DSX_RANK_POD`` is not a valid profile.
    """
    profile = merge_profiles(recipe_profile(recipe), profile_from_env(environ))

    def patch(pod_template: dict[str, Any]) -> dict[str, Any]:
        return apply_profile(pod_template, profile, container)

    return patch

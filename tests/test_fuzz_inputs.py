"""Every command that reads a file or standard input, fed damaged input: it answers 0, 1 or 2, never crashes.

For each such command (found in ``workflows/cli``: a catalogue, a resolved recipe, a snapshot, a fleet
file or state, a kubeconfig, thresholds, an nccl-tests log on disk or on stdin, a certification report,
a workflow file, compiled files), deterministic pseudo-random inputs are made from a valid file:

- random bytes (some pure noise, some YAML- and JSON-like text, some a valid file with noise spliced in);
- the valid file cut at many offsets;
- the valid document with one node replaced by a value of the wrong type, written back as YAML or JSON.

The command must exit 0, 1 or 2; on 2, standard error is exactly one line; no traceback is ever
printed. ``DSX_FUZZ_CASES`` sets the cases per command (default 36; raise it for a longer search) and
``DSX_FUZZ_SEED`` the seed. ``dsx compile --check`` compiles every template per case, so it gets a sixth.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from steps.cluster import load_fleet
from steps.cluster.sim.store import write_fleet
from steps.readiness.models import Subject, Verdict
from steps.readiness.report import CertificationReport, NodeResult
from tests.emulator.apiserver import write_kubeconfig
from tests.paths import REPO
from workflows.cli.main import run

# A warning printed on stderr would break the one-line contract: here it fails the case instead.
pytestmark = pytest.mark.filterwarnings("error")

CASES = int(os.environ.get("DSX_FUZZ_CASES", "36"))
SEED = int(os.environ.get("DSX_FUZZ_SEED", "20250601"))
CRITERIA = ["--service", "eks", "--accelerator", "h100", "--os", "ubuntu", "--intent", "training"]
WRONG_VALUES: list[Any] = [
    None,
    True,
    -1,
    7,
    10**20,
    1.5,
    float("nan"),
    float("inf"),
    "",
    "x y",
    "$(touch pwned)",
    [],
    [1, "a"],
    {},
    {"k": [None]},
]
TOKENS = [
    "a:", " b", "- ", "[", "]", "{", "}", ",", ":", "&x ", "*x", "!!python/object ", "'", '"', "#", "\n",
    "\t", "---\n", "1e999", ".nan", "~", "null", "<<: ", "|", ">", "%YAML 1.1\n", "\\u0000", "N/A", "  ",
]  # fmt: skip


@dataclass
class Target:
    """A command and the input it reads: where the input goes and how the command is called."""

    name: str
    valid: bytes
    argv: list[str]
    path: Path | None = None
    stdin: bool = False
    documents: str = "yaml"  # how a mutated document is written back: yaml or json
    cases: int = CASES


def _state(tmp: Path) -> Path:
    path = tmp / "state.json"
    write_fleet(load_fleet("sim:nodes=2,gpu=h100"), path)
    return path


def _report(tmp: Path) -> bytes:
    node = Subject(kind="node", name="node-1")
    report = CertificationReport(
        status="failed",
        summary="1 of 2 checks did not pass",
        nodes=[NodeResult(name="node-1", status="failed", reasons=["slow"])],
        verdicts=[
            Verdict(subject=node, test="allreduce-run", status="pass", message="ran"),
            Verdict(subject=node, test="allreduce-busbw@1GiB", status="fail", measured=1.0, message="slow"),
        ],
    )
    return report.model_dump_json(indent=2).encode()


def _targets(tmp: Path) -> list[Target]:
    """Every command that reads a file or standard input, each with a valid input to damage."""
    catalogue = tmp / "cat"
    shutil.copytree(REPO / "recipes", catalogue, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    recipe = tmp / "recipe.json"
    snapshot = tmp / "snapshot.json"
    fleet = REPO / "recipes" / "fleets" / "eks-h100-training.yaml"
    state = _state(tmp)
    kubeconfig = write_kubeconfig(tmp / "kubeconfig", "http://127.0.0.1:9")
    logs = REPO / "tests" / "steps" / "readiness" / "logs"
    workflow = REPO / "tests" / "workflows" / "runner" / "fixtures" / "items.yaml"
    thresholds = yaml.safe_dump(
        {"nccl": {"allReduce": [{"size": "1MiB", "busBwGBps": 1.5, "scope": "node"}], "timeoutFactor": 3}}
    ).encode()
    input_file = tmp / "input"
    out = tmp / "out"
    evidence = ["--out-dir", str(tmp / "evidence"), "--inject", "9:fail"]  # refused before any rank starts
    compiled = tmp / "compiled"
    shutil.copytree(REPO / "charts" / "dsx" / "files", compiled)
    certify = compiled / "workflow-template-dsx-certify.yaml"
    values = catalogue / "components" / "gpu-operator" / "values.yaml"
    overlay = catalogue / "overlays" / "eks-h100.yaml"
    return [
        Target(
            "catalogue registry",
            (catalogue / "registry.yaml").read_bytes(),
            ["recipe", "resolve", "--recipes", str(catalogue), *CRITERIA],
            catalogue / "registry.yaml",
        ),
        Target(
            "catalogue overlay",
            overlay.read_bytes(),
            ["recipe", "graph", "--recipes", str(catalogue), *CRITERIA],
            overlay,
        ),
        Target(
            "catalogue values",
            values.read_bytes(),
            ["recipe", "list", "--recipes", str(catalogue), "--components"],
            values,
        ),
        Target(
            "bundle --recipe",
            b"",
            ["bundle", "-f", "flux", "--out", str(out), "--recipe", str(recipe)],
            recipe,
            documents="json",
        ),
        Target(
            "drift --recipe",
            b"",
            ["drift", "--cluster", f"sim:{fleet}", "--recipe", str(recipe)],
            recipe,
            documents="json",
        ),
        Target(
            "drift --snapshot",
            b"",
            ["drift", "--snapshot", str(snapshot), *CRITERIA],
            snapshot,
            documents="json",
        ),
        Target(
            "sim fleet file",
            fleet.read_bytes(),
            ["snapshot", "--cluster", f"sim:{tmp / 'fleet.yaml'}"],
            tmp / "fleet.yaml",
        ),
        Target(
            "fleet state",
            state.read_bytes(),
            ["cluster", "nodes", "--cluster", f"state:{state}"],
            state,
            documents="json",
        ),
        Target(
            "kubeconfig",
            kubeconfig.read_bytes(),
            ["cluster", "nodes", "--cluster", "kube", "--kubeconfig", str(kubeconfig)],
            kubeconfig,
            documents="json",
        ),
        Target(
            "nccl parse FILE",
            (logs / "new_layout_clean.txt").read_bytes(),
            ["nccl", "parse", str(input_file)],
            input_file,
        ),
        Target(
            "nccl parse -",
            (logs / "old_layout.txt").read_bytes(),
            ["nccl", "parse", "-", "-o", "json"],
            stdin=True,
        ),
        Target(
            "nccl sweep --thresholds",
            thresholds,
            ["nccl", "sweep", "--thresholds", str(input_file), *evidence],
            input_file,
        ),
        Target(
            "train smoke --thresholds",
            thresholds,
            ["train", "smoke", "--thresholds", str(input_file), *evidence],
            input_file,
        ),
        Target(
            "certify report",
            _report(tmp),
            ["certify", "report", str(input_file), "-o", "json"],
            input_file,
            documents="json",
        ),
        Target(
            "run --file",
            workflow.read_bytes(),
            ["run", "dsx-fixture-items", "--local", "--dry-run", "--file", str(input_file)],
            input_file,
        ),
        Target(
            "run --file (argo submit)",
            workflow.read_bytes(),
            ["run", "dsx-fixture-items", "--file", str(input_file)],
            input_file,
        ),
        Target(
            "compile --check",
            certify.read_bytes(),
            ["compile", "--check", "--out", str(compiled)],
            certify,
            cases=max(3, CASES // 6),
        ),
        Target(
            "goodput simulate --rates",
            (catalogue / "goodput" / "fault-rates.yaml").read_bytes(),
            [
                "goodput",
                "simulate",
                "--nodes",
                "64",
                "--days",
                "10",
                "--seeds",
                "1",
                "--rates",
                str(input_file),
            ],
            input_file,
        ),
    ]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*prefix, index))


def _wrong_type(valid: bytes, rng: random.Random, documents: str) -> bytes:
    """The valid document with one node (or the whole) replaced by a value of another type."""
    try:
        data = json.loads(valid) if documents == "json" else yaml.safe_load(valid)
    except (ValueError, yaml.YAMLError):
        return valid[: len(valid) // 2]
    value = rng.choice(WRONG_VALUES)
    paths = list(_paths(data))
    path = rng.choice(paths)
    if not path:
        data = value
    else:
        node = data
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    if documents == "json":
        return json.dumps(data).encode()  # NaN and Infinity as Python writes them: not strict JSON
    return yaml.safe_dump(data, sort_keys=False).encode()


def _inputs(target: Target, rng: random.Random) -> Iterator[tuple[str, bytes]]:
    valid = target.valid
    cases = target.cases
    for case in range(cases):
        kind = case % 3
        if kind == 0:
            style = (case // 3) % 3
            if style == 0:
                yield "random bytes", rng.randbytes(rng.randrange(0, 300))
            elif style == 1:
                text = "".join(
                    rng.choice(TOKENS) + rng.choice(["k", "1", "v", "-"]) for _ in range(rng.randrange(1, 60))
                )
                yield "random tokens", text.encode()
            else:
                at = rng.randrange(len(valid) + 1)
                yield f"noise at byte {at}", valid[:at] + rng.randbytes(rng.randrange(1, 8)) + valid[at:]
        elif kind == 1:
            at = (case * len(valid)) // cases if case % 2 else rng.randrange(len(valid) + 1)
            yield f"cut at byte {at}", valid[:at]
        else:
            yield "a value of the wrong type", _wrong_type(valid, rng, target.documents)


TARGET_NAMES = [
    "catalogue registry",
    "catalogue overlay",
    "catalogue values",
    "bundle --recipe",
    "drift --recipe",
    "drift --snapshot",
    "sim fleet file",
    "fleet state",
    "kubeconfig",
    "nccl parse FILE",
    "nccl parse -",
    "nccl sweep --thresholds",
    "train smoke --thresholds",
    "certify report",
    "run --file",
    "run --file (argo submit)",
    "compile --check",
    "goodput simulate --rates",
]


def _valid_input(name: str, tmp: Path, capsys: pytest.CaptureFixture[str]) -> bytes:
    """The valid input of targets whose file is made by dsx itself (a resolved recipe, a snapshot)."""
    if name in ("bundle --recipe", "drift --recipe"):
        assert run(["recipe", "resolve", *CRITERIA, "-o", "json"]) == 0
    else:
        fleet = REPO / "recipes" / "fleets" / "eks-h100-training.yaml"
        assert run(["snapshot", "--cluster", f"sim:{fleet}", "-o", "json"]) == 0
    return capsys.readouterr().out.encode()


@pytest.mark.parametrize("name", TARGET_NAMES)
def test_damaged_input_never_crashes_a_command(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DSX_CLUSTER", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("DSX_RETRY_ATTEMPTS", "1")
    monkeypatch.setenv("DSX_RETRY_BASE_DELAY", "0")
    target = {t.name: t for t in _targets(tmp_path)}[name]
    capsys.readouterr()
    valid = target.valid or _valid_input(name, tmp_path, capsys)
    target.valid = valid
    rng = random.Random(f"{SEED}:{name}")
    problems: list[str] = []
    codes: dict[int, int] = {}
    for label, data in _inputs(target, rng):
        if target.path is not None:
            target.path.write_bytes(data)
        if target.stdin:
            monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
        code = run(target.argv)
        out, err = capsys.readouterr()
        codes[code] = codes.get(code, 0) + 1
        lines = err.strip().splitlines()
        if code not in (0, 1, 2):
            problems.append(f"{label}: exit {code}: {lines[-1:] or out[-200:]}")
        elif code == 2 and len(lines) != 1:
            problems.append(f"{label}: exit 2 with {len(lines)} lines on stderr: {err[:300]!r}")
        if "Traceback" in err or "Traceback" in out:
            problems.append(f"{label}: a traceback: {err[-300:]!r}")
    if target.path is not None:
        target.path.write_bytes(valid)
    assert problems == [], f"{name} ({codes}):\n" + "\n".join(problems[:10])
    assert sum(codes.values()) == target.cases

"""DCGM's GPU diagnostics on one node: ``dcgmi diag -r RUN -j``, read into a :class:`DiagResult`.

Run one process per rank like every rank program (torchrun on a cluster, the local launcher here)::

    torchrun --nproc-per-node 8 -m steps.readiness.ranks.diag --diag 3 --out diag.json

Rank 0 runs the diagnostics for its node (DCGM tests every GPU of the node at once; the other ranks have
nothing to do and leave). ``--diag`` is what ``dcgmi diag -r`` takes: a level (1 quick, 2 medium, 3 long,
4 extended; each includes the ones below) or test names, comma-separated (``memory,memtest``).

DCGM absent is a result, not an error: ``dcgmi`` not on the image's ``PATH``, or no host engine answering
at ``--host`` (``dcgmi`` prints "unable to establish a connection" and nothing else) gives
``present: false`` with the reason. Anything else ``dcgmi`` says is read from its JSON (DCGM 4's layout:
``"DCGM Diagnostic"`` -> ``test_categories`` -> ``tests`` -> ``results`` per entity, with a
``test_summary``; DCGM 3's, ``"DCGM GPU Diagnostic"`` with results per ``gpu_id``, is read too; a
diagnostic that could not run says so in ``runtime_error``); output that is not that
JSON is kept as ``error`` with the command's exit status and the start of its output.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import Field

from steps.files import write_text
from steps.readiness.models import Model, dump_json
from steps.readiness.ranks.rankenv import exit_rank, node_name

__all__ = [
    "DCGM_TESTS",
    "DiagEntity",
    "DiagResult",
    "DiagTest",
    "diag_args",
    "main",
    "read_dcgmi",
    "run_dcgmi",
]

#: The tests ``dcgmi diag -r`` accepts by name (DCGM 4's plugin names).
DCGM_TESTS = (
    "software",
    "pcie",
    "memory",
    "memtest",
    "memory_bandwidth",
    "diagnostic",
    "targeted_stress",
    "targeted_power",
    "sm_stress",
    "context_create",
    "pulse_test",
    "nvbandwidth",
    "eud",
)

#: What ``dcgmi`` prints, and only that, when no host engine answers.
_NO_HOST_ENGINE = "unable to establish a connection"


class DiagEntity(Model):
    """One entity's (a GPU's) result in one test."""

    group: str = Field(description="DCGM's entity group, GPU for a GPU")
    id: int | None = Field(default=None, description="DCGM's id of the entity (a GPU's index)")
    status: str = Field(description="Pass, Fail, Warn, Skip")
    warnings: list[str] = Field(default_factory=list)
    info: list[str] = Field(default_factory=list)


class DiagTest(Model):
    """One diagnostic test: its category, name, overall status and each entity's result."""

    category: str
    name: str
    status: str = Field(description="the test summary's status: Pass, Fail, Warn, Skip")
    warnings: list[str] = Field(default_factory=list, description="the summary's warnings, all entities")
    entities: list[DiagEntity] = Field(default_factory=list)


class DiagResult(Model):
    """What DCGM's diagnostics said about one node, or why they did not run."""

    node: str = Field(description="the node, as the rank knew it")
    run: str = Field(description="what dcgmi diag -r was given")
    present: bool = Field(description="dcgmi was found and a host engine answered")
    reason: str | None = Field(default=None, description="why DCGM is taken as absent")
    command: list[str] = Field(default_factory=list)
    exit_code: int | None = None
    elapsed_s: float = 0.0
    version: str | None = Field(default=None, description="DCGM's version, from the output's metadata")
    driver: str | None = None
    gpus: list[str] = Field(default_factory=list, description="the GPUs tested: DCGM id and serial")
    tests: list[DiagTest] = Field(default_factory=list)
    error: str | None = Field(
        default=None, description="the diagnostic could not run, or said nothing readable"
    )


def _texts(items: object, key: str) -> list[str]:
    if isinstance(items, str):  # DCGM 3 gives a result's info as one string
        return [items] if items else []
    if not isinstance(items, list):
        return []
    return [str(item.get(key, item)) if isinstance(item, dict) else str(item) for item in items]


def _entity(raw: dict[str, Any]) -> DiagEntity:
    entity_id = raw.get("entity_id")
    gpu_id = str(raw.get("gpu_id", ""))  # DCGM 3's layout: every result is a GPU's, its index a string
    if not isinstance(entity_id, int) and gpu_id.isdigit():
        entity_id = int(gpu_id)
    return DiagEntity(
        group=str(raw.get("entity_group", "GPU" if gpu_id else "")),
        id=entity_id if isinstance(entity_id, int) else None,
        status=str(raw.get("status", "")),
        warnings=_texts(raw.get("warnings"), "warning"),
        info=_texts(raw.get("info"), "info"),
    )


def _gpus(output: dict[str, Any]) -> list[str]:
    serials = output.get("GPU Device Serials")  # DCGM 3: index -> serial
    if isinstance(serials, dict):
        return [f"GPU {index} (serial {serial})" for index, serial in sorted(serials.items())]
    found = []
    for group in output.get("entity_groups") or []:
        if not isinstance(group, dict) or group.get("entity_group") != "GPU":
            continue
        for entity in group.get("entities") or []:
            if isinstance(entity, dict):
                serial = entity.get("serial_num")
                found.append(f"GPU {entity.get('entity_id')}" + (f" (serial {serial})" if serial else ""))
    return found


def _worst(statuses: Iterable[str]) -> str:
    """A test's status from its entities' (DCGM 3 gives no summary): Fail, then Warn, else Pass."""
    seen = set(statuses)
    return next((s for s in ("Fail", "Warn") if s in seen), "Pass")


def read_dcgmi(text: str, exit_code: int) -> dict[str, Any]:
    """The fields of a :class:`DiagResult` that ``dcgmi diag -j``'s output ``text`` gives.

    Output that is not DCGM's JSON gives ``error`` (with the exit status and the output's start); a
    diagnostic that could not run, its ``runtime_error``.
    """
    start, end = text.find("{"), text.rfind("}")
    try:
        output = json.loads(text[start : end + 1]) if start >= 0 else None
    except ValueError:
        output = None
    # DCGM 4 names the body "DCGM Diagnostic", DCGM 3 "DCGM GPU Diagnostic" (nvvs/include/NvvsJsonStrings.h)
    body = None
    if isinstance(output, dict):
        body = output.get("DCGM Diagnostic") or output.get("DCGM GPU Diagnostic")
    if not isinstance(output, dict) or not isinstance(body, dict):
        said = " ".join(text.split())[:300] or "nothing"
        return {"error": f"dcgmi exited {exit_code} without DCGM's diagnostic JSON: {said}"}
    metadata = output.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    fields: dict[str, Any] = {
        "version": metadata.get("version") or body.get("version"),
        "driver": metadata.get("Driver Version Detected") or output.get("Driver Version Detected"),
        "gpus": _gpus(output),
    }
    tests = []
    for category in body.get("test_categories") or []:
        if not isinstance(category, dict):
            continue
        for test in category.get("tests") or []:
            if not isinstance(test, dict):
                continue
            summary = test.get("test_summary")
            if not isinstance(summary, dict):
                summary = {}
            entities = [_entity(r) for r in test.get("results") or [] if isinstance(r, dict)]
            status = summary.get("status") or _worst(e.status for e in entities)
            tests.append(
                DiagTest(
                    category=str(category.get("category", "")),
                    name=str(test.get("name", "")),
                    status=str(status),
                    warnings=_texts(summary.get("warnings"), "warning"),
                    entities=entities,
                )
            )
    fields["tests"] = tests
    if body.get("runtime_error"):
        fields["error"] = str(body["runtime_error"])
    elif not tests:
        fields["error"] = f"dcgmi exited {exit_code} and reported no test"
    return fields


def run_dcgmi(
    run: str, node: str, dcgmi: str = "dcgmi", host: str = "", timeout_s: float = 3600.0
) -> DiagResult:
    """Run ``dcgmi diag -r RUN -j`` (against ``host``'s host engine when given) and read what it says."""
    found = shutil.which(dcgmi)
    if found is None:
        return DiagResult(node=node, run=run, present=False, reason=f"{dcgmi} is not on this image's PATH")
    command = [found, "diag", "-r", run, "-j", *(["--host", host] if host else [])]
    began = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return DiagResult(
            node=node,
            run=run,
            present=True,
            command=command,
            elapsed_s=round(time.monotonic() - began, 3),
            error=f"dcgmi diag -r {run} did not finish within {timeout_s:g} s",
        )
    except OSError as exc:
        return DiagResult(
            node=node, run=run, present=False, reason=f"{found} cannot run: {exc}", command=command
        )
    elapsed = round(time.monotonic() - began, 3)
    said = done.stdout + done.stderr
    if _NO_HOST_ENGINE in said.lower() and "{" not in done.stdout:
        where = host or "localhost"
        return DiagResult(
            node=node,
            run=run,
            present=False,
            reason=f"no DCGM host engine answers at {where} ({' '.join(said.split())[:200]})",
            command=command,
            exit_code=done.returncode,
            elapsed_s=elapsed,
        )
    fields = read_dcgmi(done.stdout, done.returncode)
    return DiagResult(
        node=node,
        run=run,
        present=True,
        command=command,
        exit_code=done.returncode,
        elapsed_s=elapsed,
        **fields,
    )


def diag_args(run: str, host: str = "", timeout_s: float = 3600.0) -> list[str]:
    """The program's flags for a run (the same on every rank)."""
    return ["--diag", run, "--timeout", f"{timeout_s:g}", *(["--host", host] if host else [])]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m steps.readiness.ranks.diag", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--diag", required=True, help="dcgmi diag -r: a level 1-4 or test names, comma-separated"
    )
    parser.add_argument("--host", default="", help="the DCGM host engine (dcgmi's --host); default localhost")
    parser.add_argument("--dcgmi", default="dcgmi", help="the dcgmi program")
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds before the diagnostic is given up"
    )
    parser.add_argument("--out", type=Path, help="where rank 0 writes the result as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one rank: rank 0 runs the node's diagnostics and writes ``--out``. Returns the exit status."""
    args = _parser().parse_args(argv)
    if os.environ.get("RANK", "0") != "0":
        return 0
    result = run_dcgmi(args.diag, node_name(), args.dcgmi, args.host, args.timeout)
    text = dump_json(result)
    if args.out is not None:
        write_text(args.out, text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    exit_rank(main())

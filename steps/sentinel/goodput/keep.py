"""The step of ``dsx-goodput``: the week's goodput report, kept in a ConfigMap.

A default Argo install has no artifact repository, so the report lives in the ConfigMap
``dsx-goodput-report`` in dsx's namespace, replaced each run: ``report.json.gz`` (binaryData, the
report's JSON gzip-compressed), ``metrics.prom`` (its Prometheus text, for a textfile collector or a
person) and ``summary.txt``; its annotation ``dsx.dev/report-contents`` says what it holds. A report
too big for a ConfigMap drops the per-node timelines, then keeps only the nodes that lost the most
(the fleet's figures stay whole). The step also writes the full files under ``$DSX_OUTPUT_DIR/goodput``
(the optional artifact).

Step modules are read by Hera's runner in the pod, so this one keeps its annotations evaluated.
"""

import base64
import datetime as dt
import gzip
import json

from steps.cluster import connect
from steps.cluster import vocabulary as vocab
from steps.cluster.errors import ConflictError
from steps.errors import DsxError
from steps.files import write_text
from steps.outputs import runner_dir
from steps.sentinel.goodput.ledger_report import GoodputReport, parse_since, report
from steps.sentinel.goodput.metrics import exposition

__all__ = ["MAX_STORED_BYTES", "REPORT_CONFIGMAP", "keep_goodput_report"]

REPORT_CONFIGMAP = "dsx-goodput-report"
MAX_STORED_BYTES = 900_000
"""What the ConfigMap's values may take (the API server's limit is 1 MiB for the whole object)."""
_KEPT_NODES = 100


def _summary(result: GoodputReport) -> str:
    fleet = result.fleet
    share = f"{fleet.availability:.2%}" if fleet.availability is not None else "-"
    worst = ", ".join(f"{n.node} {n.lost_gpu_hours:,.1f}" for n in result.nodes[:5] if n.lost_gpu_hours > 0)
    return (
        f"{result.since} to {result.until}: {fleet.nodes} nodes, {fleet.gpu_hours:,.1f} GPU-hours, "
        f"{fleet.lost_gpu_hours:,.2f} lost ({share} in service); remediations repaired {fleet.repairs}, "
        f"recertifications passed {fleet.recertifications_passed} failed {fleet.recertifications_failed}"
        + (f"; most lost: {worst}" if worst else "")
    )


def _packed(result: GoodputReport) -> tuple[bytes, str]:
    """The report's JSON gzip-compressed, cut down until it fits, and what it holds."""
    full = gzip.compress(result.model_dump_json().encode(), mtime=0)
    if len(full) * 4 // 3 <= MAX_STORED_BYTES:
        return full, "complete"
    bare = result.model_copy(update={"nodes": [n.model_copy(update={"timeline": []}) for n in result.nodes]})
    packed = gzip.compress(bare.model_dump_json().encode(), mtime=0)
    if len(packed) * 4 // 3 <= MAX_STORED_BYTES:
        return packed, "node timelines dropped: too big for a ConfigMap; the artifact has them"
    top = bare.model_copy(update={"nodes": bare.nodes[:_KEPT_NODES]})
    packed = gzip.compress(top.model_dump_json().encode(), mtime=0)
    return packed, (
        f"node timelines dropped and only the {_KEPT_NODES} nodes that lost most kept: too big for a "
        "ConfigMap; the artifact has them all"
    )


def keep_goodput_report(since: str = "7d") -> str:
    """Account for the period ending now, keep it in the ConfigMap, and return its summary line."""
    port = connect()
    until = dt.datetime.now(dt.UTC).replace(microsecond=0)
    result = report(port, parse_since(since, until), until)
    metrics = exposition(result)
    summary = _summary(result)
    folder = runner_dir()
    if folder is not None:
        out = folder / "goodput"
        write_text(out / "report.json", json.dumps(result.model_dump(), indent=2, sort_keys=True) + "\n")
        write_text(out / "metrics.prom", metrics)
    packed, note = _packed(result)
    if len(packed) * 4 // 3 + len(metrics) > MAX_STORED_BYTES:
        raise DsxError(
            f"goodput report: {len(packed)} bytes compressed, too big to keep in {REPORT_CONFIGMAP}"
        )
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": REPORT_CONFIGMAP,
            "namespace": port.namespace,
            "annotations": {vocab.ANNOTATION_REPORT_CONTENTS: note},
        },
        "data": {"metrics.prom": metrics, "summary.txt": summary + "\n"},
        "binaryData": {"report.json.gz": base64.b64encode(packed).decode()},
    }
    try:
        port.create_object(body)
    except ConflictError:  # last week's report, or a retried step
        port.patch_object(
            "v1",
            "ConfigMap",
            REPORT_CONFIGMAP,
            {"metadata": body["metadata"], "data": body["data"], "binaryData": body["binaryData"]},
            port.namespace,
        )
    return summary

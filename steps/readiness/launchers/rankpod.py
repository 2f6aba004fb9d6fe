"""The entry point of a group test's rank pod: torchrun as a child, signals passed on, rank 0 publishing.

    python -m steps.readiness.launchers.rankpod --publish NAME --result FILE --nnodes N --nproc-per-node G \\
        --master-addr HOST --master-port P -- MODULE [ARGS...]

The node rank is the pod's completion index (``JOB_COMPLETION_INDEX``, set by the Indexed Job). Why a
Python parent rather than ``sh -c``: as PID 1 of its container a shell does not pass SIGTERM on, so
deleting the Job (or its deadline) left torchrun and its ranks running until the kubelet killed them;
this one forwards SIGTERM and SIGINT to torchrun, which stops its ranks.

Once torchrun has ended, pod index 0 writes the result file (when there is one) and torchrun's exit
code into the state ConfigMap ``NAME``: keys ``result.json`` (the text), ``exit-code`` and, without a
result, ``error``. A result over :data:`PLAIN_LIMIT` (a large group's per-rank records) goes
gzip-compressed under ``binaryData`` ``result.json.gz`` instead, since a ConfigMap holds 1 MiB in all;
:func:`read_published` reads either form. It only updates that ConfigMap: the step that created the
Job made it, with the labels and owner it must carry; if it is gone the step has stopped waiting and
the result is dropped. A pod stopped by a signal publishes nothing: its Job is being deleted or has
run past its deadline, and a late result could land in the state of a later try of the same test.
The exit code is torchrun's (128 + N when a signal N ended it).

Usage errors exit 2. The ConfigMap's namespace is the port's (``DSX_NAMESPACE``, set on the pod).
"""

import argparse
import base64
import gzip
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from steps.cluster import ClusterPort, NotFoundError, connect
from steps.errors import DsxError

__all__ = [
    "MAX_PACKED",
    "PLAIN_LIMIT",
    "STATE_ERROR",
    "STATE_EXIT_CODE",
    "STATE_RESULT",
    "STATE_RESULT_GZ",
    "main",
    "publish",
    "read_published",
    "torchrun_command",
]

#: Keys of the state ConfigMap: rank 0's result text, or (``binaryData``) the same compressed, the
#: exit code of torchrun, and why there is no result.
STATE_RESULT = "result.json"
STATE_RESULT_GZ = "result.json.gz"
STATE_EXIT_CODE = "exit-code"
STATE_ERROR = "error"
#: Results up to this many bytes are published as text, larger ones compressed.
PLAIN_LIMIT = 256 * 1024
#: The most a compressed result may take: a ConfigMap holds 1 MiB, base64 adds a third.
MAX_PACKED = 700 * 1024


def torchrun_command(options: argparse.Namespace, node_rank: int) -> list[str]:
    """torchrun (as a module of this interpreter) with the rendezvous and the module to run."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={options.nnodes}",
        f"--nproc-per-node={options.nproc_per_node}",
        f"--node-rank={node_rank}",
        f"--master-addr={options.master_addr}",
        f"--master-port={options.master_port}",
        "-m",
        options.module,
        *options.module_args,
    ]


def publish(name: str, path: str, exit_code: int, port: ClusterPort | None = None) -> bool:
    """Put rank 0's result file and exit code into the existing state ConfigMap ``name``.

    Returns ``False`` (and says so on stderr) when the ConfigMap is gone: nobody waits for the result.

    Raises:
        ClusterError: the API refused the update or could not be reached.
    """
    data = {STATE_EXIT_CODE: str(exit_code)}
    binary: dict[str, str] = {}
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        data[STATE_ERROR] = f"rank 0 wrote no result at {path}: {exc.strerror or exc}"
        raw = None
    if raw is not None and len(raw) <= PLAIN_LIMIT:
        data[STATE_RESULT] = raw.decode("utf-8", "replace")
    elif raw is not None:
        packed = gzip.compress(raw, mtime=0)
        if len(packed) > MAX_PACKED:
            data[STATE_ERROR] = (
                f"rank 0's result takes {len(packed)} bytes compressed, more than the state ConfigMap "
                f"holds ({MAX_PACKED})"
            )
        else:
            binary[STATE_RESULT_GZ] = base64.b64encode(packed).decode()
    target = port or connect()
    try:
        patch: dict[str, Any] = {"data": data}
        if binary:
            patch["binaryData"] = binary
        target.patch_object("v1", "ConfigMap", name, patch, target.namespace)
    except NotFoundError:
        print(
            f"rankpod: state ConfigMap {target.namespace}/{name} is gone (the step stopped waiting); "
            f"result dropped",
            file=sys.stderr,
        )
        return False
    return True


def read_published(configmap: dict[str, Any] | None) -> dict[str, str]:
    """What rank 0 published in a state ConfigMap, as text keys (the result decompressed if need be).

    An unreadable compressed result becomes an ``error`` entry naming why.
    """
    if configmap is None:
        return {}
    state = {str(k): str(v) for k, v in (configmap.get("data") or {}).items()}
    packed = (configmap.get("binaryData") or {}).get(STATE_RESULT_GZ)
    if isinstance(packed, str):
        try:
            state[STATE_RESULT] = gzip.decompress(base64.b64decode(packed, validate=True)).decode()
        except (ValueError, OSError, EOFError) as exc:
            state[STATE_ERROR] = f"rank 0's compressed result is unreadable: {exc}"
    return state


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m steps.readiness.launchers.rankpod",
        description="Run one node of a group test under torchrun; pod index 0 publishes the result.",
    )
    parser.add_argument("--publish", required=True, metavar="NAME", help="the state ConfigMap")
    parser.add_argument("--result", required=True, metavar="FILE", help="where rank 0 writes its result")
    parser.add_argument("--nnodes", required=True, type=int)
    parser.add_argument("--nproc-per-node", required=True, type=int)
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", required=True, type=int)
    parser.epilog = "After the options: -- MODULE [ARGS...], the module torchrun runs on every rank."
    return parser


def _node_rank(nnodes: int) -> int:
    raw = os.environ.get("JOB_COMPLETION_INDEX", "")
    if not raw.isdigit() or int(raw) >= nnodes:
        raise ValueError(
            f"JOB_COMPLETION_INDEX={raw!r}: expected the pod's completion index, 0 to {nnodes - 1}"
        )
    return int(raw)


def main(argv: list[str]) -> int:
    """Run torchrun, pass SIGTERM and SIGINT on to it, publish on index 0; torchrun's exit code."""
    parser = _parser()
    split = argv.index("--") if "--" in argv else len(argv)
    try:
        options = parser.parse_args(argv[:split])
    except SystemExit as exc:  # argparse has printed the usage and the error
        return 2 if exc.code else 0
    if split + 1 >= len(argv):
        parser.print_usage(sys.stderr)
        print("rankpod: error: expected -- MODULE [ARGS...] after the options", file=sys.stderr)
        return 2
    options.module, options.module_args = argv[split + 1], argv[split + 2 :]
    try:
        node_rank = _node_rank(options.nnodes)
    except ValueError as exc:
        print(f"rankpod: error: {exc}", file=sys.stderr)
        return 2
    Path(options.result).parent.mkdir(parents=True, exist_ok=True)

    received: list[int] = []
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    if received:
        return 128 + received[0]
    child = subprocess.Popen(torchrun_command(options, node_rank))
    if received:  # a signal between the check above and the start: pass it on now
        child.send_signal(received[0])
    code = child.wait()
    code = 128 - code if code < 0 else code  # -N: ended by signal N
    if node_rank != 0:
        return code
    if received:
        print(f"rankpod: stopped by signal {received[0]}; nothing published", file=sys.stderr)
        return code
    try:
        publish(options.publish, options.result, code)
    except DsxError as exc:
        print(f"rankpod: error: publishing the result: {exc}", file=sys.stderr)
        return code or 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Start one container of the process kubelet: ``python container.py SPEC.json`` (as root).

The kubelet runs this inside the pod's network namespace and new mount, UTS and PID namespaces of the
container's own (``unshare --mount --uts --pid --fork --kill-child --propagation private``). It sets the
pod's host name, mounts a private ``/tmp``, binds the pod's volumes at their mount paths (sub-paths and
read-only included), the pod's ``/etc/hosts`` and ``/etc/resolv.conf`` (when it has one of its own) and
the container's termination-message file, drops to the pod's user and groups (``setpriv``), then
``exec``s the container's command with exactly the environment the kubelet resolved. A command that
cannot be started leaves ``start-error`` beside the spec and exits 128, as a container runtime's
StartError does.

Standard library only: it runs before anything of the container exists.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import socket
import sys
from pathlib import Path

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = _libc.mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        flags,
        data.encode() if data else None,
    )
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def _target(path: str, is_file: bool) -> None:
    target = Path(path)
    if is_file:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.touch()
    else:
        target.mkdir(parents=True, exist_ok=True)


def _bind(source: str, target: str, read_only: bool, is_file: bool) -> None:
    _target(target, is_file)
    _mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        _mount(source, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    started_marker = Path(spec_path).with_name("start-error")
    try:
        socket.sethostname(spec["hostname"])
        mounts = [(m["source"], m["target"], bool(m.get("readOnly"))) for m in spec["mounts"]]
        mounts.sort(key=lambda m: m[1].rstrip("/").count("/"))
        mounts += [
            (spec["hosts"], "/etc/hosts", True),
            (spec["terminationLog"], spec["terminationMessagePath"], False),
        ]
        if spec.get("resolv"):
            mounts.append((spec["resolv"], "/etc/resolv.conf", True))
        # Every source is held open first: the sources may live under the host's /tmp, which the
        # container's own /tmp is about to hide. A bind of /proc/self/fd/N mounts what N refers to.
        held = [
            (os.open(source, os.O_PATH), Path(source).is_file(), target, ro) for source, target, ro in mounts
        ]
        _mount("tmpfs", "/tmp", "tmpfs", 0, "mode=1777,size=4g")
        for fd, is_file, target, read_only in held:
            _bind(f"/proc/self/fd/{fd}", target, read_only, is_file)
            os.close(fd)
        workdir = spec.get("workingDir") or "/"
        Path(workdir).mkdir(parents=True, exist_ok=True)
        os.chdir(workdir)
        env = spec["env"]
        argv = spec["argv"]
        if spec["uid"] != 0 or spec["gid"] != 0:
            # The pod's user and groups. One capability stays, CAP_DAC_READ_SEARCH: an image's files are
            # readable by every user, but here they are the host's (an interpreter under a root-only
            # home), so reading and searching is allowed; writing is checked as in the pod.
            argv = [
                "setpriv",
                f"--reuid={spec['uid']}",
                f"--regid={spec['gid']}",
                f"--groups={','.join(str(g) for g in spec['groups'])}",
                "--inh-caps=-all,+dac_read_search",
                "--ambient-caps=-all,+dac_read_search",
                "--bounding-set=-all,+dac_read_search",
                "--",
                *argv,
            ]
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        message = f"failed to start container {spec.get('name')!r}: {exc}"
        started_marker.write_text(message)
        print(message, file=sys.stderr)
        return 128
    return 128  # not reached: execvpe does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""Build the real engine of the e2e tier from the Go module proxy: `python -m tests.e2e.build [--print-bin]`.

Every version comes from tests/e2e/versions.env. The binaries land in a cache outside the checkout,
``$DSX_E2E_CACHE`` or ``~/.cache/dsx-e2e``, under a folder named by a digest of that file, the Go version
and this script's recipe, and are reused when present. Nothing of the modules' source enters the checkout:
each component is built in a module generated under the cache (Kubernetes and the single-binary tools), or,
for Argo Workflows, in a copy of the module under the cache with what its module zip cannot carry: the
symbolic link its repository has for ``signal_linux.go``, and an empty placeholder page for the UI folder the
``argo`` CLI embeds.

Exit status: 0 built or already there; 2 a malformed versions file; 3 a module the proxy refused or a build
that failed, named in one line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERSIONS_FILE = HERE / "versions.env"
# Changed whenever the way a component is built changes, so an old cache is not taken for a new one.
RECIPE = "3"
KEYS = ("KUBERNETES", "ETCD", "ARGO_WORKFLOWS", "ARGO_EVENTS", "NATS_SERVER")
_VERSION = re.compile(r"^v\d+\.\d+\.\d+$")


class BuildError(Exception):
    """A component could not be had or built: one line naming the module and version."""


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """Parse KEY=vX.Y.Z lines; every key of KEYS must be there with a plain release version."""
    versions: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or key not in KEYS or not _VERSION.match(value):
            raise ValueError(f"{path}:{number}: expected one of {', '.join(KEYS)}=vX.Y.Z, got {raw!r}")
        versions[key] = value
    missing = [key for key in KEYS if key not in versions]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)}")
    return versions


def go_version() -> str:
    out = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def cache_root() -> Path:
    return Path(os.environ.get("DSX_E2E_CACHE") or Path.home() / ".cache" / "dsx-e2e")


def cache_dir(versions: dict[str, str], go: str) -> Path:
    text = "\n".join(f"{k}={versions[k]}" for k in KEYS) + f"\nGO={go}\nRECIPE={RECIPE}\n"
    return cache_root() / hashlib.sha256(text.encode()).hexdigest()[:16]


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    # The local toolchain only: a go.mod asking for a newer one is an error here, not a download.
    env["GOTOOLCHAIN"] = "local"
    env["CGO_ENABLED"] = "0"
    env["GOFLAGS"] = "-buildvcs=false -trimpath"
    return env


def _go(args: list[str], cwd: Path, what: str) -> str:
    proc = subprocess.run(["go", *args], cwd=cwd, env=_go_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [
            ln
            for ln in (proc.stderr + proc.stdout).splitlines()
            if ln.strip() and not ln.startswith("go: downloading")
        ]
        refused = [ln for ln in lines if re.search(r"40[34]|not available|not found|unknown revision", ln)]
        detail = (refused or lines or [f"go {' '.join(args)} exited {proc.returncode}"])[0].strip()
        raise BuildError(f"{what}: {detail}")
    return proc.stdout


def _module_download(module: str, version: str, cwd: Path) -> dict[str, str]:
    out = _go(["mod", "download", "-json", f"{module}@{version}"], cwd, f"{module}@{version}")
    info: dict[str, str] = json.loads(out)
    if info.get("Error"):
        raise BuildError(f"{module}@{version}: {info['Error'].splitlines()[0]}")
    return info


def _write_module(work: Path, name: str, requires: list[str], tools: list[str], replaces: list[str]) -> None:
    work.mkdir(parents=True, exist_ok=True)
    lines = [f"module dsx.dev/e2e/{name}", "", "go 1.26.0", ""]
    lines += ["require (", *(f"\t{r}" for r in requires), ")", ""]
    if tools:
        lines += ["tool (", *(f"\t{t}" for t in tools), ")", ""]
    if replaces:
        lines += ["replace (", *(f"\t{r}" for r in replaces), ")", ""]
    (work / "go.mod").write_text("\n".join(lines))


def staging_replaces(kubernetes_gomod: str, version: str) -> list[str]:
    """The replace block Kubernetes' maintainers advise: each k8s.io/X that k8s.io/kubernetes requires at
    v0.0.0 (its staging modules) pinned at v0.MINOR.PATCH."""
    staging = f"v0{version[2:]}"  # v1.37.2 -> v0.37.2
    names = sorted(set(re.findall(r"^\s*(k8s\.io/[\w.-]+) v0\.0\.0\s*$", kubernetes_gomod, re.M)))
    return [f"{name} => {name} {staging}" for name in names]


@dataclass(frozen=True)
class Component:
    name: str
    binaries: tuple[str, ...]
    build: Callable[[dict[str, str], Path, Path], None]


def _build_kubernetes(versions: dict[str, str], work: Path, out: Path) -> None:
    version = versions["KUBERNETES"]
    work.mkdir(parents=True, exist_ok=True)
    info = _module_download("k8s.io/kubernetes", version, work)
    replaces = staging_replaces(Path(info["GoMod"]).read_text(), version)
    commands = [
        f"k8s.io/kubernetes/cmd/{b}" for b in ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
    ]
    _write_module(work, "kubernetes", [f"k8s.io/kubernetes {version}"], commands, replaces)
    _go(["mod", "tidy"], work, f"k8s.io/kubernetes@{version}")
    _go(["build", "-ldflags=-s -w", "-o", f"{out}/", *commands], work, f"k8s.io/kubernetes@{version}")


def _build_etcd(versions: dict[str, str], work: Path, out: Path) -> None:
    version = versions["ETCD"]
    # etcd's server module has replace lines, so `go install` refuses it: a main of our own calls etcdmain,
    # exactly what etcd's own server/main.go does.
    _write_module(work, "etcd", [f"go.etcd.io/etcd/server/v3 {version}"], [], [])
    (work / "main.go").write_text(
        'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\n'
        "func main() { etcdmain.Main(os.Args) }\n"
    )
    _go(["mod", "tidy"], work, f"go.etcd.io/etcd/server/v3@{version}")
    _go(["build", "-ldflags=-s -w", "-o", f"{out}/etcd", "."], work, f"go.etcd.io/etcd/server/v3@{version}")


def _build_argo_workflows(versions: dict[str, str], work: Path, out: Path) -> None:
    version = versions["ARGO_WORKFLOWS"]
    module = "github.com/argoproj/argo-workflows/v4"
    work.mkdir(parents=True, exist_ok=True)
    info = _module_download(module, version, work)
    tree = work / "argo-workflows"
    if tree.exists():
        shutil.rmtree(tree)
    shutil.copytree(info["Dir"], tree)
    for path in [tree, *tree.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    # Argo's repository has workflow/executor/osspecific/signal_linux.go as a symbolic link to
    # signal_darwin.go; module zips carry no links, so the served module lacks it and argoexec does not
    # build for Linux. The link is made again here, as the repository has it.
    link = tree / "workflow" / "executor" / "osspecific" / "signal_linux.go"
    if not link.exists():
        link.symlink_to("signal_darwin.go")
    # The CLI embeds ui/dist/app, which Argo's release builds produce and the module does not carry.
    placeholder = tree / "ui" / "dist" / "app"
    placeholder.mkdir(parents=True, exist_ok=True)
    (placeholder / "index.html").write_text("<!doctype html><title>argo</title>\n")
    commands = ["./cmd/argo", "./cmd/argoexec", "./cmd/workflow-controller"]
    _go(["build", "-ldflags=-s -w", "-o", f"{out}/", *commands], tree, f"{module}@{version}")


def _single_tool(name: str, key: str, module: str, package: str, binary: str) -> Component:
    def build(versions: dict[str, str], work: Path, out: Path) -> None:
        version = versions[key]
        _write_module(work, name, [f"{module} {version}"], [package], [])
        _go(["mod", "tidy"], work, f"{module}@{version}")
        _go(["build", "-ldflags=-s -w", "-o", f"{out}/{binary}", package], work, f"{module}@{version}")

    return Component(name, (binary,), build)


COMPONENTS: tuple[Component, ...] = (
    Component(
        "kubernetes", ("kube-apiserver", "kube-controller-manager", "kube-scheduler"), _build_kubernetes
    ),
    Component("etcd", ("etcd",), _build_etcd),
    Component("argo-workflows", ("argo", "argoexec", "workflow-controller"), _build_argo_workflows),
    _single_tool(
        "argo-events",
        "ARGO_EVENTS",
        "github.com/argoproj/argo-events",
        "github.com/argoproj/argo-events/cmd",
        "argo-events",
    ),
    _single_tool(
        "nats-server",
        "NATS_SERVER",
        "github.com/nats-io/nats-server/v2",
        "github.com/nats-io/nats-server/v2",
        "nats-server",
    ),
)


#: What the control plane of :mod:`tests.e2e.cluster` runs.
CORE = frozenset({"kubernetes", "etcd", "argo-workflows"})
#: What its Events tier adds: the Argo Events controller (and the image of the pods it makes) and the
#: JetStream server of the EventBus.
EVENTS = frozenset({"argo-events", "nats-server"})


def module_dir(key: str, module: str) -> Path:
    """The module cache's folder of ``module`` at the version ``key`` pins in the versions file (its
    manifests: CRDs, install YAML), downloaded if the cache lacks it."""
    version = read_versions()[key]
    return Path(_module_download(module, version, HERE)["Dir"])


def build(only: set[str] | frozenset[str] | None = None, log: Callable[[str], None] = print) -> Path:
    """Build what the cache lacks; return the folder of binaries."""
    versions = read_versions()
    root = cache_dir(versions, go_version())
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for component in COMPONENTS:
        if only is not None and component.name not in only:
            continue
        if all((bin_dir / b).is_file() for b in component.binaries):
            continue
        staging = root / "staging" / component.name
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir(parents=True)
        log(f"building {component.name} ({', '.join(component.binaries)}) into {bin_dir}")
        started = time.monotonic()
        component.build(versions, root / "src" / component.name, staging)
        for binary in component.binaries:
            (staging / binary).replace(bin_dir / binary)  # whole binaries only: a half build leaves none
        log(f"built {component.name} in {time.monotonic() - started:.0f}s")
    return bin_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.build", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", action="append", choices=[c.name for c in COMPONENTS], help="build just these"
    )
    parser.add_argument(
        "--core", action="store_true", help=f"build what the control plane runs ({', '.join(sorted(CORE))})"
    )
    parser.add_argument(
        "--events",
        action="store_true",
        help=f"with --core: the Events tier's too ({', '.join(sorted(EVENTS))})",
    )
    parser.add_argument("--print-bin", action="store_true", help="print the binaries' folder, nothing else")
    args = parser.parse_args(argv)
    try:
        core = CORE | EVENTS if args.events else CORE
        bin_dir = build(
            set(args.only) if args.only else (core if args.core else None),
            log=(lambda _: None) if args.print_bin else print,
        )
    except ValueError as exc:
        print(f"dsx e2e build: {exc}", file=sys.stderr)
        return 2
    except BuildError as exc:
        print(f"dsx e2e build: {exc}", file=sys.stderr)
        return 3
    print(bin_dir if args.print_bin else f"binaries in {bin_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

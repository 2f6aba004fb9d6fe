"""The two images run what the compiled templates and the rank pods ask of them.

No image is built or pulled here: the tests read the Dockerfile (``tests/dockerfile.py``) and check it
against the commands that run in each image. Every script or container template in
``charts/dsx/files`` runs in the control image, whose ``python`` must be the interpreter dsx is installed
in, whose entry modules must belong to packages it installs and import without torch; the rank pod's
command, rendered by ``steps.readiness.launchers.jobspec.render_group_job`` (so these tests follow the
code), runs in the GPU image with its programs on ``PATH`` and its modules installed where torchrun
starts its ranks. The
chart's own pods (the sentinel DaemonSet, rendered with real helm) run a ``dsx`` command of the control
image that exists with the flags they give, and the libraries the sentinel imports are dsx's
dependencies. Both end as uid/gid 65532; names and versions agree across ``_base.py``, pyproject, the
chart and the release.

What a base image brings (its ``PATH``, its programs, whether it holds CUDA and torch) cannot be read from the
Dockerfile: it is written once in ``BASE_IMAGES`` below, keyed by the exact pinned reference, so changing a
base in the Dockerfile fails here until its entry is reviewed.
"""

import ast
import functools
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from fnmatch import fnmatch
from importlib import metadata, util
from pathlib import Path
from typing import Any

import pytest

from steps.readiness.launchers.jobspec import JobSettings, render_group_job
from steps.readiness.models import Subject
from steps.readiness.outcomes import RunRef
from tests import dockerfile, yamltext
from tests.paths import CHART, REPO, helm_binary
from workflows.templates import _base

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
RELEASE = REPO / ".github" / "workflows" / "release.yaml"

CONTROL, GPU = "control", "gpu"
NON_ROOT = "65532:65532"
#: Programs the GPU image promises beyond what the rank pod's command names (``_base.GPU_IMAGE``).
GPU_PROGRAMS = ("python", "torchrun", "all_reduce_perf")
#: Distributions that bring torch or CUDA; none may reach the control image.
GPU_STACK = re.compile(r"^(torch|torchvision|torchaudio|triton|cuda-python|cupy.*|nvidia-.*-cu\d+)$", re.I)
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash"}
#: Shell builtins and keywords a command may use without a program of that name.
BUILTINS = {"[", "test", "exit", "cd", "export", "set", "true", "false", ":", "continue", "echo", "exec"}


@dataclass(frozen=True)
class BaseImage:
    """What a pinned base image brings, from its documentation.

    Attributes:
        path: its ``PATH``, in order.
        programs: program name -> the folder it is in.
        torch_python: the interpreter holding its CUDA torch (the one ``torchrun`` starts ranks with),
            or None when it has no torch.
        cuda: whether it holds the CUDA toolkit or libraries.
    """

    path: tuple[str, ...]
    programs: dict[str, str]
    torch_python: str | None
    cuda: bool


BASE_IMAGES: dict[str, BaseImage] = {
    # Docker's official Python image on Debian 13: CPython built into /usr/local, nothing else. Its PATH
    # puts /usr/local/bin before Debian's default, which holds it too.
    "python:3.12.12-slim-trixie": BaseImage(
        path=(
            "/usr/local/bin",
            "/usr/local/sbin",
            "/usr/local/bin",
            "/usr/sbin",
            "/usr/bin",
            "/sbin",
            "/bin",
        ),
        # nsenter: Debian's util-linux, an Essential package every Debian image holds.
        programs={
            "python": "/usr/local/bin",
            "pip": "/usr/local/bin",
            "sh": "/usr/bin",
            "mkdir": "/usr/bin",
            "nsenter": "/usr/bin",
        },
        torch_python=None,
        cuda=False,
    ),
    # NGC PyTorch 25.12 (release notes): Ubuntu 24.04, CUDA 13.1 toolkit with NCCL, PyTorch 2.10 installed in
    # the default Python 3.12 environment (/usr/local/lib/python3.12/dist-packages), its torchrun script
    # in /usr/local/bin.
    "nvcr.io/nvidia/pytorch:25.12-py3": BaseImage(
        path=(
            "/usr/local/cuda/bin",
            "/usr/local/sbin",
            "/usr/local/bin",
            "/usr/sbin",
            "/usr/bin",
            "/sbin",
            "/bin",
        ),
        programs={"python": "/usr/bin", "torchrun": "/usr/local/bin", "sh": "/usr/bin", "mkdir": "/usr/bin"},
        torch_python="/usr/bin/python",
        cuda=True,
    ),
}


# ---------------------------------------------------------------------------------------------------------
# What the repository says


def _dockerfile(text: str | None = None) -> dockerfile.Dockerfile:
    return dockerfile.parse(DOCKERFILE.read_text(encoding="utf-8") if text is None else text)


def _base_path(image: str) -> list[str]:
    return list(BASE_IMAGES[image].path) if image in BASE_IMAGES else []


def _base_has(image: str, program_path: str) -> bool:
    base = BASE_IMAGES.get(image)
    if base is None:
        return False
    folder, _, name = program_path.rpartition("/")
    return base.programs.get(name) == folder


def _build(df: dockerfile.Dockerfile, stage: str) -> dockerfile.Build:
    return df.build(stage, _base_path, _base_has)


def _pyproject() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def _project_packages() -> set[str]:
    """Top-level packages of the dsx distribution (setuptools' ``packages.find`` include patterns)."""
    patterns = _pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    return {
        d.name
        for d in REPO.iterdir()
        if (d / "__init__.py").exists() and any(fnmatch(d.name, p) for p in patterns)
    }


def _dependency(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return match.group(0).lower().replace("_", "-")


def _dependencies() -> set[str]:
    """Distributions dsx requires (not its extras: the images install the wheel without them)."""
    return {_dependency(r) for r in _pyproject()["project"]["dependencies"]}


@functools.cache
def _distributions() -> dict[str, set[str]]:
    """Import name -> the distributions providing it, in this environment."""
    found = metadata.packages_distributions().items()
    return {name: {d.lower().replace("_", "-") for d in dists} for name, dists in found}


def _distribution_of(top_level: str) -> set[str]:
    return _distributions().get(top_level, set())


def _containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    found = [template[k] for k in ("script", "container") if k in template]
    for key in ("initContainers", "sidecars"):
        found += template.get(key) or []
    return found


@functools.cache
def _compiled_containers() -> list[tuple[str, dict[str, Any]]]:
    """(where, container) for every container of every template in the compiled files."""
    found = []
    for path in sorted((CHART / "files").glob("*.yaml")):
        for doc in yamltext.load_all(path.read_text(encoding="utf-8")):
            spec = doc["spec"].get("workflowSpec", doc["spec"])
            for template in spec.get("templates", []):
                for container in _containers(template):
                    found.append((f"{path.name}: template {template['name']}", container))
    return found


def _job_settings() -> JobSettings:
    """Settings of a group job whose pods get the GPU image, as a certification run's step has them."""
    return JobSettings(
        namespace="gpu-ops",
        image=_base.GPU_IMAGE,
        service_account=_base.RANK_SERVICE_ACCOUNT,
        gpus_per_node=8,
        run=RunRef(name="dsx-certify-x7k2p", uid="3f1c-77ab", namespace="gpu-ops"),
    )


def _rank_pods() -> list[tuple[str, dict[str, Any]]]:
    """(torchrun module, rank container) of a rendered group job for each module the group tests run."""
    subject = Subject(kind="group", name="rack-00", members=["node-00", "node-01"])
    found = []
    for module in ("steps.readiness.ranks.sweep", "steps.readiness.ranks.smoke"):
        group = render_group_job(
            "allreduce-sweep", subject, module, ["--out", "/tmp/dsx-out/result.json"], _job_settings(), 600
        )
        containers = group.job["spec"]["template"]["spec"]["containers"]
        found += [(module, c) for c in containers]
    return found


def _words(container: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(programs run, every word) of a container's command and args; a ``sh -c`` script is read too."""
    argv = [str(a) for a in (container.get("command") or []) + (container.get("args") or [])]
    if argv and argv[0] in SHELLS and "-c" in argv[1:]:
        script = argv[argv.index("-c") + 1]
        commands = dockerfile.simple_commands(script)
        programs = [argv[0]] + [c[0] for c in commands if c[0] not in BUILTINS]
        return programs, [w for c in commands for w in c]
    return argv[:1], argv


def _modules_run(words: list[str]) -> list[str]:
    """Modules started with ``-m`` (python's or torchrun's)."""
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m"]


def _runnable(module: str) -> str | None:
    """Why ``python -m module`` would not run it from this checkout, or None."""
    spec = util.find_spec(module)
    if spec is None or spec.origin is None:
        return f"module {module} does not exist"
    if spec.submodule_search_locations is not None:
        main = Path(spec.origin).parent / "__main__.py"
        return None if main.exists() else f"package {module} has no __main__.py"
    source = Path(spec.origin).read_text(encoding="utf-8")
    if not re.search(r"""if __name__ == ["']__main__["']:""", source):
        return f'module {module} has no `if __name__ == "__main__":` block: `-m {module}` would do nothing'
    return None


@functools.cache
def _entry_points_without_torch(entries: tuple[str, ...]) -> dict[str, str]:
    """Import each ``module:function`` in a fresh interpreter where torch cannot be imported (once a run)."""
    code = (
        "import importlib, json, sys\n"
        "sys.modules['torch'] = None  # the control image has no torch\n"
        "out = {}\n"
        "for entry in sys.argv[1:]:\n"
        "    module, _, function = entry.partition(':')\n"
        "    try:\n"
        "        target = getattr(importlib.import_module(module), function, None)\n"
        "        out[entry] = 'ok' if callable(target) else f'{module} has no function {function}'\n"
        "    except Exception as exc:\n"
        "        out[entry] = f'importing {module}: {type(exc).__name__}: {exc}'\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *entries], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def _runner_entry(words: list[str]) -> str | None:
    """The ``-e module:function`` of ``python -m hera.workflows.runner -e module:function``."""
    if "hera.workflows.runner" in _modules_run(words) and "-e" in words[:-1]:
        return words[words.index("-e") + 1]
    return None


def _release() -> dict[str, Any]:
    return dict(yamltext.load(RELEASE.read_text(encoding="utf-8")))


def _release_images() -> dict[str, str]:
    """target -> image repository, from the release workflow's build matrix."""
    include = _release()["jobs"]["images"]["strategy"]["matrix"]["include"]
    return {entry["target"]: entry["image"] for entry in include}


# ---------------------------------------------------------------------------------------------------------
# Checks: each returns the problems it finds, so the mutation test below can show every one can fail.


def base_problems(df: dockerfile.Dockerfile) -> list[str]:
    """Targets exist; every external base is pinned by tag (or digest) and documented in BASE_IMAGES."""
    problems = [f"no `{t}` target in the Dockerfile" for t in (CONTROL, GPU) if not df.is_stage(t)]
    used = {s.base for s in df.stages if not df.is_stage(s.base)}
    for image in sorted(used):
        name = image.split("@")[0].rsplit("/", 1)[-1]
        if "@sha256:" not in image and (":" not in name or name.endswith(":latest")):
            problems.append(f"base image {image} is not pinned to a version tag or digest")
        if image not in BASE_IMAGES:
            problems.append(f"base image {image} is not described in BASE_IMAGES (tests/test_image.py)")
    problems += [f"BASE_IMAGES describes {i}, which no stage uses" for i in sorted(set(BASE_IMAGES) - used)]
    return problems


def user_problems(df: dockerfile.Dockerfile) -> list[str]:
    """Both images end as uid/gid 65532, the user the workflow pods' securityContext runs as."""
    return [
        f"the {t} image ends as user {_build(df, t).user or 'of its base (root)'}, not {NON_ROOT}"
        for t in (CONTROL, GPU)
        if _build(df, t).user != NON_ROOT
    ]


def wheel_problems(df: dockerfile.Dockerfile) -> list[str]:
    """The stage that builds the dsx wheel copies pyproject.toml, the README it names and every package."""
    builders = [
        stage
        for stage in df.stages
        for ins in stage.instructions
        if ins.keyword == "RUN"
        and any(w[1:4] == ["-m", "pip", "wheel"] for w in dockerfile.simple_commands(ins.value))
    ]
    if not builders:
        return ["no stage builds the dsx wheel (`pip wheel`)"]
    copied = {
        source.rstrip("/")
        for stage in builders
        for ins in stage.instructions
        if ins.keyword == "COPY" and not ins.flag("from")
        for source in dockerfile.copy_operands(ins.value)[:-1]
    }
    needed = {"pyproject.toml", _pyproject()["project"]["readme"], *_project_packages()}
    return [f"the wheel stage does not copy {n}" for n in sorted(needed - copied)]


def _program_problems(build: dockerfile.Build, image: str, programs: list[str], where: str) -> list[str]:
    problems = []
    for program in programs:
        name = program.rsplit("/", 1)[-1]
        if program.startswith("/"):
            if program not in build.files and not _base_has(build.image, program):
                problems.append(f"{where}: {program} is not in the {image} image")
        elif build_path := _resolve(build, name):
            if name.startswith("python") and build_path not in build.dsx_pythons:
                problems.append(
                    f"{where}: `{name}` is {build_path} in the {image} image, which dsx is not installed in "
                    f"(installed in: {', '.join(sorted(build.dsx_pythons)) or 'none'})"
                )
        else:
            problems.append(
                f"{where}: `{name}` is on no folder of the {image} image's PATH ({':'.join(build.path)}): "
                "neither a program of its base (BASE_IMAGES) nor one its build proves (test -x, run by path)"
            )
    return problems


def _resolve(build: dockerfile.Build, name: str) -> str | None:
    for folder in build.path:
        candidate = f"{folder}/{name}"
        if candidate in build.files or _base_has(build.image, candidate):
            return candidate
    return None


def control_problems(df: dockerfile.Dockerfile) -> list[str]:
    """Every compiled template runs in the control image, and what it runs is there."""
    build = _build(df, CONTROL)
    packages = _project_packages() if build.dsx_pythons else set()
    problems = []
    entries: dict[str, str] = {}
    containers = _compiled_containers()
    if not containers:
        problems.append("no compiled template found under charts/dsx/files")
    for where, container in containers:
        if container.get("image") != _base.DEFAULT_IMAGE:
            problems.append(
                f"{where}: runs {container.get('image')}, not the control image {_base.DEFAULT_IMAGE}"
            )
        programs, words = _words(container)
        problems += _program_problems(build, CONTROL, programs, where)
        for module in _modules_run(words):
            top = module.split(".")[0]
            if top not in packages and not (_distribution_of(top) & _dependencies()):
                problems.append(
                    f"{where}: `-m {module}`: {top} is neither a dsx package nor a dsx dependency"
                )
            elif why := _runnable(module):
                problems.append(f"{where}: {why}")
        entry = _runner_entry(words)
        if entry is not None:
            if entry.split(".")[0] not in packages:
                problems.append(f"{where}: `-e {entry}` is not in a package the control image installs")
            entries[entry] = where
    for entry, outcome in _entry_points_without_torch(tuple(sorted(entries))).items():
        if outcome != "ok":
            problems.append(f"{entries[entry]}: `-e {entry}` fails without torch: {outcome}")
    return problems


@functools.cache
def _chart_pods() -> tuple[tuple[str, str, str], ...]:
    """(where, container as JSON, image) of every container of a pod the chart itself runs (DaemonSets,
    Deployments), rendered with real helm and every optional part on."""
    done = subprocess.run(
        [
            helm_binary(),
            "template",
            "dsx",
            str(CHART),
            "--set",
            "sentinel.serviceMonitor.enabled=true",
            "--set",
            "monitoring.exporter.enabled=true",
            "--set",
            "sentinel.repair.resetGpus=true",
            "--set",
            "sentinel.repair.agentReboot=true",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = []
    for doc in yamltext.load_all(done.stdout):
        if not doc or doc["kind"] not in ("DaemonSet", "Deployment", "StatefulSet"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            where = f"{doc['kind']}/{doc['metadata']['name']}: container {container['name']}"
            found.append((where, json.dumps(container), str(container.get("image"))))
    return tuple(found)


def _imports(paths: list[Path]) -> set[str]:
    """Top-level names of every module these files import, at the top or inside a function."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return names


def _dsx_command_problems(words: list[str], where: str) -> list[str]:
    """``dsx SUBCOMMAND... --flag=...``: the subcommand exists and takes every flag given."""
    command = [w for w in words[1:] if not w.startswith("-")]
    flags = [w.split("=")[0] for w in words[1:] if w.startswith("--")]
    done = subprocess.run(
        [sys.executable, "-m", "workflows.cli", *command, "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "COLUMNS": "200"},
    )
    if done.returncode != 0:
        return [f"{where}: `dsx {' '.join(command)}` is not a dsx command: {done.stderr.strip()[-200:]}"]
    return [f"{where}: `dsx {' '.join(command)}` takes no {f}" for f in flags if f not in done.stdout]


def chart_pod_problems(
    df: dockerfile.Dockerfile, pods: tuple[tuple[str, str, str], ...] | None = None
) -> list[str]:
    """The chart's own pods (the sentinel DaemonSet) run the control image, and what they run is there:
    the program on its PATH, a dsx command that exists with the flags given, and every library the
    sentinel's code imports installed with dsx (a dependency in pyproject, not a dev tool)."""
    build = _build(df, CONTROL)
    pods = _chart_pods() if pods is None else pods
    problems = [] if pods else ["the chart runs no DaemonSet: the sentinel is missing"]
    for where, text, image in pods:
        container = json.loads(text)
        if image != _base.DEFAULT_IMAGE:
            problems.append(f"{where}: runs {image}, not the control image {_base.DEFAULT_IMAGE}")
        programs, words = _words(container)
        problems += _program_problems(build, CONTROL, programs, where)
        if programs[:1] == ["dsx"]:
            problems += _dsx_command_problems(words, where)
        # the agent's own reboot runs a program of the image too
        for word in words:
            if word.startswith("--reboot-command="):
                command = shlex.split(word.split("=", 1)[1])
                problems += _program_problems(build, CONTROL, command[:1], f"{where} --reboot-command")
    sentinel = [*sorted((REPO / "steps" / "sentinel").glob("*.py")), REPO / "workflows/cli/sentinel.py"]
    for name in sorted(
        _imports(sentinel) - set(sys.stdlib_module_names) - _project_packages() - {"__future__"}
    ):
        if not _distribution_of(name) & _dependencies():
            problems.append(
                f"the sentinel imports {name}, which no dependency of dsx provides "
                f"({', '.join(sorted(_distribution_of(name))) or 'not installed'}): not in the control image"
            )
    return problems


def gpu_problems(df: dockerfile.Dockerfile) -> list[str]:
    """The rank pod's command, its programs and its modules are in the GPU image, where torchrun runs them."""
    build = _build(df, GPU)
    base = BASE_IMAGES.get(build.image)
    problems = []
    if base is None or base.torch_python is None:
        problems.append(f"the gpu image's base {build.image} holds no CUDA torch")
    elif base.torch_python not in build.dsx_pythons:
        problems.append(
            f"dsx is not installed in {base.torch_python}, the interpreter torchrun starts the ranks with "
            f"(installed in: {', '.join(sorted(build.dsx_pythons)) or 'none'})"
        )
    problems += _program_problems(build, GPU, list(GPU_PROGRAMS), "the GPU image's programs")
    for module, container in _rank_pods():
        where = f"rank pod of {module}"
        if container.get("image") != _base.GPU_IMAGE:
            problems.append(f"{where}: runs {container.get('image')}, not the GPU image {_base.GPU_IMAGE}")
        programs, words = _words(container)
        problems += _program_problems(build, GPU, programs, where)
        if module not in words:
            problems.append(f"{where}: the command never names {module}: {words}")
        for run in sorted({module, *_modules_run(words)}):
            if run.split(".")[0] not in _project_packages():
                problems.append(f"{where}: `{run}` is not in a dsx package, the only ones the GPU image adds")
            elif why := _runnable(run):
                problems.append(f"{where}: {why}")
    return problems


def no_torch_problems(df: dockerfile.Dockerfile) -> list[str]:
    """Nothing with torch or CUDA reaches the control image: not its bases, not what it installs."""
    build = _build(df, CONTROL)
    problems = []
    for name in sorted({CONTROL, *build.sources}):
        image = _build(df, name).image
        base = BASE_IMAGES.get(image)
        if base is None or base.cuda or base.torch_python is not None:
            problems.append(
                f"the control image takes files from stage {name}, built on {image} (CUDA or torch)"
            )
    for stage, run in build.runs + [r for s in build.sources for r in _build(df, s).runs]:
        for words in dockerfile.simple_commands(run):
            if "install" not in words or not any("pip" in w for w in words[:3]):
                continue
            for word in words[words.index("install") + 1 :]:
                package = re.split(r"[\[=<>!~;]", word.rsplit("/", 1)[-1])[0]
                if GPU_STACK.match(package) or "[" in word:
                    problems.append(f"stage {stage} pip-installs {word} into the control image")
    problems += [
        f"dsx depends on {d}, which would put torch or CUDA in the control image"
        for d in sorted(_dependencies())
        if GPU_STACK.match(d)
    ]
    return problems


# ---------------------------------------------------------------------------------------------------------
# Tests


def test_dockerfile_has_both_targets_on_pinned_documented_bases() -> None:
    assert base_problems(_dockerfile()) == []


def test_both_images_end_as_the_non_root_user_of_the_pod_security_context() -> None:
    assert user_problems(_dockerfile()) == []


def test_the_dsx_wheel_is_built_from_every_package_of_the_project() -> None:
    assert wheel_problems(_dockerfile()) == []


def test_every_compiled_template_runs_in_the_control_image_and_its_command_exists_there() -> None:
    assert control_problems(_dockerfile()) == []


def test_the_rank_pods_command_and_its_torchrun_module_exist_in_the_gpu_image() -> None:
    assert gpu_problems(_dockerfile()) == []


def test_the_sentinel_daemonset_runs_a_dsx_command_of_the_control_image() -> None:
    assert chart_pod_problems(_dockerfile()) == []
    assert {where.split(":")[0] for where, _, _ in _chart_pods()} >= {
        "DaemonSet/dsx-sentinel",
        "Deployment/dsx-exporter",
    }


@pytest.mark.story
def test_a_chart_pod_running_what_the_control_image_lacks_is_found() -> None:
    df = _dockerfile()
    base = {"image": _base.DEFAULT_IMAGE, "command": ["dsx", "sentinel", "agent"], "args": ["--interval=10"]}
    cases = [
        ({**base, "command": ["dcgmi", "diag"]}, "`dcgmi` is on no folder"),
        ({**base, "command": ["dsx", "sentinel", "watch"]}, "`dsx sentinel watch` is not a dsx command"),
        ({**base, "args": ["--poll=10"]}, "`dsx sentinel agent` takes no --poll"),
        ({**base, "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4"}, "not the control image"),
    ]
    for container, expected in cases:
        pod = (("DaemonSet/x: container c", json.dumps(container), container["image"]),)
        problems = chart_pod_problems(df, pod)
        assert any(expected in p for p in problems), (expected, problems)
    assert chart_pod_problems(df, (("ok", json.dumps(base), base["image"]),)) == []


def test_the_control_image_installs_no_torch_and_no_cuda() -> None:
    assert no_torch_problems(_dockerfile()) == []


#: (what is broken, text replaced in the Dockerfile, its replacement, the check, words of the problem).
MUTATIONS = [
    (
        "control runs as root",
        "USER 65532:65532\nWORKDIR /tmp\nCMD",
        "USER root\nWORKDIR /tmp\nCMD",
        user_problems,
        "control image ends as user root",
    ),
    (
        "gpu keeps the base's user",
        "/tmp/ldd.txt\nUSER 65532:65532\n",
        "/tmp/ldd.txt\n",
        user_problems,
        "gpu image ends as user of its base",
    ),
    (
        "unpinned base",
        "ARG PYTHON_IMAGE=python:3.12.12-slim-trixie",
        "ARG PYTHON_IMAGE=python:latest",
        base_problems,
        "not pinned",
    ),
    (
        "undocumented base",
        "nvcr.io/nvidia/pytorch:25.12-py3",
        "nvcr.io/nvidia/pytorch:26.02-py3",
        base_problems,
        "not described in BASE_IMAGES",
    ),
    ("no gpu target", "AS gpu\n", "AS gpu-image\n", base_problems, "no `gpu` target"),
    ("wheel without recipes", "COPY recipes/ recipes/\n", "", wheel_problems, "does not copy recipes"),
    (
        "venv off PATH",
        "ENV PATH=/opt/dsx/bin:${PATH} \\\n",
        "ENV ",
        control_problems,
        "which dsx is not installed in",
    ),
    (
        "venv not copied",
        "COPY --from=control-venv /opt/dsx/ /opt/dsx/\n",
        "",
        control_problems,
        "which dsx is not installed in",
    ),
    (
        "dsx not installed in the gpu image",
        "python -m pip install --no-cache-dir /wheels/dsx-*.whl\nENV PATH=/opt/nccl",
        "python -m pip install --no-cache-dir /wheels/other.whl\nENV PATH=/opt/nccl",
        gpu_problems,
        "dsx is not installed in /usr/bin/python",
    ),
    (
        "nccl-tests not proven",
        "&& test -x /opt/nccl-tests/bin/all_reduce_perf\n",
        "\n",
        gpu_problems,
        "`all_reduce_perf` is on no folder",
    ),
    (
        "nccl-tests off PATH",
        "ENV PATH=/opt/nccl-tests/bin:${PATH} \\\n",
        "ENV ",
        gpu_problems,
        "`all_reduce_perf` is on no folder",
    ),
    (
        "nccl-tests not copied",
        "COPY --from=nccl-tests /opt/nccl-tests/bin/ /opt/nccl-tests/bin/\n",
        "",
        gpu_problems,
        "`all_reduce_perf` is on no folder",
    ),
    (
        "dsx not proven in the control image",
        "    && test -x /opt/dsx/bin/dsx \\\n",
        "",
        chart_pod_problems,
        "`dsx` is on no folder",
    ),
    (
        "control on the pytorch base",
        "FROM ${PYTHON_IMAGE} AS control\n",
        "FROM ${PYTORCH_IMAGE} AS control\n",
        no_torch_problems,
        "CUDA or torch",
    ),
    (
        "control installs the train extra",
        "/wheels/dsx-*.whl\n\nFROM ${PYTHON_IMAGE} AS control",
        "/wheels/dsx-*.whl torch==2.10.0\n\nFROM ${PYTHON_IMAGE} AS control",
        no_torch_problems,
        "pip-installs torch==2.10.0",
    ),
    (
        "control takes nccl-tests",
        "COPY --from=control-venv /opt/dsx/ /opt/dsx/\n",
        "COPY --from=control-venv /opt/dsx/ /opt/dsx/\nCOPY --from=nccl-tests /opt/nccl-tests/ /opt/x/\n",
        no_torch_problems,
        "stage nccl-tests",
    ),
]


@pytest.mark.parametrize(
    ("broken", "old", "new", "check", "expected"), MUTATIONS, ids=[m[0] for m in MUTATIONS]
)
def test_each_check_finds_the_fault_it_is_for(
    broken: str, old: str, new: str, check: Any, expected: str
) -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert old in text, f"{broken}: the Dockerfile no longer holds {old!r}; update this case"
    problems = check(_dockerfile(text.replace(old, new, 1)))
    assert any(expected in p for p in problems), problems


def test_a_rank_command_naming_a_missing_program_or_module_is_found() -> None:
    df = _dockerfile()
    build = _build(df, GPU)
    assert _program_problems(build, GPU, ["mpirun"], "pod") and not _program_problems(
        build, GPU, ["torchrun"], "pod"
    )
    assert (
        _runnable("steps.readiness.no_such_module") == "module steps.readiness.no_such_module does not exist"
    )
    assert "no `if __name__" in (_runnable("steps.readiness.models") or "")
    missing, needs_torch = "steps.readiness.certify:no_such_step", "torch.nn:Module"
    outcome = _entry_points_without_torch((missing, needs_torch))
    assert outcome[missing] == "steps.readiness.certify has no function no_such_step"
    assert outcome[needs_torch].startswith("importing torch.nn: ModuleNotFoundError")


def test_image_names_and_version_agree_across_the_repository() -> None:
    version = _pyproject()["project"]["version"]
    chart = yamltext.load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    values = yamltext.load((CHART / "values.yaml").read_text(encoding="utf-8"))
    images = _release_images()
    assert chart["appVersion"] == version
    assert images == {CONTROL: "ghcr.io/dsx-dev/dsx", GPU: "ghcr.io/dsx-dev/dsx-gpu"}
    assert f"{images[CONTROL]}:{version}" == _base.DEFAULT_IMAGE
    assert f"{images[GPU]}:{version}" == _base.GPU_IMAGE
    assert values["image"]["repository"] == images[CONTROL]
    if "gpuImage" in values:
        assert values["gpuImage"]["repository"] == images[GPU]
    assert all(_dockerfile().is_stage(target) for target in images)


def test_release_lints_then_pushes_both_targets_tagged_with_the_version_and_latest() -> None:
    release = _release()
    on = release.get("on", release.get(True))  # YAML 1.1 reads the key `on` as true
    assert on == {"push": {"tags": ["v*"]}}
    jobs = release["jobs"]
    assert any("hadolint Dockerfile" in str(s.get("run", "")) for s in jobs["lint"]["steps"])
    build = jobs["images"]
    assert build["needs"] == "lint" and build["permissions"]["packages"] == "write"
    steps = build["steps"]
    uses = [s["uses"] for job in jobs.values() for s in job["steps"] if "uses" in s]
    assert all(re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", u) for u in uses), uses
    by_action = {s["uses"].split("@")[0]: s.get("with", {}) for s in steps if "uses" in s}
    assert {"docker/setup-buildx-action", "docker/login-action", "docker/build-push-action"} <= set(by_action)
    login = by_action["docker/login-action"]
    assert login["registry"] == "ghcr.io" and login["password"] == "${{ secrets.GITHUB_TOKEN }}"
    push = by_action["docker/build-push-action"]
    assert push["target"] == "${{ matrix.target }}" and push["push"] is True
    tags = push["tags"].splitlines()
    assert tags == ["${{ matrix.image }}:${{ steps.version.outputs.version }}", "${{ matrix.image }}:latest"]
    check = next(s for s in steps if s.get("id") == "version")["run"]
    assert (
        '"${GITHUB_REF_NAME}" != "v${version}"' in check and "exit 1" in check and "pyproject.toml" in check
    )


# ---------------------------------------------------------------------------------------------------------
# The build context


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves ``path`` out of the context (.dockerignore: last match wins, parents count)."""
    parts = path.split("/")
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        glob = pattern.lstrip("!").strip("/")
        regex = re.escape(glob).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        regex = regex.replace(r"\?", "[^/]").replace(r"\[", "[").replace(r"\]", "]")
        if any(re.fullmatch(regex, "/".join(parts[: i + 1])) for i in range(len(parts))):
            excluded = not negate
    return excluded


def test_the_build_context_holds_what_copy_needs_and_leaves_out_the_rest() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    sources = {
        source.rstrip("/")
        for stage in _dockerfile().stages
        for ins in stage.instructions
        if ins.keyword == "COPY" and not ins.flag("from")
        for source in dockerfile.copy_operands(ins.value)[:-1]
    }
    needed = sorted(
        str(p.relative_to(REPO))
        for source in sources
        for p in ([REPO / source] if (REPO / source).is_file() else (REPO / source).rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert "recipes/registry.yaml" in needed and "steps/readiness/launchers/job.py" in needed
    assert [p for p in needed if _ignored(p, patterns)] == []
    for junk in (
        ".git/config",
        ".venv/bin/python",
        ".tools/bin/helm",
        "dsx-runs/x/workflow.json",
        "tests/x.py",
    ):
        assert _ignored(junk, patterns), junk
    assert _ignored("steps/__pycache__/x.cpython-311.pyc", patterns)

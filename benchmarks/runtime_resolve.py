"""Recipe resolution and bundle rendering speed against their goals.

    python benchmarks/runtime_resolve.py [RUNS]

Builds a synthetic catalogue of 200 overlays and 100 components (each overlay touching 10 components
with nested values, a third of them matching the query), then measures:

- resolving the recipe from the loaded catalogue (goal: under 50 ms);
- rendering and writing all three bundles, Helm, Argo CD and Flux, of the shipped eks/h100 recipe
  (goal: under 300 ms for the three).
"""

import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from steps.runtime.bundle import render_bundle, write_bundle
from steps.runtime.catalogue import load_catalogue
from steps.runtime.criteria import ALLOWED, parse_criteria
from steps.runtime.resolve import resolve

RESOLVE_GOAL_S = 0.050
BUNDLE_GOAL_S = 0.300
COMPONENTS = 100
OVERLAYS = 200


def _synthetic_catalogue(root: Path) -> None:
    rng = random.Random(7)
    names = [f"component-{i:03d}" for i in range(COMPONENTS)]
    components = {}
    for index, name in enumerate(names):
        deps = sorted(rng.sample(names[:index], k=min(index, rng.randint(0, 3))))
        components[name] = {
            "repository": f"https://charts.example.org/{index % 7}",
            "chart": name,
            "defaultVersion": f"1.{index}.0",
            "namespace": f"ns-{index % 10}",
            "dependsOn": deps,
            "nodeScheduling": {
                "nodeSelector": ["controller.nodeSelector"],
                "tolerations": ["controller.tolerations"],
            },
        }
    registry = {
        "apiVersion": "dsx.dev/v1alpha1",
        "kind": "ComponentRegistry",
        "metadata": {"name": "synthetic"},
        "spec": {"components": components},
    }
    (root / "overlays").mkdir(parents=True)
    (root / "registry.yaml").write_text(yaml.safe_dump(registry))
    fields = ["service", "accelerator", "os", "intent"]
    for index in range(OVERLAYS):
        criteria = {}
        if index:
            for field in rng.sample(fields, k=rng.randint(1, 3)):
                # the query's value a third of the time, so that about a third of overlays apply
                criteria[field] = ALLOWED[field][0] if rng.random() < 0.6 else rng.choice(ALLOWED[field])
        refs = []
        for name in sorted(rng.sample(names, k=10)):
            refs.append(
                {
                    "name": name,
                    "values": {
                        "controller": {"replicas": rng.randint(1, 3), "args": [f"--flag-{index}"]},
                        f"feature{index % 13}": {"enabled": rng.random() < 0.5, "level": index},
                    },
                }
            )
        document = {
            "apiVersion": "dsx.dev/v1alpha1",
            "kind": "Recipe",
            "metadata": {"name": f"overlay-{index:03d}"},
            "spec": {
                "criteria": criteria,
                "componentRefs": refs,
                "thresholds": {"nccl": {"timeoutFactor": 2.0 + index / 1000}},
                "scheduling": {
                    "system": {"tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}]}
                }
                if index == 0
                else {},
            },
        }
        (root / "overlays" / f"overlay-{index:03d}.yaml").write_text(yaml.safe_dump(document))


def _timings(fn: Callable[[], object], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _line(label: str, times: list[float], goal: float) -> None:
    median, best = statistics.median(times), min(times)
    print(
        f"{label:<40} median {median * 1000:7.2f} ms (best {best * 1000:7.2f})   goal {goal * 1000:4.0f} ms"
        f"   ratio {median / goal:.2f} (best {best / goal:.2f})"
    )


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder) / "catalogue"
        _synthetic_catalogue(root)
        start = time.perf_counter()
        catalogue = load_catalogue(root)
        load_s = time.perf_counter() - start
        query = parse_criteria({f: ALLOWED[f][0] for f in ("service", "accelerator", "os", "intent")})
        result = resolve(catalogue, query)
        resolve_times = _timings(lambda: resolve(catalogue, query), runs)
        applied, resolved = len(result.appliedOverlays), len(result.components)
        overlays, components = len(catalogue.overlays), len(catalogue.components)
        print(
            f"synthetic catalogue: {overlays} overlays, {components} components;"
            f" {applied} overlays applied, {resolved} components resolved"
        )
        print(f"{'load and check the catalogue (once)':<40} {load_s * 1000:7.2f} ms (no goal)")
        _line("resolve (200 overlays, 100 components)", resolve_times, RESOLVE_GOAL_S)

        shipped = resolve(
            load_catalogue(),
            parse_criteria({"service": "eks", "accelerator": "h100", "os": "ubuntu", "intent": "training"}),
        )
        out = Path(folder) / "bundles"

        def all_bundles() -> None:
            for fmt in ("helm", "argocd", "flux"):
                files = render_bundle(shipped, fmt, repo_url="https://git.example.org/gitops.git")
                write_bundle(files, out / fmt)

        _line("render and write helm + argocd + flux", _timings(all_bundles, runs), BUNDLE_GOAL_S)


if __name__ == "__main__":
    main()

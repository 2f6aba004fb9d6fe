"""Resolution rules: specificity, merge rules, provenance, bases, and errors a person can act on."""

from pathlib import Path

import pytest

from steps.errors import InputError
from steps.runtime.catalogue import load_catalogue
from steps.runtime.criteria import parse_criteria
from steps.runtime.resolve import RecipeResult, resolve
from tests.steps.runtime.kit import component, overlay, write_catalogue


def _resolve(root: Path, **criteria: object) -> RecipeResult:
    return resolve(load_catalogue(root), parse_criteria(criteria))


def test_merge_rules_and_provenance(tmp_path: Path) -> None:
    root = write_catalogue(
        tmp_path,
        {"a": component(), "b": component(), "c": component()},
        [
            overlay(
                "base",
                componentRefs=[
                    {"name": "a", "values": {"x": {"y": 1, "z": [1, 2]}, "keep": True, "drop": 5}},
                    {"name": "b", "dependsOn": ["a"], "manifests": ["one.yaml"]},
                    {"name": "c"},
                ],
                thresholds={"nccl": {"timeoutFactor": 2.0, "relative": {"madFactor": 3.0}}},
            ),
            overlay(
                "eks",
                {"service": "eks"},
                componentRefs=[
                    {"name": "a", "values": {"x": {"z": [3]}, "drop": None}, "version": "2.0.0"},
                    {"name": "b", "dependsOn": ["c"], "manifests": ["two.yaml", "one.yaml"]},
                ],
                thresholds={"nccl": {"relative": {"minGroups": 3}}},
            ),
        ],
        values={"a": {"x": {"y": 0, "w": "default"}}},
        manifests={"b": {"one.yaml": "kind: A\n", "two.yaml": "kind: B\n"}},
    )
    result = _resolve(root, service="eks")
    a = result.component("a")
    assert a.values == {"x": {"y": 1, "w": "default", "z": [3]}, "keep": True}  # deep merge, list replaced
    assert a.version == "2.0.0"
    b = result.component("b")
    assert b.dependsOn == ["c"]  # replaced, not added
    assert [m.name for m in b.manifests] == ["one.yaml", "two.yaml"]  # added without duplicates
    assert result.thresholds["nccl"] == {"timeoutFactor": 2.0, "relative": {"madFactor": 3.0, "minGroups": 3}}
    assert result.provenance["a.values.x.w"] == "components/a/values.yaml"
    assert result.provenance["a.values.x.y"] == "base"
    assert result.provenance["a.values.x.z"] == "eks"
    assert result.provenance["a.version"] == "eks"
    assert "a.values.drop" not in result.provenance
    assert result.provenance["thresholds.nccl.relative.minGroups"] == "eks"


def test_more_specific_overlays_win_and_ties_go_by_name(tmp_path: Path) -> None:
    root = write_catalogue(
        tmp_path,
        {"a": component()},
        [
            overlay("base", componentRefs=[{"name": "a"}]),
            overlay(
                "zz-accel", {"accelerator": "h100"}, componentRefs=[{"name": "a", "values": {"v": "zz"}}]
            ),
            overlay("aa-svc", {"service": "eks"}, componentRefs=[{"name": "a", "values": {"v": "aa"}}]),
            overlay(
                "a-both",
                {"service": "eks", "accelerator": "h100"},
                componentRefs=[{"name": "a", "values": {"w": 1}}],
            ),
        ],
    )
    result = _resolve(root, service="eks", accelerator="h100")
    assert [o.name for o in result.appliedOverlays] == ["base", "aa-svc", "zz-accel", "a-both"]
    assert result.component("a").values == {"v": "zz", "w": 1}


def test_any_is_a_wildcard_on_the_recipe_side_only(tmp_path: Path) -> None:
    root = write_catalogue(
        tmp_path,
        {"a": component()},
        [
            overlay("base", componentRefs=[{"name": "a"}]),
            overlay("eks", {"service": "eks"}, componentRefs=[{"name": "a", "values": {"eks": True}}]),
            overlay(
                "wide", {"service": "any", "nodes": 4}, componentRefs=[{"name": "a", "values": {"big": True}}]
            ),
        ],
    )
    assert [o.name for o in _resolve(root).appliedOverlays] == ["base"]
    assert [o.name for o in _resolve(root, service="eks").appliedOverlays] == ["base", "eks"]
    assert [o.name for o in _resolve(root, nodes=8).appliedOverlays] == ["base", "wide"]
    assert [o.name for o in _resolve(root, nodes=2).appliedOverlays] == ["base"]


def test_equal_specificity_pins_that_disagree_are_a_conflict(tmp_path: Path) -> None:
    root = write_catalogue(
        tmp_path,
        {"a": component()},
        [
            overlay("base", componentRefs=[{"name": "a"}]),
            overlay("eks", {"service": "eks"}, componentRefs=[{"name": "a", "version": "1.1.0"}]),
            overlay("h100", {"accelerator": "h100"}, componentRefs=[{"name": "a", "version": "1.2.0"}]),
        ],
    )
    with pytest.raises(InputError) as error:
        _resolve(root, service="eks", accelerator="h100")
    message = str(error.value)
    assert "conflict" in message
    assert "overlays/eks.yaml" in message and "overlays/h100.yaml" in message
    assert "'1.1.0' vs '1.2.0'" in message
    assert _resolve(root, service="eks").component("a").version == "1.1.0"


def test_base_chains_apply_first_and_cycles_are_printed(tmp_path: Path) -> None:
    root = write_catalogue(
        tmp_path,
        {"a": component()},
        [
            overlay("base", componentRefs=[{"name": "a"}]),
            overlay(
                "h100",
                {"accelerator": "h100"},
                componentRefs=[{"name": "a", "values": {"gpu": "h100", "nv": 4}}],
            ),
            overlay(
                "h200",
                {"accelerator": "h200"},
                base="h100",
                componentRefs=[{"name": "a", "values": {"gpu": "h200"}}],
            ),
        ],
    )
    result = _resolve(root, accelerator="h200")
    assert [o.name for o in result.appliedOverlays] == ["base", "h100", "h200"]
    assert result.component("a").values == {"gpu": "h200", "nv": 4}

    cyclic = write_catalogue(
        tmp_path / "cyclic",
        {"a": component()},
        [
            overlay("x", {"service": "eks"}, base="y", componentRefs=[{"name": "a"}]),
            overlay("y", {"service": "gke"}, base="x"),
        ],
    )
    with pytest.raises(InputError, match=r"base cycle: x -> y -> x"):
        _resolve(cyclic, service="eks")


def test_dependency_errors_name_the_file_and_the_cycle(tmp_path: Path) -> None:
    root = write_catalogue(
        tmp_path,
        {"a": component(), "b": component(), "c": component()},
        [
            overlay(
                "base", componentRefs=[{"name": "a", "dependsOn": ["b"]}, {"name": "b", "dependsOn": ["a"]}]
            ),
        ],
    )
    with pytest.raises(InputError, match=r"dependency cycle: a -> b -> a"):
        _resolve(root)
    missing = write_catalogue(
        tmp_path / "missing",
        {"a": component(), "c": component()},
        [overlay("base", componentRefs=[{"name": "a", "dependsOn": ["c"]}])],
    )
    with pytest.raises(InputError) as error:
        _resolve(missing)
    assert "overlays/base.yaml:" in str(error.value)
    assert "'c' is not in this recipe" in str(error.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "apiVersion: dsx.dev/v1alpha1\nkind: Recipe\nmetadata: {name: bad\n",
            r"bad\.yaml:\d+: not valid YAML",
        ),
        (
            "apiVersion: dsx.dev/v1alpha1\nkind: Recipe\nmetadata: {name: bad}\nspec:\n  colour: red\n",
            r"bad\.yaml:5: spec\.colour: Extra inputs are not permitted",
        ),
        (
            "apiVersion: dsx.dev/v1alpha1\nkind: Recipe\nmetadata: {name: bad}\nspec:\n"
            "  criteria: {accelerator: h800}\n",
            r"bad\.yaml:5: criteria\.accelerator: unknown value 'h800'; "
            r"allowed: h100, h200, b200, gb200, a100, cpu, any",
        ),
        (
            "apiVersion: dsx.dev/v1alpha1\nkind: Recipe\nmetadata: {name: bad}\nspec:\n"
            "  componentRefs:\n    - name: a\n    - name: nope\n",
            r"bad\.yaml:7: unknown component 'nope'",
        ),
        (
            "apiVersion: dsx.dev/v1alpha1\nkind: Recipe\nmetadata: {name: bad}\nmetadata: {name: again}\n",
            r"bad\.yaml:4: duplicate key 'metadata'",
        ),
        (
            "apiVersion: dsx.dev/v1alpha1\nkind: Recipe\nmetadata: {name: bad}\nspec:\n"
            "  fabric:\n    rankPods: {}\n",
            r"bad\.yaml:6: spec\.fabric\.rankPods: Extra inputs are not permitted",
        ),
    ],
)
def test_bad_overlays_are_reported_with_file_and_line(tmp_path: Path, text: str, expected: str) -> None:
    root = write_catalogue(tmp_path, {"a": component()}, [overlay("base", componentRefs=[{"name": "a"}])])
    (root / "overlays" / "bad.yaml").write_text(text)
    with pytest.raises(InputError, match=expected):
        load_catalogue(root)


def test_unknown_criteria_flags_name_the_flag_and_allowed_values() -> None:
    with pytest.raises(
        InputError,
        match=r"--service: unknown value 'azure'; allowed: eks, gke, aks, oke, bare-metal, local, any",
    ):
        parse_criteria({"service": "azure"})
    with pytest.raises(InputError, match=r"--nodes: expected a positive integer or 'any'"):
        parse_criteria({"nodes": "0"})


def test_scheduling_abstract_overlays_and_disabling(tmp_path: Path) -> None:
    scheduling = {"nodeSelector": ["controller.nodeSelector"], "tolerations": ["controller.tolerations"]}
    root = write_catalogue(
        tmp_path,
        {
            "a": component(nodeScheduling=scheduling),
            "b": component(nodeScheduling=scheduling),
            "gpu": component(),
        },
        [
            overlay(
                "base",
                componentRefs=[
                    {"name": "a"},
                    {"name": "b", "values": {"controller": {"nodeSelector": {"pool": "mine"}}}},
                    {"name": "gpu"},
                ],
                scheduling={"system": {"nodeSelector": {"pool": "system"}}},
            ),
            overlay(
                "fabric",
                abstract=True,
                componentRefs=[{"name": "a", "values": {"rdma": True}}],
                scheduling={"system": {"tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}]}},
            ),
            overlay("metal", {"service": "bare-metal"}, base="fabric"),
            overlay("cpu", {"accelerator": "cpu"}, componentRefs=[{"name": "gpu", "enabled": False}]),
        ],
    )
    plain = _resolve(root)
    assert [o.name for o in plain.appliedOverlays] == ["base"]  # abstract overlays are never selected alone
    assert plain.component("a").values == {"controller": {"nodeSelector": {"pool": "system"}}}
    assert plain.component("b").values["controller"]["nodeSelector"] == {"pool": "mine"}  # explicit wins
    assert plain.provenance["a.values.controller.nodeSelector"] == "base (scheduling.system.nodeSelector)"

    metal = _resolve(root, service="bare-metal", accelerator="cpu")
    assert [o.name for o in metal.appliedOverlays] == ["base", "cpu", "fabric", "metal"]  # base just before
    a = metal.component("a").values
    assert a["rdma"] is True
    assert a["controller"]["tolerations"] == [{"key": "CriticalAddonsOnly", "operator": "Exists"}]
    assert "gpu" not in metal.deploymentOrder
    assert metal.provenance["a.values.controller.tolerations"] == "fabric (scheduling.system.tolerations)"


def test_fabric_merges_like_thresholds_and_records_its_overlays(tmp_path: Path) -> None:
    root = write_catalogue(
        tmp_path,
        {"a": component()},
        [
            overlay(
                "base",
                componentRefs=[{"name": "a"}],
                fabric={"rankPod": {"env": [{"name": "X", "value": "1"}]}, "sources": {"env.X": "doc"}},
            ),
            overlay(
                "eks",
                {"service": "eks"},
                fabric={"rankPod": {"resources": {"vpc.amazonaws.com/efa": "4"}}, "sources": {"r": "doc2"}},
            ),
            overlay("gke", {"service": "gke"}, fabric={"rankPod": None, "sources": None}),
        ],
    )
    eks = _resolve(root, service="eks")
    assert eks.fabric == {
        "rankPod": {"env": [{"name": "X", "value": "1"}], "resources": {"vpc.amazonaws.com/efa": "4"}},
        "sources": {"env.X": "doc", "r": "doc2"},
    }
    assert eks.provenance["fabric.rankPod.env"] == "base"
    assert eks.provenance["fabric.rankPod.resources.vpc.amazonaws.com/efa"] == "eks"
    assert _resolve(root, service="gke").fabric == {}  # null takes an earlier overlay's fabric out
    assert _resolve(root, service="local").digest != eks.digest

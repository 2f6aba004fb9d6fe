"""A real Prometheus (Debian's package) on loopback scrapes ``dsx sentinel agent`` watching a simulated node,
with dsx's rules loaded; a fatal XID injected into that node makes ``DsxNodeTaintedWithoutRemediation`` fire
within its ``for:`` plus two scrape intervals, read back from Prometheus' HTTP API.

The test shortens the alert's ``for:`` and the intervals through configuration (the rules file it loads is
the shipped one with the alert's ``for`` overridden, as ``monitoring.rules.overrides`` does in the chart)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from steps.cluster import connect, load_fleet
from steps.cluster import vocabulary as vocab
from steps.cluster.sim import write_fleet
from tests.monitoring import rules
from tests.paths import REPO, prometheus_binaries

NODE = "node-01"
ALERT = "DsxNodeTaintedWithoutRemediation"
FOR_S = 6.0
SCRAPE_S = 1.0
# The alert fires at most one agent pass, one scrape and one evaluation after the fault, plus its for: the
# evaluation and the agent's pass are kept well under a scrape so the bound holds on a busy machine.
EVALUATE_S = 0.25
AGENT_S = 0.1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _wait(what: str, check: Any, timeout: float, procs: list[subprocess.Popen[str]]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args[0]} exited {proc.returncode} while waiting for {what}")
        try:
            found = check()
        except OSError:
            found = None
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def _overridden_rules(path: Path) -> None:
    data = rules()
    for group in data["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == ALERT:
                rule["for"] = f"{int(FOR_S)}s"
    path.write_text(yaml.safe_dump(data))


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    prometheus, _ = prometheus_binaries()
    fleet = tmp_path / "fleet.json"
    write_fleet(load_fleet("sim:nodes=2,gpu=h100,workloads=false"), fleet)
    agent_port, prom_port = _free_port(), _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workflows.cli",
            "sentinel",
            "agent",
            "--node",
            NODE,
            "--cluster",
            f"state:{fleet}",
            f"--interval={AGENT_S}",
            f"--metrics-port={agent_port}",
            "--node-read-interval=0",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "agent.log").open("w"),
        text=True,
    )
    rules_file = tmp_path / "rules.yaml"
    _overridden_rules(rules_file)
    config = {
        "global": {
            "scrape_interval": f"{int(SCRAPE_S * 1000)}ms",
            "evaluation_interval": f"{int(EVALUATE_S * 1000)}ms",
        },
        "rule_files": [str(rules_file)],
        "scrape_configs": [
            {
                "job_name": "dsx-sentinel",
                "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"], "labels": {"node": NODE}}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    server = subprocess.Popen(
        [
            prometheus,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--log.level=warn",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
        text=True,
    )
    try:
        yield {"fleet": fleet, "api": f"http://127.0.0.1:{prom_port}/api/v1", "procs": [agent, server]}
    finally:
        for proc in (agent, server):
            proc.terminate()
        for proc in (agent, server):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _firing(api: str) -> list[dict[str, Any]]:
    alerts = _get(f"{api}/alerts")["data"]["alerts"]
    return [a for a in alerts if a["labels"]["alertname"] == ALERT and a["state"] == "firing"]


def _query(api: str, expr: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = _get(f"{api}/query?{urllib.parse.urlencode({'query': expr})}")["data"][
        "result"
    ]
    return result


@pytest.mark.story
def test_a_fatal_fault_fires_the_tainted_node_alert_within_for_plus_two_scrapes(
    stack: dict[str, Any],
) -> None:
    api, procs = stack["api"], stack["procs"]
    loaded = _wait("the rules loaded", lambda: _get(f"{api}/rules")["data"]["groups"], 60, procs)
    assert ALERT in {r["name"] for g in loaded for r in g["rules"]}
    # healthy: the agent scraped, its node untainted and in service, the alert inactive
    _wait(
        "the agent scraped",
        lambda: _query(api, 'dsx_sentinel_node_state{job="dsx-sentinel",state="none"} == 1'),
        60,
        procs,
    )
    assert _query(api, "dsx_sentinel_node_tainted == 1") == []
    time.sleep(FOR_S + 2 * SCRAPE_S)  # as long as the alert could take: it must stay silent
    assert _firing(api) == []
    assert _query(api, f'ALERTS{{alertname="{ALERT}"}}') == []

    port = connect(f"state:{stack['fleet']}")
    injected = time.monotonic()
    port.inject(NODE, "xid=79")  # type: ignore[attr-defined]
    firing = _wait(f"{ALERT} firing", lambda: _firing(api), FOR_S + 10 * SCRAPE_S, procs)
    took = time.monotonic() - injected
    assert took <= FOR_S + 2 * SCRAPE_S, (
        f"fired {took:.1f} s after the fault; for {FOR_S:g} s + 2 scrapes of {SCRAPE_S:g} s"
    )
    assert took >= FOR_S  # not before its for:
    (alert,) = firing
    assert alert["labels"]["node"] == NODE and alert["labels"]["severity"] == "warning"
    assert (
        NODE in alert["annotations"]["description"]
        and "`dsx sentinel reconcile" in alert["annotations"]["description"]
    )
    assert port.get_node(NODE).has_taint(vocab.TAINT_UNHEALTHY, vocab.TAINT_UNHEALTHY_EFFECT)

    # a remediation takes the node: the alert resolves once the agent reads its state
    port.set_labels(NODE, {vocab.LABEL_STATE: "quarantined"})
    _wait(f"{ALERT} resolved", lambda: not _firing(api), 10 * SCRAPE_S, procs)

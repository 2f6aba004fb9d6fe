"""The one check path: launch, read rank 0's result, judge, build the outcome, whatever the program."""

from __future__ import annotations

from pathlib import Path

import pytest

from steps.readiness import check
from steps.readiness.judge import verdict
from steps.readiness.launchers.base import RankProgram
from steps.readiness.launchers.local import LocalLauncher
from steps.readiness.models import Model, Subject, Verdict

NODE = Subject(kind="node", name="node-07", members=["node-07"])
ECHO = "tests.steps.readiness.launchers.echo_rank"


class Figure(Model):
    busbw: float


def _judge(result: Figure, evidence: list[str]) -> list[Verdict]:
    status = "pass" if result.busbw >= 10 else "fail"
    return [verdict(NODE, "echo", status, f"busbw {result.busbw}", measured=result.busbw, evidence=evidence)]


def _run(text: str, tmp_path: Path) -> check.CheckOutcome[Figure]:
    program = RankProgram(module=ECHO, args=[text], outputs=[("--out", "figure.json")])
    echo = check.Check("echo", NODE, program, Figure, _judge, timeout_s=60)
    return check.run(echo, LocalLauncher(tmp_path, ranks=2, method="spawn"))


def test_rank_zeros_result_is_read_and_judged_citing_the_file_it_came_in(tmp_path: Path) -> None:
    done = _run('{"busbw": 4.5}', tmp_path)
    assert done.status == "fail" and done.result == Figure(busbw=4.5)
    (judged,) = done.verdicts
    assert judged.measured == 4.5 and judged.evidence == [str(tmp_path / "figure.json")]
    assert done.evidence[0] == str(tmp_path / "figure.json")
    assert done.evidence[1:] == [
        str(tmp_path / "ranks" / f"rank-{r}.{k}") for r in (0, 1) for k in ("stdout", "stderr")
    ]
    assert done.out_dir == str(tmp_path)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("-", "node node-07: rank 0 wrote no readable result"),
        ("busbw=4.5", "node node-07: rank 0's result is not readable: busbw=4.5"),
    ],
)
def test_a_missing_or_unreadable_result_is_an_error_naming_why(text: str, said: str, tmp_path: Path) -> None:
    done = _run(text, tmp_path)
    assert done.status == "error" and done.result is None
    (error,) = done.verdicts
    assert (error.test, error.message) == ("echo", said)
    assert str(tmp_path / "figure.json") not in done.evidence  # only a result that was read is kept

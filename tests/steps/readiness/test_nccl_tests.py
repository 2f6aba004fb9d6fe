"""dsx nccl parse: real nccl-tests logs and every awkward case they contain."""

from __future__ import annotations

import copy
import gc
import pickle
from pathlib import Path

import pytest

from steps.errors import InputError
from steps.readiness.models import CollectiveRun, ResultTable, Row
from steps.readiness.nccl_tests import exit_code, parse_nccl_tests, parse_nccl_tests_file
from steps.readiness.table import format_nccl_table
from tests.cli import dsx as _dsx
from tests.paths import REPO, shared_path

LOGS = Path(__file__).parent / "logs"


def test_a_clean_new_layout_run_is_complete_with_ranks_hosts_rows_and_footer() -> None:
    run = parse_nccl_tests_file(LOGS / "new_layout_clean.txt")
    assert run.status == "complete" and exit_code(run) == 0
    assert run.collective == "all_reduce" and run.layout == "new"
    assert run.nccl_version == "2.21.5+cuda12.4"
    assert run.preamble is not None and run.preamble.max_bytes == 4194304 and run.preamble.iters == 20
    assert run.preamble.warmup_iters == 5 and run.preamble.step_factor == 2
    assert [r.host for r in run.ranks] == ["node-a", "node-b"] and run.hosts == ["node-a", "node-b"]
    assert run.ranks[0].bus_id == "0000:04:00" and run.ranks[0].device_name == "NVIDIA H100 80GB HBM3"
    assert [row.size for row in run.rows] == [1048576, 2097152, 4194304]
    last = run.rows[-1]
    assert last.out_of_place is not None and last.in_place is not None
    assert (last.out_of_place.time_us, last.out_of_place.busbw_gbps, last.in_place.busbw_gbps) == (
        50.0,
        83.89,
        82.24,
    )
    assert last.busbw() == 82.24  # the lower half is the one judged
    assert run.footer is not None and run.footer.out_of_bounds == 0 and run.footer.out_of_bounds_ok
    assert run.footer.avg_busbw_gbps == 67.6733
    assert run.problems == []


def test_the_old_layout_has_no_group_no_root_and_an_error_column() -> None:
    run = parse_nccl_tests_file(LOGS / "old_layout.txt")
    assert run.status == "complete" and run.layout == "old"
    assert [r.rank for r in run.ranks] == [0, 1, 2, 3] and run.ranks[0].group is None
    assert run.ranks[0].bus_id == "0x06" and run.hosts == ["dgx1"]
    assert run.rows[1].root is None and run.rows[1].redop == "sum"
    assert run.rows[1].out_of_place is not None and run.rows[1].out_of_place.max_error == 1e-07
    assert run.preamble is not None and run.preamble.agg_iters is None and run.preamble.n_gpus == 4


@pytest.mark.parametrize("name", ["srun_prefix.txt", "mpirun_prefix.txt"])
def test_launcher_prefixes_and_interleaved_debug_lines_are_ignored(name: str) -> None:
    run = parse_nccl_tests_file(LOGS / name)
    assert run.status == "complete"
    assert [row.size for row in run.rows] == [8, 16]
    assert len(run.hosts) == 2 and run.footer is not None


def test_na_and_e_notation_in_figures_and_wrong_counts() -> None:
    run = parse_nccl_tests_file(LOGS / "na_enotation.txt")
    first, second = run.rows
    assert first.out_of_place is not None and first.out_of_place.busbw_gbps == pytest.approx(0.1024)
    assert first.out_of_place.wrong is None  # N/A: validation off
    assert second.in_place is None  # N/A in every in-place column: no in-place figures at all
    assert run.results.in_place is not None and run.results.in_place.busbw_gbps == [0.09, None]
    assert second.busbw() == 0.17 and first.busbw() == 0.09
    assert second.out_of_place is not None and second.out_of_place.wrong == 0  # 0e+00
    assert run.footer is not None and run.footer.avg_busbw_gbps == pytest.approx(0.12)
    assert run.status == "complete"


def test_a_missing_footer_is_incomplete_never_a_pass() -> None:
    run = parse_nccl_tests_file(LOGS / "missing_footer.txt")
    assert run.status == "incomplete" and exit_code(run) == 1
    assert len(run.rows) == 2 and "no footer" in run.problems[0]


def test_a_test_nccl_failure_is_a_failed_run_with_its_message() -> None:
    run = parse_nccl_tests_file(LOGS / "nccl_failure.txt")
    assert run.status == "failed" and exit_code(run) == 1
    first = run.failures[0]
    assert (first.line, first.host, first.kind, first.where) == (
        10,
        "box1",
        "Test NCCL failure",
        "common.cu:392",
    )
    assert first.message == "remote process exited or there was a network error"
    assert run.failures[1].kind == "Test failure" and run.failures[1].where == "common.cu:590"


def test_wrong_elements_or_a_failed_out_of_bounds_footer_is_corrupted() -> None:
    run = parse_nccl_tests_file(LOGS / "wrong_elements.txt")
    assert run.status == "corrupted" and exit_code(run) == 1
    assert any("line 6: 2 wrong elements at 16B" in p for p in run.problems)
    assert run.footer is not None and run.footer.out_of_bounds_ok is False


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("corrupt_number.txt", "line 6: out-of-place algbw '0.0x' is not a number"),
        ("infinite_wrong.txt", "line 3: out-of-place #wrong 'inf' is not a count"),
        ("empty.txt", "empty input"),
        ("not_a_log.txt", "not an nccl-tests log"),
    ],
)
def test_bad_input_is_a_parse_error_naming_the_line(name: str, message: str) -> None:
    with pytest.raises(InputError, match="^.*" + message.replace("(", r"\(")) as caught:
        parse_nccl_tests_file(LOGS / name)
    assert name in str(caught.value)


_CLEAN = (LOGS / "new_layout_clean.txt").read_text().splitlines()
_GOOD_ROW = _CLEAN[11]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({4: ("52.43", "5x.43")}, "line 16: out-of-place algbw '5x.43' is not a number"),
        ({2: ("   0    21.00", "-1    21.00")}, "line 14: out-of-place #wrong '-1' is not a count"),
        ({3: ("   0\n", "1.5\n")}, "line 15: in-place #wrong '1.5' is not a count"),
        ({1: ("-1 ", "N/A ")}, "line 13: root 'N/A' is not a whole number"),
        ({5: ("-1 ", "-x ")}, "line 17: root '-x' is not a whole number"),
        # the first bad line is named, whatever is wrong with the lines after it
        ({3: ("52.43", "nope"), 4: ("      0", "")}, "line 15: out-of-place algbw 'nope' is not a number"),
        ({3: ("      0", ""), 4: ("52.43", "nope")}, "line 15: a result row needs 13 fields"),
        ({2: ("20.00", "2O.00"), 4: ("49.93", "NaN?")}, "line 14: out-of-place time '2O.00' is not a number"),
    ],
)
def test_the_first_bad_field_of_a_table_is_named_by_its_line(
    bad: dict[int, tuple[str, str]], message: str
) -> None:
    rows = []
    for index in range(1, 6):
        row = _GOOD_ROW + "\n"
        if index in bad:
            old, new = bad[index]
            row = row.replace(old, new, 1)
        rows.append(row.rstrip("\n"))
    lines = [*_CLEAN[:11], _GOOD_ROW, *rows, "# Out of bounds values : 0 OK"]
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        parse_nccl_tests(lines)


def test_rows_of_several_tables_and_layouts_join_one_table() -> None:
    old = (LOGS / "old_layout.txt").read_text().splitlines()
    run = parse_nccl_tests([*_CLEAN[:14], *old[8:14], "# Out of bounds values : 0 OK"])
    table = run.results
    assert table.size == [1048576, 2097152, 4194304, 8, 16, 32] and run.layout == "old"
    assert table.root == [-1, -1, -1, None, None, None]
    assert table.in_place is not None and table.in_place.wrong == [0, 0, 0, None, None, None]
    assert table.out_of_place is not None and table.out_of_place.max_error == [
        None,
        None,
        None,
        0.0,
        1e-07,
        0.0,
    ]
    assert table.line == [12, 13, 14, 18, 19, 20] and run.status == "complete"


@pytest.mark.story
def test_the_cli_exit_codes_gate_ci() -> None:
    clean = _dsx("nccl", "parse", str(LOGS / "new_layout_clean.txt"), "-o", "json")
    assert clean.returncode == 0, clean.stderr
    assert '"status": "complete"' in clean.stdout
    assert _dsx("nccl", "parse", str(LOGS / "nccl_failure.txt")).returncode == 1
    assert _dsx("nccl", "parse", str(LOGS / "missing_footer.txt")).returncode == 1
    bad = _dsx("nccl", "parse", str(LOGS / "corrupt_number.txt"))
    assert bad.returncode == 2 and "line 6" in bad.stderr
    assert _dsx("nccl", "parse", str(LOGS / "not_a_log.txt")).returncode == 2
    piped = _dsx("nccl", "parse", "-", "-o", "yaml", stdin=(LOGS / "old_layout.txt").read_text())
    assert piped.returncode == 0 and "layout: old" in piped.stdout


def test_a_table_written_by_dsx_reads_back_through_the_parser() -> None:
    run = parse_nccl_tests_file(LOGS / "new_layout_clean.txt")
    again = parse_nccl_tests(format_nccl_table(run).splitlines())
    assert [r.size for r in again.rows] == [r.size for r in run.rows]
    assert [r.busbw() for r in again.rows] == [r.busbw() for r in run.rows]
    assert again.hosts == run.hosts and again.status == "complete"


def test_ten_thousand_lines_parse_without_error() -> None:
    lines = (LOGS / "new_layout_clean.txt").read_text().splitlines()
    head, row = lines[:11], lines[11]
    run = parse_nccl_tests([*head, *([row] * 10_000), "# Out of bounds values : 0 OK"])
    assert len(run.rows) == 10_000 and run.status == "complete"


@pytest.mark.parametrize(
    "name", ["new_layout_clean.txt", "old_layout.txt", "na_enotation.txt", "wrong_elements.txt"]
)
def test_the_parsed_columns_are_what_validation_makes_and_rows_read_them(name: str) -> None:
    run = parse_nccl_tests_file(LOGS / name)
    validated = CollectiveRun.model_validate(run.model_dump())
    assert run == validated and repr(run) == repr(validated)
    assert run.model_dump_json() == validated.model_dump_json()
    table = run.results
    assert all(type(v) is int for v in [*table.size, *table.count, *table.line])
    for _, half in table.halves():
        for name_ in ("time_us", "algbw_gbps", "busbw_gbps", "max_error"):
            assert all(v is None or type(v) is float for v in getattr(half, name_))
        assert all(v is None or type(v) is int for v in half.wrong)
    for index, row in enumerate(run.rows):
        assert isinstance(row, Row) and Row.model_validate(row.model_dump()) == row
        assert (row.size, row.line, row.busbw(), row.wrong()) == (
            table.size[index],
            table.line[index],
            table.busbw(index),
            table.wrong(index),
        )
        assert pickle.loads(pickle.dumps(row)) == row and copy.deepcopy(row) == row
        with pytest.raises(ValueError, match="frozen"):
            row.size = 1  # type: ignore[misc]
    assert ResultTable.of(run.rows) == table or name == "na_enotation.txt"  # all-N/A halves become None


def test_a_result_table_refuses_columns_of_different_lengths() -> None:
    with pytest.raises(ValueError, match="column count has 1 items, column size has 2"):
        ResultTable(
            size=[1, 2], count=[1], type=["float"] * 2, redop=[None] * 2, root=[None] * 2, line=[1, 2]
        )
    empty = ResultTable()
    assert len(empty) == 0 and bool(empty) and empty.find(8) is None


def test_the_garbage_collector_is_as_it_was_after_a_parse() -> None:
    lines = (LOGS / "new_layout_clean.txt").read_text().splitlines()
    assert gc.isenabled()
    parse_nccl_tests(lines)
    assert gc.isenabled()
    with pytest.raises(InputError):
        parse_nccl_tests([*lines[:11], "1 2 float sum -1 x", "# Out of bounds values : 0 OK"])
    assert gc.isenabled()
    gc.disable()
    try:
        parse_nccl_tests(lines)
        assert not gc.isenabled()  # paused by the caller, and left so
    finally:
        gc.enable()


SHARED_EXPECTED = {
    # file: (status, rows, ranks, hosts, average busbw in the footer or None)
    "a100_sxm4_40gb_2node_16gpu_oci_oke_rdma_full_sweep.txt": (
        "complete",
        31,
        16,
        ["nccl-allreduce-job0-mpiworker-0", "nccl-allreduce-job0-mpiworker-1"],
        66.4834,
    ),
    "a100_sxm4_80gb_1node_8gpu_gcm_fixture.txt": ("complete", 6, 8, ["{hostname}"], 210.99),
    "gb200_nvl72_single_rack_72gpu_coreweave_excerpt.txt": (
        "complete",
        5,
        1,
        ["slurm-gb200-207-171"],
        745.53,
    ),
    "h100_p5_2node_16gpu_aws_efa_srun_label_prefix_table_only.txt": ("incomplete", 32, 0, [], None),
    "h100_sxm_2node_16gpu_gcp_a3mega_tcpxo_full_sweep.txt": (
        "complete",
        31,
        16,
        ["ztan-mig-235z", "ztan-mig-gq73"],
        70.742,
    ),
    "h200_2node_16gpu_socket_single_nic_degraded_full_sweep.txt": (
        "complete",
        32,
        16,
        ["nvidiatools-dgx-2d-workload", "nvidiatools-dgx-9d-workload"],
        36.2205,
    ),
    "rtx5090_1node_2gpu_crash_test_nccl_failure_unhandled_cuda_error.txt": (
        "failed",
        0,
        2,
        ["GENOA-06"],
        None,
    ),
}


@pytest.mark.shared
@pytest.mark.parametrize("name", sorted(SHARED_EXPECTED))
def test_real_nccl_tests_logs_from_shared(name: str) -> None:
    path = shared_path("fixtures", "nccl-tests", name)
    status, rows, ranks, hosts, average = SHARED_EXPECTED[name]
    run = parse_nccl_tests_file(path)
    assert (run.status, len(run.rows), len(run.ranks), run.hosts) == (status, rows, ranks, hosts)
    assert (run.footer.avg_busbw_gbps if run.footer else None) == average
    if run.footer is not None:
        assert run.footer.out_of_bounds == 0 and run.footer.out_of_bounds_ok
    if status == "failed":
        assert run.failures[0].kind == "Test NCCL failure"
        assert run.failures[0].message.startswith("unhandled cuda error")
    if name.startswith("h100_p5"):
        assert run.rows[-1].size == 17179869184 and run.rows[-1].busbw() == 487.09
    if name.startswith("h200"):
        assert run.nccl_version == "2.27.3+cuda12.9" and run.row_at(1 << 30) is not None


@pytest.mark.shared
def test_the_cli_fails_the_crashed_shared_run() -> None:
    path = shared_path(
        "fixtures", "nccl-tests", "rtx5090_1node_2gpu_crash_test_nccl_failure_unhandled_cuda_error.txt"
    )
    result = _dsx("nccl", "parse", str(path))
    assert result.returncode == 1 and "unhandled cuda error" in result.stderr


# Non-finite figures, cut logs and the README's statuses ------------------------------------------------

_ROW_LAST = _CLEAN[13]  # the 4 MiB row
_FOOTER = _CLEAN.index("# Out of bounds values : 0 OK")


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("83.89   83.89", "83.89   inf", "out-of-place busbw 'inf'"),
        ("51.00   82.24   82.24", "51.00   82.24   nan", "in-place busbw 'nan'"),
        ("50.00", "-inf", "out-of-place time '-inf'"),
        ("82.24   82.24", "Infinity   82.24", "in-place algbw 'Infinity'"),
    ],
)
def test_a_nan_or_inf_figure_makes_the_run_corrupted_and_never_reaches_json(
    tmp_path: Path, old: str, new: str, field: str
) -> None:
    log = tmp_path / "nonfinite.txt"
    log.write_text("\n".join([*_CLEAN[:13], _ROW_LAST.replace(old, new, 1), *_CLEAN[14:]]) + "\n")
    run = parse_nccl_tests_file(log)
    assert run.status == "corrupted" and exit_code(run) == 1
    assert f"line 14: {field} is not a finite number" in run.problems
    result = _dsx("nccl", "parse", str(log), "-o", "json")
    assert result.returncode == 1, result.stderr
    import json

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON output")

    data = json.loads(result.stdout, parse_constant=refuse)  # strict JSON: no NaN, no Infinity
    assert data["status"] == "corrupted"


def test_an_infinite_busbw_never_meets_a_threshold() -> None:
    from steps.readiness.judge import judge_collective
    from steps.readiness.models import Subject
    from steps.readiness.thresholds import load_thresholds

    row = _ROW_LAST.replace("83.89   83.89", "83.89   +inf", 1).replace("82.24   82.24", "82.24   inf", 1)
    run = parse_nccl_tests([*_CLEAN[:13], row, *_CLEAN[14:]])
    limits = load_thresholds({"nccl": {"allReduce": [{"size": "4MiB", "busBwGBps": 1, "scope": "node"}]}})
    verdicts = judge_collective(run, Subject(kind="node", name="node-a"), limits)
    busbw = [v for v in verdicts if v.test == "allreduce-busbw@4MiB"]
    assert [v.status for v in busbw] == ["error"] and busbw[0].measured is None
    assert [v.status for v in verdicts if v.test == "allreduce-data"] == ["error"]


def test_an_average_that_is_not_finite_makes_the_run_corrupted() -> None:
    lines = [line.replace("67.6733", "nan") for line in _CLEAN]
    run = parse_nccl_tests(lines)
    assert run.status == "corrupted" and run.footer is not None and run.footer.avg_busbw_gbps is None


@pytest.mark.story
def test_a_log_cut_anywhere_in_its_last_row_is_incomplete_through_the_cli(tmp_path: Path) -> None:
    text = (LOGS / "new_layout_clean.txt").read_text()
    start = text.index(_ROW_LAST)
    codes: dict[int, str] = {}
    for end in range(start + 1, start + len(_ROW_LAST)):
        log = tmp_path / "cut.txt"
        log.write_text(text[:end])
        result = _dsx("nccl", "parse", str(log), "-o", "json") if end % 16 == 0 else None
        run = parse_nccl_tests_file(log)
        codes[end] = run.status
        if result is not None:
            assert result.returncode == 1, (end, result.stderr)
    assert set(codes.values()) == {"incomplete"}, codes
    run = parse_nccl_tests_file(LOGS / "truncated_row.txt")
    assert run.status == "incomplete" and len(run.rows) == 1
    assert any(p.startswith("line 6: the last result row is cut") for p in run.problems)


def test_a_log_that_stops_before_any_row_is_incomplete_not_bad_input() -> None:
    run = parse_nccl_tests_file(LOGS / "header_no_rows.txt")
    assert run.status == "incomplete" and exit_code(run) == 1 and len(run.rows) == 0
    assert run.problems[0] == "line 3: table header but no result rows after it"
    preamble_only = parse_nccl_tests(_CLEAN[:6])
    assert preamble_only.status == "incomplete" and preamble_only.hosts == ["node-a", "node-b"]


def test_a_cut_row_followed_by_more_of_the_log_is_bad_input() -> None:
    cut = _ROW_LAST[:40]
    for after in (_ROW_LAST, "# Out of bounds values : 0 OK", _CLEAN[9]):
        with pytest.raises(InputError, match="line 14: a result row needs 13 fields"):
            parse_nccl_tests([*_CLEAN[:13], cut, after])


def test_the_readme_states_the_exit_code_of_every_status() -> None:
    from steps.readiness.nccl_tests import EXIT_CODES

    readme = (REPO / "README.md").read_text()
    line = next(row for row in readme.splitlines() if row.startswith("| `dsx nccl parse"))
    assert "exit 0 clean, 1 failed, corrupted or incomplete, 2 not a log" in line
    assert EXIT_CODES == {"complete": 0, "failed": 1, "corrupted": 1, "incomplete": 1}
    for status in ("failed", "corrupted", "incomplete"):
        assert status in line

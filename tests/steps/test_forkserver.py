"""The fork server: children run a module as ``python -m`` would, in the client's session, and die with it."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from steps.forkserver import ForkServer

MODULES = {
    # imported at load time: remembers which process imported it
    "fs_marker": "import os\nLOADED_IN = os.getpid()\n",
    "fs_report": """
        import os, sys
        import fs_marker
        print("out", sys.argv[1:])
        print("err", file=sys.stderr)
        print("preloaded", fs_marker.LOADED_IN != os.getpid())
        print("env", os.environ.get("FS_VALUE"), "FS_SECRET" in os.environ)
        print("cwd", os.getcwd())
        print("stdin", repr(sys.stdin.read()))
        print("group", os.getpgid(0) == os.getpid(), "session", os.getsid(0))
        print("main", __name__)
        sys.exit(3)
    """,
    "fs_sleep": "import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n",
    "fs_raise": "raise RuntimeError('boom from the child')\n",
    "fs_message": "import sys\nsys.exit('a message, not a number')\n",
    # an object whose finalizer, run at exit, appends the pid of the process running it to $FS_FINAL
    "fs_final": """
        import os, weakref
        class Held:
            pass
        def mark():
            with open(os.environ["FS_FINAL"], "a") as out:
                out.write(f"{os.getpid()}\\n")
        HELD = Held()
        weakref.finalize(HELD, mark)
    """,
    "fs_own_final": "import weakref, fs_final\nOWN = fs_final.Held()\nweakref.finalize(OWN, fs_final.mark)\n",
    # a step module whose processes fork children of their own, which import fs_warm
    "fs_host": "FORK_SERVER_PRELOAD = ('fs_warm',)\n",
    "fs_warm": "import os\nLOADED_IN = os.getpid()\n",
    # a step: takes the nested server it was given (once), forks a probe from it, says what it found
    "fs_step": """
        import os, sys
        from steps import forkserver
        from steps.forkserver import ForkServer
        if sys.argv[2:] == ["ignore"]:  # never takes it: ending must stop and reap it
            print("untaken", forkserver._NESTED[0])
            sys.exit(0)
        nested = ForkServer.nested()
        print("nested", nested is not None)
        if nested is not None:
            print("taken once", ForkServer.nested() is None)
            print("server in my group", os.getpgid(nested.process.pid) == os.getpgid(0))
            out, env = sys.argv[1], dict(os.environ)
            probe = nested.start("fs_probe", [], env, out, out + ".err", timeout=30)
            print("probe", probe.wait(30))
            if sys.argv[2:] == ["leave"]:  # a child left running, the server open: ending stops both
                sleeper = nested.start("fs_sleep", [], dict(os.environ), os.devnull, os.devnull, timeout=30)
                print("sleeper", sleeper.pid, flush=True)
                os._exit(0)
            nested.close()
    """,
    "fs_probe": """
        import os, sys
        already = "fs_warm" in sys.modules
        import fs_warm
        print("warm", already, fs_warm.LOADED_IN)
        print("group", os.getpgid(0) == os.getpgid(os.getppid()))
    """,
}


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("modules")
    for name, source in MODULES.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return folder


@pytest.fixture(scope="module")
def server(modules: Path) -> Iterator[ForkServer]:
    env = dict(os.environ, PYTHONPATH=str(modules))
    with ForkServer(env) as started:
        assert started.preload(["fs_marker"], timeout=30) == {}
        yield started


def _env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "FS_SECRET"}
    return {**env, **extra}


def test_a_child_writes_its_files_and_exits_with_its_code(server: ForkServer, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    child = server.start(
        "fs_report",
        ["a", "b"],
        _env(FS_VALUE="42"),
        tmp_path / "out.txt",
        tmp_path / "err.txt",
        cwd=work,
    )
    assert child.wait(10) == 3
    out = (tmp_path / "out.txt").read_text().splitlines()
    assert out == [
        "out ['a', 'b']",
        "preloaded True",
        "env 42 False",
        f"cwd {work}",
        "stdin ''",
        f"group True session {os.getsid(0)}",  # leads its own group, in the client's session
        "main __main__",
    ]
    assert (tmp_path / "err.txt").read_text() == "err\n"
    assert child.ended_at is not None and child.ended_at <= time.monotonic()


def test_a_child_killed_by_a_signal_reports_it_negative(server: ForkServer, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    child = server.start("fs_sleep", [], _env(), out, tmp_path / "err.txt")
    deadline = time.monotonic() + 10
    while not (out.exists() and "sleeping" in out.read_text()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert child.wait(0) is None
    os.killpg(child.pid, signal.SIGTERM)  # its own process group
    assert child.wait(10) == -signal.SIGTERM


def test_exceptions_and_exit_messages_go_to_stderr_with_code_1(server: ForkServer, tmp_path: Path) -> None:
    raised = server.start("fs_raise", [], _env(), tmp_path / "out.txt", tmp_path / "err.txt")
    assert raised.wait(10) == 1
    err = (tmp_path / "err.txt").read_text()
    assert "Traceback" in err and "RuntimeError: boom from the child" in err
    message = server.start("fs_message", [], _env(), tmp_path / "out.txt", tmp_path / "err2.txt")
    assert message.wait(10) == 1
    assert (tmp_path / "err2.txt").read_text() == "a message, not a number\n"


def test_sys_path_entries_come_first_and_failures_are_named(server: ForkServer, tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "fs_extra.py").write_text("import sys\nprint(sys.path[0])\n")
    child = server.start(
        "fs_extra", [], _env(), tmp_path / "out.txt", tmp_path / "err.txt", sys_path=[str(extra)]
    )
    assert child.wait(10) == 0
    assert (tmp_path / "out.txt").read_text() == f"{extra}\n"
    assert server.preload(["fs_no_such_module"], timeout=30) == {
        "fs_no_such_module": "ModuleNotFoundError: No module named 'fs_no_such_module'"
    }
    missing = server.start("fs_extra", [], _env(), tmp_path / "out.txt", tmp_path / "err.txt")
    assert missing.wait(10) == 1  # not on this child's sys.path
    assert "No module named fs_extra" in (tmp_path / "err.txt").read_text()


def test_the_servers_finalizers_never_run_at_a_childs_exit_the_childs_own_do(
    server: ForkServer, tmp_path: Path
) -> None:
    assert server.preload(["fs_final"], timeout=30) == {}
    marks = tmp_path / "finalized.txt"
    child = server.start(
        "fs_own_final", [], _env(FS_FINAL=str(marks)), tmp_path / "out.txt", tmp_path / "err.txt"
    )
    assert child.wait(10) == 0, (tmp_path / "err.txt").read_text()
    assert marks.read_text().splitlines() == [str(child.pid)]  # the child's object only, once


def test_end_of_stdin_kills_the_children_and_stops_the_server(modules: Path, tmp_path: Path) -> None:
    server = ForkServer(dict(os.environ, PYTHONPATH=str(modules)))
    children = [
        server.start("fs_sleep", [], _env(), tmp_path / f"out-{i}.txt", tmp_path / f"err-{i}.txt")
        for i in range(2)
    ]
    assert all(child.wait(0) is None for child in children)
    server.close(timeout=10)
    assert server.process.returncode == 0
    assert [child.wait(10) for child in children] == [-signal.SIGKILL, -signal.SIGKILL]
    for child in children:
        with pytest.raises(ProcessLookupError):
            os.kill(child.pid, 0)
    assert not server.alive
    with pytest.raises(OSError, match="fork server is gone"):
        server.start("fs_sleep", [], _env(), tmp_path / "out.txt", tmp_path / "err.txt")


def _wait_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_without_own_groups_every_child_stays_in_the_clients_process_group(
    modules: Path, tmp_path: Path
) -> None:
    with ForkServer(dict(os.environ, PYTHONPATH=str(modules)), own_groups=False) as server:
        child = server.start("fs_sleep", [], _env(), tmp_path / "out.txt", tmp_path / "err.txt")
        assert child.wait(0) is None
        assert os.getpgid(server.process.pid) == os.getpgrp()
        assert os.getpgid(child.pid) == os.getpgrp()  # killing the caller's group reaches it
        assert os.getsid(child.pid) == os.getsid(0)


def test_sigint_is_ignored_and_sigterm_kills_the_children_first(modules: Path, tmp_path: Path) -> None:
    server = ForkServer(dict(os.environ, PYTHONPATH=str(modules)))
    out = tmp_path / "out.txt"
    child = server.start("fs_sleep", [], _env(), out, tmp_path / "err.txt")
    deadline = time.monotonic() + 10
    while "sleeping" not in (out.read_text() if out.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(server.process.pid, signal.SIGINT)  # a terminal's Ctrl-C is the client's to handle
    assert child.wait(0.5) is None and server.alive
    os.kill(server.process.pid, signal.SIGTERM)
    assert child.wait(10) == -signal.SIGKILL
    assert server.process.wait(10) == 0
    assert _wait_gone(child.pid)


def test_a_step_of_a_module_naming_fork_server_preload_gets_a_warm_nested_server(
    server: ForkServer, tmp_path: Path
) -> None:
    """The module's named imports are done once, by the server, and the step's own children fork from a
    server that has them: in the step's group, given once, gone with the step."""
    assert server.preload(["fs_host"], timeout=30) == {}
    probe = tmp_path / "probe.txt"
    step = server.start(
        "fs_step", [str(probe)], _env(), tmp_path / "out.txt", tmp_path / "err.txt", nest_for="fs_host"
    )
    assert step.wait(30) == 0, (tmp_path / "err.txt").read_text()
    assert (tmp_path / "out.txt").read_text().splitlines() == [
        "nested True",
        "taken once True",
        "server in my group True",
        "probe 0",
    ]
    # imported before the probe started, by the server that forked the step, not by anyone after it
    assert probe.read_text().splitlines() == [f"warm True {server.process.pid}", "group True"]


def test_a_step_of_any_other_module_gets_no_nested_server(server: ForkServer, tmp_path: Path) -> None:
    for nest_for in (None, "fs_marker", "fs_not_imported"):
        out = tmp_path / f"out-{nest_for}.txt"
        step = server.start("fs_step", ["-"], _env(), out, tmp_path / "err.txt", nest_for=nest_for)
        assert step.wait(30) == 0
        assert out.read_text() == "nested False\n"


def test_a_step_that_ends_without_closing_its_nested_server_leaves_nothing_running(
    server: ForkServer, tmp_path: Path
) -> None:
    assert server.preload(["fs_host"], timeout=30) == {}
    out = tmp_path / "out.txt"
    step = server.start(
        "fs_step",
        [str(tmp_path / "probe.txt"), "leave"],
        _env(),
        out,
        tmp_path / "err.txt",
        nest_for="fs_host",
    )
    assert step.wait(30) == 0
    sleeper = int(out.read_text().split("sleeper ")[1].split()[0])
    assert _wait_gone(sleeper)  # the nested server saw its input close and killed it


def test_a_nested_server_the_step_never_took_is_stopped_and_reaped_when_the_step_ends(
    server: ForkServer, tmp_path: Path
) -> None:
    assert server.preload(["fs_host"], timeout=30) == {}
    out = tmp_path / "out.txt"
    step = server.start("fs_step", ["-", "ignore"], _env(), out, tmp_path / "err.txt", nest_for="fs_host")
    assert step.wait(30) == 0, (tmp_path / "err.txt").read_text()
    nested = int(out.read_text().split()[1])
    with pytest.raises(ProcessLookupError):  # not even a zombie: the step waited for it
        os.kill(nested, 0)

"""A warm process that imports modules once and forks children that run a module as ``python -m`` would.

Starting a Python program that imports torch or Hera costs seconds, paid again by every process. A fork
server pays it once: it imports what its client asks for, then forks a child per request. Each child
reads stdin from ``/dev/null``, writes stdout and stderr to the files named, takes the environment,
working directory and extra ``sys.path`` entries it is given, and runs the module as ``__main__``
through :mod:`runpy`; the finalizers of the server's objects do not run at its exit (a fresh
interpreter has none). The server imports nothing heavy itself, never touches CUDA, and, unlike
:mod:`multiprocessing`'s forkserver, never re-imports the client's ``__main__``: the same program
works under a console script, ``python -c`` or a test runner.

Nothing leaves the client's session, so whatever stops the client's processes reaches every child.
Where the children go depends on ``own_groups``:

- ``True`` (the local runner's steps): the server takes a process group of its own and each child
  leads a new one, so that killing a step's group kills everything the step started (its ranks too),
  and a Ctrl-C at the terminal reaches only the client, which stops its steps itself.
- ``False`` (the ranks of one test): the server and its children stay in the client's process group,
  so killing the group of the step that launched the ranks kills every rank with it.

The server ignores SIGINT (its children take Python's default back) and answers SIGTERM as it answers
the end of its stdin: it kills every child still running, then exits.

The server speaks JSON lines, requests on its stdin and answers on its stdout:

- ``{"op": "preload", "modules": [...], "id": N}``: import the modules. An import that fails is
  skipped (a child that needs the module reports the error in its own stderr); with an ``id``
  (optional) the server answers ``{"id": N, "errors": {module: message}}`` once done. What a module
  names in ``FORK_SERVER_PRELOAD`` (below) is imported later, before the first child that gets a
  nested server is forked: a run whose steps launch no ranks never pays for it, and no step that needs
  none waits for it (the server forks nothing while it imports, and torch takes seconds).
- ``{"op": "start", "id": N, "module": M, "args": [...], "env": {...}, "stdout": PATH, "stderr":
  PATH, "cwd": PATH, "sys_path": [...], "own_group": B, "nest_for": MODULE}`` (all from ``cwd`` on
  optional; ``own_group`` true by default: the child leads a new process group): fork a child. The
  answer is ``{"id": N, "pid": P}``, or ``{"id": N, "error": message}`` when no child could be forked.
- When a child ends: ``{"pid": P, "code": C, "time": T}``; ``C`` is the exit status, negative when a
  signal killed it, and ``T`` the server's :func:`time.monotonic` (the same clock as the client's).

At the end of its stdin, or on SIGTERM, the server kills every child still running and exits.
:class:`ForkServer` is the client's side: it starts the server, preloads, starts children and waits for
them.

**Nested servers.** A child that forks children of its own (a local runner's step that launches the
ranks of a test) would start a server of its own and pay the imports again. A module whose code does
that names what its children import, ``FORK_SERVER_PRELOAD = ("torch", ...)``, with what its own
functions import only when called (a report's plotting library); a server preloading the module imports
those as well (before the first child that nests, see ``preload``). A start request
whose ``nest_for`` names such a module gives the child a nested server: forked from the child before
its module runs (the child has one thread then, and everything the server imported), in the child's
process group, its own child, and gone when the child's end of its pipes closes. The child takes it
with :meth:`ForkServer.nested`.

Example:
    >>> with ForkServer() as server:  # doctest: +SKIP
    ...     failed = server.preload(["json"])
    ...     child = server.start("json.tool", ["in.json"], dict(os.environ), "out.txt", "err.txt")
    ...     child.wait(timeout=10)
    0
"""

from __future__ import annotations

import atexit
import contextlib
import io
import itertools
import json
import os
import runpy
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["ForkServer", "ForkedChild", "main"]

_SERVER = "from steps.forkserver import main; main()"


# -- the server -------------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _stdio(fd: int, mode: str, env: Mapping[str, str]) -> io.TextIOWrapper:
    """A text stream on ``fd`` as a new interpreter would make one under ``env``."""
    encoding, _, errors = (env.get("PYTHONIOENCODING") or "").partition(":")
    unbuffered = bool(env.get("PYTHONUNBUFFERED")) and mode == "w"
    raw = io.FileIO(fd, mode, closefd=False)
    stream: IO[bytes] = (
        raw if unbuffered else (io.BufferedWriter(raw) if mode == "w" else io.BufferedReader(raw))
    )
    return io.TextIOWrapper(
        stream,
        encoding=encoding or "utf-8",
        errors=errors or "backslashreplace",
        line_buffering=fd == 2 and not unbuffered,
        write_through=unbuffered,
    )


def _redirect(stdout: str, stderr: str) -> None:
    """Point fds 0, 1 and 2 at ``/dev/null``, ``stdout`` and ``stderr`` (one file when both are the same)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    same = os.path.abspath(stderr) == os.path.abspath(stdout)
    targets = [(0, os.devnull, os.O_RDONLY), (1, stdout, flags)] + ([] if same else [(2, stderr, flags)])
    for fd, path, mode in targets:
        opened = os.open(path, mode, 0o644)
        if opened != fd:
            os.dup2(opened, fd)
            os.close(opened)
    if same:
        os.dup2(1, 2)


def _run_module(module: str, args: Sequence[str]) -> int:
    """Run ``module`` as ``__main__`` with ``sys.argv`` set as ``python -m module args`` would; its code.

    The exit code follows Python's: 0 when the module returns or raises ``SystemExit(None)``, the
    number of ``SystemExit(n)``, 1 (with the message on stderr) for any other ``SystemExit`` and, with
    the traceback on stderr, for an uncaught exception. On ``KeyboardInterrupt`` the process kills
    itself with SIGINT after printing the traceback, as Python does. Non-daemon threads are joined and
    :mod:`atexit` handlers run before the code is returned.

    Args:
        module: the module to run, e.g. ``hera.workflows.runner``.
        args: its command-line arguments (``sys.argv[1:]``).
    """
    sys.argv = [module, *args]
    code = 1
    interrupted = False
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        traceback.print_exc()
    try:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 128 + int(signal.SIGINT)
    return code


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    with contextlib.suppress(Exception):
        print(exc.code, file=sys.stderr)
    return 1


def _child(request: Mapping[str, Any], server_fds: Iterable[int]) -> None:  # pragma: no cover - forked
    """Become the child ``request`` asks for and run its module; never returns."""
    code = 1
    redirected = False
    try:
        if request.get("own_group", True):
            os.setpgid(0, 0)  # a new group in the same session: the client kills it whole
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a new interpreter starts
        for fd in server_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        env = {str(key): str(value) for key, value in dict(request.get("env") or {}).items()}
        _redirect(str(request["stdout"]), str(request["stderr"]))
        redirected = True
        for fd, name in enumerate(("stdin", "stdout", "stderr")):
            stream = _stdio(fd, "r" if fd == 0 else "w", env)
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)  # as in a new interpreter, the same objects
        os.environ.clear()
        os.environ.update(env)
        if request.get("cwd"):
            os.chdir(str(request["cwd"]))
        if sys.path and sys.path[0] == "":
            sys.path[0] = os.getcwd()  # python -m puts the working directory first
        for entry in reversed([str(path) for path in request.get("sys_path") or []]):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        _forget_inherited_finalizers()
        if _nests(request.get("nest_for")):
            _fork_nested()
        code = _run_module(str(request["module"]), [str(arg) for arg in request.get("args") or []])
    except BaseException:
        with contextlib.suppress(BaseException):
            if redirected:
                traceback.print_exc()
                sys.stderr.flush()
            else:
                with open(str(request["stderr"]), "a", encoding="utf-8") as err:
                    traceback.print_exc(file=err)
    finally:
        with contextlib.suppress(BaseException):
            _end_nested()
        os._exit(code)


def _forget_inherited_finalizers() -> None:
    """Keep the :class:`weakref.finalize` callbacks of the server's objects from running at this child's exit.

    The objects are the server's: what their finalizers free or delete (a temporary folder, a registry
    entry) is the server's business, and a fresh ``python -m`` would have none to run. torch registers
    one per operator library it loads; running them took about 65 ms of every child's exit. The child's
    own finalizers still run. The registry is private to :mod:`weakref` (the only handle on the live
    finalizers); ``atexit`` is their public switch.
    """
    for finalizer in list(getattr(weakref.finalize, "_registry", {})):
        finalizer.atexit = False


_NESTED: tuple[int, int, int] | None = None
"""In a child given a nested server: its pid, the write end of its requests, the read end of its answers."""


def _nests(module: object) -> bool:
    """Whether ``module`` is imported here and names modules for the servers of its processes."""
    return isinstance(module, str) and bool(getattr(sys.modules.get(module), "FORK_SERVER_PRELOAD", None))


def _fork_nested() -> None:  # pragma: no cover - runs in a forked child
    """Fork a server from this (single-threaded) child, serving on two new pipes; see :data:`_NESTED`."""
    global _NESTED
    requests_read, requests_write = os.pipe()
    answers_read, answers_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(requests_write)
            os.close(answers_read)
            os.dup2(requests_read, 0)
            os.dup2(answers_write, 1)
            os.close(requests_read)
            os.close(answers_write)
            _Server().serve()
        finally:
            os._exit(0)
    os.close(requests_read)
    os.close(answers_write)
    _NESTED = (pid, requests_write, answers_read)


def _end_nested(grace_s: float = 5.0) -> None:  # pragma: no cover - runs in a forked child
    """Stop the nested server the child never took: close its input, wait (killing it past ``grace_s``)."""
    global _NESTED
    if _NESTED is None:
        return
    pid, requests, answers = _NESTED
    _NESTED = None
    os.close(requests)
    os.close(answers)
    server = _OwnChild(pid)
    try:
        server.wait(grace_s)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _preload(
    modules: Iterable[str], seen: set[str] | None = None, deferred: list[str] | None = None
) -> dict[str, str]:
    """Import ``modules`` with warnings silenced; the message of each import that failed.

    What an imported module names in ``FORK_SERVER_PRELOAD`` is imported too, or, given ``deferred``,
    added to it for later.
    """
    import importlib
    import warnings

    seen = set() if seen is None else seen
    errors: dict[str, str] = {}
    for module in modules:
        if module in seen:
            continue
        seen.add(module)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                imported = importlib.import_module(module)
        except Exception as exc:
            errors[module] = f"{type(exc).__name__}: {exc}".strip()
            continue
        named = [str(name) for name in getattr(imported, "FORK_SERVER_PRELOAD", None) or ()]
        if deferred is None:
            errors.update(_preload(named, seen))
        else:
            deferred.extend(name for name in named if name not in deferred and name not in seen)
    return errors


class _Server:
    """The server's state: its channels, its children and the loop that serves requests."""

    def __init__(self) -> None:
        self.requests = 0
        self.answers = os.dup(1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # what preloaded modules print must not reach the answers
        os.close(devnull)
        self.wake_read, self.wake_write = os.pipe()
        for fd in (self.wake_read, self.wake_write):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_write)  # each signal writes its number there
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: None)  # seen through the wakeup fd: stop
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the client's to handle
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.requests, selectors.EVENT_READ, "requests")
        self.selector.register(self.wake_read, selectors.EVENT_READ, "children")
        self.children: set[int] = set()
        self.deferred: list[str] = []
        """Modules named in ``FORK_SERVER_PRELOAD``, imported before the first child that gets a nested
        server is forked: the steps that need no torch do not wait for it."""

    def send(self, message: Mapping[str, Any]) -> None:
        with contextlib.suppress(OSError):
            _write_all(self.answers, json.dumps(message).encode() + b"\n")

    def reap(self, block: bool = False) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            self.children.discard(pid)
            self.send({"pid": pid, "code": os.waitstatus_to_exitcode(status), "time": time.monotonic()})

    def handle(self, line: bytes) -> None:
        request: dict[str, Any] = {}
        try:
            request = json.loads(line)
            if request.get("op") == "preload":
                modules = [str(module) for module in request.get("modules") or []]
                errors = _preload(modules, deferred=self.deferred)
                if request.get("id") is not None:
                    self.send({"id": request["id"], "errors": errors})
                return
            if request.get("op", "start") != "start":
                raise ValueError(f"unknown op {request.get('op')!r}")
            for key in ("id", "module", "stdout", "stderr"):
                if key not in request:
                    raise ValueError(f"a start request needs {key!r}")
            if _nests(request.get("nest_for")):
                while self.deferred:
                    _preload([self.deferred.pop(0)])  # a failure is the child's to report, as it imports
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                fds = [self.answers, self.wake_read, self.wake_write, self.selector.fileno()]
                _child(request, fds)
            if request.get("own_group", True):
                # The child does the same; done here too, its group exists before anyone hears its pid.
                with contextlib.suppress(OSError):
                    os.setpgid(pid, pid)
            self.children.add(pid)
            self.send({"id": request["id"], "pid": pid})
        except Exception as exc:
            ident = request.get("id") if isinstance(request, dict) else None
            self.send({"id": ident, "error": f"{type(exc).__name__}: {exc}"})

    def serve(self) -> None:
        pending = b""
        while True:
            ready = self.selector.select()
            for key, _ in ready:
                if key.data == "children":
                    received = b""
                    with contextlib.suppress(BlockingIOError):
                        while chunk := os.read(self.wake_read, 512):
                            received += chunk
                    if int(signal.SIGTERM) in received:
                        self.stop()
                        return
                    self.reap()
                    continue
                chunk = os.read(self.requests, 1 << 16)
                if not chunk:
                    self.stop()
                    return
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip():
                        self.handle(line)
            self.reap()

    def stop(self) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pid:  # it leads its own group: everything it started goes too
                    os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.reap(block=True)


def main() -> None:  # pragma: no cover - runs as the server process
    """Serve requests from stdin until it closes, then kill the children still running and exit."""
    _Server().serve()


# -- the client -------------------------------------------------------------------------------------


class ForkedChild:
    """A child the server forked: its pid, and its exit once the server reports it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._ended = threading.Event()
        self._code: int | None = None
        self._time: float | None = None

    def _end(self, code: int, when: float) -> None:
        self._code, self._time = code, when
        self._ended.set()

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code (negative: killed by that signal), or None if it still runs after ``timeout``."""
        return self._code if self._ended.wait(timeout) else None

    @property
    def returncode(self) -> int | None:
        """The exit code once the child has ended, else None."""
        return self._code

    @property
    def ended_at(self) -> float | None:
        """When the child ended, on the :func:`time.monotonic` clock (None while it runs)."""
        return self._time


class _OwnChild:
    """A child of this process known by its pid (a nested server): polled, waited for and killed as a
    :class:`subprocess.Popen` is."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: gone, how is unknown
                    self.returncode = -int(signal.SIGKILL)
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        return code

    def kill(self) -> None:
        with self._lock:
            if self.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)


class ForkServer:
    """The client's side: starts a server process and talks to it; safe to use from many threads.

    If the server dies, every child not yet reported is taken as killed by SIGKILL and every later
    request raises :class:`OSError`.

    Args:
        env: the server's environment (default: this process's). The directory holding the ``steps``
            package is put first on its ``PYTHONPATH`` so that the server can import itself; the
            server's ``sys.path`` is the one every child starts from.
        stderr: where the server's own stderr goes (a file, ``subprocess.DEVNULL``, or None to
            inherit).
        own_groups: put the server in a process group of its own and each child at the head of a
            new one (True), or keep the server and every child in this process's group (False).
            Either way they stay in this process's session.
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        stderr: int | IO[Any] | None = subprocess.DEVNULL,
        *,
        own_groups: bool = True,
    ) -> None:
        server_env = dict(os.environ if env is None else env)
        root = str(Path(__file__).resolve().parent.parent)
        paths = [p for p in server_env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
        server_env["PYTHONPATH"] = os.pathsep.join([root, *paths])
        process = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=server_env,
            process_group=0 if own_groups else None,
        )
        assert process.stdin is not None and process.stdout is not None
        self._attach(process, process.stdin, process.stdout, own_groups)

    @classmethod
    def nested(cls, *, own_groups: bool = False) -> ForkServer | None:
        """The nested server the server that forked this process gave it (see the module's text), once;
        None when there is none or it was taken already.

        Args:
            own_groups: as for a new server; the nested server itself is in this process's group either way.
        """
        global _NESTED
        if _NESTED is None:
            return None
        pid, requests, answers = _NESTED
        _NESTED = None
        server = cls.__new__(cls)
        server._attach(_OwnChild(pid), os.fdopen(requests, "wb"), os.fdopen(answers, "rb"), own_groups)
        return server

    def _attach(
        self,
        process: subprocess.Popen[bytes] | _OwnChild,
        requests: IO[bytes],
        answers: IO[bytes],
        own_groups: bool,
    ) -> None:
        self.process = process
        self.own_groups = own_groups
        self._in: IO[bytes] = requests
        self._out: IO[bytes] = answers
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._dead = False
        self._answers: dict[int, tuple[threading.Event, list[tuple[dict[str, Any], ForkedChild | None]]]] = {}
        self._children: dict[int, ForkedChild] = {}
        threading.Thread(target=self._read, name="dsx-forkserver", daemon=True).start()

    @property
    def alive(self) -> bool:
        """The server process is running and answering."""
        return not self._dead and self.process.poll() is None

    def _read(self) -> None:
        for line in self._out:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                if "id" in message:
                    waiting = self._answers.pop(message["id"], None)
                    child = None
                    if "pid" in message:
                        child = self._children[message["pid"]] = ForkedChild(int(message["pid"]))
                    if waiting is not None:
                        waiting[1].append((message, child))
                        waiting[0].set()
                elif "pid" in message:
                    child = self._children.pop(message["pid"], None)
                    if child is not None:
                        child._end(int(message["code"]), float(message["time"]))
        with self._lock:  # the server is gone: nothing more will start or end
            self._dead = True
            for event, _ in self._answers.values():
                event.set()
            self._answers.clear()
            now = time.monotonic()
            for child in self._children.values():
                child._end(-int(signal.SIGKILL), now)
            self._children.clear()

    def _ask(
        self, message: dict[str, Any], timeout: float | None
    ) -> tuple[dict[str, Any], ForkedChild | None]:
        event, box = threading.Event(), list[tuple[dict[str, Any], ForkedChild | None]]()
        with self._lock:
            if self._dead:
                raise OSError("the fork server is gone")
            ident = next(self._ids)
            self._answers[ident] = (event, box)
        try:
            self._send({**message, "id": ident})
        except OSError as exc:
            with self._lock:
                self._answers.pop(ident, None)
            raise OSError(f"the fork server is gone ({exc})") from exc
        if not event.wait(timeout):
            with self._lock:
                self._answers.pop(ident, None)
            raise TimeoutError(f"the fork server did not answer within {timeout:g} s")
        if not box:
            raise OSError("the fork server stopped before answering")
        return box[0]

    def _send(self, message: Mapping[str, Any]) -> None:
        """Raises OSError when the server's input is gone, closed by :meth:`close` included (which
        may come between the liveness check and the write: the pipe then says ValueError)."""
        with self._send_lock:
            try:
                self._in.write(json.dumps(message).encode() + b"\n")
                self._in.flush()
            except ValueError as exc:  # "write to closed file"
                raise OSError(f"its input is closed: {exc}") from exc

    def preload(
        self, modules: Iterable[str], wait: bool = True, timeout: float | None = None
    ) -> dict[str, str]:
        """Have the server import ``modules`` (in order) so that every child has them already.

        Args:
            modules: module names, e.g. ``["torch", "torch.distributed"]``.
            wait: wait until the server has imported them; otherwise return at once.
            timeout: how long to wait, in seconds (None: as long as it takes).

        Returns:
            The message of each import that failed (empty when all worked or when not waiting).

        Raises:
            OSError: the server is gone; :class:`TimeoutError` when it did not answer in time.
        """
        request = {"op": "preload", "modules": list(modules)}
        if wait:
            return dict(self._ask(request, timeout)[0].get("errors") or {})
        try:
            self._send(request)
        except OSError as exc:
            raise OSError(f"the fork server is gone ({exc})") from exc
        return {}

    def start(
        self,
        module: str,
        args: Sequence[str],
        env: Mapping[str, str],
        stdout: str | os.PathLike[str],
        stderr: str | os.PathLike[str],
        cwd: str | os.PathLike[str] | None = None,
        sys_path: Sequence[str] = (),
        timeout: float | None = None,
        nest_for: str | None = None,
    ) -> ForkedChild:
        """Fork a child running ``python -m module args`` and return once it is started.

        Args:
            module: the module the child runs as ``__main__``.
            args: its arguments.
            env: the child's whole environment.
            stdout: file for its stdout (created or truncated).
            stderr: file for its stderr (created or truncated).
            cwd: its working directory (default: the server's).
            sys_path: entries put first on its ``sys.path``, in order, unless already there.
            timeout: how long to wait for the server to fork it, in seconds.
            nest_for: the module whose code the child runs: when the server imported it and it names
                ``FORK_SERVER_PRELOAD``, the child gets a nested server (:meth:`nested`).

        Raises:
            OSError: the server is gone or could not fork; :class:`TimeoutError` when it did not
                answer in time.
        """
        answer, child = self._ask(
            {
                "op": "start",
                "module": module,
                "args": list(args),
                "env": dict(env),
                "stdout": os.fspath(stdout),
                "stderr": os.fspath(stderr),
                "cwd": os.fspath(cwd) if cwd is not None else None,
                "sys_path": list(sys_path),
                "own_group": self.own_groups,
                "nest_for": nest_for,
            },
            timeout,
        )
        if child is None:
            raise OSError(f"the fork server could not start {module}: {answer.get('error')}")
        return child

    def close(self, timeout: float = 10.0) -> None:
        """Close the server's stdin (it kills its children and exits) and wait; kill it past ``timeout``."""
        try:
            self._in.close()
            self.process.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

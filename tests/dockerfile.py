"""A small reader of the repository's Dockerfile, for tests that tie the images to what runs in them.

No image can be built or pulled where the tests run, so the tests read the build instead: the stages
(``FROM ... AS``), the global and stage ``ARG`` defaults, and per stage what it ends up with: its ``PATH``
(``ENV PATH``), its user (``USER``), the stages it takes files from (``FROM`` a stage, ``COPY --from``,
``RUN --mount=...,from=``), the executables its build proves (a ``RUN`` runs them by absolute path or tests
them with ``test -x``), followed through ``COPY --from`` of their folders, and the interpreters the dsx
wheel is pip-installed into. What a base image brings is not in the file: callers pass a table of it.

Only what the project's Dockerfile uses is understood (line continuations, comments, shell-form ``RUN``,
``ENV K=V``); anything else is kept as text.
"""

import json
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatch

__all__ = [
    "Build",
    "Dockerfile",
    "Instruction",
    "Stage",
    "copy_operands",
    "expand",
    "parse",
    "simple_commands",
]

_VARIABLE = re.compile(r"\$\{(?P<braced>\w+)(?::?-(?P<default>[^}]*))?\}|\$(?P<bare>\w+)")
_FLAG = re.compile(r"^--(?P<name>[\w-]+)(?:=(?P<value>\S*))?\s+")
_ASSIGNMENT = re.compile(r"^\w+=")
_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", ";;"}
_KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}"}


@dataclass(frozen=True)
class Instruction:
    """One logical instruction: keyword, leading ``--flags`` (name, value) and the rest, as written."""

    keyword: str
    flags: tuple[tuple[str, str], ...]
    value: str
    line: int

    def flag(self, name: str) -> list[str]:
        """Values of every ``--name=value`` flag of this instruction."""
        return [v for n, v in self.flags if n == name]


@dataclass(frozen=True)
class Stage:
    """A build stage: its expanded ``FROM`` and its instructions."""

    name: str
    base: str
    line: int
    instructions: tuple[Instruction, ...]


@dataclass
class Build:
    """What a stage ends up with, as far as the Dockerfile says.

    Attributes:
        image: the external image at the root of the stage's ``FROM`` chain.
        path: the folders of ``PATH``, in order.
        user: the last ``USER`` along the chain, None when the base's own.
        files: executables the build proves, as absolute paths in this stage's file system.
        dsx_pythons: interpreters the dsx wheel was installed into (absolute paths).
        sources: names of the stages this one takes files from, directly or not.
        runs: every ``RUN`` command along the ``FROM`` chain, as (stage name, shell text).
    """

    image: str
    path: list[str]
    user: str | None = None
    files: set[str] = field(default_factory=set)
    dsx_pythons: set[str] = field(default_factory=set)
    sources: set[str] = field(default_factory=set)
    runs: list[tuple[str, str]] = field(default_factory=list)

    def copy(self) -> "Build":
        return Build(
            self.image,
            list(self.path),
            self.user,
            set(self.files),
            set(self.dsx_pythons),
            set(self.sources),
            list(self.runs),
        )


def expand(text: str, env: Mapping[str, str]) -> str:
    """``${NAME}``, ``${NAME:-default}`` and ``$NAME`` replaced from ``env`` (unknown names: empty)."""

    def value(match: re.Match[str]) -> str:
        name = match["braced"] or match["bare"]
        if name in env:
            return env[name]
        return match["default"] or ""

    return _VARIABLE.sub(value, text)


def simple_commands(script: str) -> list[list[str]]:
    """The simple commands of a shell script, as word lists without leading keywords or assignments.

    ``a && b; if [ x ]; then c; fi`` gives ``[a], [b], [[, x, ]], [c]``; ``for`` loops are left out (their
    word list is data, not a command).
    """
    lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    commands: list[list[str]] = []
    current: list[str] = []
    for token in lexer:
        if token in _SEPARATORS:
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    result = []
    for words in commands:
        while words and (words[0] in _KEYWORDS or _ASSIGNMENT.match(words[0])):
            words = words[1:]
        if words and words[0] not in ("for", "case", "in"):
            result.append(words)
    return result


def _split_flags(rest: str) -> tuple[tuple[tuple[str, str], ...], str]:
    flags = []
    while match := _FLAG.match(rest):
        flags.append((match["name"], match["value"] or ""))
        rest = rest[match.end() :]
    return tuple(flags), rest.strip()


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Instructions with their continuations joined; comment and blank lines dropped, as Docker does."""
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not parts:
            start = number
        if line.endswith("\\"):
            parts.append(line[:-1].strip())
            continue
        parts.append(line)
        yield start, " ".join(parts)
        parts = []
    if parts:
        yield start, " ".join(parts)


@dataclass
class Dockerfile:
    """A parsed Dockerfile: global ``ARG`` defaults and its stages in order."""

    args: dict[str, str]
    stages: list[Stage]

    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(f"no stage {name!r} in the Dockerfile (stages: {', '.join(self.names())})")

    def is_stage(self, name: str) -> bool:
        return name in self.names()

    def build(
        self, name: str, base_path: Callable[[str], list[str]], base_has: Callable[[str, str], bool]
    ) -> Build:
        """Follow stage ``name`` instruction by instruction (see :class:`Build`).

        Args:
            name: the stage.
            base_path: ``PATH`` of an external image, as a list of folders.
            base_has: whether an external image has ``executable`` in ``folder`` (called as
                ``base_has(image, folder + "/" + executable)``).
        """
        stage = self.stage(name)
        if self.is_stage(stage.base):
            state = self.build(stage.base, base_path, base_has).copy()
            state.sources.add(stage.base)
        else:
            state = Build(image=stage.base, path=list(base_path(stage.base)))

        def resolve(executable: str) -> str | None:
            for folder in state.path:
                candidate = f"{folder.rstrip('/')}/{executable}"
                if candidate in state.files or base_has(state.image, candidate):
                    return candidate
            return None

        env = dict(self.args)
        for ins in stage.instructions:
            if ins.keyword == "ARG":
                key, _, default = ins.value.partition("=")
                env[key.strip()] = default.strip().strip("\"'") if default else env.get(key.strip(), "")
            elif ins.keyword == "ENV":
                for word in shlex.split(ins.value):
                    key, _, value = word.partition("=")
                    value = expand(value, {**env, "PATH": ":".join(state.path)})
                    env[key] = value
                    if key == "PATH":
                        state.path = [p for p in value.split(":") if p]
            elif ins.keyword == "USER":
                state.user = ins.value.strip()
            elif ins.keyword == "COPY" and ins.flag("from") and self.is_stage(ins.flag("from")[0]):
                origin = ins.flag("from")[0]
                copied = self.build(origin, base_path, base_has)
                state.sources |= {origin} | copied.sources
                *sources, destination = copy_operands(ins.value)
                for source in sources:
                    state.files |= _moved(copied.files, source, destination)
                    state.dsx_pythons |= _moved(copied.dsx_pythons, source, destination)
            elif ins.keyword == "RUN":
                for mount in ins.flag("mount"):
                    options = dict(o.partition("=")[::2] for o in mount.split(","))
                    if self.is_stage(options.get("from", "")):
                        state.sources |= {options["from"]} | self.build(
                            options["from"], base_path, base_has
                        ).sources
                state.runs.append((stage.name, ins.value))
                for words in simple_commands(ins.value):
                    program = words[0]
                    if program.startswith("/"):
                        state.files.add(program)
                    if program in ("test", "[") and "-x" in words[:-1]:
                        tested = words[words.index("-x") + 1]
                        if tested.startswith("/"):
                            state.files.add(tested)
                    if _installs_dsx_wheel(words):
                        interpreter = program if program.startswith("/") else resolve(program)
                        if interpreter is not None:
                            state.dsx_pythons.add(interpreter)
        state.path = [p.rstrip("/") or "/" for p in state.path]
        return state


def copy_operands(value: str) -> list[str]:
    if value.startswith("["):
        return [str(v) for v in json.loads(value)]
    return shlex.split(value)


def _moved(paths: set[str], source: str, destination: str) -> set[str]:
    """Where the files ``paths`` under folder ``source`` land when it is copied to folder ``destination``."""
    source = source.rstrip("/")
    destination = destination.rstrip("/")
    return {destination + p[len(source) :] for p in paths if p.startswith(source + "/")}


def _installs_dsx_wheel(words: list[str]) -> bool:
    """``<python> -m pip install ... /somewhere/dsx-*.whl``: the dsx wheel into that interpreter."""
    return words[1:4] == ["-m", "pip", "install"] and any(
        fnmatch(w.rsplit("/", 1)[-1], "dsx-*.whl") for w in words[4:]
    )


def parse(text: str) -> Dockerfile:
    """Read a Dockerfile's text (see the module's docstring for what is understood)."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    name = base = ""
    start = 0
    instructions: list[Instruction] = []

    def close() -> None:
        if base:
            stages.append(Stage(name, base, start, tuple(instructions)))

    for line, text_ in _logical_lines(text):
        keyword, _, rest = text_.partition(" ")
        keyword = keyword.upper()
        flags, rest = _split_flags(rest.strip())
        if keyword == "FROM":
            close()
            words = rest.split()
            base = expand(words[0], args)
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            start, instructions = line, []
        elif keyword == "ARG" and not base:
            key, _, default = rest.partition("=")
            args[key.strip()] = default.strip().strip("\"'")
        elif base:
            instructions.append(Instruction(keyword, flags, rest, line))
    close()
    return Dockerfile(args, stages)

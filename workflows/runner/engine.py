"""The engine: Argo's semantics for one workflow, carried out on this machine.

One thread per running node. A DAG starts every task whose dependencies are done, as threads; a steps
template runs its groups in order, the steps of a group in parallel. Leaf templates (script, container,
resource) run through :mod:`workflows.runner.executor`; ``parallelism`` bounds them with semaphores.
Node names, IDs, pod names, messages and phases follow the Argo controller.

The engine is split as Argo's controller is (``workflow/controller/``), each module a set of functions
over one :class:`~workflows.runner.state.RunState`:

==========================  =========================================================================
module                      Argo
==========================  =========================================================================
``engine`` (this one)       ``operator.go`` ``operate``: the workflow, entrypoint then ``spec.onExit``
``state``                   ``wfOperationCtx``: what every part reads
``scope``                   ``scope.go``, and ``setGlobalParameters``, ``processAggregateNodeOutputs``
``nodes``                   ``initializeNode``, ``markNodePhase``, ``checkParallelism``
``templates``               ``executeTemplate``, ``processNodeRetries``, ``executeSuspend``
``workflowpod``             ``workflowpod.go`` with the wait container's ``SaveParameters`` / ``Artifacts``
``resource``                ``workflow/executor/resource.go``
``dag``, ``steps``          ``dag.go``, ``steps.go``
``exit_handler``            ``exit_handler.go``
``names``, ``values``       ``workflow/util/pod_name.go``; Go's encodings of the values Argo passes
==========================  =========================================================================

This module keeps the engine's public names (the messages and encoders tests and callers compare with)
importable from where they have always been.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from workflows.runner.executor import Launcher, hera_entrypoint
from workflows.runner.exit_handler import run_workflow_exit
from workflows.runner.library import Library, spec_of
from workflows.runner.model import NodeStatus, RunOptions
from workflows.runner.names import node_id, pod_name, step_or_task_name
from workflows.runner.scope import global_lookup, workflow_globals
from workflows.runner.state import Ctx, RunState, Shutdown, stronger
from workflows.runner.synchronization import hold
from workflows.runner.templates import DEPTH_MESSAGE, MAX_DEPTH, execute, transient
from workflows.runner.templating import render_all
from workflows.runner.values import MAX_RESULT_BYTES, go_json, go_quote
from workflows.runner.workflowpod import ARTIFACT_REPOSITORY_MESSAGE, DEADLINE_MESSAGE

__all__ = [
    "ARTIFACT_REPOSITORY_MESSAGE",
    "DEADLINE_MESSAGE",
    "DEPTH_MESSAGE",
    "MAX_DEPTH",
    "MAX_RESULT_BYTES",
    "Engine",
    "go_json",
    "go_quote",
    "node_id",
    "pod_name",
    "step_or_task_name",
    "transient",
]


def preload(library: Library, entrypoint: str, cluster_spec: str | None = None) -> list[str]:
    """The step modules the run can reach, then those opening its cluster's port, for the fork server
    to import once; nothing when no step runs in Hera's runner."""
    from steps.cluster import port_modules

    modules: set[str] = set()
    for scope, name in library.reachable(entrypoint):
        script = scope.templates[name].get("script") or {}
        entry = hera_entrypoint(script.get("command") or [], script.get("args") or [])
        if entry and ":" in entry:
            modules.add(entry.split(":", 1)[0])
    return [*sorted(modules), *port_modules(cluster_spec)] if modules else []


class Engine:
    """Runs one workflow; create one per run. Its :attr:`state` is the run's, read by the caller too."""

    def __init__(
        self,
        library: Library,
        options: RunOptions,
        run_dir: Path,
        workflow_name: str,
        parameters: Mapping[str, str],
        cluster_spec: str | None,
    ) -> None:
        spec = spec_of(library.entry)
        start = str(options.entrypoint or spec.get("entrypoint"))
        self.state = RunState(
            library=library,
            options=options,
            run_dir=run_dir,
            workflow=workflow_name,
            parameters=dict(parameters),
            cluster_spec=cluster_spec,
            launcher=Launcher(preload(library, start, cluster_spec)),
            execute=execute,
            spec=spec,
        )
        self.state.globals.update(workflow_globals(self.state))
        if self.state.launcher.needed:
            threading.Thread(target=self.state.launcher.warm, name="dsx-warm", daemon=True).start()

    def stop(self, strategy: Shutdown = "Terminate") -> None:
        """Stop the run as ``argo terminate`` (``Terminate``) or ``argo stop`` (``Stop``) does: nothing new
        starts, waits end, running steps are killed with their process groups; ``Stop`` still runs the
        exit handler. A ``Terminate`` overrides an earlier ``Stop``, never the other way round."""
        with self.state.lock:
            self.state.shutdown = stronger(self.state.shutdown, strategy)
            self.state.stop.set()
        self.kill_all()

    def kill_all(self) -> None:
        """Kill every step process still running (the run is over or being abandoned)."""
        with self.state.lock:
            running = list(self.state.processes)
        for process in running:
            process.kill()

    def artifact_repository_error(self) -> str | None:
        """Why the workflow cannot start for want of an artifact repository (None when it can).

        Argo resolves ``spec.artifactRepositoryRef`` before anything runs; on a cluster without the
        ConfigMap it names (``--artifact-repository none``), the workflow ends Error with no nodes.
        """
        ref = self.state.spec.get("artifactRepositoryRef")
        if ref is None or self.state.options.artifact_repository != "none":
            return None
        named = f"{(ref or {}).get('configMap', '')}#{(ref or {}).get('key', '')}"
        return (
            "failed to resolve artifact repository: failed to find any artifact repository for "
            f'artifact repository ref "{named}"'
        )

    def run(self, entrypoint: str) -> tuple[NodeStatus, NodeStatus | None]:
        """Run the entrypoint, then the workflow's ``onExit``; returns the root and exit handler nodes.

        A run stopped with ``Terminate`` skips the exit handler, as Argo's ``Terminate`` strategy does; one
        stopped with ``Stop`` runs it (Argo runs only the ``onExit`` pods of a workflow whose shutdown is
        ``Stop``), unless a ``Terminate`` comes after.
        """
        state = self.state
        root_ctx = Ctx(boundary_id=None, parent_id=None, depth=1, display=state.workflow)
        sync = render_all(
            dict(state.spec.get("synchronization") or {}), lambda tag: global_lookup(state, tag)
        )
        namespace = global_lookup(state, "workflow.namespace") or "default"
        # A workflow-level mutex is held from before the entrypoint until the exit handler has ended.
        with hold(state, sync, namespace, lambda text: print(text, file=sys.stderr)):
            root = execute(
                state,
                state.workflow,
                {"template": entrypoint},
                state.library.entry_scope,
                state.parameters,
                root_ctx,
            )
            on_exit = state.spec.get("onExit")
            with state.lock:
                if not on_exit or state.shutdown == "Terminate":
                    return root, None
                if state.shutdown == "Stop":
                    state.stop.clear()  # the steps of the exit handler run; a Terminate still ends them
            return root, run_workflow_exit(state, root, str(on_exit))

"""Readiness: is this cluster fit for production? NCCL sweeps, a training smoke run, bisection, verdicts,
labels.

The part in five kinds of module, each kind knowing only the kinds above it::

    ranks/          code that runs inside one rank process, started by torchrun or the local launcher
      rankenv         the rank's place (RANK, WORLD_SIZE, its node), its process group, the marks
                      (phase, first error) it leaves for its launcher
      inject          faults injected on purpose into one rank (2:delay=20ms, 1:fail, 1:hang ...)
      sweep           the all-reduce sweep program; rank 0 writes a CollectiveRun
      smoke           the DDP training smoke run program; rank 0 writes a SmokeResult
      diag            DCGM's diagnostics (dcgmi diag -r RUN -j); rank 0 writes a DiagResult, DCGM
                      absent included
    launchers/      where the ranks of a check run; every launcher has one run(test, subject, program,
                    timeout_s) -> Launched
      base            RankProgram, Launched, the Launcher protocol
      local           N processes on this machine (LocalLauncher, launch_local); the faults through
                      which a local rank plays a simulated node (local_injections)
      job             an Indexed Job on the cluster (JobLauncher): create, wait on two clocks, clean up
      jobspec         the Job's manifests and settings (render_group_job, settings_for)
      rankpod         the entry point of a Job's pod: torchrun as a child, rank 0 publishing
      profiles        what a rank pod needs to reach the fabric (recipe and operator profiles)
    check           the one check path, run(check, launcher) -> CheckOutcome: launch, read rank 0's
                    result, judge it, build the outcome, which names its test; CheckKind, what a test
                    adds to the report (its result model, section, plot, injected faults)
    checks          the checks made from it: the all-reduce sweep, the training smoke run and DCGM's
                    diagnostics (requests, run_sweep / run_smoke / run_diag with any launcher, the local
                    runs), and KINDS, every test's CheckKind: the one registration

    judgement and data (flat: every other module and the workflows import them)
      models          CollectiveRun, Subject, Verdict: what every step exchanges
      thresholds      the recipe's thresholds in this part's model
      judge           every verdict, built by judge.verdict: collective runs, smoke runs, relative mode
      nccl_tests      the nccl-tests log parser; nccl_rows, its result rows read column by column
      table           a CollectiveRun printed in the nccl-tests layout
      sizes           message sizes (1KiB, 8GiB) read and written

    the certification pipeline (flat: the compiled YAML names steps.readiness.certify:STEP)
      certify         the dsx-certify workflow's steps: plan, keep_recipe, node_check, group_check,
                      smoke_check, report, gate, release
      planning        the plan: options, nodes, groups, launcher, recipe criteria
      diagnostics     which DCGM diagnostics each node runs: the diag option, and by the fault's check
                      for a node under remediation (recipes/faults/diagnostics.yaml)
      node_marks      what a run writes on its nodes: the Lease that holds each, its verdict label
      outcomes        where checks leave their outcomes for later steps, by test and subject:
                      ConfigMaps of the run
      report          the certification report (JSON, Markdown, plots): every outcome by its test, and
                      each node's result from every verdict
      sections        each check's section of the report's Markdown
      plots           bus bandwidth and step-time plots
      evidence        the folder a step writes its evidence to

    bisect/         from a group that fails while its members pass alone, to the nodes at fault (beside
                    the pipeline: its steps run the certification's group test, whose report reads
                    its records)
      models          a group test's result, every test run, suspects, the result
      session         rounds, repeats within the noise band, the clock, node time
      strategies      halving, pairs and auto over any group test (bisect, choose)
      probes          the group tests of dsx bisect: the fabric model, or real local gloo ranks
      records         one record per test of a workflow's bisection, kept in ConfigMaps of the run
      flow            the steps of dsx-bisect and of dsx-certify's bisection stages

A new check (an NVLink bandwidth test, say) touches six files: its rank program (``ranks/X.py``, with
its result model), its judge (``judge.py``), its registration (``checks.py``: the request, the
:class:`~steps.readiness.check.Check` and one :class:`~steps.readiness.check.CheckKind` in ``KINDS``),
the stage that runs it (``certify.py``: ``node_check`` for a node's own test), its thresholds
(``thresholds.py``, read from the recipe with defaults) and its tests. The outcome store, the step's
one-line result, the report (its section, plot and injected faults; trimming when too big to keep) and
the node labels follow from the outcome's test and verdicts:
``tests/steps/readiness/test_check_kinds.py`` runs a check registered only there through all of them.

Why flat for judgement, data and pipeline: they are what the workflows, the CLI and the tests import,
and the compiled templates name the pipeline's steps by module path; a subpackage would only lengthen
those paths. ``ranks`` and ``launchers`` are packages because their rules differ from the rest: a rank
never touches the cluster (an import-linter contract in ``pyproject.toml``), and a launcher never reads
what it runs. ``bisect`` is one because it is a whole of its own built over the pipeline's group test.
"""

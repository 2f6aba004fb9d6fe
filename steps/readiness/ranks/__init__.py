"""Rank programs: the code that runs inside one rank process of a distributed run.

Started once per rank, by torchrun in a cluster's rank pod or by the local launcher on one machine
(:mod:`steps.readiness.launchers`), each module here is a program (``python -m
steps.readiness.ranks.sweep``) or what such a program uses:

- :mod:`~steps.readiness.ranks.rankenv`: the rank's place (torchrun's variables, its node), its process
  group, and the marks it leaves for its launcher (phase and first-error files);
- :mod:`~steps.readiness.ranks.inject`: faults injected on purpose into one rank (``2:delay=20ms``);
- :mod:`~steps.readiness.ranks.sweep`: the all-reduce sweep; rank 0 writes a ``CollectiveRun``;
- :mod:`~steps.readiness.ranks.smoke`: the DDP training smoke run; rank 0 writes a ``SmokeResult``.

A rank never touches the cluster: it runs in the GPU image with whatever torch gives it, and its
only way out is the result file rank 0 writes. At most it reads :mod:`steps.cluster.vocabulary` for the
names of the ``DSX_*`` variables its launcher sets; an import-linter contract in ``pyproject.toml``
refuses any other import of ``steps.cluster`` from here.
"""

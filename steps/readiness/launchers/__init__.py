"""Launchers: where the rank programs of a check run, all behind one ``run(...)`` signature.

- :mod:`~steps.readiness.launchers.base`: what every launcher takes (:class:`RankProgram`) and gives
  (:class:`Launched`), and the :class:`Launcher` protocol with its one method ``run``;
- :mod:`~steps.readiness.launchers.local`: N rank processes on this machine (:class:`LocalLauncher`,
  :func:`launch_local`), and the faults through which a local rank plays a simulated node;
- :mod:`~steps.readiness.launchers.job`: an Indexed Job with a headless Service on a cluster, pinned to
  the group's nodes (:class:`JobLauncher`), its lifecycle and its two clocks;
- :mod:`~steps.readiness.launchers.jobspec`: the manifests of one group test and the settings they need;
- :mod:`~steps.readiness.launchers.rankpod`: the entry point of a group test's pod (torchrun as a child,
  rank 0 publishing its result);
- :mod:`~steps.readiness.launchers.profiles`: what a rank pod needs to reach the fabric (devices, env,
  /dev/shm), from the recipe and the operator.

A launcher knows nothing of what it runs: it starts a module on every rank, tells rank 0 where to write,
and returns rank 0's result text with the verdicts its ending alone gives (hang, error, unschedulable).
Reading and judging that result is the check's (:func:`steps.readiness.check.run`).
"""

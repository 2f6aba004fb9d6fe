"""Sentinel: is the cluster still fit, right now? Watch every GPU node, act on a fault at once, and bring a
node back only after it passed again.

The agent, on each GPU node:

- :mod:`~steps.sentinel.events`: the HealthEvent, one reading of one check about one entity;
- :mod:`~steps.sentinel.probes`: small functions from what the node's hardware reports (the health seam,
  :mod:`steps.cluster.health`) to health events; their sources: :mod:`~steps.sentinel.nvml` (pynvml),
  :mod:`~steps.sentinel.kernel_log` (XID and SXid lines), :mod:`~steps.sentinel.sysfs` (NIC ports), and
  the simulated fleet;
- :mod:`~steps.sentinel.catalogue`: what each XID and condition means (severity, action, mode), data in
  ``recipes/faults/``;
- :mod:`~steps.sentinel.agent`: the loop that turns readings into conditions, Events, metrics and the taint;
  :mod:`~steps.sentinel.node` assembles it for one node; :mod:`~steps.sentinel.state` keeps its state
  on the node across restarts within one boot; :mod:`~steps.sentinel.budget` is the fleet-wide taint
  budget every agent asks before it taints.

Remediation, the steps of ``dsx-remediate``:

- :mod:`~steps.sentinel.policy`: from an event to observe, taint or remediate, and the circuit breaker;
- :mod:`~steps.sentinel.drain`: eviction only, never breaking a PodDisruptionBudget;
- :mod:`~steps.sentinel.remediate`, :mod:`~steps.sentinel.recertify`: guard, quarantine, repair,
  recertification, outcome;
- :mod:`~steps.sentinel.ledger`: every state change with its time, which goodput reads.

Goodput, :mod:`steps.sentinel.goodput`: what the fleet lost and why, and what each policy wins back.

Like every part it imports only :mod:`steps.cluster` and the helpers at the top of :mod:`steps`.
"""

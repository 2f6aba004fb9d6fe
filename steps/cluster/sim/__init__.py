"""A simulated GPU fleet: nodes, GPU Feature Discovery labels, pods, budgets, faults, and a call log.

``connect("sim:nodes=64,gpu=h100,racks=8,faults=node-17:slow-nic;node-40:xid=79")`` gives a
:class:`SimCluster` that behaves as the kubernetes-client adapter does against a real cluster;
``releases=gpu-operator@v25.3.4`` adds deployed Helm releases, stored as Helm stores them.
"""

from steps.cluster.sim.cluster import SimCluster
from steps.cluster.sim.faults import FAULT_KINDS, VERSION_FAULTS, apply_fault
from steps.cluster.sim.gpus import GPU_MODELS, GpuModel, gpu_model
from steps.cluster.sim.helm import Release
from steps.cluster.sim.model import ApiFaults, CallRecord, Fleet, NodeHealth, Pdb
from steps.cluster.sim.spec import FleetSpec, build_fleet, load_spec_file, parse_short_spec
from steps.cluster.sim.store import FileStore, FleetStore, MemoryStore, write_fleet

__all__ = [
    "FAULT_KINDS",
    "GPU_MODELS",
    "VERSION_FAULTS",
    "ApiFaults",
    "CallRecord",
    "FileStore",
    "Fleet",
    "FleetSpec",
    "FleetStore",
    "GpuModel",
    "MemoryStore",
    "NodeHealth",
    "Pdb",
    "Release",
    "SimCluster",
    "apply_fault",
    "build_fleet",
    "gpu_model",
    "load_spec_file",
    "parse_short_spec",
    "write_fleet",
]

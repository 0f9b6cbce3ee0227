"""The KWOK-style cluster simulator behind a kubesim API server.

It plays every in-cluster actor a client could observe: kubelets (Nodes, Leases,
pod readiness), the scheduler, and the workload controllers. It works on the
in-process `Store` only, never over HTTP. `KubeSim` builds one `Simulator` per
non-hub server; `routes()` adds the `/sim/v1/nodes` fault-injection endpoint.

Hand-written because the tools that do this (KWOK, kube-controller-manager,
kube-scheduler) are Go binaries that need a real kube-apiserver and etcd; nothing
maintained simulates a cluster inside a Python process.
"""

from flotilla.kubesim.sim.options import SimOptions
from flotilla.kubesim.sim.simulator import Simulator

__all__ = ["SimOptions", "Simulator"]

"""Knobs of one simulated cluster (the `flotilla-kubesim` node and timing flags)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SimOptions:
    """How many nodes, how big, and how fast pods become ready or finish."""

    nodes: int = 3
    node_cpu: str = "8"
    node_memory: str = "32Gi"
    node_pods: int = 110
    node_gpus: int = 0
    node_labels: dict[str, str] = field(default_factory=dict)
    pod_ready_seconds: float = 1.0
    job_seconds: float = 2.0
    # Lease renewal period; upstream kubelets renew every 10 s.
    heartbeat_seconds: float = 10.0
    # Record the Events a real cluster's scheduler, kubelets and controllers write.
    record_events: bool = True

"""Cluster backends: one interface (`base.ClusterBackend`), a simulated and a Kubernetes
implementation. They report what the cluster does and carry out what services decide;
they import nothing above them. `queueing.composition` builds them from settings."""

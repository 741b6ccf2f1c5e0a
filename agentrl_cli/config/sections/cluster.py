"""`cluster`: the nodes and the network plan of a deployment. One module per section; `agentrl_cli/config/models.py` joins them."""

from __future__ import annotations


from pydantic import Field

from agentrl_cli.config.sections.base import (Section)


class ClusterConfig(Section):
    nodes: int = Field(1, ge=1, description="Nodes in the training cluster (trainer replicas of the rendered JobSet)")
    gpus_per_node: int = Field(0, ge=0, description="GPUs per node (0 = CPU only); the trainer asks for this many")
    namespace: str = Field("agentrl", description="Kubernetes namespace")
    kueue_queue: str = Field("agentrl", description="Prefix of the Kueue LocalQueues, one per pool (<prefix>-<pool>)")
    image_registry: str = Field("registry.local/agentrl", description="Registry for the role images")
    base_image: str = Field("python:3.11-slim", description="Pinned base image the role images build on")
    accelerator_resource: str = Field("nvidia.com/gpu", description="Kubernetes extended resource name of an accelerator")
    accelerator_product: str = Field("", description="Node label value of nvidia.com/gpu.product that accelerator jobs require ('' = any)")
    kubeconfig: str = Field("", description="Cluster to apply to: a kubeconfig path, or in-cluster ('' = none configured: render and validate only)")
    runs_volume_claim: str = Field("agentrl-runs", pattern=r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)?$", description="PersistentVolumeClaim (ReadWriteMany) `agentrl controlplane render` creates in cluster.namespace and mounts writable at observe.runs_dir in the training JobSet's trainer and inference pods, so they share the weight exports, checkpoints and rank files ('' = an emptyDir per pod: nothing shared, nothing kept past the pod; `agentrl plan --executor kubernetes` warns when a path must be shared)")
    runs_volume_gb: int = Field(0, ge=0, description="Size of cluster.runs_volume_claim in GB (0 = from `agentrl plan`: (training.keep_last_checkpoints + 1) x its checkpoint size + 3 weight exports + 1 GB, rounded up)")
    storage_class: str = Field("", description="StorageClass of cluster.runs_volume_claim; it must offer ReadWriteMany, e.g. NFS, CephFS or a cloud file store ('' = the cluster's default)")


# permissive licences, MPL-2.0 (file-level copyleft) and LGPL (libraries used unmodified, loaded dynamically)

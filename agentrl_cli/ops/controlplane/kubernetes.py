"""The Kubernetes executor: each job a suspended batch/v1 Job in its pool's Kueue LocalQueue, which Kueue
admits by quota and priority (and preempts, where the pool's ClusterQueue allows it).

It talks to the Kubernetes API (the `kubernetes` package, `pip install 'agentrl-cli[kubernetes]'`) only when
`cluster.kubeconfig` names a cluster (a kubeconfig path, or `in-cluster` for a pod's service account).
With none configured, `check()` raises ExecutorUnavailable saying exactly what would be created, and
stage 3 reports its job checks as skipped with that text.
"""

from __future__ import annotations

from agentrl_cli.config.models import PlatformConfig
from agentrl_cli.ops.controlplane.executor import (FAILED, PENDING, RUNNING, SUCCEEDED, ExecutorUnavailable, JobSpec,
                                               JobStatus)
from agentrl_cli.ops.controlplane.manifests import queue_name, render_all, render_job

FIELD_MANAGER = "agentrl"


class KubernetesExecutor:
    name = "kubernetes"

    def __init__(self, cfg: PlatformConfig) -> None:
        self.cfg = cfg
        self._api = None

    def would_run(self) -> str:
        pools = ", ".join(f"{p.name} -> LocalQueue {queue_name(self.cfg, p.name)}" for p in self.cfg.controlplane.pools)
        kinds: dict[str, int] = {}
        for d in render_all(self.cfg):
            kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
        objects = ", ".join(f"{n} {k}" for k, n in kinds.items())
        return (f"would apply {objects} in namespace {self.cfg.cluster.namespace}, then submit each job as a suspended "
                f"batch/v1 Job labelled with its pool's queue ({pools}) for Kueue to admit")

    def check(self) -> None:
        if not self.cfg.cluster.kubeconfig:
            raise ExecutorUnavailable(f"no Kubernetes cluster is configured (cluster.kubeconfig is empty): {self.would_run()}",
                                      "set cluster.kubeconfig to a kubeconfig path (or in-cluster); "
                                      "`agentrl controlplane render` shows the manifests")
        client = self._client()
        try:
            client.VersionApi(self._api_client()).get_code()
        except Exception as exc:  # noqa: BLE001 - any failure to reach the API server means the same to the user
            raise ExecutorUnavailable(f"the Kubernetes cluster in {self.cfg.cluster.kubeconfig} is not reachable: "
                                      f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                                      "check cluster.kubeconfig and that the API server answers (kubectl version)") from None

    def preemption(self) -> str:
        if not any(p.preemptible for p in self.cfg.controlplane.pools):
            return "no pool is preemptible (controlplane.pools[].preemptible), so no ClusterQueue preempts"
        return ""

    def apply(self, docs: list[dict]) -> list[str]:
        """Server-side apply of rendered objects; returns 'Kind/name' of each."""
        from kubernetes.dynamic import DynamicClient

        dyn = DynamicClient(self._api_client())
        done = []
        for doc in docs:
            res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            ns = doc["metadata"].get("namespace")
            res.server_side_apply(body=doc, name=doc["metadata"]["name"], namespace=ns, field_manager=FIELD_MANAGER)
            done.append(f"{doc['kind']}/{doc['metadata']['name']}")
        return done

    def submit(self, spec: JobSpec) -> str:
        job = render_job(self.cfg, spec)
        batch = self._client().BatchV1Api(self._api_client())
        try:
            batch.create_namespaced_job(self.cfg.cluster.namespace, job)
        except self._client().ApiException as exc:
            if exc.status != 409:  # 409: already created before a leader change
                raise
        return job["metadata"]["name"]

    def poll(self, external_ids: list[str]) -> dict[str, JobStatus]:
        batch = self._client().BatchV1Api(self._api_client())
        out = {}
        for name in external_ids:
            try:
                job = batch.read_namespaced_job(name, self.cfg.cluster.namespace)
            except self._client().ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            pool = (job.metadata.labels or {}).get("agentrl/pool", "")
            st = job.status
            if st.succeeded:
                out[name] = JobStatus(SUCCEEDED, "", pool, 0)
            elif st.failed:
                out[name] = JobStatus(FAILED, _condition(job, "Failed"), pool, 1)
            elif st.active:
                out[name] = JobStatus(RUNNING, "", pool)
            elif job.spec.suspend:
                out[name] = JobStatus(PENDING, self._workload_reason(name) or "Suspended: waiting for Kueue to admit it", pool)
            else:
                out[name] = JobStatus(PENDING, "pods not started yet", pool)
        return out

    def cancel(self, external_id: str) -> None:
        batch = self._client().BatchV1Api(self._api_client())
        batch.delete_namespaced_job(external_id, self.cfg.cluster.namespace, propagation_policy="Background")

    def logs(self, external_id: str, spec: JobSpec) -> str:
        core = self._client().CoreV1Api(self._api_client())
        pods = core.list_namespaced_pod(self.cfg.cluster.namespace, label_selector=f"job-name={external_id}").items
        return "".join(core.read_namespaced_pod_log(p.metadata.name, self.cfg.cluster.namespace) for p in pods)

    def _workload_reason(self, job_name: str) -> str:
        custom = self._client().CustomObjectsApi(self._api_client())
        items = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", self.cfg.cluster.namespace, "workloads").get("items", [])
        for wl in items:
            owners = wl.get("metadata", {}).get("ownerReferences") or []
            if any(o.get("name") == job_name for o in owners):
                for cond in wl.get("status", {}).get("conditions") or []:
                    if cond.get("type") == "QuotaReserved" and cond.get("status") == "False":
                        return f"{cond.get('reason', '')}: {cond.get('message', '')}"
        return ""

    def _client(self):
        try:
            import kubernetes.client as client
        except ImportError:
            raise ExecutorUnavailable("the kubernetes Python package is not installed",
                                      "pip install 'agentrl-cli[kubernetes]'") from None
        return client

    def _api_client(self):
        if self._api is None:
            self._client()
            from kubernetes import config as kconfig

            if self.cfg.cluster.kubeconfig == "in-cluster":
                kconfig.load_incluster_config()
                self._api = self._client().ApiClient()
            else:
                self._api = kconfig.new_client_from_config(config_file=self.cfg.cluster.kubeconfig)
        return self._api


def _condition(job, kind: str) -> str:
    for cond in job.status.conditions or []:
        if cond.type == kind and cond.status == "True":
            return f"{cond.reason}: {cond.message}"
    return kind


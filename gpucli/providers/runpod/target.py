"""``--provider runpod``: a RunPod pod, rented for the run (REST API v2, see gpucli/providers/runpod/api.py)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from gpucli.errors import NoCapacityError, UsageError
from gpucli.providers.cloudtarget import MAX_OFFERS, CloudPlan, CloudProvisioner, CloudTarget
from gpucli.providers.credentials import runpod_base_url
from gpucli.providers.query import parse_query
from gpucli.providers.runpod.api import SPOT_REFUSED, RunPodProvider
from gpucli.providers.runpod.clusterrent import cluster_volume
from gpucli.providers.target import Capabilities
from gpucli.settings import volume_mount

if TYPE_CHECKING:
    from gpucli.plan.catalog import Catalog, Gpu
    from gpucli.providers.api import Offer, Provider
    from gpucli.providers.runpod.api import NetworkVolume
    from gpucli.providers.target import OfferAsk, Provisioner


class RunPodTarget(CloudTarget):
    name = "runpod"
    describe = "a RunPod pod"
    #: RunPod's own PyTorch image, the one its API reference creates pods with (runpod/docs
    #: api-reference-v2/openapi.json L534, CreatePodRequest example, 2026-08): CUDA 12.8.1, torch 2.8, Ubuntu
    #: 24.04 (Python 3.12). CUDA 12.8 is the first with sm_100 (B200) and sm_120 (RTX 5090, RTX PRO 6000),
    #: torch 2.7 the first release built for it; the former default (torch 2.4, CUDA 12.4) ran neither, and
    #: its torch could not import the trainer. The bundled trainer brings its own pinned torch anyway
    #: (gpucli/pod/envbuild.py, on the volume).
    default_image = "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404"
    min_cuda = "12.8"  # the default image's CUDA: sent as gpu.minCudaVersion on create
    # A pod stopped by RunPod (a host gone, a $0 balance: pods/pricing.mdx L59) reports EXITED (openapi
    # PodStatus), as podStop leaves it: the pod no longer runs the run.
    exited_means = "preempted"
    #: The run folder is on the pod's volume disk (mounts.persistent at /workspace), which a stop keeps
    #: ("Volume disk ... Persistent; retained until Pod deleted", pods/pricing.mdx L47): --on-end stop
    #: keeps the checkpoints, at $0.20/GB/month while stopped (caps.kept_storage).
    caps = Capabilities(
        network_volumes=True,  # storage/network-volumes.mdx: mounted at /workspace, Secure Cloud only
        # Instant Clusters (runpod/docs instant-clusters.mdx): one cluster, its member pods are managed
        # through it (ClusterCompute in api-reference-v2), and gpucli deletes it when the run ends.
        clusters=True,
        max_nodes=250,  # ClusterCompute.podCount: 2..250 (runpod api-reference-v2)
        nodes_are="pods (a RunPod Instant Cluster holds 2 to 250)",
        # instant-clusters/configuration.mdx: PRIMARY_ADDR/MASTER_ADDR "corresponds to ens1", the
        # interface NCCL is told to use between the pods.
        nccl_ifname="ens1",
        # instant-clusters.mdx: 1600-3200 Gbps node to node; the lower bound is planned with.
        link_gbps=1600.0,
        link_source="RunPod Instant Clusters: 1600-3200 Gbps node to node (runpod docs, instant-clusters)",
        bills_transfer=False,  # "no fees for data ingress or egress" (pods/pricing.mdx L16)
        provider_billing=False,  # REST v2 reports no per-pod charges: gpucli's meter is the cost
        # "Volume disk ... Persistent; retained until Pod deleted" at $0.20/GB/month stopped (pods/pricing.mdx L47)
        kept_storage="a stopped pod keeps its volume disk (the run folder) at $0.20/GB/month",
        # PersistentMount: "Host-local ... does not survive a host failure" (api-reference-v2 openapi.json);
        # at a $0 balance "Pods without a network volume are terminated and their data cannot be
        # recovered" (pods/pricing.mdx L39, L59)
        kept_storage_risk="that disk is host-local: lost with its host, and at a $0 account balance RunPod "
                          "terminates the pod (--volume keeps the run on a network volume instead)",
        stop_supported=True,  # podAction stop: "the pod moves to EXITED" (openapi podAction)
        spot=False,  # no interruptible pods in REST v2 (gpucli/providers/runpod/api.py SPOT_REFUSED)
        # The create call's args (the container's start command) run the boot guard and resume.sh at every
        # container start (gpucli/providers/bootguard.py; pods/templates/manage-templates.mdx L27): a
        # host-side restart of a live run resumes it from the volume disk, as a vast instance does; a pod
        # started again after its run ended is only ever stopped.
        in_place_resume=True,
    )

    def default_workdir(self, run: str) -> str:
        return f"{volume_mount()}/gpucli-runs/{run}"  # the volume disk (or network volume) mount

    def pod_api_env(self) -> dict[str, str]:
        return {"GPUCLI_RUNPOD_API_BASE_URL": runpod_base_url()}

    def plan_offers(self, catalog: Catalog, gpu_id: str, n_gpus: int, *, spot: bool,
                    bid_per_gpu_usd: float | None, client: Provider | None = None,
                    disk_gb: int | None = None, ask: OfferAsk | None = None) -> CloudPlan:
        if spot:  # refused before anything is searched or rented
            raise UsageError(SPOT_REFUSED)
        return super().plan_offers(catalog, gpu_id, n_gpus, spot=spot, bid_per_gpu_usd=bid_per_gpu_usd,
                                   client=client, disk_gb=disk_gb, ask=ask)

    def with_volume(self, provision: Provisioner, name_or_id: str, *, size_gb: int | None = None,
                    volume_id: str | None = None) -> Provisioner:
        """The provisioner creating its pod with the named network volume (looked up before the pod is
        created; the pod goes to the volume's data centre, Secure Cloud). With ``size_gb``, a volume of
        that name is created when the account has none: in the Secure Cloud data centre with the most
        free GPUs of the chosen offer's type at the run's GPU count. A volume this launch created is
        marked ``created``: a failed launch names it, its monthly cost and how to delete it.
        ``volume_id``: the volume an earlier launch of the run used (a resume), taken while it exists."""
        client = self.client()
        assert isinstance(client, RunPodProvider) and isinstance(provision, CloudProvisioner)  # this target's own
        if volume_id is not None:
            known = next((v for v in client.network_volumes() if v.volume_id == volume_id), None)
            if known is not None:
                return dataclasses.replace(provision, volume=known, plan=secure_plan(client, provision))
        try:
            volume = client.find_volume(name_or_id)
        except UsageError:
            if size_gb is None:
                raise
            first = provision.plan.offers[0]
            dc = client.data_center_for(first.gpu_name, provision.plan.n_gpus)
            volume = dataclasses.replace(client.create_volume(name_or_id, size_gb, dc), created=True)
        return dataclasses.replace(provision, volume=volume, plan=secure_plan(client, provision))

    def cluster_volume(self, name_or_id: str, *, size_gb: int | None, gpu_type: str, gpus_per_pod: int,
                       volume_id: str | None = None) -> NetworkVolume:
        client = self.client()
        assert isinstance(client, RunPodProvider)
        return cluster_volume(client, name_or_id, size_gb=size_gb, gpu_type=gpu_type, gpus_per_pod=gpus_per_pod,
                              volume_id=volume_id)

    def search(self, client: Provider, gpu: Gpu, n_gpus: int, *, spot: bool, limit: int,
               disk_gb: int | None = None, query: str | None = None, hours: float | None = None) -> list[Offer]:
        # A RunPod pod has no contract end (it runs until stopped or the balance runs out): ``hours``
        # is not a filter here. One catalog read per cloud for this count; offers come pinned to cloud and data centre.
        # --query filters the offers here (fields RunPod's catalog does not report are skipped).
        ids = {i.lower() for i in gpu.runpod_ids}
        words = f"num_gpus={n_gpus}" + (f" {query}" if query else "")
        return [o for o in client.search_offers(parse_query(words), spot=spot, limit=200,
                                                     disk_gb=disk_gb)
                if (o.gpu_name or "").lower() in ids]


def secure_plan(client: Provider, provision: CloudProvisioner) -> CloudPlan:
    """The plan with Secure Cloud offers only: network volumes are Secure Cloud only
    (storage/network-volumes.mdx L98), and a Community quote would not be what such a pod bills."""
    plan = provision.plan
    names = {o.gpu_name for o in plan.offers}
    offers = [o for o in plan.offers if o.cloud_type == "SECURE"]
    if len(offers) < MAX_OFFERS:
        more = [o for o in client.search_offers(parse_query(f"num_gpus={plan.n_gpus}"), limit=200,
                                                disk_gb=provision.disk_gb)
                if o.gpu_name in names and o.cloud_type == "SECURE" and o not in offers]
        offers = (offers + sorted(more, key=lambda o: o.price_per_hour_usd))[:MAX_OFFERS]
    if not offers:
        raise NoCapacityError(f"no RunPod Secure Cloud offer for {plan.n_gpus}x {', '.join(sorted(names))}: "
                              "network volumes are Secure Cloud only", hint="drop --volume, or try another GPU")
    return dataclasses.replace(plan, offers=tuple(offers),
                               max_price_per_hour_usd=round(max(o.price_per_hour_usd for o in offers), 6))

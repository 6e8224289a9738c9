"""``--provider runpod``: a RunPod pod, rented for the run."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from gpucli.cloud.credentials import runpod_base_url, runpod_rest_url
from gpucli.cloud.query import parse_query
from gpucli.cloud.runpod import RunPodProvider
from gpucli.errors import UsageError
from gpucli.run.targets.cloud import CloudProvisioner, CloudTarget

if TYPE_CHECKING:
    from gpucli.cloud.base import Offer, Provider
    from gpucli.plan.catalog import Gpu


class RunPodTarget(CloudTarget):
    name = "runpod"
    describe = "a RunPod pod"
    default_image = "runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04"
    # RunPod reports a spot pod it took back as EXITED (podStop leaves the same state).
    exited_means = "preempted"
    network_volumes = True  # --volume: a network volume at /workspace (vast.ai has none)

    def default_workdir(self, run: str) -> str:
        return f"/workspace/gpucli-runs/{run}"  # /workspace is the pod's persistent volume

    def pod_api_env(self) -> dict[str, str]:
        return {"GPUCLI_RUNPOD_API_BASE_URL": runpod_base_url(), "GPUCLI_RUNPOD_API_URL": runpod_rest_url()}

    def with_volume(self, provision: CloudProvisioner, name_or_id: str, *, size_gb: int | None = None,
                    volume_id: str | None = None) -> CloudProvisioner:
        """The provisioner creating its pod with the named network volume (looked up before the pod is
        created; the pod goes to the volume's data centre). With ``size_gb``, a volume of that name is
        created when the account has none: in the data centre with the most of the chosen offer's GPU
        in stock. A created volume is never deleted by gpucli (it holds the data and checkpoints).
        ``volume_id``: the volume an earlier launch of the run used (a resume), taken while it exists."""
        client = self.client()
        assert isinstance(client, RunPodProvider)
        if volume_id is not None:
            known = next((v for v in client.network_volumes() if v.volume_id == volume_id), None)
            if known is not None:
                return dataclasses.replace(provision, volume=known)
        try:
            volume = client.find_volume(name_or_id)
        except UsageError:
            if size_gb is None:
                raise
            gpu = provision.plan.offers[0].gpu_name
            dc = client.data_center_for(gpu)
            volume = dataclasses.replace(client.create_volume(name_or_id, size_gb, dc), created=True)
        return dataclasses.replace(provision, volume=volume)

    def search(self, client: Provider, gpu: Gpu, n_gpus: int, *, spot: bool, limit: int,
               disk_gb: int | None = None) -> list[Offer]:
        # RunPod prices each GPU count separately: ask for this count only (one request).
        ids = {i.lower() for i in gpu.runpod_ids}
        return [o for o in client.search_offers(parse_query(f"num_gpus={n_gpus}"), spot=spot, limit=200,
                                                     disk_gb=disk_gb)
                if (o.gpu_name or "").lower() in ids]

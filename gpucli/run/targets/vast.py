"""``--provider vast``: a vast.ai instance, rented for the run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpucli.cloud.credentials import vast_base_url
from gpucli.cloud.query import parse_query
from gpucli.run.targets.cloud import CloudTarget

if TYPE_CHECKING:
    from gpucli.cloud.base import Offer, Provider
    from gpucli.plan.catalog import Gpu


class VastTarget(CloudTarget):
    name = "vast"
    describe = "a vast.ai instance"
    default_image = "pytorch/pytorch:2.4.0-cuda12.4-cudnn9-devel"

    def pod_api_env(self) -> dict[str, str]:
        return {"GPUCLI_VAST_URL": vast_base_url()}

    def search(self, client: Provider, gpu: Gpu, n_gpus: int, *, spot: bool, limit: int,
               disk_gb: int | None = None) -> list[Offer]:
        offers: list[Offer] = []
        for vname in gpu.vast_names or (gpu.name,):
            q = parse_query(f"gpu_name={vname.replace(' ', '_')} num_gpus={n_gpus}")
            # allocated_storage = the launch's --disk: vast's dph_total then includes that storage.
            offers += client.search_offers(q, spot=spot, limit=limit * 4, disk_gb=disk_gb)
        return offers

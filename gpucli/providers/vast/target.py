"""``--provider vast``: a vast.ai instance, rented for the run."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gpucli.providers.cloudtarget import CloudTarget
from gpucli.providers.credentials import vast_base_url
from gpucli.providers.query import comparisons, parse_query
from gpucli.providers.target import Capabilities

if TYPE_CHECKING:
    from gpucli.plan.catalog import Gpu
    from gpucli.providers.api import Offer, Provider


#: Offer filters every launch adds unless its query names the field (dstack vastai/compute.py L59-70
#: filters cuda_max_good, reliability2 and inet_down the same way; vast-cli's launch adds disk_space).
#: The numbers are gpucli's: hosts below them fail or crawl after being billed.
MIN_RELIABILITY = 0.95
MIN_INET_DOWN_MBPS = 100

#: A rental must outlast the run. "Every offer has a maximum rental duration ... When the rental end
#: date is reached, the rental contract expires and the instance is stopped" (vast-ai/docs
#: guides/reference/faq/instances.mdx L13), and "Expired instances may be deleted 48 hours after
#: expiration" (guides/instances/choosing/instance-types.mdx L49) - with the checkpoints a stopped run
#: keeps. The search's ``duration`` is the "minimum required rental duration in seconds (the offer must
#: be available for at least this long from now)" (api-reference/openapi/yaml/search_offers.yaml
#: L104-106). gpucli asks for the run's planned hours times this margin (estimates run long; a resume
#: after a preemption adds time), at least ``MIN_RENTAL_HOURS`` when the run has no planned length.
RENTAL_MARGIN = 1.5
MIN_RENTAL_HOURS = 24.0


def rental_hours(planned_hours: float | None) -> float:
    """The rental time an offer must have left for a run planned to take ``planned_hours``."""
    if planned_hours is None or not planned_hours > 0:
        return MIN_RENTAL_HOURS
    return max(planned_hours * RENTAL_MARGIN, planned_hours + 2.0)


class VastTarget(CloudTarget):
    name = "vast"
    describe = "a vast.ai instance"
    #: PyTorch's official image (hub.docker.com/r/pytorch/pytorch, tag 2.9.1-cuda12.8-cudnn9-runtime), the
    #: family vast's own examples start from (vast-ai/docs api-reference/hello-world.mdx L97 uses
    #: pytorch/pytorch:2.4.0-cuda12.4, whose CUDA 12.4 has no kernels for Blackwell). CUDA 12.8 is the first
    #: with sm_100 (B200) and sm_120 (RTX 5090, RTX PRO 6000), torch 2.7 the first release built for it.
    #: The bundled trainer brings its own pinned torch anyway (gpucli/pod/envbuild.py, on the volume);
    #: the runtime flavour (no compiler toolchain) pulls faster than devel, and torch.compile's Triton
    #: carries its own ptxas.
    default_image = "pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime"
    min_cuda = "12.8"  # the default image's CUDA: hosts whose driver is older cannot run it

    #: The instance's onstart runs the run's resume.sh at every container start (see onstart.py):
    #: caps.in_place_resume.
    caps = Capabilities(
        # Instances joined to one overlay network (vast-ai/docs multi-node-training-using-torch-nccl.mdx;
        # cli/reference overlay commands): each is an instance like any other, whose own watchdog ends it
        # with its CONTAINER_API_KEY (hello-world.mdx L112), and no address variables are given.
        overlays=True,
        # torch-nccl.mdx L47: eth0 is the overlay network (unless networks were changed after creation).
        nccl_ifname="eth0",
        link_source="vast.ai cluster overlay network: the cluster's own link, not published per offer "
                    "(vast docs, multi-node-training-using-torch-nccl)",
        in_place_resume=True,  # the onstart runs resume.sh at every container start (targets/onstart.py)
        bills_transfer=True,  # "Charges apply per byte transferred" (guides/instances/pricing.mdx L70)
        provider_billing=True,  # GET /api/v0/charges/: per-instance charges, bwd/bwu included (show_charges.yaml)
        # storage bills "regardless of running state ... typically higher for stopped" (pricing.mdx)
        kept_storage="a stopped instance keeps its disk, billed at the host's storage rate",
        # "instances and data will be scheduled for deletion" at $0 credit (guides/instances/pricing.mdx
        # L113); "Expired instances may be deleted 48 hours after expiration" (instance-types.mdx L49)
        kept_storage_risk="at $0 credit vast schedules it and its data for deletion, and an instance past its "
                          "rental end may be deleted 48 h later",
        stop_supported=True,  # PUT /api/v0/instances/{id}/ {"state":"stopped"} (manage_instance.yaml)
        spot=True,  # interruptible instances rented with a bid (create_instance.yaml price)
    )

    def pod_api_env(self) -> dict[str, str]:
        return {"GPUCLI_VAST_URL": vast_base_url()}

    def search(self, client: Provider, gpu: Gpu, n_gpus: int, *, spot: bool, limit: int,
               disk_gb: int | None = None, query: str | None = None, hours: float | None = None) -> list[Offer]:
        offers: list[Offer] = []
        for vname in gpu.vast_names or (gpu.name,):
            q = parse_query(f"gpu_name={vname.replace(' ', '_')} num_gpus={n_gpus} "
                            + launch_filters(disk_gb, self.required_cuda(gpu), os.environ.get("GPUCLI_OFFER_QUERY"),
                                             query, hours=rental_hours(hours)))
            # allocated_storage = the launch's --disk: vast's dph_total then includes that storage.
            offers += client.search_offers(q, spot=spot, limit=limit * 4, disk_gb=disk_gb)
        return offers


def launch_filters(disk_gb: float | None, min_cuda: str | None, *overrides: str | None,
                   hours: float | None = None) -> str:
    """The launch's own offer filters in vast query words: disk >= the launch disk, a driver that runs
    the image's CUDA, reliability, download speed and (``hours``) the rental time left on the offer. Each of ``overrides`` (vast query words: the
    ``GPUCLI_OFFER_QUERY`` environment variable, then the launch's ``--query``) replaces, field by field,
    what comes before it: gpucli's defaults, then the earlier override."""
    words = {"reliability": f"reliability>={MIN_RELIABILITY}", "inet_down": f"inet_down>={MIN_INET_DOWN_MBPS}"}
    if disk_gb:
        words["disk_space"] = f"disk_space>={float(disk_gb):g}"
    if min_cuda:
        words["cuda_max_good"] = f"cuda_max_good>={min_cuda}"
    if hours:
        words["duration"] = f"duration>={hours / 24.0:.6g}"  # query words count days (vastai CLI)
    for override in overrides:
        if override and override.strip():
            given: dict[str, list[str]] = {}
            for field, typed in comparisons(override):
                given.setdefault(field, []).append(typed)
            words = {f: w for f, w in words.items() if f not in given}
            words.update({field: " ".join(typed) for field, typed in given.items()})
    return " ".join(words.values())

"""HTTP emulators of the RunPod GraphQL and vast.ai REST APIs whose pods are real sshd processes."""

from tests.support.emulators.common import Fault, FaultQueue, Ledger, PodBehaviour
from tests.support.emulators.runpod import RunPodEmulator
from tests.support.emulators.vast import VastEmulator

__all__ = ["Fault", "FaultQueue", "Ledger", "PodBehaviour", "RunPodEmulator", "VastEmulator"]

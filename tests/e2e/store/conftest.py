# The same fresh state as the cloud tests (catalogue, consoles, one math thread, quick provider polls):
# these runs go through the same emulators.
from tests.e2e.cloud.conftest import fresh_state  # noqa: F401 - an autouse fixture, used by being here

# The same fresh state as the lifecycle tests (catalogue, consoles, one math thread): the agent's tools
# drive the same commands.
from tests.e2e.lifecycle.conftest import fresh_state  # noqa: F401 - an autouse fixture, used by being here

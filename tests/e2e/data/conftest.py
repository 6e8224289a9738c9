# The same per-test state as the cloud tests: fresh catalogue and consoles, one thread per trainer, fast
# emulator polls.
from tests.e2e.cloud.conftest import fresh_state  # noqa: F401

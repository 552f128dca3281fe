"""The domain, one module per aggregate. Every row belongs to a tenant."""

from memory.models.cognition import *  # noqa: F403
from memory.models.context import *  # noqa: F403
from memory.models.decay import *  # noqa: F403
from memory.models.digest import *  # noqa: F403
from memory.models.experiences import *  # noqa: F403
from memory.models.extraction import *  # noqa: F403
from memory.models.forget import *  # noqa: F403
from memory.models.jobs import *  # noqa: F403
from memory.models.otel import *  # noqa: F403
from memory.models.recorder import *  # noqa: F403
from memory.models.sessions import *  # noqa: F403
from memory.models.store import *  # noqa: F403
from memory.models.tenancy import *  # noqa: F403
from memory.models.user_memory import *  # noqa: F403

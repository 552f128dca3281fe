"""/api/v1 routes, one module per capability."""

from django.urls import include, path

urlpatterns = [
    path("", include("memory.api.tenancy")),
    path("", include("memory.api.agents")),
    path("", include("memory.api.sessions")),
    path("", include("memory.api.context")),
    path("", include("memory.api.experiences")),
    path("", include("memory.api.cognition")),
    path("", include("memory.api.task_context")),
    path("", include("memory.api.decay")),
    path("", include("memory.api.digest")),
    path("", include("memory.api.memory")),
    path("", include("memory.api.store")),
    path("", include("memory.api.forget")),
]

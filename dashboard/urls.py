from django.contrib.auth import views as auth_views
from django.urls import path

from dashboard import traces, views

app_name = "dashboard"

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(template_name="dashboard/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.overview, name="overview"),
    path("tenant/switch", views.tenant_switch, name="tenant-switch"),
    path("sessions/", views.sessions_list, name="sessions"),
    path("sessions/<str:session_id>/", views.session_detail, name="session"),
    path("sessions/<str:session_id>/messages", views.session_messages, name="session-messages"),
    # A user id is the tenant's own string, slashes included.
    path("users/<path:user_id>/forget", views.user_forget, name="user-forget"),
    path("users/<path:user_id>/", views.user_detail, name="user"),
    path("agents/", views.agents_list, name="agents"),
    path("agents/<str:external_id>/", views.agent_detail, name="agent"),
    path("agents/<str:external_id>/events", views.agent_events, name="agent-events"),
    path(
        "agents/<str:external_id>/checkpoints/<str:checkpoint_id>",
        views.agent_checkpoint,
        name="agent-checkpoint",
    ),
    path("agents/<str:external_id>/diff", views.agent_diff, name="agent-diff"),
    path("traces/<str:trace_id>/", traces.trace_detail, name="trace"),
    path("experiences/", views.experiences, name="experiences"),
    path("memory/search", views.memory_search, name="memory-search"),
    path("jobs/", views.jobs_page, name="jobs"),
    path("jobs/running", views.jobs_running, name="jobs-running"),
    path("jobs/<str:event_id>/retry", views.job_retry, name="job-retry"),
]

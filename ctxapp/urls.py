from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from ctxapp import health
from ctxapp.integrations import metrics

handler404 = "ctxapp.api_errors.handler404"
handler500 = "ctxapp.api_errors.handler500"

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/v1/", include("memory.api.urls")),
    path("", include("memory.api.otel")),  # OTLP/HTTP exporters post to <endpoint>/v1/traces
    path("", include("dashboard.urls")),
]

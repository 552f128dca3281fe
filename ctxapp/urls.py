from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from ctxapp import health, metrics

# /api/ is left out of the site-wide policy (it answers JSON); its one HTML page, Swagger UI, gets
# its own: the split view serves the page's script from its own URL, so no inline script runs.
# Swagger UI sets style attributes as it renders, hence 'unsafe-inline' for styles only.
API_DOCS_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; "
    "frame-ancestors 'none'"
)


class ApiDocsView(SpectacularSwaggerSplitView):
    schema = None  # the page that shows the schema is not an operation of it

    def get(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        response = super().get(request, *args, **kwargs)
        response["Content-Security-Policy"] = API_DOCS_POLICY
        return response


handler404 = "ctxapp.api_errors.handler404"
handler500 = "ctxapp.api_errors.handler500"

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", ApiDocsView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/v1/", include("memory.api.urls")),
    path("", include("memory.api.otel")),  # OTLP/HTTP exporters post to <endpoint>/v1/traces
    path("", include("dashboard.urls")),
]

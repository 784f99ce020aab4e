from __future__ import annotations

from typing import Any

from django.conf import settings
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from accounts import api as accounts_api

from . import (  # noqa: F401 - schema registers the token auth scheme
    accounting,
    arrays,
    checkpoints,
    clusters,
    costs,
    jobs,
    quota_tree,
    reservations,
    resources,
    schema,
    sessions,
    starts,
    watch,
    webhooks,
)
from .errors import api_not_found
from .root import ApiRootView
from .views import FairShareView, JobViewSet

# The root of /api/v1/ is ours (queueing/api/root.py): DRF's lists only the router's.
router = DefaultRouter()
router.include_root_view = False
router.register("jobs", JobViewSet, basename="job")

def _fast_submit() -> list[Any]:
    """`jobs/` through the submit fast path (queueing/api/jobs.py), in front of the
    router's own `jobs/` (kept: the schema and `reverse` read it); FAIRQ_FAST_SUBMIT off:
    the router's alone."""
    if not settings.FAIRQ_FAST_SUBMIT:
        return []
    drf_view = next(p.callback for p in router.urls if getattr(p, "name", "") == "job-list")
    assert drf_view is not None
    return [path("jobs/", jobs.jobs_view(drf_view))]


urlpatterns = [
    path("", ApiRootView.as_view(), name="api-root"),
    # Before the router: its jobs/{id}/ would take "stream" and "starts" for ids.
    path("jobs/stream/", watch.JobStreamView.as_view(), name="job-stream"),
    path("jobs/starts/", starts.JobStartsView.as_view(), name="job-starts"),
    *_fast_submit(),
    path("jobs/<int:job_id>/checkpoints/", checkpoints.JobCheckpointsView.as_view(),
         name="job-checkpoints"),
    path("", include(router.urls)),
    path("fairshare/", FairShareView.as_view(), name="fairshare"),
    path("sessions/", sessions.SessionListView.as_view(), name="session-list"),
    path("sessions/<int:session_id>/", sessions.SessionDetailView.as_view(),
         name="session-detail"),
    path("reservations/", reservations.ReservationListView.as_view(), name="reservation-list"),
    path("reservations/earliest/", reservations.ReservationEarliestView.as_view(),
         name="reservation-earliest"),
    path("reservations/<int:reservation_id>/", reservations.ReservationDetailView.as_view(),
         name="reservation-detail"),
    path("reservations/<int:reservation_id>/cancel/", reservations.ReservationCancelView.as_view(),
         name="reservation-cancel"),
    path("arrays/<int:array_id>/", arrays.ArrayDetailView.as_view(), name="array-detail"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view: its script is a file (docs/?script), as the CSP requires.
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="docs"),
    path("teams/", accounts_api.TeamListView.as_view(), name="team-list"),
    path("teams/<slug:slug>/", accounts_api.TeamDetailView.as_view(), name="team-detail"),
    path("teams/<slug:slug>/resources/", accounts_api.TeamResourcesView.as_view(),
         name="team-resources"),
    path("teams/<slug:slug>/workload-policy/", accounts_api.TeamResourcesView.as_view(),
         name="team-workload-policy"),
    path("teams/<slug:slug>/members/", accounts_api.MembershipListView.as_view(),
         name="membership-list"),
    path("teams/<slug:slug>/members/<str:username>/", accounts_api.MembershipDetailView.as_view(),
         name="membership-detail"),
    path("teams/<slug:slug>/webhooks/", webhooks.WebhookListView.as_view(), name="webhook-list"),
    path("teams/<slug:slug>/webhooks/notify-secret/", webhooks.NotifySecretView.as_view(),
         name="webhook-notify-secret"),
    path("teams/<slug:slug>/webhooks/notify-deliveries/",
         webhooks.NotifyDeliveryListView.as_view(), name="webhook-notify-deliveries"),
    path("teams/<slug:slug>/webhooks/<int:webhook_id>/", webhooks.WebhookDetailView.as_view(),
         name="webhook-detail"),
    path("teams/<slug:slug>/webhooks/<int:webhook_id>/deliveries/",
         webhooks.WebhookDeliveryListView.as_view(), name="webhook-deliveries"),
    path("teams/<slug:slug>/webhooks/<int:webhook_id>/rotate-secret/",
         webhooks.WebhookRotateSecretView.as_view(), name="webhook-rotate-secret"),
    path("teams/<slug:slug>/webhooks/<int:webhook_id>/test/", webhooks.WebhookTestView.as_view(),
         name="webhook-test"),
    path("tokens/", accounts_api.TokenListView.as_view(), name="token-list"),
    path("tokens/<int:token_id>/", accounts_api.TokenDetailView.as_view(), name="token-detail"),
    path("quotas/", resources.QuotaListView.as_view(), name="quota-list"),
    path("quotas/<int:quota_id>/", resources.QuotaDetailView.as_view(), name="quota-detail"),
    path("quota-tree/", quota_tree.QuotaTreeView.as_view(), name="quota-tree"),
    path("tiers/", resources.TierListView.as_view(), name="tier-list"),
    path("gpu-types/", resources.GpuTypeListView.as_view(), name="gputype-list"),
    path("gpu-types/<slug:slug>/", resources.GpuTypeDetailView.as_view(),
         name="gputype-detail"),
    path("usage/", resources.UsageView.as_view(), name="usage"),
    path("accounting/", accounting.AccountingView.as_view(), name="accounting"),
    path("costs/", costs.CostView.as_view(), name="costs"),
    path("gpu-prices/", costs.GpuPriceListView.as_view(), name="gpuprice-list"),
    path("gpu-prices/<int:price_id>/", costs.GpuPriceDetailView.as_view(), name="gpuprice-detail"),
    path("budgets/", costs.BudgetListView.as_view(), name="budget-list"),
    path("budgets/<slug:slug>/", costs.BudgetDetailView.as_view(), name="budget-detail"),
    path("capacity/", resources.CapacityView.as_view(), name="capacity"),
    path("clusters/", clusters.ClusterListView.as_view(), name="cluster-list"),
    path("clusters/<slug:name>/", clusters.ClusterDetailView.as_view(), name="cluster-detail"),
    path("clusters/<slug:name>/pools/", clusters.NodePoolListView.as_view(),
         name="nodepool-list"),
    path("clusters/<slug:name>/pools/<slug:pool>/", clusters.NodePoolDetailView.as_view(),
         name="nodepool-detail"),
    # Anything else under /api/v1/ answers in the API's error shape, not an HTML page.
    re_path(r"^[\s\S]*$", api_not_found, name="api-not-found"),
]

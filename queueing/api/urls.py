from __future__ import annotations

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import DefaultRouter

from .views import FairShareView, JobViewSet

router = DefaultRouter()
router.register("jobs", JobViewSet, basename="job")

urlpatterns = [
    path("", include(router.urls)),
    path("fairshare/", FairShareView.as_view(), name="fairshare"),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
]

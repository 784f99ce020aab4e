"""Routes of the web pages (namespace `web`)."""

from __future__ import annotations

from django.urls import path

from . import reports, reservations, sessions, views

app_name = "web"

urlpatterns = [
    path("", views.home, name="home"),
    path("team/switch/", views.team_switch, name="team-switch"),
    path("jobs/", views.job_list, name="jobs"),
    path("jobs/new/", views.job_new, name="job-new"),
    path("jobs/new/check/", views.job_check, name="job-check"),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel_view, name="job-cancel"),
    path("jobs/<int:job_id>/resubmit/", views.job_resubmit, name="job-resubmit"),
    path("sessions/new/", sessions.session_new, name="session-new"),
    path("sessions/<int:job_id>/", sessions.session_page, name="session"),
    path("sessions/<int:job_id>/stop/", sessions.session_stop_view, name="session-stop"),
    path("teams/<slug:slug>/", views.team_page, name="team"),
    path("teams/<slug:slug>/resources/", views.team_resources_update, name="team-resources"),
    path("teams/<slug:slug>/workload-policy/", views.team_workload_policy_update,
         name="team-workload-policy"),
    path("teams/<slug:slug>/cancel-rule/", views.team_cancel_rule_update,
         name="team-cancel-rule"),
    path("teams/<slug:slug>/members/", views.team_member_add, name="team-member-add"),
    path("teams/<slug:slug>/members/<int:membership_id>/", views.team_member_change,
         name="team-member-change"),
    path("teams/<slug:slug>/tokens/", views.token_create, name="token-create"),
    path("teams/<slug:slug>/tokens/<int:token_id>/revoke/", views.token_revoke_view,
         name="token-revoke"),
    path("teams/<slug:slug>/webhooks/", views.webhook_create_view, name="webhook-create"),
    path("teams/<slug:slug>/webhooks/<int:endpoint_id>/", views.webhook_change_view,
         name="webhook-change"),
    path("reports/", reports.reports_page, name="reports"),
    path("reservations/", reservations.reservations_page, name="reservations"),
    path("reservations/<int:reservation_id>/cancel/", reservations.reservation_cancel_view,
         name="reservation-cancel"),
    path("quotas/", views.quota_board, name="quotas"),
    path("cluster/", views.cluster_page, name="cluster"),
    path("weights/<slug:team_slug>/", views.team_weight, name="team-weight"),
    path("parents/<slug:team_slug>/", views.team_parent, name="team-parent"),
    path("quotas/<slug:team_slug>/<slug:gpu_slug>/", views.quota_cell, name="quota-cell"),
]

"""API v1: GPU prices (read; staff write), team budgets (read; staff write) and costs per
team or department and day or month, as JSON or as finance's CSV (docs/api.md, "Cost")."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.selectors import all_teams, teams_for_user
from queueing.errors import NotFound
from queueing.models import BudgetPolicy, GpuPrice
from queueing.selectors.budgets import budget_statuses, team_budget_by_slug
from queueing.selectors.costs import (
    PERIODS,
    bucket_as_dict,
    by_department,
    cost_buckets,
    costs_write_csv,
    currency,
    gpu_price_by_id,
    gpu_prices_listed,
)
from queueing.selectors.reference import all_gpu_types
from queueing.services.access import check_staff
from queueing.services.costs import (
    gpu_price_delete,
    gpu_price_set,
    team_budget_delete,
    team_budget_set,
)

from .fields import InstantField
from .location import location
from .scope import teams_asked
from .strict import StrictFieldsMixin

MAX_DAYS = {"day": 400, "month": 3700}  # one request's range per period


class GpuPriceSerializer(StrictFieldsMixin, serializers.ModelSerializer[GpuPrice]):
    gpu_type = serializers.SlugRelatedField(slug_field="slug", queryset=all_gpu_types())
    price_per_gpu_hour = serializers.DecimalField(max_digits=12, decimal_places=4,
                                                  min_value=Decimal(0))
    effective_from = serializers.DateField(help_text="The first UTC day at this price.")
    currency = serializers.SerializerMethodField()

    class Meta:
        model = GpuPrice
        fields = ["id", "gpu_type", "price_per_gpu_hour", "currency", "effective_from"]
        read_only_fields = ["id", "currency"]
        validators: list[Any] = []  # gpu_price_set upserts (gpu_type, effective_from)

    def get_currency(self, obj: GpuPrice) -> str:
        return currency()


class GpuPriceListView(APIView):
    """Prices per GPU type and hour, each from a UTC day until the type's next one
    (rule C1). Everyone signed in reads them; staff set them (one per type and day:
    posting an existing day changes its price)."""

    @extend_schema(responses=GpuPriceSerializer(many=True))
    def get(self, request: Request) -> Response:
        """List the GPU prices per type and UTC day they start (rule C1), with the
        currency."""
        prices = gpu_prices_listed()
        return Response(GpuPriceSerializer(prices, many=True).data)

    @extend_schema(request=GpuPriceSerializer,
                   responses={201: GpuPriceSerializer, 200: GpuPriceSerializer})
    def post(self, request: Request) -> Response:
        """Set a GPU type's price from a UTC day on (staff): 201 new with `Location`,
        200 when that day's price changed. Audited."""
        check_staff(actor=request.user, doing="set GPU prices")
        s = GpuPriceSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        d = s.validated_data
        price, created = gpu_price_set(actor=request.user, gpu_type=d["gpu_type"],
                                       effective_from=d["effective_from"],
                                       price_per_gpu_hour=d["price_per_gpu_hour"])
        return Response(GpuPriceSerializer(price).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
                        headers=location("gpuprice-detail", price_id=price.pk) if created else None)


class GpuPriceDetailView(APIView):
    @extend_schema(responses={204: None})
    def delete(self, request: Request, price_id: int) -> Response:
        """Delete a GPU price (staff); the days it priced fall back to the type's
        previous price (or unpriced). Audited."""
        check_staff(actor=request.user, doing="delete GPU prices")
        price = gpu_price_by_id(price_id=price_id)
        if price is None:
            raise NotFound(f"price {price_id} not found")
        gpu_price_delete(actor=request.user, price=price)
        return Response(status=status.HTTP_204_NO_CONTENT)


class BudgetSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    team = serializers.SlugRelatedField(slug_field="slug", queryset=all_teams())
    monthly_amount = serializers.DecimalField(max_digits=14, decimal_places=2,
                                              min_value=Decimal("0.01"))
    policy = serializers.ChoiceField(choices=BudgetPolicy.values, default=BudgetPolicy.NONE)


class BudgetStatusSerializer(serializers.Serializer[Any]):
    team = serializers.CharField()
    monthly_amount = serializers.DecimalField(max_digits=14, decimal_places=2, source="amount")
    policy = serializers.CharField()
    currency = serializers.CharField()
    month = serializers.DateTimeField()
    cost = serializers.DecimalField(max_digits=14, decimal_places=2,
                                    help_text="This UTC month so far (rule B1)")
    used_ratio = serializers.FloatField(source="ratio")
    warned = serializers.ListField(child=serializers.IntegerField(),
                                   help_text="Warning levels given this month (rule B2)")


class BudgetListView(APIView):
    """Monthly team budgets with this month's cost (rules B1-B3): team members read their
    teams', staff every team's and set them (posting a team with one changes it)."""

    @extend_schema(responses=BudgetStatusSerializer(many=True))
    def get(self, request: Request) -> Response:
        """List the monthly budgets of the caller's teams (every team for staff) with
        this month's cost and how much of it is used (rules B1-B2)."""
        rows = budget_statuses(now=timezone.now(), teams=teams_for_user(user=request.user))
        return Response(BudgetStatusSerializer(rows, many=True).data)

    @extend_schema(request=BudgetSerializer,
                   responses={201: BudgetStatusSerializer, 200: BudgetStatusSerializer})
    def post(self, request: Request) -> Response:
        """Set a team's monthly budget and policy (staff; rule B3's `downgrade` or
        `none`): 201 new with `Location`, 200 changed. Audited."""
        check_staff(actor=request.user, doing="set team budgets")
        s = BudgetSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        d = s.validated_data
        budget, created = team_budget_set(actor=request.user, team=d["team"],
                                          monthly_amount=d["monthly_amount"],
                                          policy=d["policy"])
        (row,) = budget_statuses(now=timezone.now(), teams=[budget.team])
        return Response(BudgetStatusSerializer(row).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
                        headers=location("budget-detail", slug=budget.team.slug) if created else None)


class BudgetDetailView(APIView):
    @extend_schema(responses={204: None})
    def delete(self, request: Request, slug: str) -> Response:
        """Delete a team's budget (staff): no more warnings or downgrades for it.
        Audited."""
        check_staff(actor=request.user, doing="delete team budgets")
        budget = team_budget_by_slug(slug=slug)
        if budget is None:
            raise NotFound(f"team {slug} has no budget")
        team_budget_delete(actor=request.user, budget=budget)
        return Response(status=status.HTTP_204_NO_CONTENT)


class CostQuerySerializer(serializers.Serializer[Any]):
    team = serializers.CharField(required=False, max_length=40)
    from_ = InstantField(required=False)
    to = InstantField(required=False)
    period = serializers.ChoiceField(choices=PERIODS, default="month")
    group = serializers.ChoiceField(choices=("team", "department"), default="team")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["from"] = self.fields.pop("from_")  # `from` is a keyword

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        now = timezone.now()
        end: datetime = attrs.get("to") or now
        start: datetime | None = attrs.pop("from_", None) or attrs.get("from")
        if start is None:  # this month (UTC) for months, the last 30 days for days
            start = (end.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
                     if attrs["period"] == "month" else end - timedelta(days=30))
        if start >= end:
            raise serializers.ValidationError({"from": ["Must be before 'to'."]})
        if (end - start).days > MAX_DAYS[attrs["period"]]:
            raise serializers.ValidationError({"from": [
                f"At most {MAX_DAYS[attrs['period']]} days per request by {attrs['period']}."]})
        attrs["from"], attrs["to"] = start, end
        return attrs


class CostRowSerializer(serializers.Serializer[Any]):
    period = serializers.DateField(help_text="The UTC day, or the first day of the month")
    team = serializers.CharField(help_text="The team, or the department with group=department")
    department = serializers.CharField(help_text="The team's parent (itself without one)")
    gpu_type = serializers.CharField()
    allocated_gpu_hours = serializers.FloatField()
    used_gpu_hours = serializers.FloatField(help_text="allocated × mean SM activity")
    idle_gpu_hours = serializers.FloatField(help_text="paid but idle (rule C3)")
    preempted_gpu_hours = serializers.FloatField(help_text="of attempts that ended preempted")
    unpriced_gpu_hours = serializers.FloatField(help_text="before the type's first price")
    cost = serializers.DecimalField(max_digits=16, decimal_places=2)
    idle_cost = serializers.DecimalField(max_digits=16, decimal_places=2)
    currency = serializers.CharField()
    spot_gpu_hours = serializers.FloatField(
        help_text="of allocated_gpu_hours: attempts on spot nodes (rule C4)")
    spot_cost = serializers.DecimalField(
        max_digits=16, decimal_places=2,
        help_text="of cost: those spot GPU-hours, at their pools' prices (rule C4)")
    lost_gpu_hours = serializers.FloatField(
        help_text="the work the period's preemptions lost: each victim's GPUs x the time "
                  "from its newest checkpoint (or start) to the preemption (0: every "
                  "victim had just checkpointed)")


class CsvRenderer(BaseRenderer):
    """`?format=csv`: the view hands over the finished CSV text (an error is rendered as
    JSON, with its content type, by `CostView.finalize_response`)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: Any = None) -> bytes:
        if isinstance(data, str):
            return data.encode()
        return json.dumps(data).encode()


class CostView(APIView):
    """GPU-hours and cost per team (or department: `group=department`), period (a UTC
    `day` or `month`) and GPU type over [from, to), rules C1-C4 (spot GPU-hours and their
    cost apart); team members see their
    teams, staff every team. `?format=csv` is finance's export (the columns of
    `manage.py export_costs`)."""

    renderer_classes = [JSONRenderer, CsvRenderer]

    def finalize_response(self, request: Request, response: Any, *args: Any,
                          **kwargs: Any) -> Any:
        """Errors in the API's one JSON shape, with its content type, `?format=csv` or
        not (a 401 or 400 is no CSV)."""
        if getattr(response, "exception", False):
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(
        parameters=[
            OpenApiParameter("team", str),
            OpenApiParameter("from", str, description="ISO 8601 instant with an offset "
                             "(default: the start of this UTC month, or 30 days back by day)"),
            OpenApiParameter("to", str, description="exclusive (default: now)"),
            OpenApiParameter("period", str, enum=list(PERIODS), default="month"),
            OpenApiParameter("group", str, enum=["team", "department"], default="team"),
            OpenApiParameter("format", str, enum=["json", "csv"]),
        ],
        responses={200: OpenApiResponse(inline_serializer("Costs", {
            "from": serializers.DateTimeField(), "to": serializers.DateTimeField(),
            "period": serializers.CharField(), "group": serializers.CharField(),
            "currency": serializers.CharField(),
            "rows": CostRowSerializer(many=True),
        }))},
    )
    def get(self, request: Request) -> Response:
        q = CostQuerySerializer(data=request.query_params)
        q.is_valid(raise_exception=True)
        d = q.validated_data
        teams = teams_asked(user=request.user, slug=d.get("team"))
        buckets = cost_buckets(teams=teams, start=d["from"], end=d["to"], period=d["period"],
                               now=timezone.now())
        if d["group"] == "department":
            buckets = by_department(buckets)
        if request.accepted_renderer.format == "csv":
            out = io.StringIO()
            costs_write_csv(out=out, buckets=buckets)
            name = f"fairq-costs-{_day(d['from'])}-{_day(d['to'])}.csv"
            return Response(out.getvalue(), headers={
                "Content-Disposition": f'attachment; filename="{name}"'})
        return Response({"from": d["from"], "to": d["to"], "period": d["period"],
                         "group": d["group"], "currency": currency(),
                         "rows": [bucket_as_dict(b) for b in buckets]})


def _day(when: datetime) -> str:
    return when.astimezone(UTC).date().isoformat()

"""API v1: teams, memberships (team admins manage them) and the caller's API tokens.

Thin views: validate, call one service or selector, serialize. Teams another user cannot
see answer 404 (queueing.services.access.check_team_member is the choke-point)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queueing import validation as v
from queueing.api.idempotency import IdempotentPostMixin
from queueing.api.location import location
from queueing.api.strict import StrictFieldsMixin
from queueing.errors import NotFound
from queueing.selectors.reference import all_tiers
from queueing.services.access import check_staff, check_team_admin, check_team_member
from queueing.services.tiers import team_change, team_granted_tier_slugs

from .models import TEAM_FLAVOR_FALLBACK_CHOICES, ApiToken, Membership, Role, Team
from .selectors import (
    active_user_by_username,
    all_teams,
    membership_of_team_by_username,
    memberships_of_team,
    roles_of_user,
    team_slug_taken,
    teams_with_grants_for_user,
    token_of_user,
    tokens_of_user,
)
from .services import (
    KEY_SHOWN_ONCE,
    TEAM_ADMIN_FIELDS,
    membership_remove,
    membership_set,
    team_create,
    team_resources,
    team_resources_set,
    token_issue,
    token_revoke,
)

# --- teams ---------------------------------------------------------------------------


class TeamSerializer(StrictFieldsMixin, serializers.ModelSerializer[Team]):
    parent = serializers.SlugRelatedField(  # type: ignore[assignment] # Field.parent, not ours
        slug_field="slug", queryset=all_teams(), required=False, allow_null=True)
    role = serializers.SerializerMethodField(help_text="The caller's role in the team, if any.")
    granted_tiers = serializers.SerializerMethodField(
        help_text="Tiers granted to the team besides those open to every team (rule T1).")
    resources = serializers.SerializerMethodField(
        help_text="Its workload policy: per-replica defaults and maxima of its jobs' "
                  "resources and the PVCs, Secrets and pull secrets they may name "
                  "(GET/PATCH /teams/{slug}/workload-policy/).")

    class Meta:
        model = Team
        fields = ["slug", "name", "weight", "parent", "run_as_non_root",
                  "any_member_may_cancel", "flavor_fallback", "granted_tiers", "resources",
                  "role", "created_at"]
        read_only_fields = ["created_at", "role", "granted_tiers", "resources"]

    def get_role(self, team: Team) -> str | None:
        roles: dict[int, str] = self.context.get("roles", {})
        return roles.get(team.pk)

    def get_resources(self, team: Team) -> dict[str, Any]:
        return team_resources(team)

    def get_granted_tiers(self, team: Team) -> list[str]:

        return team_granted_tier_slugs(team)


class TeamUpdateSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    name = serializers.CharField(max_length=200, required=False)
    weight = serializers.FloatField(min_value=0.0001, max_value=1e9, required=False)
    parent = serializers.SlugRelatedField(  # type: ignore[assignment] # Field.parent, not ours
        slug_field="slug", queryset=all_teams(), required=False, allow_null=True)
    run_as_non_root = serializers.BooleanField(required=False)
    any_member_may_cancel = serializers.BooleanField(
        required=False, help_text="Every member may cancel any job of the team; off: only "
        "the job's submitter, the team's admins and staff may. Team admins may change it.")
    granted_tiers = serializers.SlugRelatedField(
        slug_field="slug", queryset=all_tiers(), many=True, required=False,
        help_text="Replaces the team's tier grants (rule T1).")
    flavor_fallback = serializers.ChoiceField(
        choices=TEAM_FLAVOR_FALLBACK_CHOICES, required=False, allow_blank=True,
        help_text="Its jobs accepting several GPU types, when a preferred type has room "
                  "only by borrowing: borrow there first, or try the next type's own quota "
                  "first (next_type); \"\": each tier's setting. Team admins may change it.")


def _roles(request: Request) -> dict[int, str]:
    user: Any = request.user
    return roles_of_user(user=user)


class TeamListView(IdempotentPostMixin, APIView):
    """Teams the caller belongs to (every team for staff); staff create teams."""

    @extend_schema(responses=TeamSerializer(many=True))
    def get(self, request: Request) -> Response:
        """List the teams the caller belongs to (every team for staff), with the
        caller's role in each."""
        teams = teams_with_grants_for_user(user=request.user)
        return Response(TeamSerializer(teams, many=True, context={"roles": _roles(request)}).data)

    @extend_schema(request=TeamSerializer, responses={201: TeamSerializer})
    def post(self, request: Request) -> Response:
        """Create a team (staff): slug, name, weight, parent; 201 with `Location`.
        Audited."""
        check_staff(actor=request.user)
        s = TeamSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        if team_slug_taken(slug=s.validated_data["slug"]):
            raise serializers.ValidationError({"slug": ["A team with this slug exists."]})
        team = team_create(actor=request.user, slug=s.validated_data["slug"],
                           name=s.validated_data["name"],
                           weight=s.validated_data.get("weight", 1.0),
                           parent=s.validated_data.get("parent"),
                           run_as_non_root=s.validated_data.get("run_as_non_root", True))
        return Response(TeamSerializer(team, context={"roles": {}}).data,
                        status=status.HTTP_201_CREATED,
                        headers=location("team-detail", slug=team.slug))


class TeamDetailView(IdempotentPostMixin, APIView):
    @extend_schema(responses=TeamSerializer)
    def get(self, request: Request, slug: str) -> Response:
        """Read one team the caller belongs to (any team for staff): weight, parent,
        granted tiers, workload policy and the caller's role."""
        team = check_team_member(actor=request.user, slug=slug)
        return Response(TeamSerializer(team, context={"roles": _roles(request)}).data)

    @extend_schema(request=TeamUpdateSerializer, responses=TeamSerializer)
    def patch(self, request: Request, slug: str) -> Response:
        """Change a team (staff): name, weight, parent (never itself or a descendant:
        rule F4), `run_as_non_root` and its tier grants (rule T1); and (a team admin of
        the team too) `any_member_may_cancel`: who may cancel its jobs, and
        `flavor_fallback`: how its jobs of several GPU types fall back. Audited."""
        team = check_team_member(actor=request.user, slug=slug)
        s = TeamUpdateSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        if set(s.validated_data) - TEAM_ADMIN_FIELDS:
            check_staff(actor=request.user)
        parent = s.validated_data.get("parent")
        if parent is not None and parent.pk == team.pk:
            raise serializers.ValidationError({"parent": ["A team cannot be its own parent."]})
        fields = dict(s.validated_data)
        grants = fields.pop("granted_tiers", None)
        team = team_change(actor=request.user, team=team, fields=fields, grants=grants)
        return Response(TeamSerializer(team, context={"roles": _roles(request)}).data)


# --- resource defaults and maxima ---------------------------------------------------


def _team_quantity(help_text: str) -> serializers.CharField:
    return serializers.CharField(max_length=v.MAX_QUANTITY_LEN, required=False,
                                 allow_null=True, allow_blank=True, help_text=help_text)


def _allowlist(help_text: str) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.CharField(max_length=v.MAX_DNS_SUBDOMAIN_LEN),
        max_length=v.MAX_ALLOWLIST, required=False, help_text=help_text)


# Shapes only: whether each is a quantity, and default <= maximum, and each allowlist's
# names, are team_resources_set's.
class TeamResourcesSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """Per replica, as Kubernetes quantities; null: no default / no maximum. A job that
    names no cpu, memory, ephemeral storage or shm size gets the default; one above the
    maximum is refused at submit (400)."""

    default_cpu = _team_quantity('e.g. "4", "500m".')
    max_cpu = _team_quantity('e.g. "64".')
    default_memory = _team_quantity('e.g. "16Gi".')
    max_memory = _team_quantity('e.g. "512Gi".')
    default_ephemeral_storage = _team_quantity('e.g. "20Gi".')
    max_ephemeral_storage = _team_quantity('e.g. "500Gi".')
    default_shm_size = _team_quantity('Size of /dev/shm, e.g. "8Gi".')
    max_shm_size = _team_quantity('e.g. "128Gi".')
    allowed_pvcs = _allowlist("PersistentVolumeClaims of the team's namespace its jobs may "
                              'mount (volumes[].pvc), e.g. ["imagenet"]; replaces the list.')
    allowed_secrets = _allowlist("Secrets of the team's namespace its jobs may read "
                                 "(secrets[].secret); replaces the list.")
    allowed_pull_secrets = _allowlist("Image pull secrets of the team's namespace its jobs "
                                      "may name (image_pull_secret); replaces the list.")
    allowed_notify_url_prefixes = serializers.ListField(
        child=serializers.CharField(max_length=v.MAX_WEBHOOK_URL_LEN),
        max_length=v.MAX_NOTIFY_PREFIXES, required=False,
        help_text="URL prefixes its jobs' notify_url may start with, each ending with '/', "
                  'e.g. ["https://ci.example.com/hooks/"] (docs/webhooks.md); replaces the '
                  "list.")


class TeamResourcesView(IdempotentPostMixin, APIView):
    """The team's workload policy (GET/PATCH /teams/{slug}/workload-policy/, also served
    at /resources/): its jobs' resource defaults and maxima, and the PVCs, Secrets and
    pull secrets of its namespace they may name. Members read it, team admins and staff
    change it (audited)."""

    @extend_schema(responses=TeamResourcesSerializer)
    def get(self, request: Request, slug: str) -> Response:
        """Read the team's workload policy (members): per-replica resource defaults and
        maxima, and the PVCs, Secrets and pull secrets its jobs may name."""
        team = check_team_member(actor=request.user, slug=slug)
        return Response(team_resources(team))

    @extend_schema(request=TeamResourcesSerializer, responses=TeamResourcesSerializer)
    def patch(self, request: Request, slug: str) -> Response:
        """Change the team's workload policy (team admins and staff); fields left out
        keep their value. Audited."""
        team = check_team_member(actor=request.user, slug=slug)
        check_team_admin(actor=request.user, team=team)
        s = TeamResourcesSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        team = team_resources_set(actor=request.user, team=team, **s.validated_data)
        return Response(team_resources(team))


# --- memberships ---------------------------------------------------------------------


class MembershipSerializer(StrictFieldsMixin, serializers.ModelSerializer[Membership]):
    username = serializers.CharField(source="user.username")
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)

    class Meta:
        model = Membership
        fields = ["username", "role", "created_at"]
        read_only_fields = ["created_at"]


class RoleSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    role = serializers.ChoiceField(choices=Role.choices)


def _user_or_400(username: str) -> Any:
    user = active_user_by_username(username=username)
    if user is None:
        raise serializers.ValidationError({"username": [f"No active user {username!r}."]})
    return user


class MembershipListView(IdempotentPostMixin, APIView):
    """Members of a team (visible to its members); team admins add members."""

    @extend_schema(responses=MembershipSerializer(many=True))
    def get(self, request: Request, slug: str) -> Response:
        """List a team's members and their roles (visible to the team's members)."""
        team = check_team_member(actor=request.user, slug=slug)
        return Response(MembershipSerializer(memberships_of_team(team=team), many=True).data)

    @extend_schema(request=MembershipSerializer,
                   responses={201: MembershipSerializer, 200: MembershipSerializer})
    def post(self, request: Request, slug: str) -> Response:
        """Add a member or change a member's role (team admins and staff): 201 new with
        `Location`, 200 changed. Audited."""
        team = check_team_member(actor=request.user, slug=slug)
        check_team_admin(actor=request.user, team=team)
        s = MembershipSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        user = _user_or_400(s.validated_data["user"]["username"])
        membership, created = membership_set(actor=request.user, team=team, user=user,
                                             role=s.validated_data["role"])
        return Response(MembershipSerializer(membership).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
                        headers=location("membership-detail", slug=team.slug,
                                         username=user.get_username()) if created else None)


class MembershipDetailView(IdempotentPostMixin, APIView):
    # The membership rules (a team keeps its last team admin) are the services':
    # their Conflict answers 409 through the one error handler.

    def _membership(self, request: Request, slug: str, username: str) -> Membership:
        team = check_team_member(actor=request.user, slug=slug)
        membership = membership_of_team_by_username(team=team, username=username)
        if membership is None:
            raise NotFound(f"{username} is not a member of {slug}")
        return membership

    @extend_schema(responses=MembershipSerializer)
    def get(self, request: Request, slug: str, username: str) -> Response:
        """Read one member's role in the team."""
        return Response(MembershipSerializer(self._membership(request, slug, username)).data)

    @extend_schema(request=RoleSerializer, responses=MembershipSerializer)
    def patch(self, request: Request, slug: str, username: str) -> Response:
        """Change one member's role (team admins and staff); a team keeps its last team
        admin (409 otherwise). Audited."""
        membership = self._membership(request, slug, username)
        check_team_admin(actor=request.user, team=membership.team)
        s = RoleSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        membership, _ = membership_set(actor=request.user, team=membership.team,
                                       user=membership.user, role=s.validated_data["role"])
        return Response(MembershipSerializer(membership).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, slug: str, username: str) -> Response:
        """Remove a member (team admins and staff; a team admin may remove themselves,
        not the last one: 409). Audited."""
        membership = self._membership(request, slug, username)
        check_team_admin(actor=request.user, team=membership.team)
        membership_remove(actor=request.user, membership=membership)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- tokens --------------------------------------------------------------------------


class TokenSerializer(serializers.ModelSerializer[ApiToken]):
    active = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "expires_at", "revoked_at",
                  "last_used_at", "active"]
        read_only_fields = fields

    def get_active(self, token: ApiToken) -> bool:
        return token.is_active(timezone.now())


class TokenCreateSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    name = serializers.CharField(max_length=100, default="default")
    # Absent: FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS (TokenListView.post); null: never expires.
    expires_in_days = serializers.IntegerField(min_value=1, max_value=3650, required=False,
                                               allow_null=True, default=None)


KEY_SHOWN_NOW = "Copy the key now: it is shown only in this answer."


class IssuedTokenSerializer(TokenSerializer):
    key = serializers.CharField(
        allow_null=True,
        help_text="The secret: in the 201 that created the token only; null in a replay "
                  "(same Idempotency-Key).")
    message = serializers.CharField(help_text="Whether this answer holds the key.")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "key", "message"]
        read_only_fields = fields


class TokenListView(IdempotentPostMixin, APIView):
    """The caller's own API tokens (never their secrets); issuing returns the key once."""

    def idempotent_body(self, data: Any, status_code: int) -> Any:
        """A replay of the creation: the token without its key (docs/api.md)."""
        if isinstance(data, dict) and "key" in data:
            return {**data, "key": None, "message": KEY_SHOWN_ONCE}
        return data

    @extend_schema(responses=TokenSerializer(many=True))
    def get(self, request: Request) -> Response:
        """List the caller's own API tokens: name, prefix, expiry, last use; never their
        secrets."""
        return Response(TokenSerializer(tokens_of_user(user=request.user), many=True).data)

    @extend_schema(request=TokenCreateSerializer, responses={201: IssuedTokenSerializer})
    def post(self, request: Request) -> Response:
        """Issue an API token for the caller: the 201 carries its key, shown this once,
        and `Location`."""
        s = TokenCreateSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        days = s.validated_data["expires_in_days"]
        if "expires_in_days" not in request.data:  # absent, not null: the default lifetime
            days = settings.FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS or None
        user: Any = request.user
        issued = token_issue(user=user, name=s.validated_data["name"],
                             expires_at=timezone.now() + timedelta(days=days) if days else None)
        data = dict(TokenSerializer(issued.token).data)
        data["key"] = issued.key
        data["message"] = KEY_SHOWN_NOW
        return Response(data, status=status.HTTP_201_CREATED,
                        headers=location("token-detail", token_id=issued.token.pk))


class TokenDetailView(IdempotentPostMixin, APIView):
    def _token(self, request: Request, token_id: int) -> ApiToken:
        token = token_of_user(user=request.user, token_id=token_id)
        if token is None:
            raise NotFound(f"token {token_id} not found")
        return token

    @extend_schema(responses=TokenSerializer)
    def get(self, request: Request, token_id: int) -> Response:
        """Read one of the caller's tokens (never its secret)."""
        return Response(TokenSerializer(self._token(request, token_id)).data)

    # 200 with the revoked token (a bare `responses=` documented DELETE's default, 204).
    @extend_schema(responses={200: TokenSerializer},
                   description="Revoke the token (it stays listed).")
    def delete(self, request: Request, token_id: int) -> Response:
        token = self._token(request, token_id)
        actor: Any = request.user
        token_revoke(token=token, actor=actor)
        return Response(TokenSerializer(token).data)

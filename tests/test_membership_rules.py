"""The membership rules, owned by accounts.services and the same for the web, the API and
the admin: a team keeps its last team admin (for staff too); a team admin who is not the
last may remove themselves. Every change is audited; a refusal changes nothing."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from accounts import services
from accounts.models import AuditEntry, Membership, Role
from accounts.services import membership_remove, membership_set
from queueing.errors import Conflict
from tests.conftest import World
from tests.factories import MembershipFactory

LAST_ADMIN = "team vision would have no team admin; make someone else team-admin first"


def snapshot(world: World) -> list[tuple[str, str]]:
    return sorted(Membership.objects.filter(team=world.vision)
                  .values_list("user__username", "role"))


def login(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


# --- services ------------------------------------------------------------------------------


class TestServices:
    @pytest.mark.parametrize("who", ["admin", "staff"])
    def test_it_refuses_to_remove_the_last_team_admin(self, world: World, who: str) -> None:
        before, audits = snapshot(world), AuditEntry.objects.count()
        m = Membership.objects.get(team=world.vision, user=world.admin)
        with pytest.raises(Conflict, match=LAST_ADMIN):
            membership_remove(actor=getattr(world, who), membership=m)
        assert snapshot(world) == before
        assert AuditEntry.objects.count() == audits

    @pytest.mark.parametrize("who", ["admin", "staff"])
    def test_it_refuses_to_demote_the_last_team_admin(self, world: World, who: str) -> None:
        before, audits = snapshot(world), AuditEntry.objects.count()
        with pytest.raises(Conflict, match=LAST_ADMIN) as exc:
            membership_set(actor=getattr(world, who), team=world.vision, user=world.admin,
                           role=Role.MEMBER)
        assert exc.value.status_code == 409 and exc.value.code == "conflict"
        assert snapshot(world) == before
        assert AuditEntry.objects.count() == audits

    def test_a_team_admin_who_is_not_the_last_may_remove_themselves(self, world: World) -> None:
        membership_set(actor=world.admin, team=world.vision, user=world.member,
                       role=Role.TEAM_ADMIN)
        m = Membership.objects.get(team=world.vision, user=world.admin)
        membership_remove(actor=world.admin, membership=m)
        assert snapshot(world) == [("dave", "team-admin")]
        entry = AuditEntry.objects.filter(action="delete").get()
        assert entry.actor == world.admin and entry.object_id == str(m.pk)
        assert entry.changes == {"team": ["vision", None], "user": ["alice", None],
                                 "role": ["team-admin", None]}

    def test_a_team_admin_who_is_not_the_last_may_demote_themselves(self, world: World) -> None:
        MembershipFactory(team=world.vision, user=world.outsider, role=Role.TEAM_ADMIN)
        membership_set(actor=world.admin, team=world.vision, user=world.admin, role=Role.MEMBER)
        assert ("alice", "member") in snapshot(world)
        entry = AuditEntry.objects.filter(action="update").get()
        assert entry.actor == world.admin and entry.changes == {"role": ["team-admin", "member"]}

    def test_member_removal_works_and_is_audited(self, world: World) -> None:
        m = Membership.objects.get(team=world.vision, user=world.member)
        membership_remove(actor=world.admin, membership=m)
        assert snapshot(world) == [("alice", "team-admin")]
        entry = AuditEntry.objects.get(action="delete")
        assert entry.actor == world.admin and entry.object_type == "accounts.Membership"
        assert entry.changes["user"] == ["dave", None] and entry.changes["role"] == ["member", None]

    def test_a_team_without_a_team_admin_may_gain_and_lose_members(self, world: World) -> None:
        m, created = membership_set(actor=world.staff, team=world.speech, user=world.member,
                                    role=Role.MEMBER)
        assert created
        membership_remove(actor=world.staff, membership=m)
        assert not Membership.objects.filter(team=world.speech).exists()
        assert AuditEntry.objects.filter(object_type="accounts.Membership").count() == 2

    @pytest.mark.postgres
    @pytest.mark.django_db(transaction=True)
    def test_two_admins_demoting_each_other_at_once_leave_one(
        self, world: World, monkeypatch: Any
    ) -> None:
        """Each check passes on its own; the team-row lock makes the second wait for the
        first and see the outcome. The barrier holds the first inside its transaction
        until the second has had its chance to check (or times out if it is blocked)."""
        membership_set(actor=world.staff, team=world.vision, user=world.member,
                       role=Role.TEAM_ADMIN)
        barrier = threading.Barrier(2, timeout=3)
        check = services.membership_check_keeps_admin

        def checked_then_wait(**kwargs: Any) -> None:
            check(**kwargs)
            # A broken barrier means the other one is blocked on the lock: as it should be.
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()

        monkeypatch.setattr(services, "membership_check_keeps_admin", checked_then_wait)
        outcomes: list[str] = []

        def demote(actor: Any, target: Any) -> None:
            try:
                membership_set(actor=actor, team=world.vision, user=target, role=Role.MEMBER)
                outcomes.append("demoted")
            except Conflict:
                outcomes.append("conflict")
            finally:
                connection.close()

        threads = [threading.Thread(target=demote, args=(world.admin, world.member)),
                   threading.Thread(target=demote, args=(world.member, world.admin))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert sorted(outcomes) == ["conflict", "demoted"]
        assert Membership.objects.filter(team=world.vision, role=Role.TEAM_ADMIN).count() == 1


# --- web dashboard -------------------------------------------------------------------------


class TestWeb:
    def test_it_shows_the_refusal_to_remove_the_last_team_admin(self, world: World) -> None:
        before, audits = snapshot(world), AuditEntry.objects.count()
        m = Membership.objects.get(team=world.vision, user=world.admin)
        r = login(world.admin).post(f"/teams/vision/members/{m.pk}/", {"action": "remove"},
                                    follow=True)
        assert r.status_code == 200 and LAST_ADMIN in r.content.decode()
        assert snapshot(world) == before and AuditEntry.objects.count() == audits

    def test_it_shows_the_refusal_to_demote_the_last_team_admin(self, world: World) -> None:
        before, audits = snapshot(world), AuditEntry.objects.count()
        m = Membership.objects.get(team=world.vision, user=world.admin)
        r = login(world.staff).post(f"/teams/vision/members/{m.pk}/",
                                    {"action": "role", "role": "member"}, follow=True)
        assert r.status_code == 200 and LAST_ADMIN in r.content.decode()
        assert snapshot(world) == before and AuditEntry.objects.count() == audits

    def test_a_team_admin_who_is_not_the_last_may_leave(self, world: World) -> None:
        membership_set(actor=world.admin, team=world.vision, user=world.member,
                       role=Role.TEAM_ADMIN)
        c = login(world.admin)
        assert 'aria-label="Leave team vision"' in c.get("/teams/vision/").content.decode()
        m = Membership.objects.get(team=world.vision, user=world.admin)
        r = c.post(f"/teams/vision/members/{m.pk}/", {"action": "remove"})
        assert r.status_code == 302 and r["Location"] == "/"  # the team page is not hers now
        assert snapshot(world) == [("dave", "team-admin")]
        entry = AuditEntry.objects.get(action="delete", object_type="accounts.Membership")
        assert entry.actor == world.admin and entry.changes["user"] == ["alice", None]

"""factory_boy factories for the models tests need."""

from __future__ import annotations

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounts.models import Membership, Role, Team
from queueing.models import GpuType, Job, Quota, Tier
from queueing.policy.states import JobState


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.PostGenerationMethodCall("set_password", "pw")

    @factory.post_generation
    def _save(self, create: bool, extracted: object, **kwargs: object) -> None:
        if create:
            self.save()


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"team-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.title())
    weight = 1.0


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    team = factory.SubFactory(TeamFactory)
    role = Role.MEMBER


class GpuTypeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = GpuType
        django_get_or_create = ("slug",)

    slug = "h100"
    name = factory.LazyAttribute(lambda o: o.slug.upper())
    resource_name = "nvidia.com/gpu"
    billing_weight = 1.0


class TierFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tier
        django_get_or_create = ("slug",)

    slug = "normal"
    name = factory.LazyAttribute(lambda o: o.slug.title())
    rank = 100
    priority_class_name = factory.LazyAttribute(lambda o: f"fairq-{o.slug}")
    priority_value = factory.LazyAttribute(lambda o: o.rank * 10)
    preemptible = True
    min_runtime_seconds = 0
    open_to_all_teams = True  # rule T1: tests that need a closed tier close it


class QuotaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Quota

    team = factory.SubFactory(TeamFactory)
    gpu_type = factory.SubFactory(GpuTypeFactory)
    nominal = 8
    borrowing_limit = None


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    team = factory.SubFactory(TeamFactory)
    submitter = None
    name = factory.Sequence(lambda n: f"job-{n}")
    image = "ghcr.io/acme/train:1.4"
    command = factory.LazyFunction(lambda: ["python", "train.py"])
    args = factory.LazyFunction(list)
    env = factory.LazyFunction(dict)
    gpu_type = factory.SubFactory(GpuTypeFactory)
    gpus_per_replica = 1
    replicas = 1
    tier = factory.SubFactory(TierFactory)
    status = JobState.QUEUED
    created_at = factory.LazyFunction(timezone.now)
    updated_at = factory.LazyFunction(timezone.now)

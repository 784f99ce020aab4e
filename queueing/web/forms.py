"""Forms of the web pages. Job validation is `job_input_build`'s (the rules the API
applies too), not repeated here: the form only turns text fields into the spec's shapes."""

from __future__ import annotations

import shlex
from typing import Any

from django import forms
from django.conf import settings
from django.http import HttpRequest

from accounts.models import Role
from queueing import validation as v
from queueing.errors import DomainError
from queueing.models import GpuType, Tier
from queueing.services.access import check_submit
from queueing.services.jobs import JobInput, job_input_build


class JobSubmitForm(forms.Form):
    """A job as the submit page posts it; cleaned by `job_input_build`."""

    team = forms.ChoiceField(label="Team")
    name = forms.CharField(label="Name", max_length=63,
                           help_text="Lower-case letters, digits and '-' (a Kubernetes name).")
    image = forms.CharField(label="Container image", max_length=512)
    command = forms.CharField(label="Command", required=False,
                              help_text="As in a shell: python train.py")
    args = forms.CharField(label="Arguments", required=False)
    env = forms.CharField(label="Environment", required=False,
                          widget=forms.Textarea(attrs={"rows": 3}),
                          help_text="One NAME=value per line.")
    gpu_type = forms.ChoiceField(label="GPU type")
    gpus = forms.IntegerField(label="GPUs per replica", min_value=1, initial=1)
    replicas = forms.IntegerField(label="Replicas (gang size)", min_value=1, initial=1)
    tier = forms.ChoiceField(label="Tier")
    max_runtime_seconds = forms.IntegerField(label="Max runtime (seconds)", required=False,
                                             min_value=1)
    # Per replica, Kubernetes quantities; empty: the team's default (job_input_build).
    cpu = forms.CharField(label="CPUs per replica", required=False,
                          max_length=v.MAX_QUANTITY_LEN, help_text='e.g. 4 or 500m.')
    memory = forms.CharField(label="Memory per replica", required=False,
                             max_length=v.MAX_QUANTITY_LEN, help_text="e.g. 16Gi.")
    ephemeral_storage = forms.CharField(label="Ephemeral storage per replica", required=False,
                                        max_length=v.MAX_QUANTITY_LEN, help_text="e.g. 50Gi.")
    shm_size = forms.CharField(label="Shared memory (/dev/shm)", required=False,
                               max_length=v.MAX_QUANTITY_LEN, help_text="e.g. 8Gi.")

    def __init__(self, *args: Any, request: HttpRequest, teams: list[Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request = request
        choices: dict[str, list[tuple[str, str]]] = {
            "team": [(t.slug, t.name or t.slug) for t in teams],
            "gpu_type": [(g.slug, g.slug) for g in GpuType.objects.order_by("slug")],
            "tier": [(t.slug, t.slug) for t in Tier.objects.order_by("-rank")],
        }
        for name, values in choices.items():
            field = self.fields[name]
            assert isinstance(field, forms.ChoiceField)
            field.choices = values
        self.fields["tier"].initial = settings.FAIRQ_DEFAULT_TIER
        # A job's spec ("submit again") names its resources as the API does.
        for name, text in (self.initial.pop("resources", None) or {}).items():
            if name in v.RESOURCE_NAMES:
                self.initial.setdefault(name, text)
        for name, field in self.fields.items():
            attrs = field.widget.attrs
            attrs.setdefault("aria-describedby", f"{name}-help {name}-errors")
        self.job_input: JobInput | None = None

    def _split(self, name: str) -> list[str]:
        try:
            words = shlex.split(self.cleaned_data.get(name) or "")
        except ValueError as exc:
            self.add_error(name, f"Cannot split into words: {exc}.")
            return []
        # The API's shapes for argv (JobCreateSerializer's fields).
        if len(words) > v.MAX_ARGV_ITEMS:
            self.add_error(name, f"Ensure this field has no more than {v.MAX_ARGV_ITEMS} elements.")
        elif any(len(w) > v.MAX_ARG_LEN for w in words):
            self.add_error(name, f"Ensure no word has more than {v.MAX_ARG_LEN} characters.")
        return words

    def _env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for n, line in enumerate((self.cleaned_data.get("env") or "").splitlines(), 1):
            if not line.strip():
                continue
            key, sep, value = line.partition("=")
            if not sep:
                self.add_error("env", f"Line {n}: write NAME=value.")
                continue
            if len(value) > v.MAX_ENV_VALUE_LEN:  # the API's shape (JobCreateSerializer)
                self.add_error("env", f"Line {n}: ensure the value has no more than "
                                      f"{v.MAX_ENV_VALUE_LEN} characters.")
                continue
            env[key.strip()] = value
        return env

    def clean(self) -> dict[str, Any]:
        """Run `job_input_build` on what parsed, even when other fields did not, so every
        field's error shows at once; a field keeps its first error only."""
        data = super().clean() or {}
        # The API's bounds (JobCreateSerializer's fields), without `max` in the page's inputs.
        for name, most in (("replicas", v.MAX_REPLICAS),
                           ("max_runtime_seconds", v.MAX_RUNTIME_SECONDS)):
            if data.get(name) is not None and data[name] > most:
                self.add_error(name, f"Ensure this value is less than or equal to {most}.")
                data[name] = None
        spec: dict[str, Any] = {
            "command": self._split("command"), "args": self._split("args"), "env": self._env(),
            "max_runtime_seconds": data.get("max_runtime_seconds"),
            "resources": {name: data[name].strip() for name in v.RESOURCE_NAMES
                          if (data.get(name) or "").strip()},
            "shm_size": (data.get("shm_size") or "").strip() or None,
        }
        for name in ("team", "name", "image", "gpu_type", "gpus", "replicas", "tier"):
            spec[name] = data[name] if data.get(name) not in (None, "") else None
        try:
            job_input = job_input_build(actor=self.request.user, **spec)
        except DomainError as exc:
            for field, messages in exc.fields.items():
                name = field.removeprefix("resources.")  # "resources.cpu": the cpu field
                target = name if name in self.fields else None
                given = spec["resources"].get(name) if name in v.RESOURCE_NAMES \
                    else spec.get(name)
                if target is not None and (target in self.errors or given is None):
                    continue  # already reported by the form (missing or malformed)
                for message in messages:
                    self.add_error(target, message)
            return data
        if self.errors:
            return data
        try:  # rule T1 as the service applies it, so the live check shows it too
            check_submit(actor=self.request.user, team=job_input.team, tier=job_input.tier)
        except DomainError as exc:
            for field, messages in exc.fields.items():
                for message in messages:
                    self.add_error(field if field in self.fields else None, message)
            return data
        self.job_input = job_input
        return data


def _team_quantity(label: str, example: str) -> forms.CharField:
    return forms.CharField(label=label, required=False, max_length=v.MAX_QUANTITY_LEN,
                           help_text=f"e.g. {example}; empty: none.")


class TeamResourcesForm(forms.Form):
    """A team's per-replica defaults and maxima, as the API's TeamResourcesSerializer:
    quantities are checked by `team_resources_set`."""

    default_cpu = _team_quantity("Default CPUs", "4")
    max_cpu = _team_quantity("Maximum CPUs", "64")
    default_memory = _team_quantity("Default memory", "16Gi")
    max_memory = _team_quantity("Maximum memory", "512Gi")
    default_ephemeral_storage = _team_quantity("Default ephemeral storage", "20Gi")
    max_ephemeral_storage = _team_quantity("Maximum ephemeral storage", "500Gi")
    default_shm_size = _team_quantity("Default /dev/shm", "8Gi")
    max_shm_size = _team_quantity("Maximum /dev/shm", "128Gi")


class MemberForm(forms.Form):
    username = forms.CharField(label="Username", max_length=150)
    role = forms.ChoiceField(label="Role", choices=Role.choices, initial=Role.MEMBER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(label="Role", choices=Role.choices)


class TokenForm(forms.Form):
    """As the API's TokenCreateSerializer: a name and an optional lifetime."""

    name = forms.CharField(label="Token name", max_length=100, initial="default")
    expires_in_days = forms.IntegerField(label="Expires in (days)", required=False, min_value=1,
                                         max_value=3650, help_text="Empty: never expires.")
    # One per rendered form: a reload re-posting it shows the token exists (views.token_create).
    idempotency_key = forms.CharField(required=False, max_length=100, widget=forms.HiddenInput)


def _limit(label: str) -> forms.IntegerField:
    return forms.IntegerField(label=label, required=False, min_value=0, max_value=100_000)


class QuotaForm(forms.Form):
    """One cell of the quota board. Empty borrowing = unlimited, empty lending = all.

    Only the shapes of the fields: the rules between them (lending <= nominal, rule Q1)
    are `Quota.clean()`'s, run by `quota_set`; the view shows its errors on the fields."""

    nominal = forms.IntegerField(label="Nominal", min_value=0, max_value=100_000)
    borrowing_limit = _limit("Borrowing limit")
    lending_limit = _limit("Lending limit")

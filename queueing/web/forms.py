"""Forms of the web pages. Job validation is `JobCreateSerializer`'s (the API's rules),
not repeated here: the form only turns text fields into the API's shapes."""

from __future__ import annotations

import shlex
from typing import Any

from django import forms
from django.conf import settings
from django.http import HttpRequest

from accounts.models import Role
from queueing.api.serializers import JobCreateSerializer
from queueing.errors import DomainError
from queueing.models import GpuType, Tier
from queueing.services.jobs import JobInput, job_check_tier


class JobSubmitForm(forms.Form):
    """A job as the submit page posts it; cleaned by the API's serializer."""

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
        for name, field in self.fields.items():
            attrs = field.widget.attrs
            attrs.setdefault("aria-describedby", f"{name}-help {name}-errors")
        self.job_input: JobInput | None = None

    def _split(self, name: str) -> list[str]:
        try:
            return shlex.split(self.cleaned_data.get(name) or "")
        except ValueError as exc:
            self.add_error(name, f"Cannot split into words: {exc}.")
            return []

    def _env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for n, line in enumerate((self.cleaned_data.get("env") or "").splitlines(), 1):
            if not line.strip():
                continue
            key, sep, value = line.partition("=")
            if not sep:
                self.add_error("env", f"Line {n}: write NAME=value.")
                continue
            env[key.strip()] = value
        return env

    def clean(self) -> dict[str, Any]:
        """Run the API's serializer on what parsed, even when other fields did not, so
        every field's error shows at once; a field keeps its first error only."""
        data = super().clean() or {}
        body: dict[str, Any] = {
            "command": self._split("command"), "args": self._split("args"), "env": self._env(),
            "max_runtime_seconds": data.get("max_runtime_seconds"),
        }
        for name in ("team", "name", "image", "gpu_type", "gpus", "replicas", "tier"):
            if data.get(name) not in (None, ""):
                body[name] = data[name]
        serializer = JobCreateSerializer(data=body, context={"request": self.request})
        if serializer.is_valid() and not self.errors:
            job_input = serializer.to_input()
            try:  # rule T1 as the service applies it, so the live check shows it too
                job_check_tier(team=job_input.team, tier=job_input.tier)
            except DomainError as exc:
                self.add_error("tier", exc.message)
                return data
            self.job_input = job_input
            return data
        for field, messages in serializer.errors.items():
            target = field if field in self.fields else None
            if target is not None and (target in self.errors or target not in body):
                continue  # already reported by the form (missing or malformed)
            for message in messages if isinstance(messages, list) else [messages]:
                self.add_error(target, str(message) if not isinstance(message, dict)
                               else "; ".join(f"{k}: {v}" for k, v in message.items()))
        return data


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

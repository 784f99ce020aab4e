"""Forms of the web pages. Job validation is `services.job_input.job_input_of`'s (the
API's path too: `job_input_build`, the cluster fields, the dependencies), not repeated
here: the form only turns text fields into the spec's shapes."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from typing import Any

import yaml
from django import forms
from django.conf import settings
from django.http import HttpRequest

from accounts.models import Role
from fairq_cli.durations import DURATION_HELP, format_duration, parse_duration
from queueing import validation as v
from queueing.errors import DomainError
from queueing.models import WEBHOOK_EVENT_TYPES
from queueing.policy.dependencies import parse_slurm_dependencies
from queueing.selectors.clusters import cluster_choices
from queueing.selectors.reference import all_gpu_types, gpu_types_by_slug_order, tiers_by_rank
from queueing.services.access import check_submit
from queueing.services.job_input import job_input_of
from queueing.services.jobs import JobInput

# The most text a volumes or secrets box takes, and how deep its YAML may nest: 16
# volumes of the API's shape fit many times over; a deeper or longer text is no spec.
MAX_SPEC_TEXT = 16 * 1024
MAX_SPEC_DEPTH = 8
VOLUMES_EXAMPLE = ("- {name: data, pvc: imagenet, mount_path: /data, read_only: true}\n"
                   "- {name: scratch, empty_dir: {size_limit: 100Gi}, mount_path: /scratch}")
SECRETS_EXAMPLE = ("- {secret: hf-token, key: token, env: HF_TOKEN}\n"
                   "- {secret: wandb, mount_path: /etc/wandb}")
# A refusal's field path (`volumes[1].pvc`, `labels.run`, `topology.level`): its head.
_PATH_HEAD = re.compile(r"^([a-z_]+)(.*)\Z", re.DOTALL)


def spec_yaml_load(text: str) -> Any:
    """The value a volumes or secrets box holds (YAML, or JSON, which YAML reads): plain
    lists, objects, strings, numbers, booleans and null, as the API's JSON would be.
    ValueError with a readable message for text that is not, or that uses YAML's anchors
    and aliases or nests deeper than MAX_SPEC_DEPTH (neither has a use in a spec, and an
    alias can make a short text expand without bound)."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise ValueError("Write the values out: YAML anchors and aliases (&, *) "
                                 "are not taken.")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_SPEC_DEPTH:
                    raise ValueError(f"Nested more than {MAX_SPEC_DEPTH} levels deep.")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or "not YAML or JSON"
        raise ValueError(f"Not YAML or JSON{where}: {problem}.") from None
    _plain(value)
    return value


def _plain(value: Any) -> None:
    """ValueError unless `value` is what JSON could have written (YAML also reads dates,
    binary and sets, which no field of a spec is)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"Names of fields are text, not {key!r:.40}.")
            _plain(item)
    elif isinstance(value, list):
        for item in value:
            _plain(item)
    elif value is not None and not isinstance(value, str | int | float | bool):
        raise ValueError(f"{str(value)[:40]!r} is not text, a number or true/false: quote "
                         "it.")


# The order a box writes an item's keys in (as docs/api.md does; a database's JSON may
# keep them in another).
_KEY_ORDER = {key: i for i, key in enumerate(
    ("name", "pvc", "empty_dir", "secret", "key", "env", "mount_path", "read_only"))}


def _spec_yaml_dump(items: Iterable[Any]) -> str:
    """A volumes or secrets list as the box shows it: one flow-style item a line."""
    def ordered(item: Any) -> Any:
        if not isinstance(item, dict):
            return item
        return dict(sorted(item.items(), key=lambda kv: _KEY_ORDER.get(kv[0], len(_KEY_ORDER))))

    return "\n".join("- " + yaml.safe_dump(ordered(item), default_flow_style=True,
                                            sort_keys=False, width=10**6).strip()
                      for item in items)


def _pairs_text(items: dict[str, Any] | None) -> str:
    return "\n".join(f"{k}={val}" for k, val in (items or {}).items())


def spec_initial(spec: dict[str, Any]) -> dict[str, Any]:
    """The submit form's initial values for a job spec (`job_spec`'s shape): its lists,
    env, labels, annotations and topology as the form's text fields write them."""
    topology = spec.get("topology") or {}
    return {**spec, "command": shlex.join(spec.get("command") or []),
            "args": shlex.join(spec.get("args") or []),
            "env": _pairs_text(spec.get("env")),
            "volumes": _spec_yaml_dump(spec.get("volumes") or []),
            "secrets": _spec_yaml_dump(spec.get("secrets") or []),
            "labels": _pairs_text(spec.get("labels")),
            "annotations": _pairs_text(spec.get("annotations")),
            "cluster_selector": _pairs_text(spec.get("cluster_selector")),
            "topology_level": topology.get("level") or "",
            "topology_mode": topology.get("mode") or "required",
            "image_pull_secret": spec.get("image_pull_secret") or "",
            "gpu_types": ", ".join((spec.get("gpu_types") or [])[1:]),
            "working_dir": spec.get("working_dir") or "",
            "max_runtime_seconds": (format_duration(spec["max_runtime_seconds"])
                                    if spec.get("max_runtime_seconds") else ""),
            "stop_signal": spec.get("stop_signal") or v.DEFAULT_STOP_SIGNAL,
            "checkpoint_interval_seconds": (
                format_duration(spec["checkpoint_interval_seconds"])
                if spec.get("checkpoint_interval_seconds") else "")}


def _allowed_help(teams: list[Any], attr: str, what: str) -> str:
    named = [f"{t.slug}: {', '.join(getattr(t, attr))}" for t in teams if getattr(t, attr)]
    return (f" Allowed {what} — {'; '.join(named)}." if named
            else f" Your teams allow no {what} yet (team admins set them on the team page).")


def _textarea(rows: int, placeholder: str = "", *, wrap: bool = True) -> forms.Textarea:
    attrs: dict[str, Any] = {"rows": rows, "spellcheck": "false"}
    if not wrap:  # one item a line, as written: a narrow screen scrolls it sideways
        attrs["wrap"] = "off"
    if placeholder:
        attrs["placeholder"] = placeholder
    return forms.Textarea(attrs=attrs)


def gpu_type_choice_label(gpu_type: Any) -> str:
    """A GPU type in the form's list: its slug, and how one GPU is shared when it is
    ("ts-a10: time-sliced, 4 slices per GPU, no memory isolation")."""
    if gpu_type.sharing in ("time-sliced", "mps"):
        return (f"{gpu_type.slug}: {gpu_type.sharing}, {gpu_type.slices_per_gpu} slices per "
                "GPU, no memory isolation")
    if gpu_type.sharing == "mig":
        return f"{gpu_type.slug}: MIG, {gpu_type.slices_per_gpu} isolated instances per GPU"
    return str(gpu_type.slug)


class _ClusterChoiceField(forms.ChoiceField):
    """The enabled clusters to choose from, any name taken: rule K3 judges it with the
    API's words (`services.job_input.job_input_of`), so a cluster unknown or disabled
    since the page was drawn is refused as the API refuses it."""

    def valid_value(self, value: Any) -> bool:
        return True


class JobSubmitForm(forms.Form):
    """A job as the submit page posts it; cleaned by `job_input_of`."""

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
    # The API's gpu_types after the first (`gpu_type`): docs/api.md, "Several GPU types".
    gpu_types = forms.CharField(
        label="Or else", required=False, max_length=500,
        help_text="Other GPU types it may run on, in order of preference, e.g. a100, l40s; "
                  "empty: only the type above.")
    # Whole GPUs, or a fraction of one GPU of a time-sliced or MPS type (shared GPUs:
    # `validation.parse_gpus`; the type decides in `job_input_build`).
    gpus = forms.CharField(
        label="GPUs per replica", initial="1", max_length=v.MAX_GPUS_TEXT_LEN,
        help_text="Whole GPUs (2), or on a time-sliced or MPS GPU type a fraction of one "
                  "GPU: 0.5, 0.25 or 1/4. Time-sliced and MPS GPUs have NO memory isolation: "
                  "the jobs sharing a GPU share its memory, and one can exhaust it for all.")
    replicas = forms.IntegerField(label="Replicas (gang size)", min_value=1, initial=1)
    tier = forms.ChoiceField(label="Tier")
    # The API's max_runtime_seconds, written as people write it (`2h`, `90m`, `1h30m`,
    # seconds): the CLI's parser (fairq_cli.durations), so both read the same text.
    max_runtime_seconds = forms.CharField(label="Max runtime", required=False, max_length=32,
                                          help_text=f"Empty: no limit; otherwise {DURATION_HELP}.")
    # Per replica, Kubernetes quantities; empty: the team's default (job_input_build).
    cpu = forms.CharField(label="CPUs per replica", required=False,
                          max_length=v.MAX_QUANTITY_LEN, help_text='e.g. 4 or 500m.')
    memory = forms.CharField(label="Memory per replica", required=False,
                             max_length=v.MAX_QUANTITY_LEN, help_text="e.g. 16Gi.")
    ephemeral_storage = forms.CharField(label="Ephemeral storage per replica", required=False,
                                        max_length=v.MAX_QUANTITY_LEN, help_text="e.g. 50Gi.")
    shm_size = forms.CharField(label="Shared memory (/dev/shm)", required=False,
                               max_length=v.MAX_QUANTITY_LEN, help_text="e.g. 8Gi.")
    # Storage, secrets and metadata (docs/api.md): the API's shapes, checked by the service.
    volumes = forms.CharField(label="Volumes", required=False, max_length=MAX_SPEC_TEXT,
                              widget=_textarea(4, VOLUMES_EXAMPLE, wrap=False))
    secrets = forms.CharField(label="Secrets", required=False, max_length=MAX_SPEC_TEXT,
                              widget=_textarea(3, SECRETS_EXAMPLE, wrap=False))
    image_pull_secret = forms.CharField(label="Image pull secret", required=False,
                                        max_length=v.MAX_DNS_SUBDOMAIN_LEN)
    working_dir = forms.CharField(label="Working directory", required=False,
                                  max_length=v.MAX_PATH_LEN, help_text="e.g. /workspace.")
    labels = forms.CharField(label="Labels", required=False, max_length=MAX_SPEC_TEXT,
                             widget=_textarea(2, "experiment=rn50-lr-sweep"),
                             help_text="One key=value per line; the job list filters on them.")
    annotations = forms.CharField(label="Annotations", required=False,
                                  max_length=MAX_SPEC_TEXT,
                                  widget=_textarea(2, "git-sha=3f2c1d9"),
                                  help_text="One key=value per line.")
    termination_grace_seconds = forms.IntegerField(
        label="Termination grace (seconds)", required=False, min_value=0,
        max_value=v.MAX_TERMINATION_GRACE_SECONDS,
        help_text="Time to checkpoint after SIGTERM when stopped; empty: the default "
                  "(each tier caps it).")
    # Graceful stop (docs/api.md): the first signal, and how often the job says it
    # checkpoints, written as the max runtime is (`30m`, `1h`, seconds).
    stop_signal = forms.ChoiceField(
        label="Stop signal", required=False, initial=v.DEFAULT_STOP_SIGNAL,
        choices=[(s, s) for s in v.STOP_SIGNALS],
        help_text="What the program gets first when preempted or cancelled; SIGKILL "
                  "follows after the grace.")
    checkpoint_interval_seconds = forms.CharField(
        label="Checkpoints every", required=False, max_length=32,
        help_text=f"Empty: not declared; otherwise {DURATION_HELP} (at least 1m). The job "
                  "reports each one with `fairq checkpoint`.")
    topology_level = forms.ChoiceField(
        label="Keep replicas within one", required=False,
        help_text="A topology level of the GPU type (rule A7); empty: anywhere.")
    topology_mode = forms.ChoiceField(
        label="Topology mode", initial="required", required=False,
        choices=[("required", "required (wait for room in one)"),
                 ("preferred", "preferred (never wait for it)")])

    # Rules K3, K4: the API's requested_cluster, cluster_selector and allow_spot
    # (queueing/services/cluster_rules.py checks them); shown when clusters are configured.
    requested_cluster = _ClusterChoiceField(
        label="Cluster", required=False,
        help_text="Empty: wherever it fits first (rule K2: the lowest cost rank, then the "
                  "least loaded).")
    cluster_selector = forms.CharField(
        label="Cluster labels", required=False, max_length=1000,
        widget=_textarea(2, "region=eu-west"),
        help_text="Only clusters carrying these labels; one key=value per line.")
    allow_spot = forms.BooleanField(
        label="May run on spot nodes", required=False,
        help_text="Cheaper, interruptible capacity: a reclaimed node requeues the job "
                  "(rule K6). Preemptible tiers may use spot anyway.")

    dependencies = forms.CharField(
        label="Dependencies", required=False, max_length=2000,
        help_text="Wait for jobs of the team, Slurm's way: afterok:12:13,afterany:14 "
                  "(a7: all of array 7); empty: none.")

    def clean_gpus(self) -> Any:
        text = str(self.cleaned_data.get("gpus") or "").strip()
        try:
            return v.parse_gpus(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def __init__(self, *args: Any, request: HttpRequest, teams: list[Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request = request
        choices: dict[str, list[tuple[str, str]]] = {
            "team": [(t.slug, t.name or t.slug) for t in teams],
            "gpu_type": [(g.slug, gpu_type_choice_label(g)) for g in gpu_types_by_slug_order()],
            "tier": [(t.slug, t.name or t.slug) for t in tiers_by_rank()],
        }
        levels = sorted({str(lv["name"]) for g in all_gpu_types()
                         for lv in g.topology_levels or () if isinstance(lv, dict)
                         and "name" in lv})
        choices["topology_level"] = [("", "— (anywhere)"), *((lv, lv) for lv in levels)]
        choices["requested_cluster"] = [("", "— (any)"), *cluster_choices()]
        for name, values in choices.items():
            field = self.fields[name]
            assert isinstance(field, forms.ChoiceField)
            field.choices = values
        self.fields["tier"].initial = settings.FAIRQ_DEFAULT_TIER
        # A job's spec ("submit again") names its resources as the API does.
        for name, text in (self.initial.pop("resources", None) or {}).items():
            if name in v.RESOURCE_NAMES:
                self.initial.setdefault(name, text)
        self.fields["volumes"].help_text = (
            "YAML or JSON, as the API takes it: a list of {name, pvc, mount_path, read_only} "
            "or {name, empty_dir: {size_limit}, mount_path}."
            + _allowed_help(teams, "allowed_pvcs", "PVCs"))
        self.fields["secrets"].help_text = (
            "YAML or JSON: a list of {secret, key, env} (one key as an environment "
            "variable) or {secret, mount_path} (files); names only, never values."
            + _allowed_help(teams, "allowed_secrets", "secrets"))
        self.fields["image_pull_secret"].help_text = (
            "A Secret of the team's namespace." +
            _allowed_help(teams, "allowed_pull_secrets", "pull secrets"))
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
        for n, key, value in self._lines("env", "NAME=value"):
            if len(value) > v.MAX_ENV_VALUE_LEN:  # the API's shape (JobCreateSerializer)
                self.add_error("env", f"Line {n}: ensure the value has no more than "
                                      f"{v.MAX_ENV_VALUE_LEN} characters.")
                continue
            env[key.strip()] = value
        return env

    def _metadata(self, name: str) -> dict[str, str] | None:
        """Labels or annotations, one key=value a line (blanks around either dropped);
        None when a line is not one (the field's error says which)."""
        pairs = self._lines(name, "key=value")
        if name in self.errors:
            return None
        return {key.strip(): value.strip() for _, key, value in pairs}

    def _lines(self, name: str, shape: str) -> list[tuple[int, str, str]]:
        """The (line number, key, value) of each non-blank `key=value` line of `name`;
        an error on the field for each line without '='."""
        out = []
        for n, line in enumerate((self.cleaned_data.get(name) or "").splitlines(), 1):
            if not line.strip():
                continue
            key, sep, value = line.partition("=")
            if not sep:
                self.add_error(name, f"Line {n}: write {shape}.")
                continue
            out.append((n, key, value))
        return out

    def _yaml(self, name: str) -> Any:
        """The volumes or secrets box as a value (None: empty, or not YAML/JSON, which the
        field's error says)."""
        text = self.cleaned_data.get(name) or ""
        if not text.strip():
            return None
        try:
            return spec_yaml_load(text)
        except ValueError as exc:
            self.add_error(name, str(exc))
            return None

    def _topology(self) -> dict[str, str] | None:
        level = self.cleaned_data.get("topology_level") or ""
        if not level:
            return None
        return {"level": level, "mode": self.cleaned_data.get("topology_mode") or "required"}

    def clean_max_runtime_seconds(self) -> int | None:
        text = (self.cleaned_data.get("max_runtime_seconds") or "").strip()
        if not text:
            return None
        try:
            seconds = parse_duration(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc).capitalize() + ".") from None
        if seconds < 1:
            raise forms.ValidationError("Ensure this value is at least 1 second.")
        return seconds

    def clean_checkpoint_interval_seconds(self) -> int | None:
        text = (self.cleaned_data.get("checkpoint_interval_seconds") or "").strip()
        if not text:
            return None
        try:
            return parse_duration(text)
        except ValueError as exc:
            raise forms.ValidationError(str(exc).capitalize() + ".") from None

    def _gpu_types(self, data: dict[str, Any]) -> list[str] | None:
        """The accepted types: the GPU type, then the others written after it (None:
        none written, a job of one type)."""
        others = [t.strip() for t in re.split(r"[,\s]+", data.get("gpu_types") or "")
                  if t.strip()]
        if not others or not data.get("gpu_type"):
            return None
        return [data["gpu_type"], *others]

    def _target(self, path: str) -> tuple[str | None, str]:
        """The form field a refusal's field path lands on, and the part of the path the
        message names (`volumes[1].pvc` → volumes, "volumes[1].pvc: "; `labels.run` →
        labels, "run: "); (None, "path: ") for a path of no field."""
        if path.startswith("resources."):
            name = path.removeprefix("resources.")  # "resources.cpu": the cpu field
            return (name if name in self.fields else None), ""
        if path in ("topology", "topology.level"):
            return "topology_level", ""
        if path == "topology.mode":
            return "topology_mode", ""
        match = _PATH_HEAD.match(path)
        head, rest = (match.group(1), match.group(2)) if match else (path, "")
        if head in self.fields:
            if not rest:
                return head, ""
            if head in ("labels", "annotations"):
                return head, f"{rest.removeprefix('.')}: "
            return head, f"{path}: "
        return None, ("" if path == "non_field_errors" else f"{path}: ")

    def clean(self) -> dict[str, Any]:
        """Run `job_input_of` on what parsed, even when other fields did not, so every
        field's error shows at once. A field the form itself refused (missing, or text that
        does not parse) shows the form's error only; a field the service refuses shows
        every refusal under it (`volumes[0].name`, `volumes[2].pvc`, ...)."""
        data = super().clean() or {}
        before = set(self.errors)  # the fields whose text did not even parse
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
            "volumes": self._yaml("volumes"), "secrets": self._yaml("secrets"),
            "image_pull_secret": (data.get("image_pull_secret") or "").strip(),
            "working_dir": (data.get("working_dir") or "").strip(),
            "labels": self._metadata("labels"), "annotations": self._metadata("annotations"),
            "termination_grace_seconds": data.get("termination_grace_seconds"),
            "stop_signal": data.get("stop_signal") or None,
            "checkpoint_interval_seconds": data.get("checkpoint_interval_seconds"),
            "topology": self._topology(),
            "gpu_types": self._gpu_types(data),
        }
        before |= set(self.errors)
        for name in ("team", "name", "image", "gpu_type", "gpus", "replicas", "tier"):
            spec[name] = data[name] if data.get(name) not in (None, "") else None
        # Rules K3-K4: the API's cluster fields, judged with the others by `job_input_of`.
        spec["requested_cluster"] = data.get("requested_cluster") or None
        spec["cluster_selector"] = self._metadata("cluster_selector")
        spec["allow_spot"] = bool(data.get("allow_spot"))
        try:  # rules D1-D3: Slurm's syntax here, the jobs and arrays of the team below
            spec["dependencies"] = parse_slurm_dependencies(data.get("dependencies") or "")
        except ValueError as exc:
            self.add_error("dependencies", str(exc))
        before |= set(self.errors)
        try:  # the API's one path from the fields to a JobInput (services.job_input)
            job_input = job_input_of(actor=self.request.user, fields=spec)
        except DomainError as exc:
            if not exc.fields:
                self.add_error(None, exc.message)
            for field, messages in exc.fields.items():
                target, named = self._target(field)
                if target is not None and target in before:
                    continue  # already reported by the form (missing or malformed)
                for message in messages:
                    self.add_error(target, named + message)
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


class NamesField(forms.CharField):
    """A list of names, one a line (blank lines dropped); the names are the service's to
    judge (`team_workload_policy_set`)."""

    widget = forms.Textarea(attrs={"rows": 4, "spellcheck": "false"})
    # Room for MAX_ALLOWLIST of the longest names, a line each: more is no allowlist.
    max_text = v.MAX_ALLOWLIST * (v.MAX_DNS_SUBDOMAIN_LEN + 2)

    def to_python(self, value: Any) -> list[str]:  # type: ignore[override]
        text = super().to_python(value) or ""
        if len(text) > self.max_text:
            raise forms.ValidationError(
                f"At most {v.MAX_ALLOWLIST} names (this text is {len(text):,} characters).")
        return [line.strip() for line in text.splitlines() if line.strip()]

    def widget_attrs(self, widget: forms.Widget) -> dict[str, Any]:
        return {**super().widget_attrs(widget), "maxlength": str(self.max_text)}

    def prepare_value(self, value: Any) -> Any:
        return "\n".join(value) if isinstance(value, list | tuple) else value


class TeamWorkloadPolicyForm(forms.Form):
    """The names of the team's namespace its jobs may use, as the API's workload policy
    (docs/api.md, "Volumes, secrets and metadata"): each list replaces the old one."""

    allowed_pvcs = NamesField(
        label="Allowed PVCs", required=False,
        help_text="PersistentVolumeClaims of the team's namespace jobs may mount; one "
                  "name a line.")
    allowed_secrets = NamesField(
        label="Allowed secrets", required=False,
        help_text="Secrets jobs may read (as env or files); one name a line.")
    allowed_pull_secrets = NamesField(
        label="Allowed pull secrets", required=False,
        help_text="Secrets jobs may pull images with; one name a line.")


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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A token expires unless its owner clears the field (FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS).
        self.fields["expires_in_days"].initial = settings.FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS or None
    # One per rendered form: a reload re-posting it shows the token exists (views.token_create).
    idempotency_key = forms.CharField(required=False, max_length=100, widget=forms.HiddenInput)


class WebhookEndpointForm(forms.Form):
    """The team page's new webhook endpoint (docs/webhooks.md): as the API's
    `POST /teams/{slug}/webhooks/`; the URL's own rules are the service's."""

    url = forms.CharField(label="Endpoint URL", max_length=2000,
                          help_text="https://… that answers a signed POST (Standard Webhooks).")
    description = forms.CharField(label="Description", max_length=200, required=False)
    event_types = forms.MultipleChoiceField(
        label="Events", required=False, widget=forms.CheckboxSelectMultiple,
        choices=[(t, t) for t in WEBHOOK_EVENT_TYPES], help_text="None ticked: every event.")


def _limit(label: str) -> forms.IntegerField:
    return forms.IntegerField(label=label, required=False, min_value=0, max_value=100_000)


class TeamWeightForm(forms.Form):
    """A team's fair-share weight on the quota board (rule F2); `Team`'s own checks run
    in `team_update`."""

    weight = forms.FloatField(label="Weight", min_value=0.0001, max_value=1_000_000)


class TeamParentForm(forms.Form):
    """A team's parent on the quota board: a team slug, or empty for top level. Its rules
    (never itself or a team below it: rule F4; its nominals fit in every department's
    own row above it: rule Q8) are `team_update`'s; the view shows them on the field."""

    parent = forms.SlugField(label="Parent", required=False, max_length=40)


class QuotaForm(forms.Form):
    """One cell of the quota board. Empty borrowing = unlimited, empty lending = all.

    Only the shapes of the fields: the rules between them (lending <= nominal, rule Q1)
    are `Quota.clean()`'s, run by `quota_set`; the view shows its errors on the fields."""

    nominal = forms.IntegerField(label="Nominal", min_value=0, max_value=100_000)
    borrowing_limit = _limit("Borrowing limit")
    lending_limit = _limit("Lending limit")

"""Volumes, secrets, pull secret, working dir, labels, annotations, grace and topology on
the web: the submit form turns its text into the API's shapes and
`job_input_build` judges them (errors on the field they concern, nothing stored), the job
page shows them, "submit again" keeps them, the job list filters on a label, and team
admins set the team's allowlists on the team page (audited)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from accounts.models import AuditEntry, Team
from queueing.models import Job
from queueing.web.forms import spec_yaml_load
from tests.conftest import World
from tests.factories import JobFactory
from tests.web.test_pages import form_body, login

pytestmark = pytest.mark.django_db

VOLUMES = """\
- {name: data, pvc: imagenet, mount_path: /data, read_only: true}
- {name: scratch, empty_dir: {size_limit: 50Gi}, mount_path: /scratch}
"""
SECRETS = '[{"secret": "hf-token", "key": "token", "env": "HF_TOKEN"},\n' \
          ' {"secret": "wandb", "mount_path": "/etc/wandb"}]'


@pytest.fixture
def allowed(world: World) -> World:
    world.vision.allowed_pvcs = ["imagenet", "vision-checkpoints"]
    world.vision.allowed_secrets = ["hf-token", "wandb"]
    world.vision.allowed_pull_secrets = ["regcred"]
    world.vision.save()
    world.h100.topology_levels = [{"name": "rack", "node_label": "topology.kubernetes.io/rack"}]
    world.h100.save()
    return world


def _full(**overrides: str) -> dict[str, Any]:
    return form_body(**{"volumes": VOLUMES, "secrets": SECRETS, "image_pull_secret": "regcred",
                        "working_dir": "/workspace", "labels": "experiment=rn50\ntrial = 7",
                        "annotations": "git-sha=3f2c1d9", "termination_grace_seconds": "120",
                        "topology_level": "rack", "topology_mode": "preferred", **overrides})


def test_the_form_stores_every_new_field_in_the_apis_shape(allowed: World) -> None:
    r = login(allowed.member).post("/jobs/new/", _full())
    assert r.status_code == 302, r.content.decode()
    job = Job.objects.get()
    assert job.volumes == [
        {"name": "data", "pvc": "imagenet", "mount_path": "/data", "read_only": True},
        {"name": "scratch", "empty_dir": {"size_limit": "50Gi"}, "mount_path": "/scratch"}]
    assert job.secrets == [{"secret": "hf-token", "key": "token", "env": "HF_TOKEN"},
                           {"secret": "wandb", "mount_path": "/etc/wandb"}]
    assert (job.image_pull_secret, job.working_dir) == ("regcred", "/workspace")
    assert job.labels == {"experiment": "rn50", "trial": "7"}
    assert job.annotations == {"git-sha": "3f2c1d9"}
    assert job.termination_grace_seconds == 120
    assert job.topology == {"level": "rack", "mode": "preferred"}


def test_the_simple_form_still_submits_without_the_advanced_fields(allowed: World) -> None:
    r = login(allowed.member).post("/jobs/new/", form_body())
    assert r.status_code == 302, r.content.decode()
    job = Job.objects.get()
    assert job.volumes == [] and job.secrets == [] and job.labels == {}
    assert job.topology is None and job.image_pull_secret == ""


def test_a_host_path_volume_is_refused_on_the_volumes_field_nothing_stored(
        allowed: World) -> None:
    hostile = "- {name: root, hostPath: {path: /}, mount_path: /host}\n"
    r = login(allowed.member).post("/jobs/new/", _full(volumes=hostile))
    html = r.content.decode()
    assert r.status_code == 400 and not Job.objects.exists()
    errors = html.split('id="volumes-errors"', 1)[1].split("</ul>", 1)[0]
    assert "volumes[0].hostPath: Unknown field" in errors, errors
    details = html.split('<details', 1)[1].split(">", 1)[0]
    assert 'id="advanced"' in details and details.endswith(" open")  # the error in sight


@pytest.mark.parametrize(("field", "value", "message"), [
    ("volumes", "- {name: data, pvc: other-team-data, mount_path: /data}",
     "volumes[0].pvc: "),
    ("volumes", "- {name: d, pvc: imagenet, mount_path: /var/run/secrets}",
     "volumes[0].mount_path: "),
    ("volumes", "- {name: d, pvc: [unclosed", "Not YAML or JSON (line 1"),
    ("volumes", "- &a {name: d}\n- *a", "anchors and aliases"),
    ("volumes", "- {name: d, pvc: imagenet, mount_path: /d, when: 2026-01-01}",
     "is not text, a number or true/false"),
    ("secrets", '[{"secret": "db-password", "key": "pw", "env": "PW"}]', "secrets[0].secret: "),
    ("secrets", '[{"secret": "hf-token", "key": "token", "env": "SEED"}]',
     "secrets[0].env: The job&#x27;s env sets SEED already."),
    ("image_pull_secret", "someone-elses", "allowed pull secrets"),
    ("working_dir", "relative/dir", ""),
    ("labels", "run", "Line 1: write key=value."),
    ("labels", "fairq.io/team=nlp", "fairq.io/team: Keys are plain names"),
    ("annotations", "note=" + "x" * 1100, "note: At most 1024 characters."),
    ("topology_level", "nowhere", "Select a valid choice"),
])
def test_refusals_land_on_their_field_and_nothing_is_stored(
        allowed: World, field: str, value: str, message: str) -> None:
    r = login(allowed.member).post("/jobs/new/", _full(**{field: value}))
    html = r.content.decode()
    assert r.status_code == 400 and not Job.objects.exists()
    errors = html.split(f'id="{field}-errors"', 1)[1].split("</ul>", 1)[0]
    assert "<li>" in errors and message in errors, errors


def test_a_topology_level_the_gpu_type_lacks_is_refused_on_the_level(allowed: World) -> None:
    r = login(allowed.member).post("/jobs/new/", _full(gpu_type="a100"))
    html = r.content.decode()
    assert r.status_code == 400 and not Job.objects.exists()
    errors = html.split('id="topology_level-errors"', 1)[1].split("</ul>", 1)[0]
    assert "GPU type a100 has no topology level" in errors, errors


def test_the_grace_above_the_tiers_cap_is_refused_on_its_field(allowed: World) -> None:
    allowed.normal.max_termination_grace_seconds = 60
    allowed.normal.save()
    r = login(allowed.member).post("/jobs/new/", _full())
    assert r.status_code == 400 and not Job.objects.exists()
    errors = r.content.decode().split('id="termination_grace_seconds-errors"', 1)[1]
    assert "At most 60 seconds" in errors.split("</ul>", 1)[0]


def test_the_live_check_previews_a_full_spec_and_reports_a_bad_one(allowed: World) -> None:
    c = login(allowed.member)
    assert "If submitted now" in c.post("/jobs/new/check/", _full()).content.decode()
    html = c.post("/jobs/new/check/", _full(secrets="- {secret: nope, mount_path: /n}"))\
        .content.decode()
    assert "secrets[0].secret: " in html and "If submitted now" not in html


def test_the_help_names_the_teams_allowed_names(allowed: World) -> None:
    html = login(allowed.member).get("/jobs/new/").content.decode()
    assert "vision: imagenet, vision-checkpoints" in html
    assert "vision: hf-token, wandb" in html and "vision: regcred" in html
    assert '<option value="rack">rack</option>' in html


def test_the_job_page_shows_the_new_fields(allowed: World) -> None:
    c = login(allowed.member)
    c.post("/jobs/new/", _full())
    job = Job.objects.get()
    html = c.get(f"/jobs/{job.pk}/").content.decode()
    assert "<code>/data</code> ← PVC <code>imagenet</code>" in html and "(read-only)" in html
    assert "scratch of 50Gi" in html
    assert "<code>HF_TOKEN</code> ← key <code>token</code> of <code>hf-token</code>" in html
    assert "<code>/etc/wandb</code> ← the files of <code>wandb</code>" in html
    assert "<code>regcred</code>" in html and "<code>/workspace</code>" in html
    assert "experiment=rn50" in html and "?label=experiment%3Drn50" in html
    assert "git-sha=3f2c1d9" in html and "120 s" in html
    assert "one rack (preferred)" in html


def test_the_job_page_names_the_domain_its_replicas_share(allowed: World, settings: Any) -> None:
    from queueing.composition import reset_backends
    from queueing.selectors.cluster import cluster_view

    settings.FAIRQ_SIM_NODES = "4x8xh100@rack=2,2x8xa100"
    reset_backends()
    node = next(n for n in cluster_view().node_list if n.gpu_type == "h100")
    assert node.topology["rack"] == "h100-rack-0", node
    job = JobFactory(team=allowed.vision, gpu_type=allowed.h100, tier=allowed.normal,
                     topology_level="rack", topology_mode="required", placement=[node.name])
    html = login(allowed.member).get(f"/jobs/{job.pk}/").content.decode()
    assert "one rack (required), placed in rack <code>h100-rack-0</code>" in html


def test_submit_again_fills_the_form_with_the_new_fields(allowed: World) -> None:
    c = login(allowed.member)
    c.post("/jobs/new/", _full())
    job = Job.objects.get()
    html = c.get(f"/jobs/new/?from={job.pk}").content.decode()
    # The box's content (not its placeholder), keys in the documented order whatever
    # order the database's JSON keeps them in.
    assert _between(html, 'name="volumes"').strip() == VOLUMES.strip()
    assert _between(html, 'name="secrets"').strip() == (
        "- {secret: hf-token, key: token, env: HF_TOKEN}\n"
        "- {secret: wandb, mount_path: /etc/wandb}")
    assert 'value="regcred"' in html and 'value="/workspace"' in html
    labels = _between(html, 'name="labels"').split()
    assert sorted(labels) == ["experiment=rn50", "trial=7"] and 'value="120"' in html
    assert '<option value="rack" selected>' in html
    # What the form shows posts back as the same job.
    form = _full(name="again", volumes=_between(html, 'name="volumes"'),
                 secrets=_between(html, 'name="secrets"'))
    assert c.post("/jobs/new/", form).status_code == 302
    again = Job.objects.get(name="again")
    assert (again.volumes, again.secrets) == (job.volumes, job.secrets)


def _between(html: str, marker: str) -> str:
    import html as html_lib

    return html_lib.unescape(html.split(marker, 1)[1].split(">", 1)[1].split("</textarea>")[0])


def test_the_job_list_filters_on_a_label(allowed: World) -> None:
    JobFactory(team=allowed.vision, gpu_type=allowed.h100, tier=allowed.normal,
               name="with-label", labels={"experiment": "rn50"})
    JobFactory(team=allowed.vision, gpu_type=allowed.h100, tier=allowed.normal,
               name="other-label", labels={"experiment": "vit"})
    c = login(allowed.member)
    html = c.get("/jobs/?label=experiment=rn50").content.decode()
    assert "with-label" in html and "other-label" not in html
    html = c.get("/jobs/?label=experiment=rn50&status=QUEUED").content.decode()
    assert "with-label" in html and "other-label" not in html
    assert 'name="label" value="experiment=rn50"' in html
    r = c.get("/jobs/?label=not%20a%20label")
    html = r.content.decode()
    assert r.status_code == 400 and "Write label=key=value" in html
    assert "with-label" not in html and "fix the label filter" in html


def test_yaml_load_refuses_what_no_spec_holds() -> None:
    assert spec_yaml_load('[{"a": 1}]') == [{"a": 1}]
    for text, message in (("[" * 20 + "]" * 20, "Nested more than"),
                          ("!!binary aGVsbG8=", "is not text"),
                          ("{1: a}", "Names of fields are text")):
        with pytest.raises(ValueError, match=message):
            spec_yaml_load(text)


def _policy(**values: str) -> dict[str, str]:
    return {k: values.get(k, "") for k in ("allowed_pvcs", "allowed_secrets",
                                             "allowed_pull_secrets")}


def test_a_team_admin_sets_the_allowlists_on_the_team_page_audited(world: World) -> None:
    c = login(world.admin)
    assert "Save allowed names" in c.get("/teams/vision/").content.decode()
    r = c.post("/teams/vision/workload-policy/", _policy(
        allowed_pvcs="vision-checkpoints\n\nimagenet\n", allowed_secrets="hf-token",
        allowed_pull_secrets="regcred"))
    assert r.status_code == 302
    team = Team.objects.get(slug="vision")
    assert team.allowed_pvcs == ["imagenet", "vision-checkpoints"]
    assert (team.allowed_secrets, team.allowed_pull_secrets) == (["hf-token"], ["regcred"])
    entry = AuditEntry.objects.filter(object_type="accounts.Team", action="update").latest("id")
    assert "allowed_pvcs" in entry.changes and entry.actor == world.admin
    html = c.get("/teams/vision/").content.decode()
    assert "imagenet\nvision-checkpoints</textarea>" in html


def test_staff_may_set_the_allowlists(world: World) -> None:
    r = login(world.staff).post("/teams/vision/workload-policy/",
                                _policy(allowed_pvcs="imagenet"))
    assert r.status_code == 302
    assert Team.objects.get(slug="vision").allowed_pvcs == ["imagenet"]


def test_a_bad_name_is_refused_on_its_field_nothing_changed(world: World) -> None:
    r = login(world.admin).post("/teams/vision/workload-policy/", _policy(
        allowed_pvcs="imagenet", allowed_secrets="other-ns/db"))
    html = r.content.decode()
    assert r.status_code == 400
    errors = html.split('id="allowed_secrets-errors"', 1)[1].split("</ul>", 1)[0]
    assert "<li>" in errors, errors
    team = Team.objects.get(slug="vision")
    assert team.allowed_pvcs == [] and team.allowed_secrets == []


def test_members_see_the_allowlists_but_cannot_set_them(allowed: World) -> None:
    c = login(allowed.member)
    html = c.get("/teams/vision/").content.decode()
    assert "Save allowed names" not in html and "<code>vision-checkpoints</code>" in html
    r = c.post("/teams/vision/workload-policy/", _policy(allowed_pvcs="mine"))
    assert r.status_code == 403
    assert Team.objects.get(slug="vision").allowed_pvcs == ["imagenet", "vision-checkpoints"]


def test_outsiders_get_no_team_page_to_post_to(world: World) -> None:
    r = login(world.outsider).post("/teams/vision/workload-policy/", _policy(allowed_pvcs="x"))
    assert r.status_code == 404
    assert Team.objects.get(slug="vision").allowed_pvcs == []


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchrun-job.yaml"


def test_the_demo_takes_the_example_torchrun_job_through_the_form() -> None:
    """`make demo`'s team vision allows what examples/torchrun-job.yaml names, its h100s
    have racks, and the job file's spec, as the form writes it, submits from the page."""
    import yaml
    from django.contrib.auth import get_user_model

    from queueing.models import GpuType
    from queueing.services.demo import demo_seed
    from queueing.web.forms import spec_initial

    if not EXAMPLE.exists():
        pytest.skip("examples/torchrun-job.yaml is not in this tree")
    demo_seed()
    demo_seed()  # twice: the same allowlists, not doubled
    team = Team.objects.get(slug="vision")
    assert team.allowed_pvcs == ["imagenet", "vision-checkpoints", "vision-notebooks"]
    assert GpuType.objects.get(slug="h100").topology_levels[0]["name"] == "rack"
    spec = yaml.safe_load(EXAMPLE.read_text())
    body = {k: val for k, val in spec_initial(spec).items()
            if val is not None and k not in ("resources", "topology")}
    body.update({k: str(val) for k, val in spec["resources"].items()})
    body["topology_level"] = spec["topology"]["level"]
    r = login(get_user_model().objects.get(username="alice")).post("/jobs/new/", body)
    assert r.status_code == 302, r.content.decode()[-3000:]
    job = Job.objects.get(name="resnet50-ddp")
    assert [vol["pvc"] for vol in job.volumes[:2]] == ["imagenet", "vision-checkpoints"]
    assert job.secrets[0] == {"secret": "hf-token", "key": "token", "env": "HF_TOKEN"}
    assert (job.image_pull_secret, job.labels["trial"]) == ("regcred", "7")
    assert job.topology == spec["topology"] == {"level": "rack", "mode": "preferred"}


@pytest.mark.parametrize("text", [
    "42", "{a: 1}", "- null", "--- a\n--- b", "- !!python/object:os.system {}",
    "- {name: d, empty_dir: {size_limit: .nan}, mount_path: /d}",
    "- {name: d, empty_dir: {size_limit: 99999999999999999999999999999}, mount_path: /d}",
    "- {name: d, pvc: {x: 1}, mount_path: 5}",
    "- {name: d, pvc: imagenet, mount_path: /d, <<: {x: 1}}",
    "- {name: d, pvc: imagenet, mount_path: /d}\n" * 40,
])
@pytest.mark.parametrize("field", ["volumes", "secrets"])
def test_odd_yaml_is_a_400_on_its_field_never_a_500(allowed: World, field: str,
                                                    text: str) -> None:
    r = login(allowed.member).post("/jobs/new/", _full(**{field: text}))
    assert r.status_code == 400 and not Job.objects.exists()
    errors = r.content.decode().split(f'id="{field}-errors"', 1)[1].split("</ul>", 1)[0]
    assert "<li>" in errors, errors


def test_an_allowlist_of_too_much_text_is_refused_on_its_field(world: World) -> None:
    r = login(world.admin).post("/teams/vision/workload-policy/", _policy(
        allowed_pvcs="\n".join(f"pvc-{i}" for i in range(20_000))))
    assert r.status_code == 400
    errors = r.content.decode().split('id="allowed_pvcs-errors"', 1)[1].split("</ul>", 1)[0]
    assert "At most 200 names" in errors, errors
    assert Team.objects.get(slug="vision").allowed_pvcs == []

"""`fairq submit -G h100,a100`: a job accepting several GPU types, from flags, a job file
and as an array; the queue and status show the types while it waits."""

from __future__ import annotations

from pathlib import Path

from queueing.models import Job

from .conftest import Cli

SUBMIT = ["submit", "-t", "vision", "-J", "train", "-i", "ghcr.io/acme/train:1.4", "-g", "2"]


def test_dash_g_with_a_comma_list_submits_the_accepted_types_in_order(cli: Cli) -> None:
    r = cli(*SUBMIT, "-G", "h100,a100")
    assert r.code == 0, r.err
    job = Job.objects.get()
    assert (job.gpu_type.slug, job.gpu_types) == ("h100", ["h100", "a100"])
    assert r.out.startswith(f"Submitted job {job.pk} (vision/train, 2xh100|a100")
    queue = cli("queue")
    assert " 2xh100|a100 " in queue.out.splitlines()[1]
    status = cli("status", str(job.pk))
    assert "GPU types h100, a100 (most preferred first; it waits for one of them)" in status.out


def test_a_job_file_lists_gpu_types_and_a_flag_replaces_them(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("team: vision\nname: from-file\nimage: ghcr.io/acme/train:1.4\n"
                 "gpu_types: [a100, h100]\ngpus: 1\n")
    r = cli("--json", "submit", "-f", str(f))
    assert r.code == 0, r.err
    assert (r.json["gpu_type"], r.json["gpu_types"]) == ("a100", ["a100", "h100"])
    r = cli("--json", "submit", "-f", str(f), "-G", "h100")
    assert r.code == 0, r.err
    assert (r.json["gpu_type"], r.json["gpu_types"]) == ("h100", ["h100"])


def test_an_array_of_several_types(cli: Cli) -> None:
    r = cli(*SUBMIT, "-G", "a100,h100", "--array", "3")
    assert r.code == 0, r.err
    assert {tuple(j.gpu_types) for j in Job.objects.all()} == {("a100", "h100")}


def test_a_bad_list_is_a_usage_error_and_a_refused_type_the_servers_message(cli: Cli) -> None:
    r = cli(*SUBMIT, "-G", "h100,")
    assert r.code == 2 and "-G wants TYPE or TYPE,TYPE" in r.err
    r = cli(*SUBMIT, "-G", "h100,h100")
    assert r.code == 1 and "more than once: h100" in r.err
    assert Job.objects.count() == 0


def test_the_example_job_file_of_several_types_is_accepted(cli: Cli) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "eval-h100-or-a100.yaml"
    r = cli("--json", "submit", "-f", str(example))
    assert r.code == 0, r.err
    assert (r.json["gpu_type"], r.json["gpu_types"]) == ("h100", ["h100", "a100"])

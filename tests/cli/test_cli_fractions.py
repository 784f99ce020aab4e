"""`fairq submit --gpus 0.5` / `--gpus 1/4`: a fraction of one GPU of a time-sliced or
MPS type; `fairq status` and `fairq queue` say it as "0.5 GPU (2 of 4 slices,
time-sliced)" and warn that the GPU's memory is not isolated; a fraction the type does
not take is the server's readable refusal."""

from __future__ import annotations

from typing import Any

import pytest

from queueing.models import Job

from .conftest import Cli

SUBMIT = ["submit", "-t", "vision", "-J", "notebook", "-i", "ghcr.io/acme/train:1.4"]


def test_submit_a_half_gpu_and_read_it_back(cli: Cli, ts: Any) -> None:
    r = cli(*SUBMIT, "-G", "ts-a10", "-g", "0.5")
    assert r.code == 0, r.err
    job = Job.objects.get()
    assert (job.gpu_slices, job.gpus_per_replica) == (2, 1)
    assert "0.5xts-a10" in r.out
    status = cli("status", str(job.pk)).out
    assert ("  Resources 0.5 GPU (2 of 4 slices, time-sliced) of ts-a10 per replica, "
            "1 replica(s), 0.5 GPUs; tier") in status
    assert "no memory isolation" in status
    assert " 0.5xts-a10 " in cli("queue").out


def test_a_quarter_as_k_over_n(cli: Cli, ts: Any) -> None:
    r = cli("--json", *SUBMIT, "-G", "ts-a10", "-g", "1/4")
    assert r.code == 0, r.err
    assert (r.json["gpu_slices"], r.json["gpu_share"]) == (1, 0.25)


def test_a_fraction_the_type_does_not_take_is_refused_readably(cli: Cli, ts: Any) -> None:
    r = cli(*SUBMIT, "-G", "ts-a10", "-g", "0.3")
    assert r.code != 0
    assert "0.3 is not a multiple of 1/4 GPU of ts-a10 (4 slices per GPU)" in r.err
    r = cli(*SUBMIT, "-G", "h100", "-g", "0.5")
    assert "fractions need a time-sliced or MPS GPU type" in r.err


def test_a_gpus_flag_that_is_no_amount_is_refused_before_sending(
        cli: Cli, ts: Any, capsys: pytest.CaptureFixture[str]) -> None:
    r = cli(*SUBMIT, "-G", "ts-a10", "-g", "half")
    assert r.code == 2
    said = r.err + capsys.readouterr().err  # argparse writes its usage errors to stderr
    assert ("argument -g/--gpus: 'half': want whole GPUs (2) or a fraction of one GPU "
            "(0.5, 0.25, 1/4)") in said
    assert not Job.objects.exists()

"""--checkpoint-every 1h (or N steps): written into run.yaml, planned for disk (the $1000 8x H100 setup guide's hourly saves)."""

from __future__ import annotations

import json

import pytest

from gpucli.plan.disk import checkpoints_written
from gpucli.plan.runmodel import parse_checkpoint_every
from tests.support.cli import cli

SEED_004 = ("launch", "--dry-run", "--provider", "runpod", "--model", "d64", "--profile", "8xH100-PCIe",
            "--budget", "1000", "--checkpoint-every", "1h")


def test_seed_004_dry_run_says_the_checkpoints_and_their_disk(capsys):
    code, out, err = cli(capsys, *SEED_004, "--steps", "4000", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["run_yaml"]["training"]["checkpoint_every_s"] == 3600
    d = data["disk"]
    # The budget ends the run first: $1000 at the catalogue's price, an hourly checkpoint in each hour.
    price = data["price_per_hour_usd"]
    hours = min(1000 / price, data["planned"]["hours"])
    assert d["checkpoints_written"] == checkpoints_written(4000, data["run_yaml"]["training"]["checkpoint_interval"],
                                                           hours, 3600)
    assert d["all_kept_gb"] == pytest.approx(d["checkpoints_written"] * d["checkpoint_gb"])
    assert d["checkpoint_gb"] > 150  # d64 is 12.9B parameters: 4 bytes of weights + 8 of AdamW each


def test_seed_004_disk_of_270_gb_is_refused(capsys):
    code, _, err = cli(capsys, *SEED_004, "--disk", "270")
    assert code == 2 and "Traceback" not in err
    assert "--disk 270 GB cannot hold this run" in err


@pytest.mark.parametrize("text,want", [("1h", {"checkpoint_every_s": 3600.0}), ("30m", {"checkpoint_every_s": 1800.0}),
                                       ("500", {"checkpoint_interval": 500})])
def test_parse(text, want):
    assert parse_checkpoint_every(text) == want


def test_bad_values_are_one_line(capsys):
    code, _, err = cli(capsys, "launch", "--dry-run", "--profile", "cpu", "--checkpoint-every", "soon")
    assert code == 2 and "--checkpoint-every" in err and "Traceback" not in err


def test_count_of_checkpoints():
    assert checkpoints_written(1000, 100, 9.6, 3600) == 10 + 9  # the 1000th step's is the final one
    assert checkpoints_written(1050, 100, None, None) == 11

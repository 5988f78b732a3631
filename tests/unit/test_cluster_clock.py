"""The sustained clock as a property of a cluster: a profile over a catalog GPU (``base``) gives the SM
clock its GPUs hold through training (``sustained_mhz``), read against the clock the component tables
ran at (``table_clock_mhz``, accelerators.toml)."""

import pytest

from meshwise import cli
from meshwise.cost.estimate import estimate
from meshwise.layout import parse
from meshwise.spec import TrainSpec, load_cluster, load_model


def _profile(tmp_path, text):
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return str(path)


def _step(gpu):
    model, train = load_model("llama3-8b"), TrainSpec(64, 4096)
    return estimate(model, load_cluster(gpu, 8), train, parse("dp=8,zero=3,mbs=1,ac=none", 8)).time


def test_the_catalog_clock_is_the_table_clock_times_the_sustained_ratio(tmp_path):
    same = _profile(tmp_path, 'base = "h100"\nsustained_mhz = 1575\n')
    catalog = load_cluster("h100", 8).accelerator.sustained_clock  # 0.795: 1575 / 1980 to three places
    assert load_cluster(same, 8).accelerator.sustained_clock == pytest.approx(catalog, abs=1e-3)
    assert _step(same).step_s == pytest.approx(_step("h100").step_s, rel=1e-3)


def test_a_cluster_holding_a_higher_clock_computes_faster_but_no_more_than_the_clock(tmp_path):
    fast = _profile(tmp_path, 'base = "h100"\nname = "h100-vboost"\nsustained_mhz = 1755\n')
    accel = load_cluster(fast, 8).accelerator
    assert accel.name == "h100-vboost" and accel.sustained_clock == pytest.approx(1755 / 1980)
    base, quick = _step("h100"), _step(fast)
    assert 1575 / 1755 - 1e-9 <= quick.compute_s / base.compute_s < 1


@pytest.mark.parametrize(
    "text,field",
    [
        ('base = "h100"\nsustained_mhz = 2500\n', "sustained_mhz"),
        ('base = "h1000"\n', "base"),
        ('base = "h100"\nsustained_mhz = 1700\nsustained_clock = 0.8\n', "sustained_mhz"),
        ('base = "b300"\nsustained_mhz = 1700\n', "table_clock_mhz"),
    ],
)
def test_a_bad_cluster_clock_is_one_line(tmp_path, capsys, text, field):
    assert cli.main(["plan", "--gpu", _profile(tmp_path, text), "--gpus", "8", "--model", "llama3-8b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]

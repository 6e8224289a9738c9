"""`plan --plot FILE`: writes exactly FILE, refuses folders and unknown formats in one line, and says
"wrote" as its last line (it used to scroll away above the tables)."""

import pytest


def test_plot_writes_the_named_file_and_says_so_last(run, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "charts" / "front.svg"
    code, out, err = run("plan", "--model", "124m", "--plot", str(target))
    assert code == 0, err
    assert target.is_file() and target.read_bytes().lstrip().startswith(b"<?xml")
    assert not (tmp_path / "charts" / "front.svg.png").exists()
    assert err.strip().splitlines()[-1] == f"wrote {target}"


@pytest.mark.parametrize("name,needle", [("", "is a folder"), ("x.txt", "must end in .png"),
                                         ("noext", "must end in .png")])
def test_plot_refuses_folders_and_unknown_formats(run, tmp_path, name, needle):
    code, out, err = run("plan", "--model", "124m", "--plot", str(tmp_path / name) if name else str(tmp_path))
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == [], "nothing is written on a refused --plot"


def test_plot_to_an_unwritable_place_is_one_line(run, tmp_path):
    pytest.importorskip("matplotlib")
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run("plan", "--model", "124m", "--plot", str(blocker / "x.png"))
    assert code == 2 and "cannot write" in err and "Traceback" not in err, err

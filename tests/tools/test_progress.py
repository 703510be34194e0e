"""Progress bars (issue 44.3): on a terminal only, off with --quiet, and
never changing what a command prints on stdout."""
import io

import pytest

from ascmem import cli, progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def run(monkeypatch, capsys, argv, tty):
    err = Terminal() if tty else io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    code = cli.main(argv)
    return code, capsys.readouterr().out, err.getvalue()


@pytest.mark.parametrize("argv", [["replay", "--example", "many_small", "--allocator", "pool"],
                                  ["fit", "--example", "many_small", "--allocator", "pool",
                                   "--paged"]])
def test_bars_on_a_terminal_only_and_the_output_is_the_same(monkeypatch, capsys, argv):
    pytest.importorskip("tqdm")
    code, plain, err = run(monkeypatch, capsys, argv, tty=False)
    assert err == ""
    code2, shown, bars = run(monkeypatch, capsys, argv, tty=True)
    assert code == code2
    # the speed line varies, and the table's column widths with its digits
    # (so its rule of dashes, as wide as the widest cell, is left out too)
    def figures(out):
        return [line.split() for line in out.splitlines()
                if "M events/s" not in line and set(line) - set("- ")]
    assert figures(shown) == figures(plain)
    assert argv[0] in bars  # tqdm drew on the terminal
    code3, _, quiet = run(monkeypatch, capsys, argv + ["--quiet"], tty=True)
    assert quiet == "" and code3 == code


def test_without_tqdm_no_bars(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_tqdm(name, *a, **kw):
        if name == "tqdm":
            raise ImportError(name)
        return real(name, *a, **kw)
    monkeypatch.setattr("sys.stderr", Terminal())
    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    progress.configure(quiet=False)
    with progress.step("x") as watch:
        assert watch is None


def test_the_hand_written_printer_is_gone():
    assert not hasattr(cli, "_progress_printer")

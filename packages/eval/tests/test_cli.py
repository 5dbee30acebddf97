"""The `opstrata` command and `opstrata info`: versions, ranges, versions.lock, platform, cache dir."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from opstrata.eval import _cli, _info

DISTS = [f"opstrata-{name}" for name in _info.LAYERS]


def _versions() -> dict[str, str]:
    """Installed version of each opstrata distribution (skip the test outside an installed venv)."""
    try:
        return {dist: metadata.version(dist) for dist in DISTS}
    except metadata.PackageNotFoundError as exc:
        pytest.skip(f"{exc} has no installed metadata (run the tests through nox)")


def _write_lock(directory: Path, versions: dict[str, str]) -> Path:
    """A minimal versions.lock in `directory` with the given distribution versions."""
    lines = ["schema = 1", f"layers = {list(_info.LAYERS)!r}".replace("'", '"')]
    for dist, version in versions.items():
        name = dist.removeprefix("opstrata-")
        lines += ["", f"[packages.{name}]", f'path = "packages/{name}"', f'version = "{version}"']
    path = directory / "versions.lock"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cwd whose nearest versions.lock matches the installed versions.

    tmp may sit inside a checkout (nox puts TMPDIR under .nox/) whose lock legitimately disagrees with
    what a compat session installed, so tests that expect a clean report bring their own lock.
    """
    _write_lock(tmp_path, _versions())
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _info_json(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    """Run `opstrata info --json` in-process and return (exit code, parsed report)."""
    code = _cli.main(["info", "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_info_lists_every_package_with_its_version(workdir, capsys) -> None:
    versions = _versions()
    assert _cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for dist, version in versions.items():
        line = next(line for line in out.splitlines() if line.strip().startswith(dist + " "))
        assert version in line and "ranges ok" in line
    assert f"versions.lock: match ({workdir / 'versions.lock'})" in out
    assert f"numpy: {__import__('numpy').__version__}" in out
    assert "status: ok" in out


def test_outside_a_checkout_says_so(tmp_path, monkeypatch, capsys) -> None:
    _versions()
    monkeypatch.chdir(tmp_path)  # tmp may sit inside a checkout (nox puts TMPDIR under .nox/): stub the walk
    monkeypatch.setattr(_info, "find_lock", lambda start: None)
    assert _cli.main(["info"]) == 0
    assert "versions.lock: not in a checkout" in capsys.readouterr().out


def test_find_lock_walks_up_to_the_nearest(tmp_path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "versions.lock").write_text("", encoding="utf-8")
    (tmp_path / "a" / "versions.lock").write_text("", encoding="utf-8")
    assert _info.find_lock(tmp_path / "a" / "b") == tmp_path / "a" / "versions.lock"


def test_info_reports_declared_ranges(workdir, capsys) -> None:
    _, report = _info_json(capsys)
    by_name = {row["name"]: row for row in report["packages"]}
    assert by_name["ops"]["requires"] == {}
    assert set(by_name["eval"]["requires"]) == set(DISTS) - {"opstrata-eval"}
    assert all(not row["problems"] for row in report["packages"])


def test_matching_lock_found_by_walking_up(tmp_path, monkeypatch, capsys) -> None:
    lock = _write_lock(tmp_path, _versions())
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")
    code, report = _info_json(capsys)
    assert code == 0
    assert report["lock"] == {"path": str(lock), "status": "match", "problems": []}


def test_lock_mismatch_is_reported_and_fails(tmp_path, monkeypatch, capsys) -> None:
    versions = _versions()
    _write_lock(tmp_path, {**versions, "opstrata-graph": "9.9.9"})
    monkeypatch.chdir(tmp_path)
    assert _cli.main(["info"]) == 1
    out = capsys.readouterr().out
    assert "versions.lock: mismatch" in out
    assert f"opstrata-graph: installed {versions['opstrata-graph']}, versions.lock says 9.9.9" in out
    assert "pip install ./packages/graph" in out
    assert "status: PROBLEMS FOUND" in out


def test_malformed_lock_names_the_file_without_a_traceback(tmp_path, monkeypatch, capsys) -> None:
    _versions()
    (tmp_path / "versions.lock").write_text("schema = 1\n[packages\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, report = _info_json(capsys)
    assert code == 1
    assert report["lock"]["status"] == "unreadable"
    assert str(tmp_path / "versions.lock") in report["lock"]["problems"][0]
    assert "tools/lock.py sync" in report["lock"]["problems"][0]


def test_lock_entry_without_version_is_named(tmp_path, monkeypatch, capsys) -> None:
    versions = _versions()
    lock = _write_lock(tmp_path, {d: v for d, v in versions.items() if d != "opstrata-ops"})
    lock.write_text(lock.read_text() + '\n[packages.ops]\npath = "packages/ops"\n', encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, report = _info_json(capsys)
    assert code == 1
    assert (
        "key 'packages.ops.version': expected a version string, found None" in report["lock"]["problems"][0]
    )


def test_unmet_range_names_both_packages_and_versions() -> None:
    found = {"opstrata-ops": "0.3.0", "opstrata-graph": "0.1.0"}

    def version_of(dist: str) -> str:
        if dist not in found:
            raise metadata.PackageNotFoundError(dist)
        return found[dist]

    def requires_of(dist: str) -> list[str]:
        return ["numpy>=1.24", "opstrata-ops>=0.1,<0.2"] if dist == "opstrata-graph" else []

    rows = {row["name"]: row for row in _info.installed_packages(version_of, requires_of)}
    assert rows["graph"]["problems"] == [
        "requires opstrata-ops<0.2,>=0.1, but opstrata-ops 0.3.0 is installed; "
        "fix: pip install 'opstrata-graph==0.1.0' with matching lower packages"
    ]
    assert rows["ops"]["problems"] == [] and rows["runtime"]["version"] is None


def test_json_report_parses_with_platform_facts(workdir, capsys) -> None:
    versions = _versions()
    code, report = _info_json(capsys)
    assert code == 0 and report["ok"] is True
    assert {row["distribution"]: row["version"] for row in report["packages"]} == versions
    assert report["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert report["numpy"]["version"] == __import__("numpy").__version__
    assert isinstance(report["threadpools"], list)
    assert all("user_api" in pool and "num_threads" in pool for pool in report["threadpools"])


def test_cache_dir_env_override(workdir, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("OPSTRATA_CACHE_DIR", str(tmp_path / "my-cache"))
    _, report = _info_json(capsys)
    assert report["cache_dir"] == {"path": str(tmp_path / "my-cache"), "source": "OPSTRATA_CACHE_DIR"}


@pytest.mark.parametrize(
    ("environ", "expected", "source"),
    [
        ({"XDG_CACHE_HOME": "/x/cache"}, "/x/cache/opstrata", "XDG_CACHE_HOME"),
        ({"OPSTRATA_CACHE_DIR": "/o", "XDG_CACHE_HOME": "/x"}, "/o", "OPSTRATA_CACHE_DIR"),
        ({"OPSTRATA_CACHE_DIR": ""}, str(Path.home() / ".cache" / "opstrata"), "default"),
    ],
)
def test_cache_dir_precedence(environ: dict[str, str], expected: str, source: str) -> None:
    assert _info.cache_dir(environ) == {"path": expected, "source": source}


def test_no_command_prints_usage_and_exits_2(capsys) -> None:
    assert _cli.main([]) == 2
    err = capsys.readouterr().err
    assert f"expected a command ({', '.join(c.name for c in _cli.COMMANDS)})" in err
    assert "info" in err and "demo" in err


def test_every_registered_command_is_in_help(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(command.name in out for command in _cli.COMMANDS)


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a command with the checkout's sources kept off sys.path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_python_dash_m_entry_point(workdir) -> None:
    versions = _versions()
    result = _run([sys.executable, "-m", "opstrata.eval", "info", "--json"], workdir)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["packages"][0]["version"] == versions["opstrata-ops"]


def test_console_script_entry_point(workdir) -> None:
    versions = _versions()
    script = Path(sys.executable).parent / ("opstrata.exe" if os.name == "nt" else "opstrata")
    assert script.exists(), f"expected the opstrata console script at {script}; is opstrata-eval installed?"
    result = _run([str(script), "info"], workdir)
    assert result.returncode == 0, result.stderr
    assert f"opstrata-eval      {versions['opstrata-eval']}" in result.stdout
    version = _run([str(script), "--version"], workdir)
    assert version.stdout.strip() == f"opstrata {versions['opstrata-eval']}"


def test_info_reports_the_native_kernel_library(workdir, monkeypatch, capsys) -> None:
    import opstrata.ops as ops

    _, report = _info_json(capsys)
    nat = report["native"]
    if not hasattr(ops, "native_status"):  # the compat matrix runs eval against older opstrata-ops
        assert nat["available"] is False and "no native kernels" in nat["reason"]
        return
    if shutil.which("cc") is None:
        assert nat["available"] is False and nat["reason"]
    else:
        assert nat["available"] is True and nat["mode"] == "auto" and Path(nat["library"]).is_file()
    monkeypatch.setenv("OPSTRATA_NATIVE", "off")
    off = _info.native_info()
    assert off["available"] is False and "OPSTRATA_NATIVE=off" in off["reason"]
    assert "native kernels: off, numpy kernels run (disabled by OPSTRATA_NATIVE=off)" in _info.format_text(
        {**report, "native": off}
    )
    monkeypatch.setenv("OPSTRATA_NATIVE", "fast")
    bad = _info.native_info()
    assert bad["available"] is False and "OPSTRATA_NATIVE='fast'" in bad["reason"]


def test_info_reports_every_device_and_why_one_is_absent(workdir, capsys) -> None:
    import opstrata.ops as ops

    _, report = _info_json(capsys)
    rows = {d["name"]: d for d in report["devices"]}
    assert rows["cpu"]["available"] and rows["ref"]["available"]
    if not hasattr(ops, "device_status"):  # the compat matrix runs eval against older opstrata-ops
        return
    cuda = rows.get("cuda")
    assert cuda is not None, "ops' own cuda entry point should report the device, present or absent"
    shown = _info.format_text(report)
    if cuda["available"]:
        assert "device cuda: available" in shown
    else:
        assert cuda["reason"] and f"device cuda: not available: {cuda['reason']}" in shown


def test_info_reports_the_session_threads(workdir, monkeypatch, capsys) -> None:
    import opstrata.runtime as rt

    _, report = _info_json(capsys)
    th = report["session_threads"]
    if not hasattr(rt, "thread_info"):  # the compat matrix runs eval against older opstrata-runtime
        assert th["available"] is False and "added in 0.5.2" in th["reason"]
        return
    assert th["available"] is True and th["intra_op_num_threads"] >= 1
    monkeypatch.setenv("OPSTRATA_NUM_THREADS", "3")
    three = _info.session_threads()
    assert three["intra_op_num_threads"] == 3 and "OPSTRATA_NUM_THREADS" in three["intra_op_source"]
    assert "session threads: intra-op 3" in _info.format_text({**report, "session_threads": three})
    monkeypatch.setenv("OPSTRATA_NUM_THREADS", "x")
    bad = _info.session_threads()
    assert bad["available"] is False and "OPSTRATA_NUM_THREADS" in bad["reason"]
    assert f"session threads: {bad['reason']}" in _info.format_text({**report, "session_threads": bad})

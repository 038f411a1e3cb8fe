"""A base install (`pip install pdserve`, no extras) runs `pdserve simulate`, `pdserve plan` and
every subcommand's --help, and the commands that need an extra say which.

A subprocess runs the commands with an import hook that refuses every top-level module
outside the standard library, pdserve and the base dependencies of pyproject.toml (with
their own dependencies, as installed here), as if nothing else were installed: a module on
the simulate or plan path that imports an extra's package (torch, fastapi, ray, ...) at
module level fails the test. The hook is installed in the planners' worker processes too
(they re-import the script, spawned or forked).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import pytest

import pdserve

ROOT = Path(pdserve.__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
# packages of the extras, none of which the simulate or plan path may need
EXTRAS_ONLY = ("torch", "fastapi", "uvicorn", "ray", "transformers", "gguf", "tokenizers",
               "safetensors", "jinja2", "httpx", "llguidance", "plotly", "prometheus_client")

SCRIPT = textwrap.dedent('''
    import contextlib, io, json, os, sys

    ALLOWED = set(json.loads(os.environ["PDSERVE_BASE_MODULES"]))


    class BaseInstallOnly:
        """Finds nothing outside a base install: its import fails as if not installed."""

        def find_spec(self, name, path=None, target=None):
            top = name.partition(".")[0]
            if (top in ALLOWED or top in sys.stdlib_module_names or top == "pdserve"
                    or top.startswith("_sysconfigdata")):
                return None
            raise ModuleNotFoundError(f"No module named {top!r} (not a base dependency of "
                                      f"pdserve)", name=top)


    sys.meta_path.insert(0, BaseInstallOnly())

    if __name__ == "__main__":
        from pdserve import cli

        results = []
        for argv in json.loads(sys.argv[1]):
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = cli.main(argv)
                except SystemExit as exit_:  # --help
                    code = exit_.code
            results.append({"argv": argv, "code": code, "stdout": out.getvalue(),
                            "stderr": err.getvalue()})
        print(json.dumps(results))
''')


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return _normalized(match.group(1))


def base_distributions() -> set[str]:
    """The [project] dependencies of pyproject.toml and, as installed, their dependencies
    (not those behind an extra of theirs)."""
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    found: set[str] = set()
    todo = [_requirement_name(r) for r in declared]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [_requirement_name(r) for r in requires
                 if "extra" not in r.partition(";")[2]]
    return found


@lru_cache(maxsize=1)
def base_modules() -> frozenset[str]:
    """Top-level modules the base distributions install."""
    distributions = base_distributions()
    return frozenset(module for module, owners in metadata.packages_distributions().items()
                     if any(_normalized(owner) in distributions for owner in owners))


def run_cli(commands: list[list[str]], tmp_path: Path) -> list[dict]:
    script = tmp_path / "base_install.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PDSERVE_BASE_MODULES": json.dumps(sorted(base_modules())),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(script), json.dumps(commands)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def _source_checkout():
    if not PYPROJECT.is_file():
        pytest.skip("pdserve is not a source checkout (no pyproject.toml beside it)")


def test_the_hook_refuses_the_extras_packages():
    modules = base_modules()
    assert {"numpy", "yaml", "matplotlib"} <= modules
    assert not modules & set(EXTRAS_ONLY)


def test_simulate_runs_on_a_base_install(tmp_path: Path):
    [result] = run_cli([["simulate", "--trace", "synthetic", "--synthetic-requests", "40",
                         "--synthetic-rate", "20", "--policy", "static-pd", "--prefill", "1",
                         "--decode", "1", "--model", "llama-3.1-8b", "--gpu", "h800",
                         "--no-progress", "--out", str(tmp_path / "out")]], tmp_path)
    assert result["code"] == 0, result["stderr"]
    assert "SLO attainment" in result["stdout"]
    assert (tmp_path / "out" / "latency_cdf.png").is_file()
    assert (tmp_path / "out" / "summary.json").is_file()
    # no plotly: no report.html, and one line says how to get it
    assert not (tmp_path / "out" / "report.html").exists()
    hints = [line for line in result["stderr"].splitlines() if "report.html" in line]
    assert len(hints) == 1 and "pip install 'pdserve[report]'" in hints[0], result["stderr"]


def test_both_planners_run_on_a_base_install(tmp_path: Path):
    ampd, taichi = run_cli([
        ["plan", "--policy", "ampd", "--gpus", "2", "--synthetic-requests", "5",
         "--synthetic-rate", "0.5", "--model", "llama-3.1-8b", "--gpu", "h800",
         "--processes", "1", "--out", str(tmp_path / "ampd")],
        ["plan", "--policy", "taichi", "--trace", "synthetic", "--synthetic-requests", "30",
         "--synthetic-rate", "10", "--instances", "2", "--chunk-sizes", "512",
         "--d-chunk-sizes", "0", "--processes", "1", "--no-progress", "--model",
         "llama-3.1-8b", "--gpu", "h800", "--time-limit", "30"]], tmp_path)
    assert ampd["code"] == 0, ampd["stderr"]
    assert "deployments by the ILP" in ampd["stdout"]
    assert (tmp_path / "ampd" / "summary.json").is_file()  # the report needs plotly
    assert not (tmp_path / "ampd" / "report.html").exists()
    assert "pip install 'pdserve[report]'" in ampd["stderr"]
    assert taichi["code"] == 0, taichi["stderr"]
    assert "best: --policy taichi" in taichi["stdout"]


def test_every_help_works_and_extras_are_named_on_a_base_install(tmp_path: Path):
    helps = [["--help"], *([command, "--help"] for command in (
        "simulate", "plan", "serve", "bench", "profile", "predictor"))]
    results = run_cli([*helps, ["serve"], ["profile", "--quick"], ["bench"],
                       ["predictor", "train", "--data", "x.npz", "--out", "x.pt"]], tmp_path)
    for result in results[:len(helps)]:
        assert result["code"] == 0 and "usage: pdserve" in result["stdout"], result
    serve, profile, bench, predictor = results[len(helps):]
    for result, extra in ((serve, "serve"), (profile, "engine"), (bench, "bench"),
                          (predictor, "engine")):
        assert result["code"] == 2, result
        assert f"pip install 'pdserve[{extra}]'" in result["stderr"], result

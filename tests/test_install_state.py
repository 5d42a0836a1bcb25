"""Builds once: scripts/setup.sh installs again only what changed (scripts/install_state.py),
and setup.py compiles only the native modules whose inputs changed. Run on copies of the
project's files in a scratch tree, without installing or compiling anything."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sysconfig
from pathlib import Path

import pytest
from setuptools import Extension

ROOT = Path(__file__).resolve().parent.parent
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: setup.py defines, does not build
    return module


install_state = load("install_state", ROOT / "scripts" / "install_state.py")
native = load("tally_setup", ROOT / "setup.py")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A project tree: the real pyproject.toml and setup.py, one Cython module compiled."""
    root = tmp_path / "project"
    (root / "merge_engine").mkdir(parents=True)
    shutil.copy(ROOT / "pyproject.toml", root)
    shutil.copy(ROOT / "setup.py", root)
    (root / "merge_engine" / "key_groups.pyx").write_text("def groups(): return 1\n")
    (root / "merge_engine" / f"key_groups{SUFFIX}").write_bytes(b"\x7fELF compiled")
    (root / ".venv").mkdir()
    return root


def plan(root: Path, extras: str) -> tuple[str, list[str]]:
    return install_state.plan(root, root / ".venv", extras)


def test_a_new_venv_installs_the_project(tree):
    assert plan(tree, "test") == ("project", [])


def test_an_unchanged_tree_with_its_extras_installs_nothing(tree):
    install_state.record(tree, tree / ".venv", "test")
    assert plan(tree, "test") == ("current", [])
    # [test] names [spark], [lake] and [docs] through the project: they are in too.
    assert plan(tree, "spark,docs") == ("current", [])


def test_a_missing_extra_adds_its_requirements_without_a_build(tree):
    install_state.record(tree, tree / ".venv", "spark")
    action, requirements = plan(tree, "spark,docs")
    assert action == "extras"
    assert requirements == ["pdoc>=14"]
    install_state.record(tree, tree / ".venv", "spark,docs")
    assert plan(tree, "docs") == ("current", [])


def test_a_changed_cython_source_installs_the_project_again(tree):
    install_state.record(tree, tree / ".venv", "test")
    pyx = tree / "merge_engine" / "key_groups.pyx"
    os.utime(pyx, (1, 1))  # touched, not changed
    assert plan(tree, "test") == ("current", [])
    pyx.write_text("def groups(): return 2\n")
    assert plan(tree, "test") == ("project", [])


@pytest.mark.parametrize("change", ["pyproject", "setup", "compiled file removed"])
def test_other_inputs_install_the_project_again(tree, change):
    install_state.record(tree, tree / ".venv", "test")
    if change == "pyproject":
        with open(tree / "pyproject.toml", "a") as f:
            f.write("\n# a new line\n")
    elif change == "setup":
        with open(tree / "setup.py", "a") as f:
            f.write("\n# a new line\n")
    else:
        (tree / "merge_engine" / f"key_groups{SUFFIX}").unlink()
    assert plan(tree, "test") == ("project", [])


def test_extras_recorded_against_other_inputs_are_forgotten(tree):
    install_state.record(tree, tree / ".venv", "bench")
    with open(tree / "pyproject.toml", "a") as f:
        f.write("\n# a new line\n")
    install_state.record(tree, tree / ".venv", "docs")
    assert plan(tree, "docs") == ("current", [])
    assert plan(tree, "bench")[0] == "extras"


def test_an_unknown_extra_is_refused_by_name(tree):
    with pytest.raises(SystemExit, match="no extra named 'sparks'"):
        plan(tree, "sparks")


@pytest.fixture
def module(tmp_path: Path) -> tuple[Extension, Path, Path]:
    """A native module's C source, its compiled file and a directory for stamps."""
    source = tmp_path / "key_groups.c"
    source.write_text("int groups(void) { return 1; }\n")
    compiled = tmp_path / f"key_groups{SUFFIX}"
    compiled.write_bytes(b"\x7fELF compiled")
    ext = Extension("merge_engine.write.key_groups", [str(source)], extra_compile_args=["-O3"])
    return ext, compiled, tmp_path / "stamps"


def test_a_compiled_module_is_reused_until_its_inputs_change(module):
    ext, compiled, stamps = module
    assert not native.is_current(ext.name, compiled, native.inputs_digest(ext), stamps)
    native.record(ext.name, compiled, native.inputs_digest(ext), stamps)
    assert native.is_current(ext.name, compiled, native.inputs_digest(ext), stamps)

    source = Path(ext.sources[0])
    os.utime(source, (1, 1))
    assert native.is_current(ext.name, compiled, native.inputs_digest(ext), stamps)
    source.write_text("int groups(void) { return 2; }\n")
    assert not native.is_current(ext.name, compiled, native.inputs_digest(ext), stamps)


def test_other_compiler_options_compile_again(module):
    ext, compiled, stamps = module
    native.record(ext.name, compiled, native.inputs_digest(ext), stamps)
    ext.extra_compile_args = ["-O0"]
    assert not native.is_current(ext.name, compiled, native.inputs_digest(ext), stamps)


def test_a_compiled_file_that_another_build_wrote_is_compiled_again(module):
    ext, compiled, stamps = module
    native.record(ext.name, compiled, native.inputs_digest(ext), stamps)
    compiled.write_bytes(b"\x7fELF from elsewhere")
    assert not native.is_current(ext.name, compiled, native.inputs_digest(ext), stamps)
    compiled.unlink()
    assert not native.is_current(ext.name, compiled, native.inputs_digest(ext), stamps)


def test_the_build_compiles_the_modules_it_lists():
    assert {ext.name for ext in native.extensions()} == {
        path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
        for path in install_state.native_sources(ROOT) if path.suffix == ".pyx"}

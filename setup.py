"""The native modules (Cython: aggfuncs.group_joins, aggfuncs.string_gather,
aggfuncs.stored_folds, merge_engine.write.key_groups, merge_engine.kv.key_search,
merge_engine.write.row_bytes, merge_engine.write.row_gather); everything else is in pyproject.toml.

`pip install -e .` (scripts/setup.sh) compiles them with the machine's C compiler and Python
headers; Cython comes from the build requirements. A module is compiled once per content of
its inputs: a build whose module's C source, compiler options and Python ABI are those of the
compiled file already in the tree reuses that file (build/native/ keeps each one's stamp)."""

import hashlib
import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
MODULES = ("aggfuncs.group_joins", "aggfuncs.string_gather", "aggfuncs.stored_folds",
           "merge_engine.write.key_groups", "merge_engine.kv.key_search", "merge_engine.write.row_bytes",
           "merge_engine.write.row_gather")
STAMPS = ROOT / "build" / "native"


def extensions() -> list[Extension]:
    return [Extension(name, [name.replace(".", "/") + ".pyx"], extra_compile_args=["-O3"])
            for name in MODULES]


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def inputs_digest(ext: Extension) -> str:
    """What the compiled module is made of: its sources' bytes (the C that Cython generated,
    which changes with the .pyx and whatever it cimports), the options it is compiled with and
    the ABI of the Python it is for. Timestamps are not used: a checkout touches files without
    changing them."""
    digest = hashlib.sha256()
    for source in [*ext.sources, *ext.depends]:
        digest.update(source.encode() + b"\0" + file_digest(Path(source)).encode())
    options = (ext.extra_compile_args, ext.extra_link_args, ext.define_macros,
               ext.undef_macros, ext.include_dirs, ext.libraries, ext.library_dirs,
               sys.implementation.cache_tag, sysconfig.get_config_var("EXT_SUFFIX"),
               sysconfig.get_config_var("CC"), sysconfig.get_config_var("CFLAGS"),
               os.environ.get("CC"), os.environ.get("CFLAGS"))
    digest.update(repr(options).encode())
    return digest.hexdigest()


def stamp_path(name: str, stamps: Path = STAMPS) -> Path:
    return stamps / f"{name}.json"


def is_current(name: str, compiled: Path, inputs: str, stamps: Path = STAMPS) -> bool:
    """Whether `compiled` was built from `inputs` (and is the very file that build wrote)."""
    try:
        stamp = json.loads(stamp_path(name, stamps).read_text())
        return (stamp["inputs"] == inputs and compiled.is_file()
                and stamp["compiled"] == file_digest(compiled))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def record(name: str, compiled: Path, inputs: str, stamps: Path = STAMPS) -> None:
    stamps.mkdir(parents=True, exist_ok=True)
    path = stamp_path(name, stamps)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps({"inputs": inputs, "compiled": file_digest(compiled)}))
    partial.replace(path)


class BuildOnce(build_ext):
    """build_ext that compiles only the modules whose inputs changed: pip builds an editable
    install in a fresh temporary directory every time, so distutils' own up-to-date check (the
    output newer than its sources) never finds the output and recompiles everything."""

    def paths(self, ext: Extension) -> tuple[Path, Path]:
        """The module's file in the tree (kept between builds) and in build_lib (where run()
        builds it, copying it to the tree afterwards when in place)."""
        fullname = self.get_ext_fullname(ext.name)
        filename = self.get_ext_filename(fullname)
        package_dir = self.get_finalized_command("build_py").get_package_dir(
            fullname.rpartition(".")[0])
        return Path(package_dir, os.path.basename(filename)), Path(self.build_lib, filename)

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:  # both cores for a first build, or a change to several
            self.parallel = os.cpu_count() or 1

    def build_extension(self, ext: Extension) -> None:
        in_tree, built = self.paths(ext)
        inputs = inputs_digest(ext)
        if not self.force and is_current(ext.name, in_tree, inputs):
            print(f"native: {ext.name} is unchanged, reusing {in_tree}", file=sys.stderr)
            built.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(in_tree, built)
            return
        print(f"native: compiling {ext.name}", file=sys.stderr)
        super().build_extension(ext)
        record(ext.name, built, inputs)

    def copy_extensions_to_source(self) -> None:
        # By renaming a complete copy over the old file, never by rewriting it: processes
        # running from this tree have the old module mapped, and an unchanged one is left be.
        for ext in self.extensions:
            in_tree, built = self.paths(ext)
            if in_tree.is_file() and file_digest(in_tree) == file_digest(built):
                continue
            partial = in_tree.with_name(in_tree.name + ".partial")
            shutil.copy2(built, partial)
            partial.replace(in_tree)


if __name__ == "__main__":
    from Cython.Build import cythonize

    setup(ext_modules=cythonize(extensions(), language_level=3, quiet=True),
          cmdclass={"build_ext": BuildOnce})

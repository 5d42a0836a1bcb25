"""The native modules (Cython: aggfuncs.group_joins, aggfuncs.string_gather,
aggfuncs.stored_folds, merge_engine.key_groups, merge_engine.key_search,
merge_engine.row_bytes, merge_engine.row_gather); everything else is in pyproject.toml.

`pip install -e .` (scripts/setup.sh) compiles them with the machine's C compiler and Python
headers; Cython comes from the build requirements."""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize(
    [Extension(name, [name.replace(".", "/") + ".pyx"], extra_compile_args=["-O3"])
     for name in ("aggfuncs.group_joins", "aggfuncs.string_gather", "aggfuncs.stored_folds",
                  "merge_engine.key_groups", "merge_engine.key_search", "merge_engine.row_bytes",
                  "merge_engine.row_gather")],
    language_level=3))

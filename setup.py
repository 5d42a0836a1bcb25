"""The one native module (aggfuncs.group_joins, Cython): everything else is in pyproject.toml.

`pip install -e .` (scripts/setup.sh) compiles it with the machine's C compiler and Python
headers; Cython comes from the build requirements."""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize(
    [Extension("aggfuncs.group_joins", ["aggfuncs/group_joins.pyx"], extra_compile_args=["-O3"])],
    language_level=3))

# The compiled core is built by cffi (bindings/build_core.py); everything else
# about the package is declared in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["bindings/build_core.py:ffibuilder"])

"""Packaging beside pyproject.toml: the package list, and the one compiled module.

The import namespace is `kvplane` alone. The two planes keep their folders at the repository's top
level (the layout of the design card) and install as `kvplane.controlplane` and `kvplane.dataplane`.

kvplane._pricing (kvplane/_pricing.c) prices routing candidates in predicted seconds: the only
implementation of that computation, so the control plane needs it (a C compiler and the Python
headers at install). It is built as optional: where it cannot be, the SDK and the agents still
install and work, and the control plane refuses to start with an error that says what to install.
It uses only the public C API. -ffp-contract=off: no fused multiply-add, so each term rounds as
written."""

from setuptools import Extension, find_packages, setup

PLANES = {"kvplane.controlplane": "controlplane", "kvplane.dataplane": "dataplane"}

packages = find_packages(include=["kvplane", "kvplane.*"])
for package, folder in PLANES.items():
    packages += [package, *(f"{package}.{sub}" for sub in find_packages(where=folder))]

pricing = Extension("kvplane._pricing", ["kvplane/_pricing.c"], extra_compile_args=["-O2", "-std=c11", "-ffp-contract=off"], optional=True)

setup(packages=packages, package_dir=PLANES, ext_modules=[pricing])

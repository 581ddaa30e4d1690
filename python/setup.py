"""pip install --no-build-isolation ./python: the memento package with its extension.

The extension is built by the project's CMake (target _memento) in a build
directory of its own (under build_temp), or in $MEMENTO_CMAKE_BUILD_DIR:
configured there when it is empty, and used as it is configured (only the
target _memento is built; its Python must be this one) when it already holds
a CMakeCache.txt, e.g. the checkout's build/. Offline: every build
requirement is a Debian package.
"""

import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def project_version():
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        m = re.search(r"project\(memento VERSION ([0-9.]+)", f.read())
    if not m:
        raise RuntimeError("no 'project(memento VERSION x.y.z)' in CMakeLists.txt")
    return m.group(1)


def cached_python(build_dir):
    """The Python a configured build directory built the extension for, or None."""
    with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
        for line in f:
            if line.startswith("MEMENTO_PYTHON_EXECUTABLE:"):
                return line.split("=", 1)[1].strip()
    return None


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        reuse = os.environ.get("MEMENTO_CMAKE_BUILD_DIR")
        build_dir = os.path.abspath(reuse or os.path.join(self.build_temp, "cmake"))
        if reuse and os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            # A configured build directory (e.g. the checkout's build/) is used
            # as it is configured: only the extension's target is built.
            python = cached_python(build_dir)
            if python is None:
                raise RuntimeError(
                    f"MEMENTO_CMAKE_BUILD_DIR={build_dir} has no Python package configured "
                    "(MEMENTO_PYTHON=OFF, or python3-dev/pybind11-dev were missing when it was "
                    "configured)")
            if os.path.realpath(python) != os.path.realpath(sys.executable):
                raise RuntimeError(
                    f"MEMENTO_CMAKE_BUILD_DIR={build_dir} builds the extension for {python}, "
                    f"pip runs {sys.executable}; configure it with -DPython_EXECUTABLE="
                    f"{sys.executable} or unset MEMENTO_CMAKE_BUILD_DIR")
        else:
            subprocess.check_call([
                "cmake", "-S", REPO, "-B", build_dir, "-G", "Ninja",
                "-DCMAKE_BUILD_TYPE=Release", "-DMEMENTO_BUILD_TESTS=OFF",
                "-DMEMENTO_BUILD_BENCH=OFF", "-DMEMENTO_PYTHON=ON",
                f"-DPython_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "_memento"])
        built = glob.glob(os.path.join(build_dir, "python", "memento", "_memento*.so"))
        if not built:
            raise RuntimeError(f"cmake built no _memento*.so in {build_dir}/python/memento")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built[0], dest)


setup(
    name="memento",
    version=project_version(),
    description="In-memory checkpointing for large-model training (PyTorch integration)",
    packages=["memento"],
    package_dir={"memento": "memento"},
    ext_modules=[Extension("memento._memento", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.8",
)

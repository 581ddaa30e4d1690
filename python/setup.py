"""pip install --no-build-isolation ./python: the memento package with its extension.

The extension is built by the project's CMake (target _memento) in a build
directory of its own (build_temp, or $MEMENTO_CMAKE_BUILD_DIR), never in the
checkout's build/. Offline: every build requirement is a Debian package.
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


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("MEMENTO_CMAKE_BUILD_DIR") or os.path.abspath(
            os.path.join(self.build_temp, "cmake"))
        subprocess.check_call([
            "cmake", "-S", REPO, "-B", build_dir, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            "-DMEMENTO_BUILD_TESTS=OFF", "-DMEMENTO_BUILD_BENCH=OFF", "-DMEMENTO_PYTHON=ON",
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

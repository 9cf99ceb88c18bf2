# SPDX-License-Identifier: Apache-2.0
"""pip's entry to zinf's CMake build (pyproject.toml holds the metadata).

build_ext configures the source tree with CMake (release, no tests, benchmarks or CLI), builds
the one target zinf._native and copies it into the wheel beside the pure-Python package.
ZINF_CMAKE_BUILD_DIR reuses an existing build directory (scripts/test.sh points it at
build/release, which is already built); otherwise build/pip under the source tree.
ZINF_CMAKE_ARGS adds configure arguments (e.g. -DZINF_WITH_CUDA=OFF).
"""

import glob
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("ZINF_CMAKE_BUILD_DIR") or os.path.join(ROOT, "build", "pip")
        if not os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")):
            configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                         "-DZINF_BUILD_TESTS=OFF", "-DZINF_BUILD_BENCHMARKS=OFF",
                         "-DZINF_BUILD_TOOLS=OFF", "-DZINF_WITH_PYTHON=ON",
                         f"-DPython3_EXECUTABLE={sys.executable}"]
            if shutil.which("ninja"):
                configure += ["-G", "Ninja"]
            configure += shlex.split(os.environ.get("ZINF_CMAKE_ARGS", ""))
            subprocess.run(configure, check=True)
        jobs = str(os.cpu_count() or 1)
        subprocess.run(["cmake", "--build", build_dir, "--target", "zinf_python", "-j", jobs],
                       check=True)
        built = glob.glob(os.path.join(build_dir, "python", "zinf", "_native*.so"))
        if len(built) != 1:
            raise RuntimeError(f"zinf: expected one _native module under {build_dir}/python/zinf, "
                               f"found {built}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built[0], target)


setup(ext_modules=[Extension("zinf._native", sources=[])], cmdclass={"build_ext": CMakeBuild})

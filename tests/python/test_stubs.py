# SPDX-License-Identifier: Apache-2.0
# The committed type stubs of the native module (python/zinf/_native.pyi) are what the built
# module has: regenerated with scripts/gen-stubs.sh (mypy's stubgen) and compared, and checked
# by mypy itself, so an editor never shows a signature the binding no longer has. mypy writes
# no cache (--cache-dir=/dev/null): it ran in the checkout and left .mypy_cache there.
import os
import pathlib
import subprocess
import sys

import pytest

import zinf

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytest.importorskip("mypy", reason="mypy's stubgen (Debian's python3-mypy) is not installed")


def test_the_committed_stubs_are_the_built_modules(tmp_path):
    package = pathlib.Path(zinf.__file__).parent
    out = tmp_path / "_native.pyi"
    subprocess.run(["bash", str(ROOT / "scripts" / "gen-stubs.sh"), str(package.parent),
                    str(out)], check=True)
    committed = (ROOT / "python" / "zinf" / "_native.pyi").read_text()
    assert out.read_text() == committed, \
        "python/zinf/_native.pyi differs from the build: run scripts/gen-stubs.sh"


def test_the_stubs_and_the_package_type_check(tmp_path):
    # mypy over a use of the typed surface: the stubs parse and agree with their callers.
    use = tmp_path / "use.py"
    use.write_text("from zinf import _native\n"
                   "h = _native.AioHandle(4096, 8, False, False, 1)\n"
                   "n: int = h.get_block_size()\n"
                   "o = _native.io_options('', 'aio', '')\n"
                   "b: int = o.block_size\n")
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir=/dev/null",
                        "--follow-imports=skip",
                        "--ignore-missing-imports", str(use)],
                       capture_output=True, text=True,
                       env=dict(os.environ, MYPYPATH=str(ROOT / "python")))
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_public_function_and_constructor_names_its_argument_types():
    # What help() and an editor show: every argument of the public functions and classes of
    # zinf.torch, zinf.distributed, zinf.compat.deepspeed and zinf.pinned has a type.
    import inspect

    import zinf.compat.deepspeed
    import zinf.distributed
    import zinf.pinned
    import zinf.torch
    missing = []
    for mod in (zinf.pinned, zinf.torch, zinf.distributed, zinf.compat.deepspeed):
        for name in dir(mod):
            obj = getattr(mod, name)
            if name.startswith("_") or not getattr(obj, "__module__", "").startswith("zinf"):
                continue
            if inspect.isclass(obj):
                if obj.__init__ is object.__init__ or issubclass(obj, BaseException):
                    continue
                fn = obj.__init__
            elif inspect.isfunction(obj):
                fn = obj
            else:
                continue
            sig = inspect.signature(fn)
            for p, param in sig.parameters.items():
                if p != "self" and param.annotation is inspect.Parameter.empty:
                    missing.append(f"{mod.__name__}.{name}({p})")
    assert missing == []


def test_mypy_finds_nothing_in_the_package():
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental",
                        "--cache-dir=/dev/null", "--ignore-missing-imports", "-p", "zinf"],
                       capture_output=True, text=True, cwd=str(ROOT),
                       env=dict(os.environ, MYPYPATH=str(ROOT / "python")))
    assert r.returncode == 0, r.stdout + r.stderr

"""Build collectives._native from native/ with only a C compiler (libc and pthreads), and,
where jaxlib is installed, collectives._jaxffi (the XLA FFI handler of collectives.jax) against
that jaxlib's headers."""
import glob
import importlib.util
import os
import platform
import sys

from setuptools import Extension, setup

# The platform profile (native/src/platform/): $POOLTENSOR_NATIVE=linux or posix; linux on
# Linux, posix (what macOS has) elsewhere.
profile = os.environ.get("POOLTENSOR_NATIVE") or ("linux" if sys.platform.startswith("linux")
                                                   else "posix")
if profile not in ("linux", "posix"):
    raise SystemExit(f"POOLTENSOR_NATIVE must be linux or posix, not {profile!r}")
others = {f"native/src/platform/{p}.c" for p in ("linux", "posix") if p != profile}
# native/src is in rooms (core, platform, transport/*, team, kernels): every .c under it, but
# one profile.
sources = [s for s in sorted(glob.glob("native/src/**/*.c", recursive=True))
           if s.replace(os.sep, "/") not in others]
sources += sorted(glob.glob("native/binding/*.c"))   # not native/binding/jax: see below
flags = ["-std=gnu11", "-O3", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"]
flags.append(f"-DPT_PLATFORM_{profile.upper()}=1")
if platform.machine() in ("x86_64", "AMD64"):
    flags.append("-DPT_X86=1")

extensions = [
    Extension(
        "collectives._native",
        sources=sources,
        include_dirs=["native/include", "native/src"],  # "pt.h"; "core/internal.h", ...
        extra_compile_args=flags,
        libraries=["pthread"] + (["dl"] if sys.platform.startswith("linux") else []),
    )
]


def jaxlib_include():
    """The XLA FFI headers of the installed jaxlib (jax.ffi.include_dir()), found without
    importing jax; None where jaxlib is not installed or has none."""
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:
        return None
    inc = os.path.join(list(spec.submodule_search_locations)[0], "include")
    return inc if os.path.isfile(os.path.join(inc, "xla", "ffi", "api", "c_api.h")) else None


# The FFI handler: a small extension of its own, built only where jaxlib is, so that the main
# extension never needs jax ($POOLTENSOR_NO_JAX=1 skips it). It calls the engine linked into
# collectives._native through a table of function pointers, not a second copy of it.
jax_inc = None if os.environ.get("POOLTENSOR_NO_JAX") else jaxlib_include()
if jax_inc:
    extensions.append(Extension(
        "collectives._jaxffi",
        sources=["native/binding/jax/jax_ffi.c"],
        include_dirs=["native/include", "native/binding", jax_inc],
        extra_compile_args=flags,
        libraries=["pthread"],
    ))

setup(ext_modules=extensions)

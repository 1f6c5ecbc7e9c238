"""Build collectives._native from native/ with only a C compiler (libc and pthreads)."""
import glob
import platform

from setuptools import Extension, setup

# native/src is in rooms (core, platform, transport/*, team, kernels): every .c under it.
sources = sorted(glob.glob("native/src/**/*.c", recursive=True))
sources += sorted(glob.glob("native/binding/*.c"))
flags = ["-std=gnu11", "-O3", "-Wall", "-Wextra", "-Wno-unused-parameter", "-fvisibility=hidden"]
if platform.machine() in ("x86_64", "AMD64"):
    flags.append("-DPT_X86=1")

setup(
    ext_modules=[
        Extension(
            "collectives._native",
            sources=sources,
            include_dirs=["native/include", "native/src"],  # "pt.h"; "core/internal.h", ...
            extra_compile_args=flags,
            libraries=["pthread"],
        )
    ]
)

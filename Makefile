# make demo : create .venv (once), pack the embedded Fashion-MNIST default and train ResNet-50 on it to 75.9%.
# make test : create .venv (once), run the whole test suite.
# .venv holds the CPU stack (MXNet 1.9.1, DALI CPU operators, mlperf-logging) and Horovod compiled against that
# MXNet with Gloo and with Debian's Open MPI (ranks that srun starts meet through MPI over PMIx, as the NGC image's
# do). A second run reuses it; Horovod is rebuilt only if it is missing or its build flags changed.
SHELL     := /bin/bash
VENV      ?= .venv
# The interpreter of .venv: MXNet 1.9.1 needs numpy < 1.24, whose wheels stop at Python 3.11 (pip finds none for
# 3.12 and builds numpy from source, which fails). The first of these that is 3.10 or 3.11 serves.
# VENV_PYTHON=... on the command line names another.
ifndef VENV_PYTHON
VENV_PYTHON := $(shell for p in python3.11 python3.10 python3; do \
	v=$$($$p -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) && \
	{ [ "$$v" = 3.10 ] || [ "$$v" = 3.11 ]; } && { echo $$p; break; }; done)
endif
NO_PYTHON := make: rn50-mx needs Python 3.10 or 3.11 (MXNet 1.9.1 needs numpy < 1.24, which has no wheels for 3.12 \
	or newer) and none is on PATH: install python3.11 with its venv module (Debian/Ubuntu: apt-get install \
	python3.11-venv where the release has it; or pyenv install 3.11), or run everything in the image (docker build -t \
	rn50-mx .)
PY        := $(VENV)/bin/python
DATA      ?= data/fashion-mnist
LOGDIR    ?= results/demo
NEXP      ?= 1
# make test runs the suite in this many processes (pytest-xdist), one test file per process at a time: a file's
# tests share their module fixtures and run in order; the Slurm tests' daemons stay in one process.
TEST_WORKERS ?= 2
SYSTEM_PACKAGES := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz /usr/bin/shellcheck \
	/usr/sbin/slurmctld /usr/sbin/munged /usr/lib/x86_64-linux-gnu/libpmix.so /usr/bin/mpicxx
DEBIAN_PACKAGES := dataset-fashion-mnist shellcheck slurm-wlm munge libpmix-dev openmpi-bin libopenmpi-dev
HOROVOD_BUILD_ENV := HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
	HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 CMAKE_POLICY_VERSION_MINIMUM=3.5

.PHONY: venv test demo clean FORCE

venv: $(VENV)/.horovod $(SYSTEM_PACKAGES)

# Stage 1: Python packages, at the exact versions of constraints.txt. Re-run when setup.py or constraints.txt
# changes; pip then installs only what differs.
$(VENV)/.base: setup.py constraints.txt
	@test -x $(PY) || test -n "$(VENV_PYTHON)" || { echo "$(NO_PYTHON)" >&2; exit 1; }
	test -x $(PY) || $(VENV_PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt pip wheel setuptools
	$(PY) -m pip install -q -c constraints.txt -e ".[cpu,test]"
	touch $@

# Stage 2: Horovod compiled against the MXNet of stage 1, with Gloo and MPI (about 5 minutes; pip skips it when
# the pinned version is already there). It needs Open MPI's compiler wrapper (a Debian package below). The flags
# are kept in .horovod-flags, rewritten only when they change: then the installed Horovod is removed and rebuilt.
$(VENV)/.horovod-flags: FORCE
	@mkdir -p $(VENV)
	@echo '$(HOROVOD_BUILD_ENV)' | cmp -s - $@ || echo '$(HOROVOD_BUILD_ENV)' > $@

$(VENV)/.horovod: $(VENV)/.base $(VENV)/.horovod-flags /usr/bin/mpicxx
	$(if $(filter $(VENV)/.horovod-flags,$?),$(PY) -m pip uninstall -y -q horovod)
	$(HOROVOD_BUILD_ENV) $(PY) -m pip install -q -c constraints.txt --no-build-isolation --no-cache-dir horovod
	$(PY) -c "import horovod.mxnet as hvd; assert hvd.gloo_built() and hvd.mpi_built()"
	touch $@

# Debian packages: the embedded dataset (real photographs, MIT licence), the shell linter the tests run, and the
# Slurm the launch tests run (munge for its authentication, libpmix-dev for `srun --mpi=pmix`: the plugin opens the
# unversioned libpmix.so) with the Open MPI that Horovod is built against.
$(SYSTEM_PACKAGES):
	@command -v apt-get >/dev/null || { echo "install the Debian packages $(DEBIAN_PACKAGES)"; exit 1; }
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_PACKAGES)

test: venv
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The demo runs exactly what a GPU user runs: config file -> run_with_docker.sh (bare machine: CONT unset)
# -> run_and_time.sh -> python -m rn50_mx.train, then the timing tool and the MLPerf compliance checker.
# Each line execs its command: make passes a SIGTERM on to its children only, so a shell in between would die
# alone and leave the command running.
demo: venv
	source config/CPU.sh && exec $(PY) -m rn50_mx.prep_rec fashion-mnist $(DATA) $$FMNIST_ARGS
	source config/CPU.sh && exec $(PY) -m rn50_mx.prep_rec verify $(DATA)/train --num-classes $$NUM_CLASSES
	source config/CPU.sh && exec $(PY) -m rn50_mx.prep_rec verify $(DATA)/val --num-classes $$NUM_CLASSES
	source config/CPU.sh && PATH="$(CURDIR)/$(VENV)/bin:$$PATH" DATADIR=$(DATA) LOGDIR=$(LOGDIR) NEXP=$(NEXP) \
	  exec ./run_with_docker.sh  # the launcher stops its trial on SIGTERM

clean:
	rm -rf $(VENV) data results build *.egg-info

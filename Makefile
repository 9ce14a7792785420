# make demo : create .venv (once), pack the embedded Fashion-MNIST default and train ResNet-50 on it to 75.9%.
# make test : create .venv (once), run the whole test suite.
# make image-cpu : the CPU image rn50-mx:cpu from ./Dockerfile, built by the engine DOCKER_HOST names (docs/container.md).
# make fused-update : the optimizer's fused CPU update (rn50_mx/fused_update), which demo and test build first.
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
# make test runs the suite in this many processes (pytest-xdist), one unit at a time each: a test file (its tests
# share their module fixtures and run in order; the Slurm tests' daemons stay in one process) or one xdist_group of a
# file split in parts; the costliest units first, by tests/unit_costs.json (tests/support/schedule.py), so that no
# slow file is left to one worker at the end. It ends with the cost profile: the total and the 10 slowest tests
# (docs/testing.md; bench/test_profile.py prints it by file). One worker more than a 2-core machine's cores: a sixth
# of the suite's worker time is spent waiting (Slurm's scheduler, the Docker engine, a stall's floor), and a third
# worker computes meanwhile.
TEST_WORKERS ?= 3
SYSTEM_PACKAGES := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz /usr/bin/shellcheck \
	/usr/sbin/slurmctld /usr/sbin/munged /usr/lib/x86_64-linux-gnu/libpmix.so /usr/bin/mpicxx /usr/sbin/dockerd \
	/usr/bin/mmdebstrap
DEBIAN_PACKAGES := dataset-fashion-mnist shellcheck slurm-wlm munge libpmix-dev openmpi-bin libopenmpi-dev docker.io \
	mmdebstrap
HOROVOD_BUILD_ENV := HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
	HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 CMAKE_POLICY_VERSION_MINIMUM=3.5
# Built once per machine, outside the clone: Horovod's wheel (a fresh clone's .venv and the CPU image install it) and
# the CPU image's base, each in a folder named by the hash of what it is built from.
CACHE     ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/rn50-mx
# Horovod's inputs: its build flags, the pins of Horovod and the MXNet it compiles against, the Python and the Debian
# release (its Open MPI and compiler).
HOROVOD_KEY := $(shell { { echo '$(HOROVOD_BUILD_ENV)'; grep -E '^(horovod|mxnet)==' constraints.txt; \
	$(VENV_PYTHON) -c 'import sys; print(sys.version_info[:2])'; cat /etc/debian_version; uname -m; } | \
	sha256sum | cut -c1-16; } 2>/dev/null)
HOROVOD_WHEEL_DIR := $(CACHE)/horovod-$(HOROVOD_KEY)

.PHONY: venv test demo image-cpu cpu-base-key clean fused-update op-cache FORCE

venv: $(VENV)/.horovod $(SYSTEM_PACKAGES)

# Stage 1: Python packages, at the exact versions of constraints.txt. Re-run when setup.py or constraints.txt
# changes; pip then installs only what differs. pip compiles the packages' bytecode on one core (17 of the 34 s of a
# fresh .venv here); compileall does it on all of them (8 s on 2). pip uninstall removes those .pyc files too
# (UninstallPathSet.add, pip/_internal/req/req_uninstall.py). A file that does not compile is compiled at its import.
$(VENV)/.base: setup.py constraints.txt
	@test -x $(PY) || test -n "$(VENV_PYTHON)" || { echo "$(NO_PYTHON)" >&2; exit 1; }
	test -x $(PY) || $(VENV_PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt pip wheel setuptools
	$(PY) -m pip install -q --no-compile -c constraints.txt -e ".[cpu,test]"
	$(PY) -W ignore -m compileall -qq -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || \
	  echo "make: some installed files did not compile: Python compiles them at their import" >&2
	touch $@

# Stage 2: Horovod compiled against the MXNet of stage 1, with Gloo and MPI, as a wheel in HOROVOD_WHEEL_DIR (about
# 5 minutes, once per machine and set of inputs: another clone's .venv and the CPU image's base install the same
# wheel). It needs Open MPI's compiler wrapper (a Debian package below). Written under a temporary name, renamed
# when whole. A wheel built from other inputs is another folder: the installed Horovod is replaced by it.
$(HOROVOD_WHEEL_DIR): | /usr/bin/mpicxx
	$(MAKE) --no-print-directory $(VENV)/.base  # here, not a prerequisite: a clone finding the wheel needs no .venv
	mkdir -p $(CACHE) && tmp=$$(mktemp -d $@.tmp-XXXXXX) && \
	  { $(HOROVOD_BUILD_ENV) $(PY) -m pip wheel -q -c constraints.txt --no-deps --no-build-isolation --no-cache-dir \
	    -w $$tmp horovod || { rm -rf $$tmp; exit 1; }; } && \
	  { mv -T $$tmp $@ 2>/dev/null || rm -rf $$tmp; }  # a second writer's whole wheel already there: keep it
	test -d $@

# The wheel's key, rewritten only when it changes: then the installed Horovod is replaced by that wheel's (built here
# when missing). A .venv whose Horovod has this key needs no wheel folder (make run with another HOME finds none).
$(VENV)/.horovod-key: FORCE
	@mkdir -p $(VENV)
	@echo '$(HOROVOD_KEY)' | cmp -s - $@ || echo '$(HOROVOD_KEY)' > $@

$(VENV)/.horovod: $(VENV)/.base $(VENV)/.horovod-key
	$(MAKE) --no-print-directory $(HOROVOD_WHEEL_DIR)
	$(PY) -m pip uninstall -y -q horovod
	$(PY) -m pip install -q -c constraints.txt $(HOROVOD_WHEEL_DIR)/horovod-*.whl
	$(PY) -c "import horovod.mxnet as hvd; assert hvd.gloo_built() and hvd.mpi_built()"
	touch $@

# Debian packages: the embedded dataset (real photographs, MIT licence), the shell linter the tests run, and the
# Slurm the launch tests run (munge for its authentication, libpmix-dev for `srun --mpi=pmix`: the plugin opens the
# unversioned libpmix.so) with the Open MPI that Horovod is built against.
$(SYSTEM_PACKAGES):
	@command -v apt-get >/dev/null || { echo "install the Debian packages $(DEBIAN_PACKAGES)"; exit 1; }
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_PACKAGES)

# The optimizer's update of CPU tensors in one pass each (rn50_mx/fused_update/__init__.py says how it runs): C++
# with OpenMP against the MXNet wheel's headers (dmlc's number parser, so that its floats are MXNet's), compiled with
# -ffp-contract=off, as libmxnet.so's kernels have no fused multiply-add and the update is theirs bit for bit. One
# build serves every x86-64 CPU (AVX-512 and avx512_bf16 are chosen when it runs). Where it does not build, training
# runs MXNet's kernels: one line here, one when training starts. Written under a temporary name, renamed when whole.
FUSED_SRC := rn50_mx/fused_update/fused_update.cc
FUSED_LIB := rn50_mx/fused_update/libfused_update.so.1
FUSED_FLAGS := -O3 -std=c++17 -shared -fPIC -fopenmp -ffp-contract=off -Wall -Wno-maybe-uninitialized
MXNET_INCLUDE = $(shell $(PY) -c 'import importlib.util, os; \
	print(os.path.join(importlib.util.find_spec("mxnet").submodule_search_locations[0], "include"))' 2>/dev/null)

fused-update: $(FUSED_LIB)

# -Wno-maybe-uninitialized: GCC 12's own AVX-512 intrinsics headers trip it (GCC bug 105593).
$(FUSED_LIB): $(FUSED_SRC) | $(VENV)/.base
	@sha=$$(sha256sum $< | cut -c1-64) && tmp=$$(mktemp $@.tmp-XXXXXX) && \
	  if $(CXX) $(FUSED_FLAGS) -DFUSED_UPDATE_SOURCE_SHA='"'$$sha'"' -isystem "$(MXNET_INCLUDE)" $< -o $$tmp; \
	  then mv -f $$tmp $@ && echo "make: built $@"; \
	  else rm -f $$tmp; echo "make: $@ did not build ($(CXX) with the MXNet headers in '$(MXNET_INCLUDE)'): \
	training runs MXNet's unfused optimizer kernels" >&2; fi

# MXNet's operator functions compiled once for every later import (rn50_mx/op_cache): 0.35 of the 0.95 CPU-seconds of
# each MXNet import. Without it, each import compiles them itself, as MXNet does.
OP_CACHE := rn50_mx/op_cache/ops.marshal

op-cache: $(OP_CACHE)

$(OP_CACHE): rn50_mx/op_cache/__init__.py rn50_mx/op_cache/__main__.py $(VENV)/.horovod
	$(PY) -m rn50_mx.op_cache || echo "make: $@ was not written: each MXNet import compiles its operators" >&2

test: venv $(FUSED_LIB) $(OP_CACHE)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# The demo runs exactly what a GPU user runs: config file -> run_with_docker.sh (bare machine: CONT unset)
# -> run_and_time.sh -> python -m rn50_mx.train, then the timing tool and the MLPerf compliance checker.
# Each line execs its command: make passes a SIGTERM on to its children only, so a shell in between would die
# alone and leave the command running.
demo: venv $(FUSED_LIB) $(OP_CACHE)
	source config/CPU.sh && exec $(PY) -m rn50_mx.prep_rec fashion-mnist $(DATA) $$FMNIST_ARGS
	source config/CPU.sh && exec $(PY) -m rn50_mx.prep_rec verify $(DATA)/train --num-classes $$NUM_CLASSES
	source config/CPU.sh && exec $(PY) -m rn50_mx.prep_rec verify $(DATA)/val --num-classes $$NUM_CLASSES
	source config/CPU.sh && PATH="$(CURDIR)/$(VENV)/bin:$$PATH" DATADIR=$(DATA) LOGDIR=$(LOGDIR) NEXP=$(NEXP) \
	  exec ./run_with_docker.sh  # the launcher stops its trial on SIGTERM

# The CPU image. Its base is made here from Debian's packages (no registry is needed): bookworm's Python 3.11 in a venv
# at /opt/venv with MXNet, numpy and the Horovod wheel above, and Open MPI, as NVIDIA's image brings them for the GPU;
# imported into the engine as $(CPU_BASE). The Dockerfile then runs the GPU image's own steps on it, with the CPU form
# of the stack check. The root file system is kept in CACHE, named by the hash of its inputs, so that a second clone
# (or engine) imports it without rebuilding.
DOCKER    ?= docker
CPU_IMAGE ?= rn50-mx:cpu
CPU_BASE_PACKAGES := python3.11,python3.11-venv,libopenmpi3,openmpi-bin,numactl,procps,ca-certificates,libgomp1,libquadmath0
CPU_BASE_CERTS := /etc/ssl/certs/ca-certificates.crt
CPU_BASE_HOOKS := --customize-hook='chroot "$$1" python3.11 -m venv /opt/venv' \
	--customize-hook='cp $(CPU_BASE_CERTS) "$$1$(CPU_BASE_CERTS)" && mkdir "$$1/tmp/base" && \
	  cp constraints.txt $(HOROVOD_WHEEL_DIR)/*.whl "$$1/tmp/base"' \
	--customize-hook='chroot "$$1" sh -c "env -i PATH=/usr/bin:/bin HOME=/root PIP_CERT=$(CPU_BASE_CERTS) \
	  /opt/venv/bin/pip install -q --no-cache-dir -c /tmp/base/constraints.txt mxnet numpy /tmp/base/horovod-*.whl"' \
	--customize-hook='rm -rf "$$1/tmp/base" "$$1"/var/lib/apt/lists/*'
CPU_BASE_ENV := --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	--change 'ENV PIP_CERT=$(CPU_BASE_CERTS)'
CPU_BASE_KEY := $(shell { { echo '$(subst ','\'',$(HOROVOD_KEY) $(CPU_BASE_PACKAGES) $(CPU_BASE_HOOKS) $(CPU_BASE_ENV))'; \
	cat constraints.txt $(CPU_BASE_CERTS); } | sha256sum | cut -c1-16; } 2>/dev/null)
CPU_BASE  := rn50-mx-cpu-base:$(CPU_BASE_KEY)
CPU_BASE_TAR := $(CACHE)/cpu-base-$(CPU_BASE_KEY).tar
CPU_BASE_LEFT := $(CACHE): cannot remove what an earlier build left there: a mount under cpu-base.work-* (findmnt), \
	left by a build killed before mmdebstrap had a mount namespace of its own; umount it

# One build at a time writes the cache (a second waits for the lock, then finds the base there), so the bases of other
# inputs and what a killed build left (a temporary base, mmdebstrap's work folder) are removed first. The build is
# tied to make (rn50_mx/launch.sh): a SIGTERM, a Ctrl-C or a SIGKILL of make ends mmdebstrap and all it started
# within seconds (SIGKILL STOP_GRACE s after SIGTERM), and its temporary base and work folder (TMPDIR: the new root
# file system) go with them. As root, mmdebstrap mounts /proc, /sys and /dev into the new root: it runs in a mount
# namespace of its own (unshare), so that those mounts end with its last process however it ends. Killed at once
# (SIGKILL to all of it: the OOM killer, a job's cgroup), it left them mounted in the machine's namespace, and every
# later build failed at the removal below ("skipping ... since it's on a different device"). Not as root, mmdebstrap
# works in a user namespace of its own already.
$(CPU_BASE_TAR): | $(HOROVOD_WHEEL_DIR) /usr/bin/mmdebstrap
	mkdir -p -- "$(CACHE)"
	source "$(CURDIR)/rn50_mx/launch.sh" && LAUNCHER="make image-cpu" STOP_GRACE=5 && tie_to "$$PPID" && \
	  { hold_lock "$(CACHE)/cpu-base.lock" wait || die "$(CACHE): cannot write the cache"; } && \
	  if [[ -e "$@" ]]; then exit 0; fi && \
	  { rm -rf --one-file-system -- "$(CACHE)"/cpu-base-????????????????.tar "$(CACHE)"/cpu-base-*.tar.tmp-* \
	    "$(CACHE)"/cpu-base.work-* 2>/dev/null || die "$(CPU_BASE_LEFT)"; } && \
	  tmp=$$(mktemp -- "$@.tmp-XXXXXX.tar") && work=$$(mktemp -d -- "$(CACHE)/cpu-base.work-XXXXXX") && \
	  trap 'rm -rf --one-file-system -- "$$tmp" "$$work"' EXIT && \
	  own_mounts=() && { ((EUID)) || own_mounts=(unshare --mount --propagation private --); } && \
	  TMPDIR=$$work run_in_group "$${own_mounts[@]}" mmdebstrap --quiet --variant=minbase \
	    --include=$(CPU_BASE_PACKAGES) $(CPU_BASE_HOOKS) bookworm "$$tmp" && mv -- "$$tmp" "$@"

# The base's hash (tests/support/engine.py names its saved image by it and the Dockerfile's context).
cpu-base-key:
	@echo $(CPU_BASE_KEY)

image-cpu: $(CPU_BASE_TAR) /usr/sbin/dockerd $(FUSED_LIB)
	@$(DOCKER) version >/dev/null || { echo "make image-cpu: no Docker engine answers (DOCKER_HOST=$${DOCKER_HOST:-unset}): start dockerd first" >&2; exit 1; }
	$(DOCKER) image inspect $(CPU_BASE) >/dev/null 2>&1 || \
	  $(DOCKER) import $(CPU_BASE_ENV) $(CPU_BASE_TAR) $(CPU_BASE)
	$(DOCKER) build --network=host --build-arg FROM_IMAGE_NAME=$(CPU_BASE) --build-arg IMAGE_PYTHON=3.11 \
	  --build-arg EXPECT_GPU= -t $(CPU_IMAGE) .

clean:
	rm -rf $(VENV) data results build *.egg-info $(FUSED_LIB) $(OP_CACHE)

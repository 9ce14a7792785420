# make test : create .venv (once), install the CPU stack + Horovod, run the whole test suite.
# make demo : create .venv (once), pack the embedded Fashion-MNIST default and train on it.
VENV      ?= .venv
PY        := $(VENV)/bin/python
DATA      ?= data/fashion-mnist
FMNIST    := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
HOROVOD_BUILD_ENV := HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 CMAKE_POLICY_VERSION_MINIMUM=3.5

.PHONY: venv test demo bench clean

venv: $(VENV)/.horovod $(FMNIST)

# Stage 1: Python packages. Re-run when setup.py changes; Horovod is not rebuilt by that.
$(VENV)/.base: setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip wheel "setuptools<70"
	$(PY) -m pip install -q -e ".[cpu,test]"
	touch $@

# Stage 2: Horovod compiled against the MXNet of stage 1, with Gloo (about 4 minutes, done once).
$(VENV)/.horovod: $(VENV)/.base
	$(PY) -c "import horovod.mxnet" 2>/dev/null || \
	  $(HOROVOD_BUILD_ENV) $(PY) -m pip install -q --no-build-isolation --no-cache-dir horovod==0.28.1
	$(PY) -c "import horovod.mxnet as hvd; assert hvd.gloo_built()"
	touch $@

# The embedded default dataset comes from Debian (real photographs, MIT licence).
$(FMNIST):
	@command -v apt-get >/dev/null || { echo "install the Debian package dataset-fashion-mnist"; exit 1; }
	apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist

test: venv
	$(PY) -m pytest -q tests

demo: venv
	$(PY) -m rn50_mx.prep_rec fashion-mnist $(DATA)
	$(PY) -m rn50_mx.prep_rec verify $(DATA)/train
	$(PY) -m rn50_mx.prep_rec verify $(DATA)/val

clean:
	rm -rf $(VENV) data build *.egg-info

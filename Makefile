# Entry points. Names, paths, ports and the engine come from k8s/base/settings.env, the trainer's variables from
# k8s/base/trainer.env, and each room's pins from its own settings.env (k8s/engines/<name>/, scripts/<room>/).
# Its values are defaults: the environment and make's command line win over each (KEY ?= VALUE), and the
# scripts get the values make settled on in their environment (SETTINGS_ENV), so `WORKERS=3 make submit`
# and `make submit WORKERS=3` both run three workers.
, := ,
SETTINGS_FILES := k8s/base/settings.env k8s/base/trainer.env $(wildcard k8s/engines/*/settings.env scripts/*/settings.env trainer/*/settings.env)
SETTINGS_LINES := $(shell grep -hE '^[A-Za-z_][A-Za-z0-9_]*=' $(SETTINGS_FILES))
setting_key    = $(firstword $(subst =, ,$(1)))
setting_value  = $(patsubst $(call setting_key,$(1))=%,%,$(1))
SETTINGS_KEYS  = $(foreach line,$(SETTINGS_LINES),$(call setting_key,$(line)))
$(foreach line,$(SETTINGS_LINES),$(eval $(call setting_key,$(line)) ?= $(call setting_value,$(line))))
SETTINGS_ENV   = $(foreach key,$(SETTINGS_KEYS),$(key)='$($(key))')
# Every setting's value holds only the characters of GENERAL in scripts/common/settings.py (which also holds the
# stricter rule of each key, checked by the scripts), checked before any command runs: the recipes paste values
# into commands as KEY='VALUE'. $(value KEY) is the text as given, unexpanded, so a $(...) in it never runs.
SAFE_CHARACTERS := a b c d e f g h i j k l m n o p q r s t u v w x y z A B C D E F G H I J K L M N O P Q R S T U V \
  W X Y Z 0 1 2 3 4 5 6 7 8 9 . _ : / = + @ * ? [ ] - $(,)
define newline


endef
without_safe = $(if $(2),$(call without_safe,$(subst $(firstword $(2)),,$(1)),$(wordlist 2,$(words $(2)),$(2))),$(1))
unsafe_part  = $(call without_safe,$(subst $(newline),',$(subst $(space),',$(subst $(tab),',$(value $(1))))),$(SAFE_CHARACTERS))
space := $() $()
tab   := $()	$()
# The scripts' stricter check, per key (one line each, exit 2), first in every recipe that hands the settings on.
CHECK_SETTINGS = $(SETTINGS_ENV) python3 -B -m scripts.common.settings --check
$(foreach key,$(SETTINGS_KEYS),$(if $(call unsafe_part,$(key)),$(error setting $(key)='$(value $(key))' holds characters that cannot be passed on safely ($(call unsafe_part,$(key))): use letters, digits and . _ $(,) : / = + @ * ? [ ] - only ($(SETTINGS_FILES), the environment or make's command line))))

PYTHON_FOR_VENV ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Which TensorFlow wheel the venv gets: tf (any OS), cpu (Linux only, smaller) or gpu.
TF_FLAVOUR ?= tf

# make upload-images IMAGES=DIR copies a local image folder (train/<class>/*.png|jpg|gif|bmp, test/<class>/) to the
# volume, at IMAGES_ROOT/<DIR's name>; make submit IMAGES=DIR trains on that copy (--dataset image_folder). The
# scripts read it from the environment, quoted by the shell ("$$IMAGES"): a local path may hold any character.
IMAGES ?=
export IMAGES
# PRUNE=1 make upload-images also removes the files on the volume that the folder no longer holds.
PRUNE ?=
# Empty: TRAINER_DATASET (trainer.env), else the trainer's own choice (your module's dataset, else fashion_mnist).
DATASET ?= $(if $(value IMAGES),image_folder,$(TRAINER_DATASET))
DATASET_FLAG = $(if $(DATASET),--dataset $(DATASET))
# Which engine runs the group on Kubernetes (ENGINE, a setting): each folder k8s/engines/ENGINE with an
# engine.env is one (tfjob, the Kubeflow training operator v1; jobset; trainjob, Kubeflow Trainer v2 over a JobSet);
# and how it trains (STRATEGY): sync (all-reduce workers) or async (a chief coordinating parameter servers and
# workers, plus an evaluator). Each pair is one overlay, k8s/engines/ENGINE/STRATEGY.
STRATEGY ?= sync
ENGINE_FOLDERS := $(sort $(patsubst k8s/engines/%/engine.env,%,$(wildcard k8s/engines/*/engine.env)))
ENGINES    := $(strip $(filter tfjob,$(ENGINE_FOLDERS)) $(filter-out tfjob,$(ENGINE_FOLDERS)))
STRATEGIES := sync async
ifeq ($(filter $(ENGINE),$(ENGINES)),)
$(if $(ENGINES),$(error ENGINE=$(ENGINE) is not an engine: use one of $(ENGINES) (a folder k8s/engines/ENGINE with an engine.env)))
endif
ifeq ($(filter $(STRATEGY),$(STRATEGIES)),)
$(error STRATEGY=$(STRATEGY) is not a strategy: use sync or async)
endif
KUSTOMIZATION := k8s/engines/$(ENGINE)/$(STRATEGY)
# The engine's facts (ENGINE_KIND, ENGINE_JOB_LABEL, ENGINE_CHIEF_SYNC...), from its engine.env.
$(foreach line,$(shell grep -hsE '^ENGINE_[A-Z_]+=' k8s/engines/$(ENGINE)/engine.env),$(eval $(call setting_key,$(line)) := $(call setting_value,$(line))))
EPOCHS  ?= 3
ARGS    ?=
# scripts/image/build-image.sh names the image (IMAGE_NAME:git revision, -gpu/-tf for IMAGE_TF_FLAVOUR=gpu/tf) and
# picks CONTAINER_TOOL; IMAGE_TAG, IMAGE_TF_FLAVOUR and CONTAINER_TOOL reach it from make's command line
# or the environment. Asked once, so `make image` builds the name `make submit` runs.
IMAGE := $(shell $(SETTINGS_ENV) IMAGE= IMAGE_TAG='$(IMAGE_TAG)' scripts/image/build-image.sh --print-image 2>/dev/null)
# TENSORBOARD=1 make submit also deploys TensorBoard reading the volume.
TENSORBOARD ?=

export IMAGE

# run-local, tune, submit and upload-images render the overlay with kubectl: check it before anything is installed or started.
ifneq ($(filter run-local tune tune-cluster submit upload-images,$(MAKECMDGOALS)),)
KUBECTL_PROBLEM := $(shell scripts/common/check-kubectl.sh)
ifneq ($(KUBECTL_PROBLEM),)
$(error $(KUBECTL_PROBLEM))
endif
endif
ifneq ($(filter upload-images,$(MAKECMDGOALS)),)
ifeq ($(value IMAGES),)
$(error make upload-images needs IMAGES=path/to/folder, the folder that holds train/<class>/ (and test/<class>/) images (IMAGES, with an S: IMAGE names the container image))
endif
endif

.PHONY: help install lock train run-local tune tune-cluster versions test test-slow test-all lint image k3d-up k3d-down submit upload-images status logs delete fetch-model clean serve select pipeline serve-once submit-pipeline serve-cluster

help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{ printf "%-12s %s\n", $$1, $$2 }'

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON_FOR_VENV) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip==25.3"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[$(TF_FLAVOUR),dev]"
	touch $@

# checkov (the quick suite's third-party policy check) in a venv of its own: its pins (packaging<24, termcolor<2.4)
# conflict with the trainer's. Made by the targets that run the quick suite, and by make lock.
CHECKOV_VENV := $(VENV)/checkov
$(CHECKOV_VENV)/.installed: checkov-constraints.txt
	$(PYTHON_FOR_VENV) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --upgrade "pip==25.3"
	$(CHECKOV_VENV)/bin/python -m pip install --quiet -c checkov-constraints.txt "checkov==3.3.30"
	touch $@

install: $(VENV)/.installed ## create .venv with the trainer, its tests and tools

# Re-runnable: after a dependency changes in pyproject.toml, `make install` then `make lock` rewrites all three.
lock: install $(CHECKOV_VENV)/.installed ## re-pin every transitive version into constraints.txt, then the image's hashed locks and checkov's pins
	$(PY) -m pip freeze --exclude-editable | sed '1i # Every transitive version, pinned; regenerate with make lock. Used as pip -c.' > constraints.txt
	$(PY) -m scripts.image.lock_image
	$(CHECKOV_VENV)/bin/python -m pip freeze | grep -v '^checkov==' | sed '1i # checkov and every package it needs, pinned; its own venv (make test and make lock make it: .venv/checkov), because it pins\n# packaging<24 and termcolor<2.4, which constraints.txt does not. Regenerate with make lock. Used as pip -c.' > checkov-constraints.txt

train: install ## train in one process (no TF_CONFIG; IMAGES=: your image folder)
	$(PY) -m trainer $(DATASET_FLAG) --epochs $(EPOCHS) --download --data-dir runs/data --model-dir runs/train/model $(if $(value IMAGES),--image-dir "$$IMAGES") $(ARGS)

run-local: install ## run the overlay's pods as local processes under the engine's rules (ENGINE=, STRATEGY=, WORKERS=, DATASET=, EPOCHS=, ARGS=, CLEAN=1; IMAGES=: your image folder)
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) $(PY) -m scripts.localrun.run_local --kustomize $(KUSTOMIZATION) --workers $(WORKERS) $(DATASET_FLAG) --epochs $(EPOCHS) $(if $(value IMAGES),--images "$$IMAGES") $(if $(CLEAN),--clean) $(if $(ARGS),-- $(ARGS))

# pytest-xdist processes for make test and test-slow (0: all in one process). Each test file runs whole in one of them
# (--dist loadfile), so a module's fixtures are built once and one file's processes never race another file's.
TEST_WORKERS ?= 2
PYTEST = $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

test: install $(CHECKOV_VENV)/.installed ## the quick suite (under 5 minutes on 2 cores; TEST_WORKERS=)
	$(PYTEST) -m "not slow and not image and not cluster"

test-slow: install ## the slow suites: long multi-process runs, the serving bench and the image build (CI runs these; TEST_WORKERS=)
	$(PYTEST) -m "slow or image"

test-all: test test-slow ## everything CI runs

# Every check runs even when an earlier one fails, so one `make lint` lists every problem.
lint: install ## ruff (lint and format check), mypy on trainer/, shellcheck on the shell scripts; all from .venv
	@failed=0; \
	$(VENV)/bin/ruff check . || failed=1; \
	$(VENV)/bin/ruff format --check . || failed=1; \
	$(VENV)/bin/mypy trainer || failed=1; \
	$(VENV)/bin/shellcheck $$(find scripts k8s -name '*.sh') .ci/run || failed=1; \
	exit $$failed

versions: install ## each pinned component: version, release date, support end, where it runs here; warns past a support end (docs/versions.md)
	@$(SETTINGS_ENV) $(PY) -m scripts.versions.versions

image: ## build the trainer image tagged with the git revision (CONTAINER_TOOL=docker|podman|buildah)
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) scripts/image/build-image.sh

k3d-up: ## create the k3d cluster and install the engine (ENGINE=tfjob: the training operator; jobset; trainjob; SERVE=1: also cert-manager, KServe and Argo Workflows; KUEUE=1: also Kueue; KATIB=1: also Katib; NODES=2: an agent node and the class local-path-shared on a folder both mount)
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) SERVE=$(SERVE) KUEUE=$(KUEUE) KATIB=$(KATIB) NODES=$(NODES) ENGINE=$(ENGINE) scripts/cluster/k3d-up.sh

k3d-down: ## delete the k3d cluster
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) scripts/cluster/k3d-down.sh

submit: install image ## import the image, prepare data, submit the job (ENGINE=, STRATEGY=; IMAGES=: train on that uploaded image folder) and follow it
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) $(PY) -m scripts.cluster.submit --kustomize $(KUSTOMIZATION) --image $(IMAGE) --workers $(WORKERS) $(DATASET_FLAG) --epochs $(EPOCHS) $(if $(value IMAGES),--images "$$IMAGES") $(if $(TENSORBOARD),--tensorboard) $(if $(ARGS),-- $(ARGS))

upload-images: install image ## copy the image folder IMAGES= (train/<class>/, test/<class>/) to the volume, only the files missing or changed there, by sha256 (PRUNE=1: remove what the folder no longer holds)
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) $(PY) -m scripts.cluster.import_image $(IMAGE)
	@$(SETTINGS_ENV) $(PY) -m scripts.cluster.upload_images --kustomize $(KUSTOMIZATION) --image $(IMAGE) $(if $(PRUNE),--prune) --images "$$IMAGES"

status: install ## the job's conditions and the chief's live status (ENGINE=, STRATEGY=: which job to look for)
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) $(PY) -m scripts.cluster.submit --status --kustomize $(KUSTOMIZATION)

# The chief's pod, by the labels its engine's engine.env names for the strategy.
CHIEF_SELECTOR = $(ENGINE_JOB_LABEL)=$(JOB_NAME),$(ENGINE_CHIEF_$(if $(filter async,$(STRATEGY)),ASYNC,SYNC))

logs: ## follow the chief's logs (ENGINE=, STRATEGY=)
	@$(CHECK_SETTINGS)
	$(KUBECTL) logs -f -n $(NAMESPACE) -l $(CHIEF_SELECTOR)

delete: install ## delete the job in the foreground (ENGINE=, STRATEGY=; the volume and its model stay)
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) $(PY) -m scripts.cluster.submit --delete --kustomize $(KUSTOMIZATION)

fetch-model: ## copy the job's model dir to ./artifacts/model and the model published for JOB_NAME (a pipeline's, tune-cluster's) to ./artifacts/published
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) scripts/cluster/fetch-model.sh

# A job's model dir as run-local lays it out: the volume (MOUNT_PATH) is runs/<job>/, so MODEL_ROOT/<job> is
# runs/<job>/<MODEL_ROOT below MOUNT_PATH>/<job> (docs/local-runner.md).
local_model_dir = runs/$(1)/$(patsubst $(MOUNT_PATH)/%,%,$(MODEL_ROOT))/$(1)
# make serve: the base path of SavedModel versions to serve (default: the newer of the last run-local's and the one
# make select, make pipeline and make tune publish into), and its model name.
SERVE_FROM  ?= $(firstword $(shell ls -1dt $(PUBLISH_TO) $(call local_model_dir,$(JOB_NAME))/serving 2>/dev/null) $(call local_model_dir,$(JOB_NAME))/serving)
SERVE_MODEL ?= $(JOB_NAME)

# make select: the trained model dirs to choose from (default: the pipeline's variants, each run-local'd under
# JOB_NAME-<model>) and the base path the winner is published into (selection.json lands beside it).
PIPELINE_MODELS   ?= cnn dropout batch_norm
variant_job        = $(JOB_NAME)-$(subst _,-,$(1))
SELECT_CANDIDATES ?= $(foreach model,$(PIPELINE_MODELS),$(call local_model_dir,$(call variant_job,$(model))))
PUBLISH_TO        ?= runs/$(JOB_NAME)-selected/serving
# REPLACE=1: make select, pipeline, tune and their cluster steps publish their winner even where the model already
# published scores as well or was tested on other data (by default it stays, and they say why).
REPLACE           ?=

select: install ## publish the best of SELECT_CANDIDATES into PUBLISH_TO as a new version, if it beats the one published there (REPLACE=1: in any case)
	@$(CHECK_SETTINGS)
	$(PY) -m trainer.serving.select $(if $(REPLACE),--replace) --candidates $(SELECT_CANDIDATES) --base-path $(PUBLISH_TO)

# The pipeline on this machine; on a cluster, scripts/pipeline/cluster.py renders the same steps as an Argo Workflow.
pipeline: install ## train each PIPELINE_MODELS variant with run-local (JOB_NAME-<model>), select the best, serve it and send one request
	@$(CHECK_SETTINGS)
	$(foreach model,$(PIPELINE_MODELS),$(MAKE) run-local JOB_NAME=$(call variant_job,$(model)) ARGS="--model $(model) $(ARGS)" &&) true
	$(MAKE) select
	$(MAKE) serve-once

# make tune: the search space (scripts/tune/search_space.yaml says how to write one), the trial budget and trials at
# once (empty: the file's), and the study's name (runs/STUDY/ holds it; the same name resumes it).
SEARCH_SPACE ?= scripts/tune/search_space.yaml
TRIALS       ?=
PARALLEL     ?=
STUDY        ?= $(JOB_NAME)-tune

tune: install ## search SEARCH_SPACE with Optuna: TRIALS run-local jobs, pruned, resumable; the best published for make serve (ENGINE=, STRATEGY=, WORKERS=, DATASET=, EPOCHS=, ARGS=; IMAGES=: your image folder)
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) $(PY) -m scripts.tune.tune --search-space $(SEARCH_SPACE) --study $(STUDY) --kustomize $(KUSTOMIZATION) --workers $(WORKERS) $(DATASET_FLAG) --epochs $(EPOCHS) $(if $(value IMAGES),--images "$$IMAGES") --publish-to $(PUBLISH_TO) $(if $(REPLACE),--replace) $(if $(TRIALS),--trials $(TRIALS)) $(if $(PARALLEL),--parallel $(PARALLEL)) $(if $(ARGS),-- $(ARGS))

# make tune-cluster: the same search as a Katib Experiment named STUDY on the cluster (make k3d-up KATIB=1), its trials
# the ENGINE's job (tfjob or trainjob); the best published on the volume for make serve-cluster (docs/tuning.md).
tune-cluster: install image ## search SEARCH_SPACE as a Katib Experiment: TRIALS TFJobs or TrainJobs (ENGINE=), followed; the best published for make serve-cluster and fetched to ./artifacts/
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) $(PY) -m scripts.cluster.import_image $(IMAGE)
	@$(SETTINGS_ENV) $(PY) -m scripts.tune.cluster --search-space $(SEARCH_SPACE) --study $(STUDY) --kustomize $(KUSTOMIZATION) --image $(IMAGE) --workers $(WORKERS) $(DATASET_FLAG) --epochs $(EPOCHS) $(if $(REPLACE),--replace) $(if $(TRIALS),--trials $(TRIALS)) $(if $(PARALLEL),--parallel $(PARALLEL)) $(if $(ARGS),-- $(ARGS))

serve-once: install ## serve PUBLISH_TO, send it one request, print the answer and stop (the pipeline's last step)
	@$(CHECK_SETTINGS)
	$(PY) -m scripts.pipeline.serve_once --base-path $(PUBLISH_TO) --model-name $(SERVE_MODEL) --rest-port $(SERVE_PORT) --grpc-port $(SERVE_GRPC_PORT)

# make serve-cluster: which runtime the InferenceService uses: project (this image running make serve's server) or
# tf-serving (KServe's TensorFlow Serving runtime at TF_SERVING_VERSION; not run here).
SERVE_RUNTIME ?= project
SERVE ?=
# The cluster commands name their context (the k3d cluster's unless KUBE_CONTEXT names another), never the current one.
KUBECTL = kubectl --context $(or $(KUBE_CONTEXT),k3d-$(CLUSTER_NAME))

submit-pipeline: install image ## the pipeline as an Argo Workflow (ENGINE=): prepare data, train PIPELINE_MODELS in parallel, select, serve; followed to its end
	@$(CHECK_SETTINGS)
	@$(SETTINGS_ENV) $(PY) -m scripts.cluster.import_image $(IMAGE)
	@$(SETTINGS_ENV) $(PY) -m scripts.pipeline.submit workflow --engine $(ENGINE) --image $(IMAGE) --models $(PIPELINE_MODELS) --workers $(WORKERS) $(DATASET_FLAG) --epochs $(EPOCHS) $(if $(REPLACE),--replace) $(if $(ARGS),-- $(ARGS))

serve-cluster: install $(if $(filter project,$(SERVE_RUNTIME)),image) ## apply the InferenceService (KServe, Standard mode) serving the published model from the volume; wait until Ready (SERVE_RUNTIME=)
	@$(CHECK_SETTINGS)
	$(if $(filter project,$(SERVE_RUNTIME)),@$(SETTINGS_ENV) $(PY) -m scripts.cluster.import_image $(IMAGE))
	@$(SETTINGS_ENV) $(PY) -m scripts.pipeline.submit serving --image $(IMAGE) --runtime $(SERVE_RUNTIME)

# The server's batching flags, each only when its setting is set (empty: the server's default); the cluster's
# ServingRuntime passes the same ones (scripts/pipeline/cluster.py SERVER_FLAGS; a test holds the two equal).
SERVE_BATCHING = $(if $(SERVE_MAX_BATCH_SIZE),--max-batch-size $(SERVE_MAX_BATCH_SIZE)) $(if $(SERVE_BATCH_TIMEOUT_MS),--batch-timeout-ms $(SERVE_BATCH_TIMEOUT_MS)) $(if $(SERVE_MAX_QUEUED_EXAMPLES),--max-queued-examples $(SERVE_MAX_QUEUED_EXAMPLES)) $(if $(SERVE_MAX_CONCURRENT_REQUESTS),--max-concurrent-requests $(SERVE_MAX_CONCURRENT_REQUESTS))

serve: install ## serve the newest SavedModel under SERVE_FROM on SERVE_PORT (REST v1/v2) and SERVE_GRPC_PORT (gRPC v2); SERVE_MAX_BATCH_SIZE= turns batching on
	@$(CHECK_SETTINGS)
	$(PY) -m trainer.serving --model-base-path $(SERVE_FROM) --model-name $(SERVE_MODEL) --rest-port $(SERVE_PORT) --grpc-port $(SERVE_GRPC_PORT) $(strip $(SERVE_BATCHING))

clean: ## remove local runs and caches (keeps .venv)
	rm -rf runs artifacts .pytest_cache

# The harness's rooms, each deleted with its folder: the local node (make cluster-up, cluster-down, test-cluster) and
# the benches (make bench, bench-serving, bench-floor, bench-tools).
-include scripts/node/node.mk
-include scripts/bench/bench.mk
